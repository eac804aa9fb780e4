"""`agentrft demo --agentic`: the agentic recipe, multi-tool long-horizon finqa-lite levels on a CPU.

The seeds' recipe for a weak model: imitation first, then RL with a curriculum and credit for the
steps that mattered. One command, one run directory:

1. **baseline**: held-out evals of levels 2-4 (``--eval-tasks`` tasks of each level, 2 samples each,
   T 0.7), and of the ``ood`` templates, on the environment's own prompt (its worked example per level);
   and the base policy on the trained prompt (run ``baseline-trained-prompt``, below);
2. **demonstrations**: the `oracle` policy (`samplers/oracle.py`: the environment's expert written in
   the student's tool-call text and tokenizer) plays the training split of levels 1-4; stored and
   graded like any trajectory (runs ``demos`` and, of the late levels, ``demos-late``);
3. **imitation**: filtered SFT on those demonstrations (preset ``agentic-imitation``): one shuffled pass over
   every level by default (the expert's stated plan keeps levels 3 and 4 apart, docs/agentic.md); levels named
   in ``late_levels`` get a second pass from those weights (preset ``agentic-imitation-late``, with
   ``late_replay`` of each earlier level's); held-out evals again (run ``imitation``), so each stage's share
   is visible;
4. **RL**: GRPO from the imitated weights with the curriculum over levels 1-4 (`train/rl/curriculum.py`)
   and the outcome plus per-turn process credit (`envs/finqa/process_grader.py`, ``algorithm.turn_level``)
   (preset ``agentic-rl``);
5. **final** held-out and ``ood`` evals, the per-level table, and the report.

The settings (`AgenticSettings`, ``--set recipe.K=V``) and the stages' configs (`agentic_configs`) are in
`agentrft.recipes.agentic_settings`.

The trained prompt (``trained_shots``, default 0: ``finqa-lite:N?shots=0``): the base model needs the
worked example to attempt a task at all, a policy that has imitated the expert does not. Without it the prompt
before a level-3 question is ~295 tokens instead of ~1,365 (level 4: ~330 instead of ~2,430), so a level-3 or
level-4 demonstration is ~45 % shorter (2,430 -> 1,360 tokens; 4,530 -> 2,430), which every update and every
sampled turn pays for, and the model cannot copy the example's figures. Everything from the demonstrations on
uses it (every stage's ``rollout.env``; an override must keep their ``shots`` alike), so what is trained is what
is measured; the baseline is measured on both prompts (held-out and ood), and the paired tests compare each later
stage with both, and the final policy with the imitated one (RL's own share).

A task's prompt, tools and limits are its own level's whatever levels the environment serves
(`FinqaLiteEnv.initial_messages`), so what is trained on ``finqa-lite:1,2,3,4?shots=0`` is exactly what
``agentrft eval --env finqa-lite:N?shots=0`` measures.

    RUN_DIR/agentrft.db        evals (baseline, baseline-ood, baseline-trained-prompt, imitation, final,
                               final-ood), demos, both training runs
    RUN_DIR/imitation/         the SFT run (config, metrics, its policy); imitation-late/ its second pass
    RUN_DIR/config.yaml, metrics.jsonl, policy/   the GRPO run (the final policy)
    RUN_DIR/agentic.json       per-level pass@1 at each stage, the paired tests, wall times
    RUN_DIR/report.html
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.envs.registry import shots_of, with_shots
from agentrft.recipes.agentic_settings import AgenticSettings, agentic_configs

# The base policy evaluated on the prompt the trained one gets (`AgenticSettings.baseline_trained_prompt`).
BASELINE_TRAINED_PROMPT = "baseline-trained-prompt"
STAGES = ("baseline", BASELINE_TRAINED_PROMPT, "imitation", "final")


@dataclass
class AgenticResult:
    run_dir: Path
    evals: dict[str, Any]  # stage name -> EvalResult
    seconds: dict[str, float]
    steps: dict[str, int] = field(default_factory=dict)

    def stages(self) -> list[str]:
        """The held-out evals run, in the recipe's order: the table's columns."""
        return [s for s in STAGES if s in self.evals]

    def level_table(self) -> list[tuple[str, ...]]:
        """Rows (level, pass@1 at each stage), held-out then ood."""
        stages = self.stages()
        rows = []
        for kind, suffix in (("held-out", ""), ("ood", "-ood")):
            names = [s + suffix for s in stages if s + suffix in self.evals]
            if not names:
                continue
            levels = sorted({lv for n in names for lv in self.evals[n].per_level}, key=int)
            for lv in levels:
                cells = []
                for s in stages:
                    r = self.evals.get(s + suffix)
                    b = r.per_level.get(lv) if r is not None else None
                    cells.append("–" if b is None else f"{b.success_rate:.3f}")
                rows.append((f"level {lv} ({kind})", *cells))
        return rows

    def summary(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "seconds": self.seconds,
            "steps": self.steps,
            "per_level": {
                name: {lv: b.model_dump(mode="json") for lv, b in r.per_level.items()} for name, r in self.evals.items()
            },
            "evals": {name: r.model_dump(mode="json", exclude={"per_task"}) for name, r in self.evals.items()},
        }


SETTINGS_NAME = "agentic-settings.json"


def finished_eval(store: Any, name: str) -> Any:
    """The EvalResult of the finished eval run called `name` (None if there is none); an unfinished eval run of
    that name (a recipe stopped inside it) is deleted with its trajectories, to be played again."""
    from agentrft.eval.harness import result_from_run

    done = None
    for run in store.list_runs():
        if run.name != name or run.kind != "eval":  # the SFT run is called "imitation" too
            continue
        if "result" in run.metadata:
            done = result_from_run(run)
        else:
            store.delete_run(run.id)
    return done


def run_agentic(
    run_dir: Path,
    settings: AgenticSettings,
    overrides: list[str] | None = None,
    progress: bool = True,
    resume: bool = False,
) -> AgenticResult:
    """Baseline evals, oracle demonstrations, imitation, (eval), GRPO with the curriculum, final evals, report.

    ``resume``: continue a recipe that stopped (killed, or out of time) in ``run_dir`` with the same settings
    and overrides: finished evals and demonstrations are kept (an unfinished one is played again), a finished
    imitation's weights are loaded from ``RUN_DIR/imitation/policy``, a stopped SFT or GRPO run resumes from its
    latest checkpoint (`train(..., resume=True)`)."""
    from agentrft.envs.registry import make_env
    from agentrft.eval.harness import evaluate
    from agentrft.eval.report import write_report
    from agentrft.graders import load_grader
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.oracle import OracleSampler, load_oracle
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.store import RUN_STORE_NAME, Store
    from agentrft.train.config import ConfigError
    from agentrft.train.loop import Components, train

    run_dir = Path(run_dir)
    sft_cfg, late_cfg, rl_cfg = agentic_configs(run_dir, settings, list(overrides or []))
    first_demos, late_demos = settings.demo_counts()
    chosen: dict[str, Any] = {"settings": settings.model_dump(mode="json"), "overrides": list(overrides or [])}
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"demo --agentic: run dir {run_dir} is not empty (pick a new one, or --resume a stopped recipe)"
        )
    if resume:
        if not (run_dir / SETTINGS_NAME).is_file():
            raise ConfigError(f"demo --agentic --resume: {run_dir} holds no agentic recipe ({SETTINGS_NAME} missing)")
        started = json.loads((run_dir / SETTINGS_NAME).read_text())
        if started != chosen:
            was, now = started.get("settings", {}), chosen["settings"]
            differ = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
            differ += ["--set overrides"] if started.get("overrides") != chosen["overrides"] else []
            raise ConfigError(
                f"demo --agentic --resume: the settings or --set overrides differ from those {run_dir} was started "
                f"with ({', '.join(differ)}; see {run_dir / SETTINGS_NAME})"
            )
    levels = ",".join(str(lv) for lv in sorted(set(settings.levels)))
    # the baseline's prompt, and the one demonstrations, training and the later evals use (the stages' shots)
    eval_specs = {
        False: f"finqa-lite:{levels}",
        True: with_shots(f"finqa-lite:{levels}", shots_of(sft_cfg.rollout.env)),
    }
    eval_envs = {False: make_env(eval_specs[False])}
    eval_envs[True] = make_env(eval_specs[True]) if eval_specs[True] != eval_specs[False] else eval_envs[False]
    # the base policy on the trained prompt, where that prompt is another (fewer worked examples than the env has)
    trained_prompt_differs = eval_envs[True].few_shot() != eval_envs[False].few_shot()
    train_env = make_env(sft_cfg.rollout.env)  # the demonstrations are played on the prompt each pass learns
    late_env = train_env if late_cfg.rollout.env == sft_cfg.rollout.env else make_env(late_cfg.rollout.env)
    outcome = load_grader(train_env.grader_spec())
    rl_grader = load_grader(rl_cfg.rollout.grader or train_env.grader_spec())  # a bad spec fails here
    rl_env = {sft_cfg.rollout.env: train_env, late_cfg.rollout.env: late_env}.get(rl_cfg.rollout.env)
    rl_env = rl_env or make_env(rl_cfg.rollout.env)
    if rl_cfg.rollout.expert_per_group and rl_env.expert() is None:  # guided groups need one, so fail here
        raise ConfigError(
            f"rl.rollout.expert_per_group: environment {rl_env.name!r} has no expert that solves its tasks "
            "(Environment.expert(); finqa-lite has one)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SETTINGS_NAME).write_text(json.dumps(chosen, indent=2))
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    policy = load_trainable_policy(rl_cfg.policy.name, seed=rl_cfg.seed, **rl_cfg.policy.sampler_options())
    store = Store(run_dir / RUN_STORE_NAME)
    seconds["load"] = time.perf_counter() - t0
    try:
        params = SamplingParams(
            temperature=settings.eval_temperature, max_tokens=eval_envs[False].limits.max_tokens_per_turn
        )
        evals: dict[str, Any] = {}

        def run_eval(name: str, split: str, tasks: int, trained: bool = True) -> None:
            if resume and (done := finished_eval(store, name)) is not None:
                evals[name] = done
                return
            policy.reseed(rl_cfg.seed + 7919)  # every eval draws from the same sampler seed stream
            start = time.perf_counter()
            evals[name] = evaluate(
                eval_envs[trained],
                policy,
                split=split,
                samples=settings.eval_samples,
                tasks=tasks,
                store=store,
                run_name=name,
                params=params,
                env_spec=eval_specs[trained],
                grader=outcome,
                tool_format=rl_cfg.rollout.tool_format,
                seed=rl_cfg.seed,
                progress=progress,
            )
            seconds[f"eval_{name}"] = time.perf_counter() - start

        run_eval("baseline", "held-out", settings.eval_tasks, trained=False)
        if settings.ood:
            run_eval("baseline-ood", "ood", settings.ood_tasks, trained=False)
        if settings.baseline_trained_prompt and trained_prompt_differs:
            run_eval(BASELINE_TRAINED_PROMPT, "held-out", settings.eval_tasks)
            if settings.ood:
                run_eval(BASELINE_TRAINED_PROMPT + "-ood", "ood", settings.ood_tasks)

        start = time.perf_counter()
        oracle = load_oracle(f"oracle:{rl_cfg.policy.name}", train_env)
        for name, counts, env, cfg in (
            ("demos", first_demos, train_env, sft_cfg),
            ("demos-late", late_demos, late_env, late_cfg),
        ):
            if not counts or (resume and finished_eval(store, name) is not None):
                continue
            evaluate(
                env,
                oracle,
                split="train",
                samples=1,
                tasks=counts,
                store=store,
                run_name=name,
                params=SamplingParams(temperature=0.0, max_tokens=env.limits.max_tokens_per_turn),
                env_spec=cfg.rollout.env,
                grader=outcome,
                tool_format=sft_cfg.rollout.tool_format,
                seed=rl_cfg.seed,
                progress=progress,
            )
        seconds["demos"] = time.perf_counter() - start

        def stage_env(spec: str) -> Any:
            envs = {sft_cfg.rollout.env: train_env, late_cfg.rollout.env: late_env, rl_cfg.rollout.env: rl_env}
            return envs.get(spec) or make_env(spec)

        def stage(cfg: Any, where: Path, grader: Any) -> int:
            """Train one stage on the in-process policy; a stopped one resumes from its checkpoint. With guided
            groups (``rollout.expert_per_group``) the stage's environment's expert plays into them, written with
            the policy's tokenizer."""
            env = stage_env(cfg.rollout.env)
            expert = None
            if cfg.method == "grpo" and cfg.rollout.expert_per_group:
                expert = OracleSampler(env.expert(), policy.tokenizer, policy=f"oracle:{cfg.policy.name}")
            return train(
                cfg,
                where,
                resume=resume and (where / "config.yaml").is_file(),
                components=Components(env, policy, grader, store, expert=expert),
                progress=progress,
            ).steps

        steps: dict[str, int] = {}
        passes = [("imitation", sft_cfg)] + ([("imitation_late", late_cfg)] if late_demos else [])
        for name, cfg in passes:
            start = time.perf_counter()
            where = run_dir / name.replace("_", "-")
            if resume and (where / "policy").is_dir():
                steps[name] = load_weights(policy, where / "policy", cfg.steps)
            else:
                steps[name] = stage(cfg, where, outcome)
            seconds[name] = time.perf_counter() - start
        if settings.eval_after_imitation:
            run_eval("imitation", "held-out", settings.eval_tasks)

        start = time.perf_counter()
        rl_steps = stage(rl_cfg, run_dir, rl_grader)
        seconds["rl"] = time.perf_counter() - start
        run_eval("final", "held-out", settings.eval_tasks)
        if settings.ood:
            run_eval("final-ood", "ood", settings.ood_tasks)
        seconds["total"] = time.perf_counter() - t0
        result = AgenticResult(run_dir=run_dir, evals=evals, seconds=seconds, steps={**steps, "rl": rl_steps})
        summary = result.summary()
        summary["paired"] = paired_tests(evals)
        (run_dir / "agentic.json").write_text(json.dumps(summary, indent=2))
        write_report(run_dir)
    finally:
        store.close()
        close = getattr(policy, "close", None)
        if close is not None:
            close()
    return result


def load_weights(policy: Any, path: Path, version: int) -> int:
    """Load a finished stage's exported weights (`RUN_DIR/imitation/policy`) into the in-process policy and
    tell its sampler (`weights_updated`); returns `version`, the stage's steps."""
    from agentrft.samplers.policies import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(f"hf:{path}")
    with policy.paused():
        policy.model.load_state_dict(model.state_dict())
    policy.weights_updated(version)
    return version


def paired_tests(evals: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per level (held-out and ood): the paired test (`eval.metrics.paired_test`, same tasks) of each
    later stage against the baseline, and on held-out against the base policy on the trained prompt too; and
    ``final vs imitation``, RL's own share (where the recipe evaluated between the two)."""
    from agentrft.eval.metrics import paired_test

    def compare(base: Any, other: Any) -> dict[str, Any]:
        out = {}
        for level in sorted(base.per_level, key=int):
            rates = [{t.task_id: t.success_rate for t in r.per_task if t.level == level} for r in (base, other)]
            out[level] = paired_test(rates[0], rates[1]).model_dump(mode="json")
        return out

    out: dict[str, dict[str, Any]] = {}
    for suffix in ("", "-ood"):
        for base_name in ("baseline" + suffix, BASELINE_TRAINED_PROMPT + suffix):
            base = evals.get(base_name)
            if base is None:
                continue
            for stage in ("imitation", "final"):
                other = evals.get(stage + suffix)
                if other is not None:
                    out[f"{stage}{suffix} vs {base_name}"] = compare(base, other)
    if "imitation" in evals and "final" in evals:
        out["final vs imitation"] = compare(evals["imitation"], evals["final"])
    return out

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

from agentrft.envs.finqa.shots import shots_of, with_shots
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
    from agentrft.eval.report import write_report

    run_dir = Path(run_dir)
    chosen: dict[str, Any] = {"settings": settings.model_dump(mode="json"), "overrides": list(overrides or [])}
    _check_run_dir(run_dir, chosen, resume)
    recipe = _Recipe(run_dir, settings, list(overrides or []), progress, resume)  # every spec checked here
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SETTINGS_NAME).write_text(json.dumps(chosen, indent=2))
    recipe.load()
    try:
        recipe.eval("baseline", "held-out", settings.eval_tasks, trained=False)
        if settings.ood:
            recipe.eval("baseline-ood", "ood", settings.ood_tasks, trained=False)
        if settings.baseline_trained_prompt and recipe.trained_prompt_differs:
            recipe.eval(BASELINE_TRAINED_PROMPT, "held-out", settings.eval_tasks)
            if settings.ood:
                recipe.eval(BASELINE_TRAINED_PROMPT + "-ood", "ood", settings.ood_tasks)
        recipe.demonstrations()
        steps = recipe.imitation()
        if settings.eval_after_imitation:
            recipe.eval("imitation", "held-out", settings.eval_tasks)
        start = time.perf_counter()
        steps["rl"] = recipe.stage(recipe.rl_cfg, run_dir, recipe.rl_grader)
        recipe.seconds["rl"] = time.perf_counter() - start
        recipe.eval("final", "held-out", settings.eval_tasks)
        if settings.ood:
            recipe.eval("final-ood", "ood", settings.ood_tasks)
        recipe.seconds["total"] = time.perf_counter() - recipe.t0
        result = AgenticResult(run_dir=run_dir, evals=recipe.evals, seconds=recipe.seconds, steps=steps)
        summary = result.summary()
        summary["paired"] = paired_tests(recipe.evals)
        (run_dir / "agentic.json").write_text(json.dumps(summary, indent=2))
        write_report(run_dir)
    finally:
        recipe.close()
    return result


def _check_run_dir(run_dir: Path, chosen: dict[str, Any], resume: bool) -> None:
    """A new recipe needs an empty run dir; a resumed one the settings and overrides it was started with."""
    from agentrft.train.config import ConfigError

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


class _Recipe:
    """The recipe's stages over one in-process policy and one store (`run_agentic` orders them). Built from
    the settings, it makes every environment and grader the stages name, so a bad one fails before anything
    is written; `load` then loads the policy and opens the store."""

    def __init__(
        self, run_dir: Path, settings: AgenticSettings, overrides: list[str], progress: bool, resume: bool
    ) -> None:
        from agentrft.envs.registry import make_env
        from agentrft.graders import load_grader
        from agentrft.train.config import ConfigError

        self.run_dir, self.settings, self.progress, self.resume = run_dir, settings, progress, resume
        self.sft_cfg, self.late_cfg, self.rl_cfg = agentic_configs(run_dir, settings, overrides)
        self.first_demos, self.late_demos = settings.demo_counts()
        levels = ",".join(str(lv) for lv in sorted(set(settings.levels)))
        # the baseline's prompt, and the one demonstrations, training and the later evals use (the stages' shots)
        self.eval_specs = {
            False: f"finqa-lite:{levels}",
            True: with_shots(f"finqa-lite:{levels}", shots_of(self.sft_cfg.rollout.env)),
        }
        same = self.eval_specs[True] == self.eval_specs[False]
        self.eval_envs = {False: make_env(self.eval_specs[False])}
        self.eval_envs[True] = self.eval_envs[False] if same else make_env(self.eval_specs[True])
        # the base policy on the trained prompt, where that prompt is another (fewer worked examples than the env has)
        self.trained_prompt_differs = self.eval_envs[True].few_shot() != self.eval_envs[False].few_shot()
        self.envs = {self.sft_cfg.rollout.env: make_env(self.sft_cfg.rollout.env)}  # demonstrations' prompts
        for cfg in (self.late_cfg, self.rl_cfg):
            if cfg.rollout.env not in self.envs:
                self.envs[cfg.rollout.env] = make_env(cfg.rollout.env)
        train_env = self.envs[self.sft_cfg.rollout.env]
        self.outcome = load_grader(train_env.grader_spec())
        self.rl_grader = load_grader(self.rl_cfg.rollout.grader or train_env.grader_spec())  # a bad spec fails here
        rl_env = self.envs[self.rl_cfg.rollout.env]
        if self.rl_cfg.rollout.expert_per_group and rl_env.expert() is None:  # guided groups need one
            raise ConfigError(
                f"rl.rollout.expert_per_group: environment {rl_env.name!r} has no expert that solves its tasks "
                "(Environment.expert(); finqa-lite has one)"
            )
        self.evals: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}

    def load(self) -> None:
        from agentrft.samplers.base import SamplingParams
        from agentrft.samplers.policies import load_trainable_policy
        from agentrft.store import RUN_STORE_NAME, Store

        self.t0 = time.perf_counter()
        cfg = self.rl_cfg
        self.policy = load_trainable_policy(cfg.policy.name, seed=cfg.seed, **cfg.policy.sampler_options())
        self.store = Store(self.run_dir / RUN_STORE_NAME)
        self.seconds["load"] = time.perf_counter() - self.t0
        max_tokens = self.eval_envs[False].limits.max_tokens_per_turn
        self.params = SamplingParams(temperature=self.settings.eval_temperature, max_tokens=max_tokens)

    def close(self) -> None:
        self.store.close()
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()

    def eval(self, name: str, split: str, tasks: int, trained: bool = True) -> None:
        """Eval run ``name`` of the policy on ``split`` (kept when a resumed recipe finished it)."""
        from agentrft.eval.harness import evaluate

        if self.resume and (done := finished_eval(self.store, name)) is not None:
            self.evals[name] = done
            return
        self.policy.reseed(self.rl_cfg.seed + 7919)  # every eval draws from the same sampler seed stream
        start = time.perf_counter()
        self.evals[name] = evaluate(
            self.eval_envs[trained],
            self.policy,
            split=split,
            samples=self.settings.eval_samples,
            tasks=tasks,
            store=self.store,
            run_name=name,
            params=self.params,
            env_spec=self.eval_specs[trained],
            grader=self.outcome,
            tool_format=self.rl_cfg.rollout.tool_format,
            seed=self.rl_cfg.seed,
            progress=self.progress,
        )
        self.seconds[f"eval_{name}"] = time.perf_counter() - start

    def demonstrations(self) -> None:
        """The oracle's episodes of the training split (runs "demos" and "demos-late"), greedy."""
        from agentrft.eval.harness import evaluate
        from agentrft.samplers.base import SamplingParams
        from agentrft.samplers.oracle import load_oracle

        start = time.perf_counter()
        oracle = load_oracle(f"oracle:{self.rl_cfg.policy.name}", self.envs[self.sft_cfg.rollout.env])
        for name, counts, cfg in (
            ("demos", self.first_demos, self.sft_cfg),
            ("demos-late", self.late_demos, self.late_cfg),
        ):
            if not counts or (self.resume and finished_eval(self.store, name) is not None):
                continue
            env = self.envs[cfg.rollout.env]
            evaluate(
                env,
                oracle,
                split="train",
                samples=1,
                tasks=counts,
                store=self.store,
                run_name=name,
                params=SamplingParams(temperature=0.0, max_tokens=env.limits.max_tokens_per_turn),
                env_spec=cfg.rollout.env,
                grader=self.outcome,
                tool_format=self.sft_cfg.rollout.tool_format,
                seed=self.rl_cfg.seed,
                progress=self.progress,
            )
        self.seconds["demos"] = time.perf_counter() - start

    def imitation(self) -> dict[str, int]:
        """The imitation passes (a finished one's weights loaded when resumed); steps per pass."""
        steps: dict[str, int] = {}
        passes = [("imitation", self.sft_cfg)] + ([("imitation_late", self.late_cfg)] if self.late_demos else [])
        for name, cfg in passes:
            start = time.perf_counter()
            where = self.run_dir / name.replace("_", "-")
            if self.resume and (where / "policy").is_dir():
                steps[name] = load_weights(self.policy, where / "policy", cfg.steps)
            else:
                steps[name] = self.stage(cfg, where, self.outcome)
            self.seconds[name] = time.perf_counter() - start
        return steps

    def stage(self, cfg: Any, where: Path, grader: Any) -> int:
        """Train one stage on the in-process policy; a stopped one resumes from its checkpoint. With guided
        groups (``rollout.expert_per_group``) the stage's environment's expert plays into them, written with
        the policy's tokenizer."""
        from agentrft.samplers.oracle import OracleSampler
        from agentrft.train.loop import Components, train

        env = self.envs[cfg.rollout.env]
        expert = None
        if cfg.method == "grpo" and cfg.rollout.expert_per_group:
            solver = env.expert()
            assert solver is not None  # checked when the recipe was built
            expert = OracleSampler(solver, self.policy.tokenizer, policy=f"oracle:{cfg.policy.name}")
        return train(
            cfg,
            where,
            resume=self.resume and (where / "config.yaml").is_file(),
            components=Components(env, self.policy, grader, self.store, expert=expert),
            progress=self.progress,
        ).steps


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
            out[level] = paired_test(base.task_rates(level), other.task_rates(level)).model_dump(mode="json")
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

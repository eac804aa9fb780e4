"""The GRPO/DAPO training loop.

Each step reads as its stages: rollout -> grade -> filter (`collect_stage`) -> advantages ->
pack -> update -> sync -> (eval) -> log -> checkpoint.

Public API: `train(config, run_dir, resume=False) -> TrainResult`. The policy is a
`TrainablePolicy` (`samplers.base`): the trainer optimises its ``model`` in place,
inside ``policy.paused()``, and ends each update with ``policy.weights_updated(version)``
(the sync). Run directory, checkpoints, exact resume, metrics and export are the
training core's (`session.Session`); this module is GRPO's step. The periodic eval goes
through `eval.harness` (the one eval path).
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.envs.base import Environment
from agentrft.eval.harness import evaluate_async
from agentrft.graders import Grader
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams, TrainablePolicy
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import TrainConfig
from agentrft.train.memory import trim
from agentrft.train.metrics import eval_metrics
from agentrft.train.session import Session, StepFn, check_run_dir, seed_everything
from agentrft.train.stages import advantage_stage, collect_stage, pack_stage
from agentrft.train.update import policy_update


@dataclass
class Components:
    """What the loop trains with; built from the config unless passed in (tests, embedding)."""

    env: Environment
    sampler: TrainablePolicy
    grader: Grader
    store: Store | None = None


@dataclass
class TrainResult:
    run_dir: Path
    run_id: str
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    checkpoint: Path | None = None  # latest complete checkpoint; the final policy is in run_dir / "policy"


def build_components(cfg: TrainConfig, run_dir: Path) -> Components:
    from agentrft.envs.registry import make_env
    from agentrft.graders.registry import load_grader
    from agentrft.samplers.policies import load_trainable_policy

    env = make_env(cfg.rollout.env)
    grader = load_grader(cfg.rollout.grader or env.grader_spec())  # a bad spec fails before the model loads
    policy = load_trainable_policy(cfg.policy.name, sampler=cfg.policy.sampler, seed=cfg.seed)
    return Components(env, policy, grader, Store(run_dir / RUN_STORE_NAME))


def eval_stage(cfg: TrainConfig, comps: Components, run_id: str, version: int) -> dict[str, float]:
    """Held-out tasks at the eval temperature through `eval.harness` (stored as an eval run);
    metrics prefixed ``valid_``."""
    e = cfg.eval
    params = SamplingParams(temperature=e.temperature, max_tokens=cfg.rollout.max_tokens)
    if comps.store is None:
        raise ValueError("a periodic eval (eval.every_steps > 0) needs a store")
    result = asyncio.run(
        evaluate_async(
            comps.env,
            comps.sampler,
            split=e.split,
            samples=e.samples_per_task,
            tasks=e.num_tasks,
            store=comps.store,
            run_name=f"{run_id}-eval-v{version}",
            params=params,
            env_spec=cfg.rollout.env,
            grader=comps.grader,
            tool_format=cfg.rollout.tool_format,
            seed=cfg.seed,
            progress=False,
        )
    )
    return eval_metrics(result, "valid")


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    components: Components | None = None,
    stop_after: int | None = None,
    progress: bool = False,
    allow_config_change: bool = False,
) -> TrainResult:
    """Train for ``cfg.steps`` optimizer steps (``stop_after``: return after that step, as an interruption
    would). ``progress``: a live bar on a terminal, else one line per step on stderr. ``resume`` continues
    ``run_dir`` from its latest checkpoint with the config it was started with (see `resume.py`).
    ``cfg.method`` picks the method; this function is GRPO's, the others are dispatched from here."""
    if cfg.method == "dpo":
        from agentrft.train.dpo import train_dpo

        policy = components.sampler if components is not None else None
        return train_dpo(
            cfg,
            run_dir,
            resume=resume,
            policy=policy,
            stop_after=stop_after,
            progress=progress,
            allow_config_change=allow_config_change,
        )
    run_dir = Path(run_dir)
    last = check_run_dir(run_dir, cfg, resume=resume, allow_config_change=allow_config_change)
    seed_everything(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    comps = components or build_components(cfg, run_dir)
    policy = comps.sampler
    if not isinstance(policy, TrainablePolicy):
        raise TypeError(
            f"policy {getattr(policy, 'policy', policy)!r} cannot be trained in process "
            "(not a TrainablePolicy: eval-only endpoints and remote engines are sampled, not trained)"
        )
    ref_model = None  # the initial weights, before any checkpoint is loaded (LoRA: the adapter disabled)
    if cfg.algorithm.kl_coef > 0 and cfg.policy.finetune == "full":
        ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False)
    session = Session.open(
        cfg,
        run_dir,
        policy.model,
        store=comps.store,
        resume_from=last,
        resume=resume,
        policy_version=policy.policy_version,
    )
    if last is not None:
        policy.weights_updated(session.state.policy_version)
    try:
        session.run(_grpo_step(cfg, comps, session, ref_model), progress=progress, stop_after=stop_after)
        session.finish(policy.tokenizer)
    finally:
        session.close()
    return TrainResult(run_dir, session.run_id, session.state.step, session.history, session.saved)


def _grpo_step(cfg: TrainConfig, comps: Components, session: Session, ref_model: Any) -> StepFn:
    """One GRPO/DAPO step: collect (rollout -> grade -> filter) -> advantages -> pack -> update -> sync -> eval."""
    policy, state, model = comps.sampler, session.state, session.model
    dist = cfg.sampling_distribution()
    tasks = comps.env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        comps.env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    r = cfg.rollout
    runner = Runner(
        comps.env,
        policy,
        store=comps.store,
        tool_format=r.tool_format,
        progress=False,
        params=SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens),
    )
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0

    def step_fn(step: int) -> dict[str, float]:
        policy.reseed(cfg.seed * 1_000_003 + step)  # sampling does not depend on this process's history
        model.eval()  # sampling: no dropout
        groups, state.cursor, metrics = collect_stage(
            cfg, runner, tasks, state.cursor, session.run_id, state.policy_version, comps.grader, comps.store
        )
        trim()  # the rollout's KV caches were freed in the engine thread's arena
        trajs, per_token, adv_metrics = advantage_stage(groups, cfg.algorithm)
        metrics.update(adv_metrics)
        batches = pack_stage(trajs, per_token, cfg, pad_id)
        t0 = time.perf_counter()
        with policy.paused():
            metrics.update(
                policy_update(
                    model,
                    session.optimizer,
                    session.scheduler,
                    batches,
                    cfg.algorithm,
                    cfg.optimizer,
                    dist=dist,
                    precision=session.precision,
                    ref_model=ref_model,
                )
            )
            state.policy_version += 1
            policy.weights_updated(state.policy_version)  # sync: sample from these weights from now on
        model.eval()
        trim()
        metrics["time/training_s"] = time.perf_counter() - t0
        metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0.0) / max(metrics["time/training_s"], 1e-9)
        metrics["sampling_tokens_per_s"] = metrics["train_sampled_tokens"] / max(metrics["time/sampling_s"], 1e-9)
        if cfg.eval.every_steps and (step % cfg.eval.every_steps == 0 or step == cfg.steps):
            t0 = time.perf_counter()
            metrics.update(eval_stage(cfg, comps, session.run_id, state.policy_version))
            metrics["time/eval_s"] = time.perf_counter() - t0
        return metrics

    return step_fn

"""`train()`: every method on the one training core, and GRPO/DAPO's step.

`train` opens a `session.Session` and runs the step function of ``cfg.method`` on it (the
one place the method is dispatched): GRPO's below, filtered SFT's in `sft.py`, rejection
sampling's in `rejection.py`. A GRPO step reads as its stages: rollout -> grade -> filter
(`collect_stage`) -> advantages -> pack -> update -> sync -> (eval) -> log -> checkpoint.

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
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.envs.base import Environment
from agentrft.eval.harness import evaluate_async
from agentrft.graders import Grader
from agentrft.inputs import InputError
from agentrft.memory import trim
from agentrft.samplers.base import SamplingParams, TokenSampler, TrainablePolicy
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import TrainConfig
from agentrft.train.core.metrics import eval_metrics
from agentrft.train.core.session import Session, StepFn, StepHook, check_run_dir, seed_everything
from agentrft.train.core.update import policy_update
from agentrft.train.data import select_trajectories
from agentrft.train.rl.branches import BranchSource
from agentrft.train.rl.curriculum import TaskSource, task_source
from agentrft.train.rl.pipeline import (
    InProcessPlayer,
    Player,
    Producer,
    Slot,
    check_staleness,
    mark_unused,
    resume_plan,
    step_metrics,
)
from agentrft.train.rl.stages import (
    advantage_stage,
    collect_stage,
    command_agent,
    pack_stage,
    skip_zero_advantage,
    train_runner,
)
from agentrft.types import Trajectory


@dataclass
class Components:
    """What the loop trains with; built from the config unless passed in (tests, embedding)."""

    env: Environment
    sampler: TrainablePolicy
    grader: Grader
    store: Store | None = None
    expert: TokenSampler | None = None  # the environment's expert, for rollout.expert_per_group


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
    if cfg.rollout.curriculum.enabled:  # so do training tasks without levels
        task_source(env.tasks(cfg.rollout.split), cfg.rollout.curriculum, cfg.seed, None)
    expert = env.expert() if cfg.rollout.expert_per_group else None
    if cfg.rollout.expert_per_group and expert is None:
        raise InputError(
            f"rollout.expert_per_group: environment {env.name!r} has no expert that solves its tasks "
            "(Environment.expert(); finqa-lite has one)"
        )
    policy = load_trainable_policy(cfg.policy.name, seed=cfg.seed, **cfg.policy.sampler_options())
    oracle = None
    if expert is not None:
        from agentrft.samplers.oracle import OracleSampler

        oracle = OracleSampler(expert, policy.tokenizer, policy="oracle")
    return Components(env, policy, grader, Store(run_dir / RUN_STORE_NAME), expert=oracle)


def eval_stage(cfg: TrainConfig, comps: Components, run_id: str, version: int) -> dict[str, float]:
    """Held-out tasks at the eval temperature through `eval.harness` (stored as an eval run);
    metrics prefixed ``valid_``."""
    e = cfg.eval
    params = SamplingParams(temperature=e.temperature, max_tokens=cfg.rollout.max_tokens)
    player = None
    if cfg.agent is not None:
        player = command_agent(cfg.agent, comps.env, comps.sampler, params, cfg.rollout.tool_format)
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
            player=player,
            agent_command=None if cfg.agent is None else cfg.agent.command,
        )
    )
    metrics = eval_metrics(result, "valid")
    if cfg.tripwires.check_grader is not None:
        metrics.update(_check_scores(cfg.tripwires.check_grader, comps, result.run_id, e.split))
    return metrics


def _check_scores(spec: dict[str, Any], comps: Components, run_id: str | None, split: str) -> dict[str, float]:
    """The tripwires' check grader over an eval run's episodes: its mean and that mean's standard error."""
    from agentrft.graders import agrade_trajectories, load_grader

    assert comps.store is not None
    trajs = comps.store.query_trajectories(run_id=run_id)
    data = {t.id: t.data for t in comps.env.tasks(split)}
    grades = asyncio.run(agrade_trajectories(load_grader(spec), trajs, [data[t.task_id] for t in trajs]))
    rewards = [g.reward for g in grades if not g.errors]
    if not rewards:
        return {}
    se = statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0
    return {"valid_check_reward": statistics.fmean(rewards), "valid_check_se": se}


def periodic_eval(cfg: TrainConfig, comps: Components, session: Session) -> Callable[[int], dict[str, float]]:
    """``evaluate(step)``: `eval_stage`'s metrics and its time when a periodic eval is due, else nothing."""

    def evaluate(step: int) -> dict[str, float]:
        every = cfg.eval.every_steps
        if not every or (step % every and step != cfg.steps):
            return {}
        t0 = time.perf_counter()
        metrics = eval_stage(cfg, comps, session.run_id, session.state.policy_version)
        metrics["time/eval_s"] = time.perf_counter() - t0
        return metrics

    return evaluate


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    components: Components | None = None,
    stop_after: int | None = None,
    progress: bool = False,
    allow_config_change: bool = False,
    on_step: StepHook | None = None,
) -> TrainResult:
    """Train for ``cfg.steps`` optimizer steps (``stop_after``: return after that step, as an interruption
    would; ``on_step(step, metrics)``: called after each logged step of every method, True stops there with a
    checkpoint). ``progress``: a live bar on a terminal, else one line per step on stderr. ``resume`` continues
    ``run_dir`` from its latest checkpoint with the config it was started with (see `resume.py`).
    ``cfg.method`` picks the method: DPO and the reward model run their own step functions (train/data/dpo.py,
    train/data/reward_model.py); GRPO, SFT and rejection sampling are dispatched below. A method that learns
    from recorded trajectories selects them before anything is written."""
    if cfg.method in ("dpo", "reward_model"):
        hooks = {"stop_after": stop_after, "progress": progress, "on_step": on_step}
        return _train_on_pairs(cfg, run_dir, resume, components, allow_config_change, hooks)
    run_dir = Path(run_dir)
    last = check_run_dir(run_dir, cfg, resume=resume, allow_config_change=allow_config_change)
    selected: tuple[list[Trajectory], dict[str, int]] | None = None
    if cfg.method == "sft":
        selected = select_trajectories(cfg.data)  # an empty selection is refused here (InputError)
    seed_everything(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    comps = components or build_components(cfg, run_dir)
    policy = comps.sampler
    if not isinstance(policy, TrainablePolicy):
        raise TypeError(
            f"policy {getattr(policy, 'policy', policy)!r} cannot be trained in process "
            "(not a TrainablePolicy: eval-only endpoints and remote engines are sampled, not trained)"
        )
    if cfg.method == "grpo" and cfg.rollout.expert_per_group and comps.expert is None:
        raise InputError(  # before the session writes anything (Components passed in without one)
            "rollout.expert_per_group: the loop was given no expert to play guided episodes (Components.expert)"
        )
    data = None
    if selected is not None:  # token records checked, or rendered, before the session writes anything
        from agentrft.train.data.sft import sft_data

        data = sft_data(cfg, *selected, policy, comps.env.tool_schemas())
    ref_model = None  # the initial weights, before any checkpoint is loaded (LoRA: the adapter disabled)
    if cfg.method == "grpo" and cfg.algorithm.kl_coef > 0 and cfg.policy.finetune == "full":
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
    producer: Producer | None = None
    try:
        evaluate = periodic_eval(cfg, comps, session)
        if cfg.method == "sft":
            from agentrft.train.data.sft import note_data, sft_step

            assert data is not None
            note_data(comps.store, session.run_id, data, cfg.data.source)
            step_fn = sft_step(cfg, policy, session, data, evaluate)
        elif cfg.method == "rejection_sampling":
            from agentrft.train.data.rejection import rejection_sampling_step

            step_fn = rejection_sampling_step(cfg, comps.env, policy, comps.grader, comps.store, session, evaluate)
        elif cfg.async_.max_staleness or cfg.ray.on:
            producer = _start_producer(cfg, comps, session, resumed=last is not None)
            step_fn = _async_grpo_step(cfg, comps, session, ref_model, evaluate, producer)
        else:
            step_fn = _grpo_step(cfg, comps, session, ref_model, evaluate)
        if cfg.tripwires.enabled:
            step_fn, on_step = _with_tripwires(cfg, run_dir, session, step_fn, on_step)
        session.run(step_fn, progress=progress, stop_after=stop_after, on_step=on_step)
        session.finish(policy.tokenizer)
    finally:
        if producer is not None:
            producer.close()
            if session.done and comps.store is not None:
                mark_unused(comps.store, session.run_id)
        session.close()
    return TrainResult(run_dir, session.run_id, session.state.step, session.history, session.saved)


def _train_on_pairs(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    components: Components | None,
    allow_config_change: bool,
    hooks: dict[str, Any],
) -> TrainResult:
    """DPO and the reward model: their own step functions (train/data/dpo.py, train/data/reward_model.py) on the
    same session, with `train`'s hooks (``stop_after``, ``progress``, ``on_step``)."""
    if cfg.method == "dpo":
        from agentrft.train.data.dpo import train_dpo

        policy = components.sampler if components is not None else None
        return train_dpo(cfg, run_dir, resume=resume, policy=policy, allow_config_change=allow_config_change, **hooks)
    from agentrft.train.data.reward_model import train_reward_model

    given = (components.sampler.model, components.sampler.tokenizer) if components is not None else None
    return train_reward_model(
        cfg, run_dir, resume=resume, model_and_tokenizer=given, allow_config_change=allow_config_change, **hooks
    )


def _with_tripwires(
    cfg: TrainConfig, run_dir: Path, session: Session, step_fn: StepFn, on_step: StepHook | None
) -> tuple[StepFn, StepHook]:
    """``step_fn`` with the tripwires' metrics added to each step's (`train/rl/tripwires.py`), and ``on_step``
    asking the session to stop (after that step's checkpoint) once a tripwire fires under ``action: stop``."""
    from agentrft.train.rl.tripwires import Tripwires

    wires = Tripwires(cfg.tripwires, run_dir)
    for past in session.history:  # a resumed run's detectors see the steps before
        wires.history.append(dict(past))

    def guarded(step: int) -> dict[str, float]:
        metrics = step_fn(step)
        metrics.update(wires.check(step, metrics))
        return metrics

    def hook(step: int, metrics: dict[str, float]) -> bool:
        asked = on_step(step, metrics) if on_step is not None else False
        return bool(asked) or wires.stop

    return guarded, hook


def _grpo_step(
    cfg: TrainConfig, comps: Components, session: Session, ref_model: Any, evaluate: Callable[[int], dict[str, float]]
) -> StepFn:
    """One GRPO/DAPO step: collect (rollout -> grade -> filter) -> advantages -> pack -> update -> sync -> eval."""
    policy, state, model = comps.sampler, session.state, session.model
    tasks = comps.env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        comps.env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    r = cfg.rollout
    runner = train_runner(cfg, comps.env, policy, comps.store)
    source: TaskSource
    if r.branch is not None:  # groups continue recorded episodes from a turn (train/rl/branches.py)
        with Store.open_existing(r.branch.db) as parents:
            source = BranchSource.from_store(r.branch, parents, tasks, cfg.seed, comps.env.tool_schema_hash())
        runner.prefixes = source.prefixes
    else:
        source = task_source(
            tasks, r.curriculum, cfg.seed, state.extra.get("curriculum"), r.expert_per_group / r.group_size
        )
    expert = None if comps.expert is None else train_runner(cfg, comps.env, comps.expert, comps.store)
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0

    def step_fn(step: int) -> dict[str, float]:
        policy.reseed(cfg.seed * 1_000_003 + step)  # sampling does not depend on this process's history
        model.eval()  # sampling: no dropout
        for r in (runner, expert):
            if r is not None:
                r.tags["step"] = step  # what a resume keeps (train/core/resume.py)
        groups, state.cursor, metrics = collect_stage(
            cfg, runner, source, state.cursor, session.run_id, state.policy_version, comps.grader, comps.store, expert
        )
        curriculum = source.state_dict()
        if curriculum is not None:  # checkpointed with the cursor: a resumed run draws the same
            state.extra["curriculum"] = curriculum
        trim()  # the rollout's KV caches were freed in the engine thread's arena
        trajs, update_metrics = grpo_update(cfg, policy, session, groups, ref_model, pad_id)
        metrics.update(update_metrics)
        if comps.store is not None:
            comps.store.update_metadata({t.id: {"trained_step": step} for t in trajs})
        model.eval()
        trim()
        metrics["sampling_tokens_per_s"] = metrics["train_sampled_tokens"] / max(metrics["time/sampling_s"], 1e-9)
        metrics.update(evaluate(step))
        return metrics

    return step_fn


def grpo_update(
    cfg: TrainConfig,
    policy: TrainablePolicy,
    session: Session,
    groups: list[list[Trajectory]],
    ref_model: Any,
    pad_id: int,
) -> tuple[list[Trajectory], dict[str, float]]:
    """The GRPO update both loops share (synchronous and asynchronous): advantages -> (skip the
    zero-advantage trajectories) -> pack -> update -> sync. Returns the trajectories it trained and its
    metrics (``time/training_s``: the update and the sync)."""
    trajs, per_token, metrics = advantage_stage(groups, cfg.algorithm)
    computed, computed_adv, skipped = skip_zero_advantage(trajs, per_token, cfg.algorithm)
    batches = pack_stage(computed, computed_adv, cfg, pad_id)
    t0 = time.perf_counter()
    metrics.update(update_and_sync(cfg, policy, session, batches, ref_model, skipped))
    metrics["time/training_s"] = time.perf_counter() - t0
    metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0.0) / max(metrics["time/training_s"], 1e-9)
    return trajs, metrics


def update_and_sync(
    cfg: TrainConfig,
    policy: TrainablePolicy,
    session: Session,
    batches: list[Any],
    ref_model: Any,
    skipped: tuple[int, int] = (0, 0),
) -> dict[str, float]:
    """GRPO's update with the sampler paused, then the sync: the sampler samples the new version from now on.
    ``skipped``: the zero-advantage trajectories' (loss tokens, sequences), not in ``batches``. An update with
    no token to learn from (``update_skipped``) leaves the weights and so their version as they were."""
    state = session.state
    with policy.paused():
        metrics = policy_update(
            session.model,
            session.optimizer,
            session.scheduler,
            batches,
            cfg.algorithm,
            cfg.optimizer,
            dist=cfg.sampling_distribution(),
            precision=session.precision,
            ref_model=ref_model,
            correction=cfg.off_policy_correction(),
            skipped=skipped,
        )
        if metrics.get("update_skipped"):
            return metrics
        state.policy_version += 1
        t_sync = time.perf_counter()
        policy.weights_updated(state.policy_version)
        metrics["time/sync_s"] = time.perf_counter() - t_sync
    return metrics


def _start_producer(cfg: TrainConfig, comps: Components, session: Session, *, resumed: bool) -> Producer:
    """The rollout producer of an asynchronous run, started; a resumed run first gets back its stored groups."""
    tasks = comps.env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        comps.env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    state = session.state
    requeued: list[Slot] = []
    redo: list[int] = []
    cursor = state.cursor
    if resumed and comps.store is not None:
        requeued, redo, cursor = resume_plan(
            comps.store,
            session.run_id,
            cfg,
            tasks,
            step=state.step,
            version=state.policy_version,
            cursor=state.cursor,
            grader=comps.grader,
            tool_schema_hash=comps.env.tool_schema_hash(),
        )
    comps.sampler.reseed(cfg.seed * 1_000_003 + state.step)
    player: Player
    if cfg.ray.on:
        from agentrft.train.rl.ray_rollout import RayPlayer

        player = RayPlayer(cfg, session.model, version=state.policy_version)
    else:
        player = InProcessPlayer(train_runner(cfg, comps.env, comps.sampler, comps.store), comps.grader)
    producer = Producer(
        cfg,
        player,
        tasks,
        comps.store,
        session.run_id,
        version=state.policy_version,
        requeued=requeued,
        redo=redo,
        cursor=cursor,
    )
    producer.start()
    return producer


def _async_grpo_step(
    cfg: TrainConfig,
    comps: Components,
    session: Session,
    ref_model: Any,
    evaluate: Callable[[int], dict[str, float]],
    producer: Producer,
) -> StepFn:
    """One asynchronous GRPO step (train/rl/pipeline.py): take the oldest finished groups -> check staleness ->
    advantages -> pack -> update with off-policy correction -> sync -> publish -> (eval); the producer keeps
    sampling meanwhile, within ``async.max_staleness``."""
    policy, state, model, store = comps.sampler, session.state, session.model, comps.store
    k = cfg.async_.max_staleness
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0

    def step_fn(step: int) -> dict[str, float]:
        t_step = time.perf_counter()
        slots, metrics = producer.take(cfg.rollout.tasks_per_step)
        groups, staleness, dropped = check_staleness(slots, state.policy_version, k)
        metrics.update(step_metrics(slots, staleness, k))
        metrics["async/dropped_stale"] = float(len(dropped))
        trajs, update_metrics = grpo_update(cfg, policy, session, groups, ref_model, pad_id)
        metrics.update(update_metrics)
        t_pub = time.perf_counter()
        producer.publish(state.policy_version)  # Ray: the trainable tensors to every worker
        metrics["time/publish_s"] = time.perf_counter() - t_pub
        model.eval()
        state.cursor = producer.first_untaken_draw()  # the checkpoint's cursor (see pipeline.resume_plan)
        if store is not None:
            marks: dict[str, dict[str, Any]] = {t.id: {"trained_step": step} for t in trajs}
            marks.update({tid: {"dropped": why} for tid, why in dropped.items()})
            store.update_metadata(marks)
        metrics.update(evaluate(step))
        metrics["async/trainer_utilisation"] = metrics["time/training_s"] / max(time.perf_counter() - t_step, 1e-9)
        return metrics

    return step_fn

"""The evaluation harness: play an environment's tasks with a policy and summarise the trajectories.

`summarize` is a pure function of stored trajectories (and the tasks' grading
data), so a report can be recomputed from the store at any time; `evaluate`
runs the episodes through the rollout `Runner`, then stores the run (kind
``"eval"``) with its `EvalResult` JSON in ``Run.metadata["result"]``.

Choices worth knowing:

* Success is ``grade.success``. An ungraded trajectory counts as a failure with
  reward 0 *and* is counted in ``n_ungraded``, so it never disappears silently.
* pass@k / pass^k are means over tasks for k = 1 .. min samples per task (see
  `metrics`). The reward CI is a seeded bootstrap over per-task mean rewards.
* Tokens are summed over the model calls of an episode (each call's prompt is
  billed again, as by any API). Latency is ``finished_at - created_at`` when
  the runner set it, otherwise the sum of model and tool latencies.
* Cost per success: with `Prices`, USD; always also tokens and seconds per
  success. With zero successes the per-success figures are None, not infinity.
  Prices are per token (hosted endpoints) and/or per hour of compute: the
  run's wall time (first episode start to last episode end) times
  ``compute_per_hour``. Local policies (in-process samplers) are priced at
  `LOCAL_COMPUTE_USD_PER_HOUR` unless told otherwise, so cost per successful
  task exists for every policy.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrft.eval.failures import FAILURE_CATEGORIES, classify_failure
from agentrft.eval.metrics import bootstrap_ci, pass_curves
from agentrft.inputs import InputError
from agentrft.samplers.base import TrainablePolicy
from agentrft.types import GradeError, ModelCallEvent, Run, Task, Trajectory


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The stated default price of local compute: about the on-demand hourly price of a 2-vCPU cloud VM, the
# machine the demo runs on. A GPU or a bigger machine costs more: pass --compute-usd-per-hour.
LOCAL_COMPUTE_USD_PER_HOUR = 0.10


class Prices(_Model):
    """Token prices in USD per million tokens, and compute in USD per hour of the run's wall time."""

    prompt_per_mtok: float = Field(default=0.0, ge=0.0)
    completion_per_mtok: float = Field(default=0.0, ge=0.0)
    compute_per_hour: float = Field(default=0.0, ge=0.0, description="USD per hour of wall time of the run")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_mtok + completion_tokens * self.completion_per_mtok) / 1e6


class Breakdown(_Model):
    n_tasks: int
    n_samples: int
    success_rate: float
    mean_reward: float


class TaskResult(_Model):
    task_id: str
    n: int
    successes: int
    mean_reward: float
    level: str | None = None
    template: str | None = None

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0


class ToolStats(_Model):
    calls_per_episode: float = 0.0
    calls_per_episode_by_tool: dict[str, float] = Field(default_factory=dict)
    error_rate: float = 0.0
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    total_calls: int = 0


class UsageStats(_Model):
    prompt_tokens_per_episode: float = 0.0
    completion_tokens_per_episode: float = 0.0
    tokens_per_episode: float = 0.0
    latency_s_mean: float = 0.0
    latency_s_p50: float = 0.0
    latency_s_p90: float = 0.0
    turns_per_episode: float = 0.0


class CostStats(_Model):
    successes: int
    total_tokens: int
    total_seconds: float
    wall_seconds: float = Field(default=0.0, description="first episode start to last episode end")
    compute_per_hour: float | None = Field(default=None, description="the compute price used, USD per hour")
    tokens_per_success: float | None
    seconds_per_success: float | None
    total_usd: float | None = None
    usd_per_success: float | None = None


class EvalResult(_Model):
    run_id: str | None = None
    run_name: str = ""
    env: str | None = None
    policy: str | None = None
    split: str | None = None
    n_tasks: int
    n_trajectories: int
    samples_per_task: int = Field(description="smallest number of samples of any task (the k range)")
    n_ungraded: int = 0
    success_rate: float
    pass_at_k: dict[int, float]
    pass_hat_k: dict[int, float]
    mean_reward: float
    reward_ci: tuple[float, float]
    per_level: dict[str, Breakdown] = Field(default_factory=dict)
    per_template: dict[str, Breakdown] = Field(default_factory=dict)
    tools: ToolStats = Field(default_factory=ToolStats)
    usage: UsageStats = Field(default_factory=UsageStats)
    cost: CostStats
    failures: dict[str, int] = Field(default_factory=dict)
    grader_errors: dict[str, int] = Field(default_factory=dict)
    sub_reward_mean: dict[str, float] = Field(
        default_factory=dict,
        description="each named (sub-)grader's mean reward over the episodes it graded without an error",
    )
    status_counts: dict[str, int] = Field(default_factory=dict)
    per_task: list[TaskResult] = Field(default_factory=list)

    def task_rates(self, level: str | None = None) -> dict[str, float]:
        """Per-task success rate (of the tasks of `level` where given), the input of `metrics.paired_test`."""
        return {t.task_id: t.success_rate for t in self.per_task if level is None or t.level == level}


def _episode_tokens(t: Trajectory) -> tuple[int, int]:
    calls = [e for e in t.events if isinstance(e, ModelCallEvent)]
    if calls:
        return sum(e.prompt_tokens for e in calls), sum(e.completion_tokens for e in calls)
    if t.grade is not None:
        return t.grade.cost.prompt_tokens, t.grade.cost.completion_tokens
    return 0, 0


def _model_turns(t: Trajectory) -> int:
    """Sampled assistant turns: model calls, not assistant messages (few-shot examples are messages too)."""
    calls = sum(1 for e in t.events if isinstance(e, ModelCallEvent))
    return calls if calls else t.num_turns


def _episode_seconds(t: Trajectory) -> float:
    if t.finished_at is not None:
        return max(0.0, t.finished_at - t.created_at)
    return sum(getattr(e, "latency_s", 0.0) for e in t.events)


def _label(value: Any) -> str:
    return "unknown" if value is None else str(value)


def _breakdowns(per_task: Sequence[TaskResult], key: str) -> dict[str, Breakdown]:
    groups: dict[str, list[TaskResult]] = defaultdict(list)
    for tr in per_task:
        groups[_label(getattr(tr, key))].append(tr)
    out = {}
    for name in sorted(groups, key=lambda s: (len(s), s)):  # "2" before "10"
        trs = groups[name]
        n = sum(t.n for t in trs)
        out[name] = Breakdown(
            n_tasks=len(trs),
            n_samples=n,
            success_rate=sum(t.successes for t in trs) / n if n else 0.0,
            mean_reward=sum(t.mean_reward for t in trs) / len(trs),
        )
    return out


def _tool_stats(trajs: Sequence[Trajectory]) -> ToolStats:
    calls = [c for t in trajs for c in t.tool_calls]
    by_tool = Counter(c.name for c in calls)
    errors = [c for c in calls if c.error is not None or c.error_kind is not None]
    n = len(trajs)
    return ToolStats(
        calls_per_episode=len(calls) / n,
        calls_per_episode_by_tool={k: v / n for k, v in sorted(by_tool.items())},
        error_rate=len(errors) / len(calls) if calls else 0.0,
        errors_by_kind=dict(sorted(Counter(c.error_kind or "other" for c in errors).items())),
        total_calls=len(calls),
    )


def _usage(trajs: Sequence[Trajectory]) -> UsageStats:
    toks = [_episode_tokens(t) for t in trajs]
    secs = sorted(_episode_seconds(t) for t in trajs)
    n = len(trajs)
    q = statistics.quantiles(secs, n=10, method="inclusive") if n > 1 else [secs[0]] * 9
    return UsageStats(
        prompt_tokens_per_episode=sum(p for p, _ in toks) / n,
        completion_tokens_per_episode=sum(c for _, c in toks) / n,
        tokens_per_episode=sum(p + c for p, c in toks) / n,
        latency_s_mean=sum(secs) / n,
        latency_s_p50=statistics.median(secs),
        latency_s_p90=q[8],
        turns_per_episode=sum(_model_turns(t) for t in trajs) / n,
    )


def _cost(trajs: Sequence[Trajectory], successes: int, prices: Prices | None) -> CostStats:
    toks = [_episode_tokens(t) for t in trajs]
    total_tokens = sum(p + c for p, c in toks)
    total_seconds = sum(_episode_seconds(t) for t in trajs)
    ends = [t.finished_at for t in trajs if t.finished_at is not None]
    wall = max(0.0, max(ends) - min(t.created_at for t in trajs)) if ends else total_seconds
    usd = (
        None if prices is None else (sum(prices.cost(p, c) for p, c in toks) + wall / 3600.0 * prices.compute_per_hour)
    )

    def per(x):
        return None if x is None or successes == 0 else x / successes

    return CostStats(
        successes=successes,
        total_tokens=total_tokens,
        total_seconds=total_seconds,
        wall_seconds=wall,
        compute_per_hour=None if prices is None else prices.compute_per_hour,
        tokens_per_success=per(total_tokens),
        seconds_per_success=per(total_seconds),
        total_usd=usd,
        usd_per_success=per(usd),
    )


def _grader_errors(trajs: Iterable[Trajectory]) -> dict[str, int]:
    errs: list[GradeError] = [e for t in trajs if t.grade is not None for e in t.grade.errors]
    return dict(sorted(Counter(f"{e.grader}:{e.flag}" for e in errs).items()))


def _sub_reward_means(trajs: Iterable[Trajectory]) -> dict[str, float]:
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for name, v in (t.grade.sub_rewards if t.grade is not None else {}).items():
            if v is not None:
                values[name].append(float(v))
    return {name: sum(vs) / len(vs) for name, vs in sorted(values.items())}


def summarize(
    trajectories: Sequence[Trajectory],
    tasks: Sequence[Task] | Mapping[str, Task] | None = None,
    *,
    prices: Prices | None = None,
    run_id: str | None = None,
    run_name: str = "",
    env: str | None = None,
    split: str | None = None,
    seed: int = 0,
) -> EvalResult:
    """Every eval figure from trajectories; ``tasks`` supply level / template / gold program."""
    if not trajectories:
        raise ValueError("no trajectories to summarise")
    task_map: dict[str, Task] = dict(tasks) if isinstance(tasks, Mapping) else {t.id: t for t in tasks or []}
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)

    per_task = []
    for task_id in sorted(by_task):
        group = by_task[task_id]
        data = task_map[task_id].data if task_id in task_map else {}
        per_task.append(
            TaskResult(
                task_id=task_id,
                n=len(group),
                successes=sum(1 for t in group if t.grade is not None and t.grade.success),
                mean_reward=sum((t.reward or 0.0) for t in group) / len(group),
                level=None if data.get("level") is None else str(data["level"]),
                template=data.get("template"),
            )
        )
    at, hat = pass_curves([(tr.n, tr.successes) for tr in per_task])
    successes = sum(tr.successes for tr in per_task)
    rewards = [tr.mean_reward for tr in per_task]
    failures = Counter({c: 0 for c in FAILURE_CATEGORIES})
    for t in trajectories:
        cat = classify_failure(t, task_map[t.task_id].data if t.task_id in task_map else None)
        if cat is not None:
            failures[cat] += 1
    policies = sorted({t.policy for t in trajectories if t.policy})
    return EvalResult(
        run_id=run_id,
        run_name=run_name,
        env=env or trajectories[0].env.name,
        policy=", ".join(policies) or None,
        split=split,
        n_tasks=len(per_task),
        n_trajectories=len(trajectories),
        samples_per_task=min(tr.n for tr in per_task),
        n_ungraded=sum(1 for t in trajectories if t.grade is None),
        success_rate=successes / len(trajectories),
        pass_at_k=at,
        pass_hat_k=hat,
        mean_reward=sum(rewards) / len(rewards),
        reward_ci=bootstrap_ci(rewards, seed=seed),
        per_level=_breakdowns(per_task, "level"),
        per_template=_breakdowns(per_task, "template"),
        tools=_tool_stats(trajectories),
        usage=_usage(trajectories),
        cost=_cost(trajectories, successes, prices),
        failures={c: failures[c] for c in FAILURE_CATEGORIES},
        grader_errors=_grader_errors(trajectories),
        sub_reward_mean=_sub_reward_means(trajectories),
        status_counts=dict(sorted(Counter(t.status for t in trajectories).items())),
        per_task=per_task,
    )


def select_tasks(tasks: Sequence[Task], limit: int | Mapping[int, int] | None) -> list[Task]:
    """The first ``limit`` tasks (all when None): deterministic, so two evals see the same tasks. Where the
    tasks have several levels (``data["level"]``, e.g. ``finqa-lite:2,3,4``), the first ``limit`` of each
    level, so every level is measured on as many tasks as a one-level eval would be. A mapping gives each
    level its own count (a level it does not name: none)."""
    if limit is None:
        return list(tasks)
    counts: dict[Any, int] = dict(limit) if isinstance(limit, Mapping) else {}
    if min(counts.values() if isinstance(limit, Mapping) else [limit], default=1) < 1:
        raise InputError(f"tasks must be at least 1, got {limit}")
    taken: dict[Any, int] = {}
    chosen = []
    for task in tasks:
        level = task.data.get("level") if isinstance(task.data, dict) else None
        level = level if isinstance(level, int | str) else None  # only scalar levels group tasks
        cap = counts.get(level, 0) if isinstance(limit, Mapping) else limit
        if taken.get(level, 0) < cap:
            taken[level] = taken.get(level, 0) + 1
            chosen.append(task)
    return chosen


def evaluate(env: Any, sampler: Any, **kwargs: Any) -> EvalResult:
    """Synchronous `evaluate_async` (for scripts and the CLI; inside an event loop await the async one)."""
    return asyncio.run(evaluate_async(env, sampler, **kwargs))


async def evaluate_async(
    env: Any,
    sampler: Any,
    *,
    split: str = "held-out",
    samples: int = 4,
    tasks: int | Mapping[int, int] | None = None,
    store: Any,
    run_name: str = "eval",
    params: Any = None,
    prices: Prices | None = None,
    env_spec: str | None = None,
    grader: Any = None,
    tool_format: str = "xml",
    seed: int = 0,
    progress: bool = True,
    player: Any = None,
    agent_command: str | None = None,
    sampling_seed: int | None = None,
) -> EvalResult:
    """Play ``samples`` episodes of each selected task, store them and the run, return the summary.

    ``player``: who plays the episodes instead of the in-process agent loop (a
    `rollout.runner.EpisodePlayer`, e.g. an agent command; ``agent_command`` names it in the run's config).

    ``grader`` defaults to the environment's own (``env.grader_spec()``); ``params``
    to the runner's default (temperature 1, the env's per-turn token limit).
    ``progress`` shows the runner's progress bar (turn it off when stdout is JSON).
    ``sampling_seed`` reseeds the sampler first (`rollout.runner`: the same seed, the same episodes); ``seed``
    seeds the bootstrap of the reward's confidence interval.
    """
    from agentrft.rollout.runner import Runner

    if samples < 1:
        raise InputError(f"samples must be at least 1, got {samples}")
    chosen = select_tasks(env.tasks(split), tasks)
    if not chosen:
        raise InputError(f"environment {env.name!r} has no tasks in split {split!r}")
    if grader is None:
        from agentrft.graders import load_grader

        grader = load_grader(env.grader_spec())
    if prices is None and isinstance(sampler, TrainablePolicy):  # weights in this process: priced as compute
        prices = Prices(compute_per_hour=LOCAL_COMPUTE_USD_PER_HOUR)
    runner = Runner(
        env,
        sampler,
        store=store,
        grader=grader,
        params=params,
        tool_format=tool_format,
        progress=progress,
        player=player,
        seed=sampling_seed,
    )
    params = runner.params
    config = {
        "env": env_spec or env.name,
        "split": split,
        "samples": samples,
        "tasks": tasks,
        "policy": getattr(sampler, "policy", None),
        "params": params.model_dump(),
        "tool_format": tool_format,
        "sampling_seed": sampling_seed,
        "prices": None if prices is None else prices.model_dump(),
        **({"agent_command": agent_command} if agent_command else {}),
    }
    # kept so exports and reports can recover grading data without rebuilding the env
    run = Run(
        name=run_name,
        kind="eval",
        config=config,
        status="incomplete",
        metadata={"task_data": {t.id: t.data for t in chosen}},
    )
    store.add_run(run)  # first, so an eval killed midway is a visible, incomplete run
    trajs = await runner.run(chosen, samples, run_id=run.id)
    result = summarize(
        trajs, chosen, prices=prices, run_id=run.id, run_name=run_name, env=env_spec or env.name, split=split, seed=seed
    )
    store.update_run(
        run.model_copy(
            update={"status": "complete", "metadata": {**run.metadata, "result": result.model_dump(mode="json")}}
        )
    )
    return result


def result_from_run(run: Run) -> EvalResult:
    """The EvalResult stored in an eval run's metadata."""
    if "result" not in run.metadata:
        raise InputError(f"run {run.id} ({run.name!r}) holds no eval result (kind {run.kind!r})")
    return EvalResult.model_validate(run.metadata["result"])

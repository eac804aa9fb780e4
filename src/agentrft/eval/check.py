"""Is reinforcement fine-tuning worth it for this environment and policy?

Follows the eligibility advice of the RFT guides (SPECS §1): the eval comes
first; the model must already succeed sometimes (and not always); the grader
must decide without a human and give the same answer twice; lucky guesses must
be rare; and sampled groups must disagree, since a group whose rewards are all
equal gives GRPO no gradient.

`assess` is a pure function of trajectories, tasks and a grade function;
`check` plays the episodes first. The verdict:

* ``not_suitable`` — the grader is not deterministic, trivial answers score too
  often (guessable), or the policy already solves nearly everything.
* ``not_yet`` — no success at all (no learning signal: use easier tasks, more
  samples or an SFT warm start), too many zero-variance groups, or too many
  grader errors (fix the grader first).
* ``worth_it`` — none of the above.
Every verdict comes with the reasons that produced it.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrft.eval.metrics import pass_curves, wilson_interval
from agentrft.graders import Grader
from agentrft.inputs import InputError
from agentrft.types import FinalAnswerEvent, Grade, Message, Task, Trajectory

Verdict = Literal["worth_it", "not_yet", "not_suitable"]
GradeFn = Callable[[Trajectory, Task], Grade]

_SIGNED_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class CheckThresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_guess_rate: float = Field(
        default=0.2, ge=0, le=1, description="a trivial policy scoring this often is too lucky"
    )
    saturated_rate: float = Field(
        default=0.95, ge=0, le=1, description="success rate past which little is left to learn"
    )
    max_zero_variance_groups: float = Field(default=0.9, ge=0, le=1, description="share of groups without any signal")
    max_grader_error_rate: float = Field(default=0.05, ge=0, le=1)
    reward_range: tuple[float, float] = (0.0, 1.0)


class CheckResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: str | None = None
    policy: str | None = None
    n_tasks: int
    samples_per_task: int
    n_trajectories: int
    success_rate: float
    success_ci: tuple[float, float] = Field(description="95% Wilson interval over all samples")
    solved_at_least_once: float = Field(description="share of tasks with at least one success in k samples")
    pass_at_k: dict[int, float]
    guessability: dict[str, float] = Field(description="success rate of each trivial policy through the same grader")
    guess_rate_max: float
    grader_agreement: float = Field(description="share of trajectories graded identically twice")
    n_regraded: int
    grader_error_rate: float
    reward_at_min: float
    reward_at_max: float
    zero_variance_groups: float = Field(description="share of tasks (n ≥ 2) whose samples all got the same reward")
    verdict: Verdict
    reasons: list[str]


def prompt_text(task: Task) -> str:
    users = [m for m in task.messages if m.role == "user"]
    return users[-1].text() if users else ""


def trivial_answers(task: Task) -> dict[str, str | None]:
    """Answers of the trivial policies for one task (None when the policy has nothing to say)."""
    nums = [n.replace(",", "") for n in _SIGNED_NUMBER.findall(prompt_text(task))]
    return {"constant_0": "0", "first_number": nums[0] if nums else None, "last_number": nums[-1] if nums else None}


def answer_trajectory(task: Task, answer: str, policy: str) -> Trajectory:
    """A one-turn trajectory that just answers — how trivial policies go through the real grader."""
    return Trajectory(
        task_id=task.id,
        policy=policy,
        messages=[*task.messages, Message(role="assistant", content=answer)],
        events=[FinalAnswerEvent(turn=0, text=answer)],
    )


def _same(a: Grade, b: Grade) -> bool:
    return a.reward == b.reward and a.success == b.success


def assess(
    trajectories: Sequence[Trajectory],
    tasks: Sequence[Task],
    grade: GradeFn,
    *,
    thresholds: CheckThresholds | None = None,
    regrade_limit: int | None = 200,
    env: str | None = None,
    policy: str | None = None,
) -> CheckResult:
    """Eligibility figures and verdict from graded trajectories; ``grade`` re-grades (determinism, guesses)."""
    th = thresholds or CheckThresholds()
    if not trajectories:
        raise ValueError("no trajectories to assess")
    task_map = {t.id: t for t in tasks}
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.task_id].append(t)
    graded = [t.grade for t in trajectories if t.grade is not None]
    successes = sum(1 for g in graded if g.success)
    n = len(trajectories)
    counts = [(len(g), sum(1 for t in g if t.grade is not None and t.grade.success)) for g in groups.values()]
    at, _ = pass_curves(counts)
    solved = sum(1 for _, c in counts if c > 0) / len(counts)

    guess: dict[str, list[float]] = defaultdict(list)
    for task in tasks:
        for name, answer in trivial_answers(task).items():
            ok = answer is not None and grade(answer_trajectory(task, answer, name), task).success
            guess[name].append(1.0 if ok else 0.0)
    guessability = {k: sum(v) / len(v) for k, v in guess.items()} if tasks else {}

    to_regrade = [t for t in trajectories if t.task_id in task_map][:regrade_limit]
    agree = sum(1 for t in to_regrade if _same(grade(t, task_map[t.task_id]), grade(t, task_map[t.task_id])))
    agreement = agree / len(to_regrade) if to_regrade else 1.0

    rewards = [g.reward for g in graded]
    lo, hi = th.reward_range
    multi = [g for g in groups.values() if len(g) >= 2]
    flat = sum(1 for g in multi if len({(t.reward if t.grade else None) for t in g}) == 1)
    error_rate = sum(1 for g in graded if g.errors) / len(graded) if graded else 1.0

    result = CheckResult(
        env=env,
        policy=policy,
        n_tasks=len(groups),
        samples_per_task=min(len(g) for g in groups.values()),
        n_trajectories=n,
        success_rate=successes / n,
        success_ci=wilson_interval(successes, n),
        solved_at_least_once=solved,
        pass_at_k=at,
        guessability=guessability,
        guess_rate_max=max(guessability.values(), default=0.0),
        grader_agreement=agreement,
        n_regraded=len(to_regrade),
        grader_error_rate=error_rate,
        reward_at_min=sum(1 for r in rewards if r <= lo) / len(rewards) if rewards else 0.0,
        reward_at_max=sum(1 for r in rewards if r >= hi) / len(rewards) if rewards else 0.0,
        zero_variance_groups=flat / len(multi) if multi else 1.0,
        verdict="worth_it",
        reasons=[],
    )
    verdict, reasons = decide(result, th)
    return result.model_copy(update={"verdict": verdict, "reasons": reasons})


def decide(r: CheckResult, th: CheckThresholds) -> tuple[Verdict, list[str]]:
    """The verdict and every reason behind it (``not_suitable`` outranks ``not_yet``)."""
    unsuitable, later = [], []
    if r.grader_agreement < 1.0:
        unsuitable.append(
            f"grader is not deterministic: {r.grader_agreement:.0%} of {r.n_regraded} "
            "trajectories got the same grade twice"
        )
    if r.guess_rate_max >= th.max_guess_rate:
        best = max(r.guessability, key=r.guessability.__getitem__)
        unsuitable.append(
            f"answers are guessable: the trivial policy {best!r} scores {r.guess_rate_max:.0%} "
            f"(limit {th.max_guess_rate:.0%})"
        )
    if r.success_rate >= th.saturated_rate:
        unsuitable.append(
            f"already solved: success rate {r.success_rate:.0%} ≥ {th.saturated_rate:.0%}; use harder tasks"
        )
    elif r.success_ci[1] >= 1.0:
        unsuitable.append("every sample succeeds: no failure to learn from")
    if r.success_ci[0] <= 0.0:
        later.append(
            "the policy never succeeds (0 of "
            f"{r.n_trajectories}, 95% CI up to {r.success_ci[1]:.1%}): no learning signal; use easier "
            "tasks, more samples or an SFT warm start first"
        )
    if r.zero_variance_groups > th.max_zero_variance_groups:
        later.append(
            f"{r.zero_variance_groups:.0%} of groups have identical rewards (no GRPO gradient); "
            "raise samples or temperature"
        )
    if r.grader_error_rate > th.max_grader_error_rate:
        later.append(f"{r.grader_error_rate:.0%} of grades carry grader errors; fix the grader first")
    if unsuitable:
        return "not_suitable", unsuitable + later
    if later:
        return "not_yet", later
    return "worth_it", [
        f"success rate {r.success_rate:.1%} (95% CI {r.success_ci[0]:.1%}–{r.success_ci[1]:.1%}) is above 0 and below 1",
        f"{r.solved_at_least_once:.0%} of tasks solved at least once in {r.samples_per_task} samples",
        f"trivial policies score at most {r.guess_rate_max:.0%}; grader deterministic",
        f"{1 - r.zero_variance_groups:.0%} of groups carry a learning signal",
    ]


def make_grade_fn(grader: Grader) -> GradeFn:
    """Bind a grader to the (trajectory, task) signature used here; the item is ``task.data``, as in rollout."""
    from agentrft.graders import grade_trajectory

    return lambda traj, task: grade_trajectory(grader, traj, dict(task.data))


async def check_async(
    env: Any,
    sampler: Any,
    *,
    samples: int = 4,
    tasks: int | None = 20,
    split: str = "train",
    store: Any = None,
    params: Any = None,
    thresholds: CheckThresholds | None = None,
    env_spec: str | None = None,
    tool_format: str = "xml",
    progress: bool = True,
    seed: int | None = 0,
) -> CheckResult:
    """Play ``samples`` episodes on the first ``tasks`` tasks of ``split``, then `assess` them."""
    from agentrft.eval.harness import select_tasks
    from agentrft.graders import load_grader
    from agentrft.rollout.runner import Runner
    from agentrft.types import new_id

    if samples < 2:
        raise InputError(f"check needs at least 2 samples per task to see group variance, got {samples}")
    chosen = select_tasks(env.tasks(split), tasks)
    if not chosen:
        raise InputError(f"environment {env.name!r} has no tasks in split {split!r}")
    grader = load_grader(env.grader_spec())
    runner = Runner(
        env, sampler, store=store, grader=grader, params=params, tool_format=tool_format, progress=progress, seed=seed
    )
    trajs = await runner.run(chosen, samples, run_id=new_id())
    return assess(
        trajs,
        chosen,
        make_grade_fn(grader),
        thresholds=thresholds,
        env=env_spec or env.name,
        policy=getattr(sampler, "policy", None),
    )


def check(env: Any, sampler: Any, **kwargs: Any) -> CheckResult:
    """Synchronous `check_async`."""
    return asyncio.run(check_async(env, sampler, **kwargs))

"""Where GRPO's tasks come from: an endless seeded shuffle, or a curriculum over levels.

`collect_stage` draws each step's tasks from a `TaskSource` and shows it every graded episode:

* `ShuffledTasks` — the tasks in one seeded shuffle per epoch (`stages.next_tasks`); it learns nothing.
* `Curriculum` (``rollout.curriculum.enabled``) — tasks carry their level in ``task.data["level"]``
  (finqa-lite does; ``finqa-lite:1,2,3,4`` trains on all four). Levels unlock in order: the first
  ``start_unlocked`` (default 1) at the start, the next when the newest unlocked level's rolling
  pass rate (its last ``window`` graded episodes, at least ``min_episodes`` of them) reaches
  ``promote_at``. Each draw picks a level by weight, then a task of that level by weight:

  * level weights (``weighting``): ``frontier`` (the default) gives the newest unlocked level
    ``1 - keep_share`` and the levels already passed share ``keep_share`` evenly (the frontier
    gets 1 while it is the only one); ``learnability`` gives each unlocked level
    ``(1 - keep_share) * s_L / sum(s) + keep_share / n_unlocked`` with ``s_L = p_L (1 - p_L)`` of its
    rolling pass rate (0.25, the most, until ``min_episodes`` are measured): the levels whose
    groups are most often mixed, where GRPO has signal, get the most draws, and none goes below
    ``keep_share / n_unlocked``; locked levels get 0. With guided groups (``rollout.expert_per_group``
    k of G) p is the group's expected rate ``k/G + (1 - k/G) p_policy``: a level the policy fails
    still has the expert's success in every group, and keeps its draws. A policy that has imitated every level starts
    with all of them unlocked (the agentic recipe's RL: ``start_unlocked`` 4, ``learnability``);
  * ``stratified``: a step's ``n`` draws give each level ``floor(n * weight)`` of them and the remaining
    draws go to distinct levels drawn by the fractions left, in a seeded shuffle; so every level weighted
    at least ``1/n`` is in every step, where independent draws leave it out of ``(1 - w)^n`` of them (a
    step's update must see the levels whose decisions it moves together: docs/agentic.md);
  * task weights: 1 for a task not yet played, ``mixed_weight`` when its last group had some
    successes but not all (the groups GRPO learns from), ``flat_weight`` when it all passed or
    all failed (guided: only all passed is flat);
  * a task is drawn at most once per `draw` call while its level has others left.

  An episode counts in the pass rates when it has a grade without grader errors and did not end
  in an episode error (a sampler crash says nothing of the policy). The draw is a function of the
  seed, the cursor and the state, and the state (`state_dict`: unlocked levels, each level's
  recent results, each task's last group success) goes into the checkpoint
  (``TrainerState.extra["curriculum"]``), so a resumed run draws what an uninterrupted one would.
  Per step the loop logs ``curriculum/level_<L>_weight``, ``curriculum/level_<L>_pass_rate`` and
  ``curriculum/unlocked_levels``.

The asynchronous pipeline replays a draw from its index alone, so the curriculum is for the
synchronous loop (the config refuses it with ``async.max_staleness`` or ``ray``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from agentrft.inputs import InputError
from agentrft.train.config.rollout import CurriculumConfig
from agentrft.train.rl.stages import next_tasks
from agentrft.types import Task, Trajectory


class TaskSource(Protocol):
    """What `collect_stage` draws tasks from and reports graded episodes to."""

    def draw(self, cursor: int, n: int) -> list[Task]:
        """Tasks ``cursor .. cursor+n`` of the stream (the caller advances the cursor by n)."""
        ...

    def observe(self, trajs: Sequence[Trajectory]) -> None:
        """Graded episodes of the tasks drawn."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint must keep to draw the same after a resume (None: nothing)."""
        ...


class ShuffledTasks:
    """The endless seeded shuffle (`stages.next_tasks`): a pure function of the cursor."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        self.tasks, self.seed = tasks, seed

    def draw(self, cursor: int, n: int) -> list[Task]:
        return next_tasks(self.tasks, cursor, n, self.seed)

    def observe(self, trajs: Sequence[Trajectory]) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        return None


def task_level(task: Task) -> int:
    level = task.data.get("level")
    if isinstance(level, bool) or not isinstance(level, int):
        raise InputError(
            f"rollout.curriculum: task {task.id} has no integer data.level (got {level!r}); the curriculum "
            "draws by level (finqa-lite's tasks carry one)"
        )
    return level


class Curriculum:
    """Tasks by level, weighted by measured pass rates (module docstring)."""

    def __init__(
        self,
        tasks: Sequence[Task],
        cfg: CurriculumConfig,
        seed: int,
        state: dict[str, Any] | None = None,
        guided_share: float = 0.0,
    ) -> None:
        if not tasks:
            raise InputError("rollout.curriculum: no training tasks to draw from")
        if not 0.0 <= guided_share < 1.0:
            raise ValueError(f"guided_share must be in [0, 1), got {guided_share}")
        self.cfg, self.seed, self.guided_share = cfg, seed, guided_share
        self.by_level: dict[int, list[Task]] = {}
        for t in tasks:
            self.by_level.setdefault(task_level(t), []).append(t)
        self.levels = sorted(self.by_level)
        self.level_of = {t.id: task_level(t) for t in tasks}
        self.unlocked = min(cfg.start_unlocked, len(self.levels))
        self.recent: dict[int, list[int]] = {lv: [] for lv in self.levels}
        self.task_success: dict[str, float] = {}
        if state is not None:
            self.load_state_dict(state)

    # ------------------------------------------------------------ weights

    def level_weights(self) -> dict[int, float]:
        """Each level's share of the draws (module docstring); sums to 1."""
        unlocked = self.levels[: self.unlocked]
        out = {lv: 0.0 for lv in self.levels}
        if len(unlocked) == 1:
            out[unlocked[0]] = 1.0
            return out
        if self.cfg.weighting == "learnability":
            signal = {lv: self.learnability(lv) for lv in unlocked}
            total = sum(signal.values())
            for lv in unlocked:
                by_signal = signal[lv] / total if total > 0 else 1.0 / len(unlocked)
                out[lv] = (1.0 - self.cfg.keep_share) * by_signal + self.cfg.keep_share / len(unlocked)
            return out
        *passed, frontier = unlocked
        out[frontier] = 1.0 - self.cfg.keep_share
        for lv in passed:
            out[lv] = self.cfg.keep_share / len(passed)
        return out

    def learnability(self, level: int) -> float:
        """p(1-p) of the level's rolling pass rate p: the expected share of a group's episodes whose outcome
        differs from the group's mean, GRPO's signal; 0.25 (the most) until ``min_episodes`` are measured."""
        rate = self.pass_rate(level)
        if rate is None or len(self.recent[level]) < self.cfg.min_episodes:
            return 0.25
        group = self.group_rate(rate)
        return group * (1.0 - group)

    def group_rate(self, rate: float) -> float:
        """A group's expected success rate when the policy passes at ``rate``: with guided groups a share
        ``guided_share`` of it is the expert's (assumed to pass), so a level the policy fails still has signal."""
        return self.guided_share + (1.0 - self.guided_share) * rate

    def task_weight(self, task: Task) -> float:
        rate = self.task_success.get(task.id)
        if rate is None:
            return 1.0
        return self.cfg.mixed_weight if 0.0 < self.group_rate(rate) < 1.0 else self.cfg.flat_weight

    def pass_rate(self, level: int) -> float | None:
        recent = self.recent[level]
        return sum(recent) / len(recent) if recent else None

    # ------------------------------------------------------------ TaskSource

    def draw(self, cursor: int, n: int) -> list[Task]:
        rng = random.Random(f"curriculum:{self.seed}:{cursor}")  # str seeds hash the same on every machine
        weights = self.level_weights()
        levels = [lv for lv in self.levels if weights[lv] > 0]
        if self.cfg.stratified:
            drawn = stratified_levels(weights, n, rng)
        else:
            drawn = [rng.choices(levels, weights=[weights[lv] for lv in levels])[0] for _ in range(n)]
        taken: set[str] = set()
        out: list[Task] = []
        for level in drawn:
            pool = [t for t in self.by_level[level] if t.id not in taken] or self.by_level[level]
            task_weights = [self.task_weight(t) for t in pool]
            if sum(task_weights) <= 0:  # every task weighted 0 (flat_weight 0, all flat): uniform
                task_weights = [1.0] * len(pool)
            task = rng.choices(pool, weights=task_weights)[0]
            taken.add(task.id)
            out.append(task)
        return out

    def observe(self, trajs: Sequence[Trajectory]) -> None:
        groups: dict[tuple[str, str], list[int]] = {}
        for t in trajs:
            if t.grade is None or t.grade.errors or t.status == "error" or t.task_id not in self.level_of:
                continue
            groups.setdefault((t.group_id, t.task_id), []).append(int(t.grade.success))
        for (_, task_id), results in groups.items():
            level = self.level_of[task_id]
            self.recent[level] = (self.recent[level] + results)[-self.cfg.window :]
            self.task_success[task_id] = sum(results) / len(results)
        while self.unlocked < len(self.levels):
            frontier = self.levels[self.unlocked - 1]
            rate = self.pass_rate(frontier)
            if len(self.recent[frontier]) < self.cfg.min_episodes or rate is None or rate < self.cfg.promote_at:
                break
            self.unlocked += 1

    def metrics(self) -> dict[str, float]:
        out = {f"curriculum/level_{lv}_weight": w for lv, w in self.level_weights().items()}
        for lv in self.levels:
            rate = self.pass_rate(lv)
            if rate is not None:
                out[f"curriculum/level_{lv}_pass_rate"] = rate
        out["curriculum/unlocked_levels"] = float(self.unlocked)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "unlocked": self.unlocked,
            "recent": {str(lv): list(r) for lv, r in self.recent.items()},
            "task_success": dict(sorted(self.task_success.items())),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        recent = {int(k): [int(x) for x in v] for k, v in state["recent"].items()}
        if set(recent) != set(self.levels):
            raise InputError(
                f"rollout.curriculum: the checkpoint's levels {sorted(recent)} are not the training tasks' "
                f"levels {self.levels}"
            )
        self.unlocked = int(state["unlocked"])
        self.recent = recent
        self.task_success = {str(k): float(v) for k, v in state["task_success"].items()}


def stratified_levels(weights: dict[int, float], n: int, rng: random.Random) -> list[int]:
    """``n`` levels, each ``floor(n * weight)`` times and the rest one each to levels drawn without replacement
    by their fractional parts, shuffled (weights sum to 1)."""
    quota = {lv: n * w for lv, w in weights.items() if w > 0}
    out = [lv for lv, q in quota.items() for _ in range(int(q + 1e-9))]
    frac = {lv: max(q - int(q + 1e-9), 0.0) for lv, q in quota.items()}
    while len(out) < n:
        pool = [lv for lv, f in frac.items() if f > 0] or list(quota)  # float rounding left no fraction: any level
        level = rng.choices(pool, weights=[frac.get(lv, 0.0) or 1.0 for lv in pool])[0]
        frac[level] = 0.0
        out.append(level)
    rng.shuffle(out)
    return out


def task_source(
    tasks: Sequence[Task], cfg: CurriculumConfig, seed: int, state: dict[str, Any] | None, guided_share: float = 0.0
) -> TaskSource:
    """The curriculum when enabled (restored from a checkpoint's `state`), else the seeded shuffle;
    ``guided_share`` = ``rollout.expert_per_group / group_size``."""
    return Curriculum(tasks, cfg, seed, state, guided_share) if cfg.enabled else ShuffledTasks(tasks, seed)

"""Training from branches of recorded episodes (``rollout.branch``): GRPO groups rooted at a chosen turn.

A team's recorded episodes (an eval's failures, sessions an agent program played through `agentrft serve`,
imported logs) often go wrong at one turn: a tool call returned an error and the agent gave up, or the last
answer misread a result it had. Fresh episodes from the prompt reach that turn only by chance. Here each
step's groups start there instead: a parent episode is rebuilt token-exactly up to its turn T
(`rollout.replay.prefix_of`: the tool results it saw are replayed from the record), the current policy
samples ``group_size`` continuations from that point, they are graded, and GRPO normalises them within their
group. Only the continuations train: a branch's turns before T are its parent's samples, and the packer
leaves them out of the loss (`train/core/packing.py`).

Where to branch (``rollout.branch.turn``): a turn index; ``last``, the parent's last sampled turn;
``after_tool_error``, the turn after the first tool call that returned an error, where a policy that can
recover calls again; ``after_tool:NAME``, the turn after the first call of tool NAME that returned without
error, e.g. ``after_tool:open``: every group continues from the document its parent read. Parents without that
turn, without a token record, whose task the environment does not have, that were played with other tool schemas
than the environment's now (``tool_schema_drift``), or (with ``failed_only``) that succeeded, are left out and
counted. One parent per task: its prefix is that task's for the whole run, drawn in the seeded shuffle every task
source uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentrft.inputs import InputError
from agentrft.rollout.agent import EpisodePrefix
from agentrft.rollout.replay import prefix_of
from agentrft.store import Store
from agentrft.train.config.rollout import BranchConfig
from agentrft.train.rl.stages import next_tasks
from agentrft.types import Task, Trajectory


def after_tool(where: int | str) -> str | None:
    """The tool NAME of ``after_tool:NAME``, else None."""
    return where.removeprefix("after_tool:") if isinstance(where, str) and where.startswith("after_tool:") else None


def branch_turn(traj: Trajectory, where: int | str) -> int | None:
    """The turn of ``traj`` to branch at (see the module docstring), or None when it has none."""
    tok = traj.tokens
    if tok is None or not tok.ids:
        return None
    sampled = sorted({t for t, m in zip(tok.turn, tok.loss_mask, strict=True) if m})
    if not sampled:
        return None
    if where == "last":
        return sampled[-1]
    calls = traj.tool_calls
    if where == "after_tool_error":
        errors = [e.turn for e in calls if e.error is not None]
        turn = min(errors) + 1 if errors else None
    elif (name := after_tool(where)) is not None:
        done = [e.turn for e in calls if e.name == name and e.error is None]
        turn = min(done) + 1 if done else None
    else:
        turn = int(where)
    return turn if turn in sampled else None


class BranchSource:
    """The task source of a branched run (a `curriculum.TaskSource`): the parents' tasks in a seeded shuffle,
    and each task's recorded prefix (`prefixes`), which the runner continues."""

    def __init__(self, parents: Sequence[tuple[Task, EpisodePrefix]], seed: int, left_out: Counter[str]) -> None:
        if not parents:
            raise InputError(f"rollout.branch: no parent episode to branch from ({_reasons(left_out)})")
        self.tasks = [task for task, _ in parents]
        self.prefixes = {task.id: prefix for task, prefix in parents}  # the runner's ``prefixes``
        self.seed, self.left_out = seed, left_out

    @classmethod
    def from_store(
        cls, cfg: BranchConfig, store: Store, tasks: Sequence[Task], seed: int, tool_schema_hash: str | None = None
    ) -> BranchSource:
        """The parents of ``cfg.run`` in ``store`` whose task is among ``tasks`` (the training split's) and, given
        ``tool_schema_hash`` (the training environment's), whose episode saw the same tool schemas."""
        by_id = {t.id: t for t in tasks}
        run = store.find_run(cfg.run)
        parents: dict[str, tuple[Task, EpisodePrefix]] = {}
        left_out: Counter[str] = Counter()
        for traj in store.query_trajectories(run_id=run.id):
            turn = branch_turn(traj, cfg.turn)
            if traj.task_id not in by_id:
                left_out["not_in_split"] += 1
            elif tool_schema_hash is not None and traj.env.tool_schema_hash != tool_schema_hash:
                left_out["tool_schema_drift"] += 1
            elif cfg.failed_only and traj.grade is not None and traj.grade.success:
                left_out["succeeded"] += 1
            elif turn is None:
                left_out["no_turn"] += 1
            elif traj.task_id in parents:
                left_out["task_taken"] += 1
            else:
                parents[traj.task_id] = (by_id[traj.task_id], prefix_of(traj, turn))
        return cls(list(parents.values()), seed, left_out)

    def draw(self, cursor: int, n: int) -> list[Task]:
        return next_tasks(self.tasks, cursor, n, self.seed)

    def observe(self, trajs: Sequence[Trajectory]) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        out = {"branch/parents": float(len(self.tasks))}
        out.update({f"branch/left_out/{why}": float(n) for why, n in self.left_out.items()})
        return out

    def state_dict(self) -> dict[str, Any] | None:
        return None


def _reasons(left_out: Counter[str]) -> str:
    if not left_out:
        return "the run has no episodes"
    return "left out: " + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in sorted(left_out.items()))

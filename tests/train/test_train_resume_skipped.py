"""Resume after a skipped update and after a kill between storing a group and grading it (issue 47, item 12).

A step with nothing to learn from (every episode's grade flagged) leaves the weights, so their version, as
they were; a resume still tells the steps it keeps from those it redoes (by ``metadata.step``). An
asynchronous run killed after its episodes were stored but before they were graded grades them on resume
and trains them, instead of dropping the group as ungraded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakes_train as F

from agentrft.graders import Sample, Score
from agentrft.store import Store
from agentrft.train import train
from agentrft.train.rl.pipeline import resume_plan
from agentrft.train.rl.stages import next_tasks
from agentrft.types import Run, TokenRecord, Trajectory


class _BrokenGrader(F.FakeGrader):
    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        raise RuntimeError("judge unreachable")


def _components(run_dir: Path, grader: Any) -> Any:
    comps = F.components(run_dir)
    comps.grader = grader
    return comps


def _run(run_dir: Path, grader: Any, *, resume: bool = False, stop_after: int | None = None) -> Any:
    cfg = F.config(**{"eval.every_steps": 0, "steps": 3})
    return train(cfg, run_dir, resume=resume, components=_components(run_dir, grader), stop_after=stop_after)


def _stored(run_dir: Path) -> list[Trajectory]:
    with Store(run_dir / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        return s.query_trajectories(run_id=run.id)


def test_a_skipped_update_keeps_the_version_and_resume_keeps_its_steps(tmp_path: Path) -> None:
    first = _run(tmp_path, _BrokenGrader(), stop_after=2)
    assert [m.get("update_skipped") for m in first.history] == [1.0, 1.0]
    assert {t.policy_version for t in _stored(tmp_path)} == {0}  # before: 0 and 1, weights never changed
    assert sorted({t.metadata["step"] for t in _stored(tmp_path)}) == [1, 2]
    _run(tmp_path, _BrokenGrader(), resume=True)
    trajs = _stored(tmp_path)
    per_step = {s: sum(t.metadata["step"] == s for t in trajs) for s in (1, 2, 3)}
    assert per_step == {1: 6, 2: 6, 3: 6}  # 2 tasks x 3 episodes each step, none lost, none twice


def test_resume_after_a_kill_redoes_only_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    _run(tmp_path, F.FakeGrader(), stop_after=2)
    # a kill during step 3: its episodes were stored (version 2, step 3), the checkpoint is step 2
    killed = _stored(tmp_path)[0].model_copy(update={"id": "killed-step-3", "policy_version": 2})
    killed.metadata = {"step": 3}
    with Store(tmp_path / "agentrft.db") as s:
        s.add_trajectory(killed)
    _run(tmp_path, F.FakeGrader(), resume=True)
    trajs = _stored(tmp_path)
    assert "killed-step-3" not in {t.id for t in trajs}
    assert sorted(t.metadata["step"] for t in trajs) == [1] * 6 + [2] * 6 + [3] * 6


def _episode(task_id: str, group: str, ids: list[int]) -> Trajectory:
    n = len(ids)
    return Trajectory(
        run_id="r",
        task_id=task_id,
        group_id=group,
        policy_version=0,
        tokens=TokenRecord(ids=[1, *ids], loss_mask=[0] + [1] * n, logprobs=[0.0] + [-1.0] * n, turn=[0] * (n + 1)),
        metadata={"draw": 0},
    )


def test_async_resume_grades_a_stored_ungraded_group_and_puts_it_back(tmp_path: Path) -> None:
    cfg = F.config(**{"async.max_staleness": 1, "rollout.group_size": 3})
    tasks = F.FakeEnv().tasks("train")
    task = next_tasks(tasks, 0, 1, cfg.seed)[0]
    group = [_episode(task.id, "g", ids) for ids in ([2, 3, 4], [40, 50, 60], [2, 50, 4])]  # rewards differ
    with Store(tmp_path / "s.db") as store:
        store.add_run(Run(id="r", name="r", kind="train"))
        store.add_trajectories(group)  # stored as they finished; the kill came before the grades
        requeued, redo, nxt = resume_plan(store, "r", cfg, tasks, step=0, version=0, cursor=0, grader=F.FakeGrader())
        stored = store.query_trajectories(run_id="r")
    assert redo == [] and nxt == 1
    assert len(requeued) == 1 and len(requeued[0].group) == 3  # before: dropped as ungraded, never replayed
    assert all(t.grade is not None and not t.grade.errors for t in stored)
    assert all(t.metadata.get("dropped") is None for t in stored)


def test_a_stored_group_played_with_other_tool_schemas_is_flagged_and_not_put_back(tmp_path: Path) -> None:
    cfg = F.config(**{"async.max_staleness": 1, "rollout.group_size": 3})
    env = F.FakeEnv()
    tasks = env.tasks("train")
    task = next_tasks(tasks, 0, 1, cfg.seed)[0]
    group = [_episode(task.id, "g", ids) for ids in ([2, 3, 4], [40, 50, 60], [2, 50, 4])]
    for t in group:
        t.env = t.env.model_copy(update={"tool_schema_hash": "schemas-of-an-older-version"})
    with Store(tmp_path / "s.db") as store:
        store.add_run(Run(id="r", name="r", kind="train"))
        store.add_trajectories(group)
        requeued, redo, _ = resume_plan(
            store, "r", cfg, tasks, step=0, version=0, cursor=0, grader=F.FakeGrader(),
            tool_schema_hash=env.tool_schema_hash(),
        )  # fmt: skip
        stored = store.query_trajectories(run_id="r")
    assert all([e.flag for e in t.grade.errors] == ["tool_schema_drift"] for t in stored)
    assert requeued == [] and redo == []  # never trained: dropped as a grader error is, and counted
    assert all(t.metadata["dropped"] for t in stored)

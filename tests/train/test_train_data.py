"""Selecting recorded trajectories to learn from: every filter, in order, and clear errors."""

from __future__ import annotations

import pytest

from agentrft.inputs import InputError
from agentrft.store import Store
from agentrft.train.data import DataConfig, select_trajectories
from agentrft.types import Grade, GradeError, Message, Run, Trajectory


def _traj(
    task: str,
    reward: float | None,
    answer: str,
    *,
    run: str = "r1",
    version: int = 0,
    status: str = "completed",
    error: bool = False,
) -> Trajectory:
    grade = None
    if reward is not None:
        errors = [GradeError(flag="other_error", grader="g", message="boom")] if error else []
        grade = Grade(reward=reward, success=reward >= 1.0 and not error, errors=errors)
    return Trajectory(
        run_id=run,
        task_id=task,
        group_id=f"{run}-{task}",
        policy_version=version,
        status=status,  # type: ignore[arg-type]
        messages=[Message(role="user", content="q"), Message(role="assistant", content=answer)],
        n_prompt_messages=1,
        grade=grade,
    )


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "agentrft.db"
    with Store(path) as s:
        s.add_run(Run(id="r1", name="baseline", kind="eval"))
        s.add_run(Run(id="r2", name="train", kind="train"))
        for t in [
            _traj("a", 1.0, "42"),
            _traj("a", 1.0, "42"),
            _traj("a", 0.0, "7"),
            _traj("a", 0.5, "41"),
            _traj("b", 1.0, "3", run="r2", version=1),
            _traj("b", 0.0, "4", run="r2", version=1, status="error"),
            _traj("b", 1.0, "5", run="r2", version=2, error=True),
            _traj("c", None, "x", run="r2"),
        ]:
            s.add_trajectory(t)
    return path


def test_filters_apply_in_order_and_count(db) -> None:
    trajs, counts = select_trajectories(DataConfig(source=str(db)))
    # episode errors and grader errors are never learned from; ungraded ones are kept when no reward filter asks
    assert counts["loaded"] == 8 and counts["learnable"] == 6 and counts["dedupe"] == 5
    assert sorted((t.task_id, t.messages[-1].text()) for t in trajs) == [
        ("a", "41"),
        ("a", "42"),
        ("a", "7"),
        ("b", "3"),
        ("c", "x"),
    ]
    trajs, _ = select_trajectories(DataConfig(source=str(db), success_only=True))
    assert sorted(t.messages[-1].text() for t in trajs) == ["3", "42"]
    trajs, _ = select_trajectories(DataConfig(source=str(db), runs=["baseline"], best_of_n=2, dedupe=False))
    assert [t.messages[-1].text() for t in trajs] == ["42", "42"]
    trajs, _ = select_trajectories(DataConfig(source=str(db), min_reward=0.5, policy_versions=[0]))
    assert sorted(t.messages[-1].text() for t in trajs) == ["41", "42"]


def test_exports_are_sources_too(db, tmp_path) -> None:
    with Store(db) as s:
        s.export_jsonl(tmp_path / "t.jsonl")
        s.export_parquet(tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.parquet"):
        trajs, counts = select_trajectories(DataConfig(source=str(tmp_path / name), success_only=True))
        assert counts["loaded"] == 8 and sorted(t.messages[-1].text() for t in trajs) == ["3", "42"]


def test_an_empty_selection_says_which_filter_emptied_it(db, tmp_path) -> None:
    with pytest.raises(InputError, match=r"after the 'tasks' filter"):
        select_trajectories(DataConfig(source=str(db), tasks=["zzz"]))
    with pytest.raises(InputError, match=r"data.runs: no run 'nope'"):
        select_trajectories(DataConfig(source=str(db), runs=["nope"]))
    with pytest.raises(InputError, match=r"data.source: .*: no such file"):
        select_trajectories(DataConfig(source=str(tmp_path / "missing.db")))
    with pytest.raises(InputError, match=r"data.source: this method learns from recorded trajectories"):
        select_trajectories(DataConfig())


def test_dedupe_compares_tool_calls_by_name_and_arguments_not_by_their_minted_ids() -> None:
    from agentrft.train.data import filter_trajectories
    from agentrft.types import ToolCall, ToolCallFunction

    def episode(call_id: str, expression: str) -> Trajectory:
        call = ToolCall(id=call_id, function=ToolCallFunction(name="calculate", arguments=expression))
        return Trajectory(
            task_id="a",
            messages=[
                Message(role="user", content="q"),
                Message(role="assistant", tool_calls=[call]),
                Message(role="tool", tool_call_id=call_id, content="2"),
                Message(role="assistant", content="2"),
            ],
            n_prompt_messages=1,
            grade=Grade(reward=1.0, success=True),
        )

    same = [episode("call_A", '{"expression": "1+1"}'), episode("call_B", '{"expression": "1+1"}')]
    other = episode("call_C", '{"expression": "4/2"}')
    kept, counts = filter_trajectories([*same, other], DataConfig(success_only=True))
    assert [t.id for t in kept] == [same[0].id, other.id] and counts["dedupe"] == 2
    kept, counts = filter_trajectories([*same, other], DataConfig(tasks=["b"]))
    assert kept == [] and counts == {"loaded": 3, "learnable": 3, "tasks": 0}  # stops at the filter that emptied it

"""Preference pairs: the pairing rule, its refusals, and the TRL pairs file in both directions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentrft.inputs import InputError
from agentrft.pairs import build_pairs, pair_row, read_pairs, require_pairs, write_pairs
from agentrft.types import Grade, GradeError, Message, ToolCall, ToolCallFunction, Trajectory

_N = [0]


def _traj(task: str, reward: float | None, answer: str = "", *, status: str = "completed", error: bool = False):
    """A two-turn episode (tool call, result, answer); ids increase with creation, as in the store."""
    _N[0] += 1
    call = ToolCall(id=f"c{_N[0]}", function=ToolCallFunction(name="calculate", arguments='{"expression": "1+1"}'))
    grade = None
    if reward is not None:
        errors = [GradeError(flag="other_error", grader="g", message="boom")] if error else []
        grade = Grade(reward=reward, success=reward >= 1, errors=errors)
    return Trajectory(
        id=f"T{_N[0]:04d}",
        task_id=task,
        status=status,  # type: ignore[arg-type]
        messages=[
            Message(role="system", content="sys"),
            Message(role="user", content=f"question {task}"),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", content="2", tool_call_id=call.id),
            Message(role="assistant", content=answer or f"The answer is {reward}."),
        ],
        n_prompt_messages=2,
        grade=grade,
    )


def _ids(pairs):
    return [(p.chosen_trajectory.id, p.rejected_trajectory.id) for p in pairs]


def test_binary_group_best_vs_worst_then_spread_over_trajectories() -> None:
    _N[0] = 0
    group = [_traj("a", r) for r in [0, 1, 0, 1, 0, 0, 1, 0]]  # T0001..T0008; successes T0002, T0004, T0007
    pairs, stats = build_pairs(group, margin=0.5, per_task=1)
    assert _ids(pairs) == [("T0002", "T0001")]  # best vs worst, oldest of each on ties
    pairs, _ = build_pairs(group, margin=0.5, per_task=5)
    # least-used first: every success and every failure once before any repeats
    assert _ids(pairs) == [
        ("T0002", "T0001"),
        ("T0004", "T0003"),
        ("T0007", "T0005"),
        ("T0002", "T0006"),
        ("T0004", "T0008"),
    ]
    pairs, stats = build_pairs(group, margin=0.5, per_task=100)
    assert len(pairs) == 15 and len(set(_ids(pairs))) == 15  # all 3 x 5, each once
    assert (stats.trajectories, stats.candidates, stats.tasks, stats.tasks_with_pairs, stats.pairs) == (8, 8, 1, 1, 15)
    # the rule does not depend on the order trajectories come in
    shuffled = list(group)
    random.Random(0).shuffle(shuffled)
    assert _ids(build_pairs(shuffled, margin=0.5, per_task=5)[0]) == _ids(build_pairs(group, margin=0.5, per_task=5)[0])


def test_graded_rewards_largest_gap_first_and_margin() -> None:
    _N[0] = 0
    group = [_traj("a", r) for r in [0.2, 0.9, 0.5, 0.55]]  # T1 .2, T2 .9, T3 .5, T4 .55
    pairs, _ = build_pairs(group, margin=0.3, per_task=10)
    # gaps >= 0.3: (.9,.2)=.7, (.9,.5)=.4, (.9,.55)=.35, (.55,.2)=.35, (.5,.2)=.3
    # the two .35 gaps: T0004 > T0001 first, as T0002 was already picked twice
    assert _ids(pairs) == [
        ("T0002", "T0001"),
        ("T0002", "T0003"),
        ("T0004", "T0001"),
        ("T0002", "T0004"),
        ("T0003", "T0001"),
    ]
    assert all(p.chosen_reward - p.rejected_reward >= 0.3 - 1e-12 for p in pairs)  # type: ignore[operator]
    assert build_pairs(group, margin=0.8, per_task=10)[0] == []


def test_errors_never_pair_and_tasks_and_prompts_stay_apart() -> None:
    _N[0] = 0
    trajs = [
        _traj("a", 1.0),
        _traj("a", 0.0, error=True),  # a grader error is not a reward of 0
        _traj("a", 0.0, status="error"),  # nor is a crashed episode
        _traj("a", None),  # ungraded
        _traj("b", 0.0),  # another task
    ]
    pairs, stats = build_pairs(trajs, margin=0.5, per_task=8)
    assert pairs == [] and stats.candidates == 2 and stats.tasks == 2
    with pytest.raises(InputError, match=r"src: no pair .* reward gap >= margin 0.5 \(5 trajectories, 2 graded"):
        require_pairs(pairs, stats, source="src", margin=0.5)
    other_prompt = _traj("a", 0.0)
    other_prompt.messages[1] = Message(role="user", content="a different question")
    assert build_pairs([trajs[0], other_prompt], margin=0.5, per_task=8)[0] == []
    with pytest.raises(ValueError, match="margin must be > 0"):
        build_pairs(trajs, margin=0.0, per_task=1)


def test_pair_shares_the_prompt_and_keeps_whole_multi_turn_answers() -> None:
    _N[0] = 0
    pairs, _ = build_pairs([_traj("a", 1.0, "yes"), _traj("a", 0.0, "no")], margin=0.5, per_task=1)
    (p,) = pairs
    assert [m.role for m in p.prompt] == ["system", "user"]
    assert [m.role for m in p.chosen] == ["assistant", "tool", "assistant"] and p.chosen[-1].content == "yes"
    assert p.rejected[-1].content == "no" and p.id == "T0001>T0002" and p.task_id == "a"


def test_trl_file_round_trip(tmp_path: Path) -> None:
    _N[0] = 0
    pairs, _ = build_pairs([_traj("a", 1.0), _traj("a", 0.0), _traj("b", 0.0), _traj("b", 0.5)], margin=0.1, per_task=2)
    out = tmp_path / "pairs.jsonl"
    assert write_pairs(pairs, out) == 2
    row = json.loads(out.read_text().splitlines()[0])
    assert set(row) >= {"prompt", "chosen", "rejected"}
    assert row["chosen"][0] == {"role": "assistant", "tool_calls": row["chosen"][0]["tool_calls"]}
    assert row["chosen"][1]["role"] == "tool" and row["chosen_reward"] == 1.0 and row["chosen_id"] == "T0001"
    back = read_pairs(out)
    assert [(p.id, p.task_id, p.prompt, p.chosen, p.rejected) for p in back] == [
        (p.id, p.task_id, p.prompt, p.chosen, p.rejected) for p in pairs
    ]
    assert back[1].where == f"{out}:2" and back[1].chosen_trajectory is None  # a file pair has no token record
    assert pair_row(back[0])["chosen_reward"] == 1.0


_GOOD = {
    "prompt": [{"role": "user", "content": "q"}],
    "chosen": [{"role": "assistant", "content": "a"}],
    "rejected": [{"role": "assistant", "content": "b"}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chosen": None}, r"p.jsonl:2: field 'chosen': missing"),
        ({"prompt": []}, r"p.jsonl:2: field 'prompt': must be a non-empty list"),
        ({"prompt": [{"role": "system", "content": "s"}]}, r"p.jsonl:2: field 'prompt\[0\].role': the prompt must end"),
        ({"rejected": [{"role": "user", "content": "x"}]}, r"p.jsonl:2: field 'rejected\[0\].role': must be assistant"),
        (
            {"chosen": [{"role": "tool", "content": "x", "tool_call_id": "c"}]},
            r"p.jsonl:2: field 'chosen\[0\].tool_call_id'",
        ),
        ({"chosen": [{"role": "assistant"}]}, r"p.jsonl:2: field 'chosen\[0\].content': an assistant message needs"),
        ({"chosen_reward": "high"}, r"p.jsonl:2: field 'chosen_reward': must be a number"),
        ({"id": 7}, r"p.jsonl:2: field 'id': must be a string"),
    ],
)
def test_a_bad_pairs_line_names_file_line_and_field(tmp_path: Path, change, message) -> None:
    row = {**_GOOD, **change}
    row = {k: v for k, v in row.items() if v is not None}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(InputError, match=message):
        read_pairs(path)


def test_an_empty_pairs_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n")
    with pytest.raises(InputError, match="empty file"):
        read_pairs(path)

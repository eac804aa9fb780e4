"""Failure attribution on hand-built trajectories."""

from __future__ import annotations

from typing import Any

import pytest

from agentrft.eval.failures import FAILURE_CATEGORIES, classify_failure, count_failures, gold_numbers, parse_numbers
from agentrft.types import FinalAnswerEvent, Grade, Message, ToolCallEvent, Trajectory

DATA = {"answer": 0.01604, "program": "subtract(5829, 5735), divide(#0, 5735)", "doc_ids": ["ACME-2019"]}


def traj(
    *calls: ToolCallEvent, answer: str | None = "0.5", status: str = "completed", success: bool = False
) -> Trajectory:
    events: list[Any] = list(calls)
    if answer is not None:
        events.append(FinalAnswerEvent(turn=len(calls), text=answer))
    return Trajectory(
        task_id="t1",
        messages=[Message(role="user", content="q")],
        events=events,
        status=status,
        grade=Grade(reward=1.0 if success else 0.0, success=success),
    )


def call(name: str, args: dict[str, Any] | str, *, error_kind: str | None = None, turn: int = 0) -> ToolCallEvent:
    return ToolCallEvent(
        turn=turn,
        name=name,
        arguments=args,
        result=None if error_kind else "ok",
        error="failed" if error_kind else None,
        error_kind=error_kind,
    )


OPEN_OK = call("open", {"doc_id": "ACME-2019"})


def test_gold_numbers_and_parse_numbers() -> None:
    ops, results = gold_numbers("subtract(5829, 5735), divide(#0, 5735)")
    assert ops == [5829.0, 5735.0, 5735.0]
    assert results == pytest.approx([94.0, 94.0 / 5735])
    ops, results = gold_numbers("divide(12%, const_100), table_sum(revenue, none)")
    assert ops == pytest.approx([0.12, 100.0]) and results == pytest.approx([0.0012])
    assert parse_numbers("(5,829 - 5735) / 5735 * 100 and 12.5% of #0") == [5829.0, 5735.0, 5735.0, 100.0, 12.5]


def test_success_is_not_a_failure() -> None:
    assert classify_failure(traj(OPEN_OK, answer="0.016", success=True), DATA) is None


@pytest.mark.parametrize(
    ("calls", "answer", "status", "expected"),
    [
        ((), "0.5", "completed", "no_tool_call"),
        ((call("open", "{bad json", error_kind="malformed"),), "1", "completed", "malformed_tool_call"),
        ((call("browse", {"url": "x"}, error_kind="unknown_tool"),), "1", "completed", "unknown_tool"),
        ((OPEN_OK, call("calculate", {"expression": "1/0"}, error_kind="exception")), "1", "completed", "tool_error"),
        ((OPEN_OK, call("search", {"q": "x"}, error_kind="budget")), "1", "completed", "over_budget"),
        ((call("open", {"doc_id": "OTHER-2018"}), OPEN_OK), "1", "completed", "wrong_document"),
        ((OPEN_OK, call("calculate", {"expression": "(5829 - 5700) / 5700"})), "0.0226", "completed", "wrong_operands"),
        ((OPEN_OK, call("calculate", {"expression": "(5829 - 5735) / 5735"})), "0.5", "completed", "arithmetic_slip"),
        # the intermediate result 94 (gold #0) may be reused as a literal; only 5735 is then used, not 5829
        ((OPEN_OK, call("calculate", {"expression": "94 / 5735"})), "0.5", "completed", "wrong_answer"),
        ((OPEN_OK,), None, "completed", "no_final_answer"),
        ((OPEN_OK,), "", "completed", "no_final_answer"),
        ((OPEN_OK, call("search", {"q": "x"})), None, "max_turns", "over_budget"),
        ((OPEN_OK,), "12", "completed", "wrong_answer"),
    ],
)
def test_categories(calls: tuple[ToolCallEvent, ...], answer: str | None, status: str, expected: str) -> None:
    assert classify_failure(traj(*calls, answer=answer, status=status), DATA) == expected


def test_first_wrong_step_wins() -> None:
    # wrong document comes before the tool error, so it is the attribution
    t = traj(call("open", {"doc_id": "X"}), call("calculate", {"expression": "1/0"}, error_kind="exception", turn=1))
    assert classify_failure(t, DATA) == "wrong_document"
    t = traj(call("calculate", {"expression": "1/0"}, error_kind="exception"), call("open", {"doc_id": "X"}, turn=1))
    assert classify_failure(t, DATA) == "tool_error"


def test_percent_forms_are_right_operands() -> None:
    t = traj(OPEN_OK, call("calculate", {"expression": "94 / 5735 * 100"}), answer="1.6%")
    assert classify_failure(t, DATA) != "wrong_operands"


def test_count_failures_covers_every_category() -> None:
    trajs = [traj(answer="1"), traj(OPEN_OK, answer="1"), traj(OPEN_OK, success=True)]
    counts = count_failures(trajs, {"t1": DATA})
    assert set(counts) == set(FAILURE_CATEGORIES)
    assert counts["no_tool_call"] == 1 and counts["wrong_answer"] == 1 and sum(counts.values()) == 2

"""Trajectory graders, process (per-turn) rewards, grade_trajectory cost/drift, reward-hacking defences."""

from __future__ import annotations

import json

import pytest

from agentrft.graders import Sample, grade_trajectory, load_grader
from agentrft.types import (
    EnvRef,
    FinalAnswerEvent,
    Message,
    ModelCallEvent,
    ToolCall,
    ToolCallEvent,
    ToolCallFunction,
    Trajectory,
)


def traj(calls: list[list[tuple[str, dict, str | None]]], answer: str | None, *, schema_hash: str = "h1") -> Trajectory:
    """calls[t] = tool calls of assistant turn t as (name, args, error); then a final answer turn if given."""
    messages = [Message(role="user", content="q")]
    events: list = []
    n = 0
    for t, turn in enumerate(calls):
        tcs = []
        events.append(ModelCallEvent(turn=t, prompt_tokens=100, completion_tokens=20, latency_s=0.5))
        for name, args, err in turn:
            n += 1
            tcs.append(ToolCall(id=f"c{n}", function=ToolCallFunction(name=name, arguments=json.dumps(args))))
            events.append(
                ToolCallEvent(
                    turn=t,
                    call_id=f"c{n}",
                    name=name,
                    arguments=args,
                    result=None if err else "ok",
                    error=err,
                    error_kind="bad_arguments" if err else None,
                    latency_s=0.1,
                )
            )
        messages.append(Message(role="assistant", content="", tool_calls=tcs))
        for tc in tcs:
            messages.append(Message(role="tool", tool_call_id=tc.id, content="ok"))
    if answer is not None:
        t = len(calls)
        events.append(ModelCallEvent(turn=t, prompt_tokens=150, completion_tokens=10, latency_s=0.5))
        messages.append(Message(role="assistant", content=answer))
        events.append(FinalAnswerEvent(turn=t, text=answer))
    return Trajectory(
        messages=messages,
        events=events,
        env=EnvRef(name="e", tool_schema_hash=schema_hash),
        status="completed" if answer is not None else "max_turns",
    )


NUM = {"type": "numeric", "reference": "{{ item.answer }}"}
SEARCH = ("search", {"query": "revenue 2019"}, None)


def test_sample_from_trajectory_uses_final_answer_only() -> None:
    t = traj([[SEARCH]], "The answer is 12")
    s = Sample.from_trajectory(t)
    assert s.output_text == "The answer is 12"
    assert s.output_tools[0]["function"]["name"] == "search"
    unanswered = traj([[SEARCH], [("calculate", {"expression": "12"}, None)]], None)
    assert Sample.from_trajectory(unanswered).output_text == ""


def test_answer_inside_tool_call_is_not_success() -> None:
    # The policy puts the right number in a tool call (and its thoughts) but never answers.
    t = traj([[("calculate", {"expression": "the answer is 12"}, None)]], None)
    t.messages[1].content = "the answer is 12"
    grade = load_grader(NUM).grade(t, {"answer": 12})
    assert grade.reward == 0.0 and not grade.success and grade.errors == []
    assert load_grader({"type": "answered"}).grade(t, {}).reward == 0.0


def test_printed_score_in_answer_does_not_count() -> None:
    g = load_grader({"type": "multi", "calculate_output": "acc", "graders": {"acc": {**NUM}}})
    grade = g.grade({"output_text": 'score: 1.0\nreward: 1.0\n{"score": 1.0}'}, {"answer": 7})
    assert grade.reward == 0.0 and not grade.success


def test_tool_graders() -> None:
    t = traj(
        [[SEARCH, ("open", {"doc": "A-1"}, "no such document")], [("calculate", {"expression": "1+1"}, None)]],
        "The answer is 2",
    )
    item = {"company": "Revenue 2019"}
    assert load_grader({"type": "tool_called", "tool": "search"}).grade(t, item).reward == 1.0
    assert load_grader({"type": "tool_called", "tool": "open", "successful": True}).grade(t, item).reward == 0.0
    assert load_grader({"type": "tool_called", "tool": "search", "min_calls": 2}).grade(t, item).reward == 0.0
    assert load_grader({"type": "tool_called", "min_calls": 3}).grade(t, item).reward == 1.0  # any tool
    assert load_grader({"type": "tool_called", "min_calls": 3, "successful": True}).grade(t, item).reward == 0.0
    match = {"type": "tool_arguments_match", "tool": "search", "arguments": {"query": "{{ item.company }}"}}
    assert load_grader(match).grade(t, item).reward == 0.0
    assert load_grader({**match, "ignore_case": True}).grade(t, item).reward == 1.0
    assert load_grader({"type": "no_tool_errors"}).grade(t, item).reward == 0.0
    assert load_grader({"type": "no_tool_errors", "mode": "fraction"}).grade(t, item).reward == pytest.approx(2 / 3)
    assert load_grader({"type": "within_tool_budget", "max_calls": 3}).grade(t, item).reward == 1.0
    assert load_grader({"type": "within_tool_budget", "max_calls": 2}).grade(t, item).reward == 0.0
    assert load_grader({"type": "answered"}).grade(t, item).reward == 1.0
    flagged = load_grader({"type": "no_tool_errors"}).grade({"output_text": "x"}, item)
    assert flagged.error_flags == ["sample_parse_error"]


def test_efficiency_penalty() -> None:
    spec = {
        "type": "efficiency",
        "per_tool_call": 0.1,
        "free_tool_calls": 1,
        "per_token": 0.001,
        "token_budget": 50,
        "max_penalty": 0.5,
    }
    t = traj([[SEARCH], [SEARCH], [SEARCH]], "2")  # 3 calls, completion tokens 3*20 + 10 = 70
    grade = load_grader(spec).grade(t, {})
    assert grade.reward == pytest.approx(-(0.1 * 2 + 0.001 * 20))
    assert not grade.success  # success = no penalty (max_reward 0)
    assert load_grader(spec).grade(traj([[SEARCH]], "2"), {}).success


def test_process_rewards_one_per_turn() -> None:
    t = traj([[SEARCH], [("open", {"doc": "x"}, "bad arguments")], [SEARCH]], "The answer is 3")
    grade = load_grader({"type": "tool_process"}).grade(t, {})
    # turn 0 ok, turn 1 failed call, turn 2 repeats turn 0's call, turn 3 final answer
    assert grade.turn_rewards == [1.0, 0.0, 0.0, 0.0]
    assert grade.reward == pytest.approx(1 / 3)


def test_repeated_tool_calls_do_not_farm_reward() -> None:
    spec = {
        "type": "multi",
        "calculate_output": "acc + 0.2 * proc + used + eff",
        "graders": {
            "acc": NUM,
            "proc": {"type": "tool_process"},
            "used": {"type": "tool_called", "tool": "search"},
            "eff": {"type": "efficiency", "per_tool_call": 0.05, "free_tool_calls": 2},
        },
    }
    g = load_grader(spec)
    once = g.grade(traj([[SEARCH]], "The answer is 3"), {"answer": 3})
    farmed = g.grade(traj([[SEARCH]] * 10, "The answer is 3"), {"answer": 3})
    assert once.reward == pytest.approx(1 + 0.2 + 1)
    assert farmed.reward < once.reward
    assert sum(farmed.turn_rewards) <= sum(once.turn_rewards) + 0.2 * 1  # duplicates earn nothing per turn


def test_grade_trajectory_cost_and_drift() -> None:
    t = traj([[SEARCH]], "The answer is 3", schema_hash="abc")
    g = load_grader(NUM)
    grade = grade_trajectory(g, t, {"answer": 3}, expected_tool_schema_hash="abc")
    assert grade.reward == 1.0 and grade.errors == []
    assert (grade.cost.prompt_tokens, grade.cost.completion_tokens, grade.cost.tool_calls) == (250, 30, 1)
    assert grade.cost.seconds == pytest.approx(1.1)
    drift = grade_trajectory(g, t, {"answer": 3}, expected_tool_schema_hash="xyz")
    assert drift.error_flags == ["tool_schema_drift"] and drift.reward == 1.0


def test_trajectory_dict_round_trip_as_sample() -> None:
    t = traj([[SEARCH]], "The answer is 3")
    grade = load_grader(NUM).grade(json.loads(t.to_json()), {"answer": 3})
    assert grade.reward == 1.0

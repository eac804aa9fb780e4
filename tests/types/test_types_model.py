"""The trajectory data model: JSON round-trip, validation, ids."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agentrft.types import (
    SCHEMA_VERSION,
    FinalAnswerEvent,
    Grade,
    GradeError,
    Message,
    ModelCallEvent,
    TokenRecord,
    ToolCall,
    ToolCallEvent,
    ToolCallFunction,
    Trajectory,
    new_id,
)


def _trajectory() -> Trajectory:
    call = ToolCall(id="c1", function=ToolCallFunction(name="calculate", arguments='{"expression": "1+2"}'))
    return Trajectory(
        run_id="r",
        task_id="t",
        group_id="g",
        messages=[
            Message(role="user", content="1+2?"),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", content="3"),
            Message(role="assistant", content="3"),
        ],
        events=[
            ModelCallEvent(turn=0, latency_s=0.1, prompt_tokens=5, completion_tokens=3, finish_reason="stop"),
            ToolCallEvent(turn=0, call_id="c1", name="calculate", arguments={"expression": "1+2"}, result="3"),
            ModelCallEvent(turn=1, latency_s=0.1, prompt_tokens=9, completion_tokens=1, finish_reason="stop"),
            FinalAnswerEvent(turn=1, text="3"),
        ],
        tokens=TokenRecord(
            ids=[1, 2, 3, 4], loss_mask=[0, 1, 0, 1], logprobs=[0.0, -0.25, 0.0, -1.5], turn=[0, 0, 1, 1]
        ),
        grade=Grade(
            reward=1.0,
            sub_rewards={"answer": 1.0, "judge": None},
            success=True,
            errors=[GradeError(flag="other_error", grader="judge", message="x")],
        ),
    )


def test_json_round_trip_is_exact() -> None:
    traj = _trajectory()
    back = Trajectory.from_json(traj.to_json())
    assert back == traj
    assert back.to_json() == traj.to_json()
    assert isinstance(back.events[1], ToolCallEvent)
    assert back.final_answer == "3"
    assert back.num_turns == 2
    assert [e.name for e in back.tool_calls] == ["calculate"]
    assert back.grade is not None and back.grade.error_flags == ["other_error"]


def test_token_record_rejects_ragged_lists() -> None:
    with pytest.raises(ValidationError, match="loss_mask"):
        TokenRecord(ids=[1, 2], loss_mask=[1], logprobs=[0.0, 0.0], turn=[0, 0])
    with pytest.raises(ValidationError, match="only 0 and 1"):
        TokenRecord(ids=[1], loss_mask=[2], logprobs=[0.0], turn=[0])


def test_unknown_trajectory_field_and_future_schema_are_rejected() -> None:
    data = json.loads(_trajectory().to_json())
    data["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        Trajectory.model_validate(data)
    data.pop("surprise")
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValidationError, match="newer"):
        Trajectory.model_validate(data)


def test_messages_keep_unknown_openai_keys() -> None:
    msg = Message.model_validate({"role": "assistant", "content": "hi", "refusal": None, "annotations": []})
    assert msg.model_dump()["annotations"] == []


def test_ids_are_time_sortable_and_unique() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # strictly increasing within a process, even within one millisecond
    assert all(len(i) == 26 for i in ids)
    # ids minted in later milliseconds sort after earlier ones
    import time

    first = new_id()
    time.sleep(0.002)
    assert new_id() > first


def test_num_turns_skips_prompt_messages() -> None:
    traj = _trajectory()
    example = [Message(role="user", content="1+1?"), Message(role="assistant", content="2")]
    traj.messages = example + traj.messages
    traj.n_prompt_messages = len(example) + 1  # worked example + the task's user message
    assert traj.num_turns == 2
    assert Trajectory.from_json(traj.to_json()).num_turns == 2

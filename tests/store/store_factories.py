"""Realistic trajectories for store tests (imported by the store and CLI tests)."""

from __future__ import annotations

import random

from agentrft.types import (
    Cost,
    EnvRef,
    FinalAnswerEvent,
    Grade,
    GradeError,
    Message,
    ModelCallEvent,
    ReasoningEvent,
    TokenRecord,
    ToolCall,
    ToolCallEvent,
    ToolCallFunction,
    Trajectory,
)


def make_tokens(rng: random.Random, n_turns: int = 2, per_turn: int = 20) -> TokenRecord:
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turn: list[int] = []
    for k in range(n_turns):
        for _ in range(per_turn):  # prompt / tool-result tokens
            ids.append(rng.randrange(49152))
            mask.append(0)
            logprobs.append(0.0)
            turn.append(k)
        for _ in range(per_turn):  # sampled tokens
            ids.append(rng.randrange(49152))
            mask.append(1)
            logprobs.append(-rng.random() * 3)
            turn.append(k)
    return TokenRecord(ids=ids, loss_mask=mask, logprobs=logprobs, turn=turn)


def make_traj(
    i: int = 0,
    *,
    run_id: str = "run-a",
    task_id: str | None = None,
    group_id: str | None = None,
    policy_version: int = 0,
    reward: float | None = 0.5,
    status: str = "completed",
    per_turn: int = 20,
    seed: int | None = None,
) -> Trajectory:
    """A two-turn tool-using episode: search call with a result, a failed truncated call, final answer."""
    rng = random.Random(i if seed is None else seed)
    args = {"query": f"revenue 20{i % 100:02d}", "k": 3}
    messages = [
        Message(role="system", content="You answer questions about financial reports."),
        Message(role="user", content=f"What was the revenue growth in case {i}?"),
        Message(
            role="assistant",
            content=None,
            tool_calls=[
                ToolCall(
                    id=f"call_{i}_a", function=ToolCallFunction(name="search", arguments='{"query": "revenue", "k": 3}')
                ),
                ToolCall(id=f"call_{i}_b", function=ToolCallFunction(name="open", arguments="{not json")),
            ],
        ),
        Message(role="tool", tool_call_id=f"call_{i}_a", content="doc-1: revenue rose 12.5%"),
        Message(role="tool", tool_call_id=f"call_{i}_b", content="error: arguments are not valid JSON"),
        Message(role="assistant", content=f"The revenue grew by {0.1 + 0.2 * i}%.", annotations=[{"k": "v"}]),
    ]
    events = [
        ModelCallEvent(
            t=1.0 + i,
            turn=0,
            latency_s=0.25,
            prompt_tokens=per_turn,
            completion_tokens=per_turn,
            finish_reason="tool_calls",
        ),
        ReasoningEvent(t=1.1 + i, turn=0, text="I should search first."),
        ToolCallEvent(
            t=1.2 + i,
            turn=0,
            call_id=f"call_{i}_a",
            name="search",
            arguments=args,
            result="doc-1: revenue rose 12.5%",
            latency_s=0.01,
            truncated=True,
        ),
        ToolCallEvent(
            t=1.3 + i,
            turn=0,
            call_id=f"call_{i}_b",
            name="open",
            arguments="{not json",
            error="arguments are not valid JSON",
            error_kind="malformed",
        ),
        ModelCallEvent(
            t=2.0 + i,
            turn=1,
            latency_s=0.5,
            prompt_tokens=3 * per_turn,
            completion_tokens=per_turn,
            finish_reason="stop",
        ),
        FinalAnswerEvent(t=2.1 + i, turn=1, text=f"The revenue grew by {0.1 + 0.2 * i}%."),
    ]
    grade = None
    if reward is not None:
        grade = Grade(
            reward=reward,
            sub_rewards={"answer": reward, "format": 1.0, "judge": None},
            turn_rewards=[0.0, reward],
            success=reward >= 0.5,
            errors=[GradeError(flag="truncated_observation_error", grader="tools", message="search output cut")],
            cost=Cost(prompt_tokens=4 * per_turn, completion_tokens=2 * per_turn, tool_calls=2, seconds=0.75, usd=None),
            grader="multi",
            metadata={"nested": {"a": [1, 2.5, None]}},
        )
    return Trajectory(
        run_id=run_id,
        task_id=task_id if task_id is not None else f"task-{i % 10}",
        group_id=group_id if group_id is not None else f"group-{i // 4}",
        env=EnvRef(name="finqa-lite", version="1", tool_schema_hash="abc123"),
        policy="SmolLM2-135M-Instruct",
        policy_version=policy_version,
        messages=messages,
        events=events,
        tokens=make_tokens(rng, 2, per_turn),
        grade=grade,
        status=status,  # type: ignore[arg-type]
        created_at=1_700_000_000.0 + i + 0.123456789,
        finished_at=1_700_000_001.5 + i,
        metadata={"split": "train", "level": i % 3, "unicode": "é✓"},
    )

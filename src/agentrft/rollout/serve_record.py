"""What `agentrft serve` records of a request outside a session: one trajectory per sampled choice.

Its token record is exactly the prompt ids the sampler consumed (loss_mask 0) and the ids it sampled
(loss_mask 1), so it is valid training data on its own; the requests of one conversation are linked by
``metadata.conversation_id`` (`conversation_id`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from agentrft.rollout.formats import ToolFormat
from agentrft.samplers.base import SampleResult, TokenSampler
from agentrft.types import EnvRef, Message, ModelCallEvent, TokenRecord, Trajectory


def conversation_id(messages: list[Message]) -> str:
    """Stable id of a conversation: hash of its messages up to and including the first user message."""
    head: list[dict[str, Any]] = []
    for m in messages:
        head.append({"role": m.role, "content": m.text()})
        if m.role == "user":
            break
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Prepared:
    """A request rendered for the sampler: the messages as the model sees them and their token ids."""

    messages: list[Message]
    rendered_messages: list[dict[str, Any]]
    fmt: ToolFormat
    tools: list[dict[str, Any]]
    prompt_ids: list[int]
    conversation_id: str


def request_trajectory(
    prep: Prepared,
    prompt_ids: list[int],
    reply: Message,
    result: SampleResult,
    completion_id: str,
    t0: float,
    *,
    sampler: TokenSampler,
    run_id: str,
    tool_format: str,
) -> Trajectory:
    """One served choice as a trajectory of its own."""
    messages = prep.messages
    turn = sum(1 for m in messages if m.role == "assistant")
    sampled = list(result.token_ids)
    return Trajectory(
        run_id=run_id,
        task_id=completion_id,
        group_id=prep.conversation_id,
        env=EnvRef(name="serve", version="1"),
        policy=sampler.policy,
        policy_version=sampler.policy_version,
        messages=[*messages, reply],
        n_prompt_messages=len(messages),
        events=[
            ModelCallEvent(
                turn=turn,
                latency_s=result.latency_s,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                finish_reason=result.finish_reason,
            )
        ],
        tokens=TokenRecord(
            ids=prompt_ids + sampled,
            loss_mask=[0] * len(prompt_ids) + [1] * len(sampled),
            logprobs=[0.0] * len(prompt_ids) + [float(x) for x in result.logprobs],
            turn=[turn] * (len(prompt_ids) + len(sampled)),
        ),
        status="truncated" if result.finish_reason == "length" else "completed",
        created_at=t0,
        finished_at=time.time(),
        metadata={"conversation_id": prep.conversation_id, "tools": prep.tools, "tool_format": tool_format},
    )

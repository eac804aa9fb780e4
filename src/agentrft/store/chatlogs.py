"""Turn one OpenAI-style chat log record into a Trajectory.

A record is `{"messages": [...], ...}`; every other key goes to the
trajectory's `metadata` (and `model` / `task_id`, when strings, also fill
`policy` / `task_id`). Events are derived from the messages with the agent
loop's convention: each assistant `tool_calls` entry becomes a ToolCallEvent
whose result is the `tool` message answering it, and the last assistant
message, when it has no tool calls, is the final answer. There are no token
ids in a chat log, so `tokens` is None (an eval-only trajectory). The messages
must be a valid OpenAI conversation (`agentrft.openai_rows`).
"""

from __future__ import annotations

import json
from typing import Any

from agentrft.inputs import InputError
from agentrft.openai_rows import parse_messages
from agentrft.types import EnvRef, Event, FinalAnswerEvent, Message, ToolCallEvent, Trajectory

CHAT_LOG_ENV = "chat-log"


class ChatLogError(InputError):
    """A chat log record with the wrong shape; the message names the field."""


def _parse_arguments(text: str) -> dict[str, Any] | str:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def chat_record_to_trajectory(record: Any, *, run_id: str) -> Trajectory:
    """Build the trajectory of one chat log record (raises ChatLogError naming the field)."""
    if not isinstance(record, dict):
        raise ChatLogError(f"expected a JSON object with 'messages', got {type(record).__name__}")
    if "messages" not in record:
        raise ChatLogError("field 'messages': missing")
    try:
        messages = parse_messages(record["messages"])
    except InputError as exc:
        raise ChatLogError(str(exc)) from None

    # Results of tool calls, by call id (the tool message that answers each call).
    results: dict[str, str] = {}
    for msg in messages:
        if msg.role == "tool" and msg.tool_call_id is not None:
            results[msg.tool_call_id] = msg.text()

    events: list[Event] = []
    turn = -1
    last_assistant: Message | None = None
    for msg in messages:
        if msg.role != "assistant":
            continue
        turn += 1
        last_assistant = msg
        for call in msg.tool_calls or []:
            events.append(
                ToolCallEvent(
                    turn=turn,
                    call_id=call.id,
                    name=call.function.name,
                    arguments=_parse_arguments(call.function.arguments),
                    result=results.get(call.id),
                )
            )
    if last_assistant is not None and not last_assistant.tool_calls:
        events.append(FinalAnswerEvent(turn=turn, text=last_assistant.text()))

    metadata = {k: v for k, v in record.items() if k != "messages"}
    model = metadata.get("model")
    task_id = metadata.get("task_id")
    return Trajectory(
        run_id=run_id,
        task_id=task_id if isinstance(task_id, str) else "",
        env=EnvRef(name=CHAT_LOG_ENV),
        policy=model if isinstance(model, str) else "",
        messages=messages,
        events=events,
        tokens=None,
        metadata=metadata,
    )

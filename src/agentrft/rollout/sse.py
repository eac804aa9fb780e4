"""Server-sent events in the Chat Completions chunk format (``stream: true``).

`completion_chunks(response)` writes a finished ``chat.completion`` as the ``chat.completion.chunk``
events an OpenAI client reassembles to the same message: per choice a first delta with the role,
the content in pieces (each whitespace-delimited word with the space before it), each tool call
(index, id, type, name, then its arguments), a last delta with the finish reason; with
``stream_options.include_usage`` a final chunk with no choices and the usage; then ``data: [DONE]``.

The samplers return a completion whole, so the events are written once it is sampled: clients and
frameworks that ask for a stream get one, but not token-by-token latency. The completion is recorded
exactly as a non-streamed one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_PIECES = re.compile(r"\s*\S+|\s+$")


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def content_pieces(text: str) -> list[str]:
    """`text` as stream pieces that concatenate back to it exactly."""
    pieces = _PIECES.findall(text)
    assert "".join(pieces) == text
    return pieces


def completion_chunks(response: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
    """The SSE events (``data: ...`` blocks) of a finished chat completion, ending with ``data: [DONE]``."""
    head = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _event({**head, "choices": [choice]})

    for choice in response["choices"]:
        i, message = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        for piece in content_pieces(message.get("content") or ""):
            yield chunk(i, {"content": piece})
        for k, call in enumerate(message.get("tool_calls") or []):
            fn = call["function"]
            yield chunk(
                i,
                {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                },
            )
            yield chunk(i, {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
        yield chunk(i, {}, choice["finish_reason"])
    if include_usage:
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"

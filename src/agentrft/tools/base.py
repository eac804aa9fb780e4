"""Tool result type shared by tools, environments and the agent loop (no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ToolResult:
    """What one tool call gave back. `content` is what the model sees (already capped)."""

    content: str
    error: str | None = None  # set when the call failed; `content` then holds the message shown to the model
    error_kind: str | None = None  # malformed | unknown_tool | bad_arguments | budget | timeout | exception
    truncated: bool = False
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

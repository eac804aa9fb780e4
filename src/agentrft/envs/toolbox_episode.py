"""An Episode that dispatches to a Toolbox under a tool-call budget (shared by the built-in envs)."""

from __future__ import annotations

from typing import Any

from agentrft.envs.base import Episode
from agentrft.tools.base import ToolResult
from agentrft.tools.registry import Toolbox, error_result
from agentrft.types import Task


class ToolboxEpisode(Episode):
    """Every call attempt, valid or not, spends one unit of budget: a model that loops on bad calls must stop."""

    def __init__(self, task: Task, toolbox: Toolbox, max_tool_calls: int, state: Any = None):
        self.task = task
        self.toolbox = toolbox
        self.max_tool_calls = max_tool_calls
        self.state = state  # tool state (e.g. FinqaToolState), for tests and inspection
        self.calls_made = 0

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        if self.calls_made >= self.max_tool_calls:
            return error_result(
                f"Error: the budget of {self.max_tool_calls} tool calls is used up; "
                "reply with your final answer now, without a tool call.",
                "budget",
            )
        self.calls_made += 1
        try:
            return await self.toolbox.call(str(name), arguments)
        except Exception as exc:  # Toolbox.call should not raise; this is the last guard of the contract
            return error_result(f"Error: {name} failed: {type(exc).__name__}: {exc}", "exception")

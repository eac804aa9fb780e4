"""The environment interface: system prompt, tools, limits, tasks, a default grader.

An `Environment` is stateless and shared; `start(task)` returns an `Episode`
holding per-episode state (the document in scope, tool calls used so far).
The agent loop (rollout) sees only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agentrft.tools.base import ToolResult
from agentrft.types import EnvRef, Message, Task


class EnvLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=6, ge=1, description="assistant turns per episode")
    max_tokens_per_turn: int = Field(default=128, ge=1)
    max_total_tokens: int = Field(default=2048, ge=1, description="whole episode, prompt included")
    max_tool_calls: int = Field(default=8, ge=0, description="calls past this budget get an error message")
    tool_timeout_s: float = Field(default=10.0, gt=0)
    wall_time_s: float = Field(
        default=1800.0,
        gt=0,
        description="per-episode guard against hangs: the episode's own time (tools, the loop), and separately each "
        "model call's (time spent in a batching sampler's batch is the batch's, not counted against the episode)",
    )


class Episode(ABC):
    """Per-episode state. `call_tool` never raises for bad model output: it returns an error ToolResult.

    Three optional hooks let an environment drive more than one exchange (a user's next turn, a game's next
    observation) and measure the episode itself; the agent loop calls them, the defaults keep the single-answer
    convention:

    - `reply(text)`: the policy wrote a turn without a tool call. Return the messages the environment answers
      with (usually one user message) to go on, or None to end the episode with `text` as its final answer.
    - `finished`: True once the environment has ended the episode after a turn's tool calls (a one-shot
      function-calling task is over after its calls); the loop stops there with status ``completed``.
    - `outcome()`: what the environment measured (e.g. ``{"reward": 1.0}``), recorded in the trajectory's
      ``metadata["env"]`` when the episode ends, however it ends; the ``env_reward`` grader reads ``reward``.
    - `close()`: release per-episode resources; called once, after `outcome()`.
    """

    task: Task
    finished: bool = False

    @abstractmethod
    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult: ...

    async def reply(self, text: str) -> list[Message] | None:
        return None

    def outcome(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


class Expert(Protocol):
    """Solves an environment's tasks from their gold data, one assistant turn at a time.

    `next_turn(task, turns)` gets the episode's messages so far after its prompt (assistant turns
    and tool results, empty at the start) and returns the next assistant message: tool calls, or
    the final answer as content. It acts on what the tools returned, as a model would, so the
    `oracle` policy (`samplers/oracle.py`) plays it through the agent loop and its trajectories are
    demonstrations in the model's own tool-call text.
    """

    def next_turn(self, task: Task, turns: list[Message]) -> Message: ...


class Environment(ABC):
    name: str
    version: str = "1"
    limits: EnvLimits

    @abstractmethod
    def system_prompt(self) -> str: ...

    @abstractmethod
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-tool schemas of this environment's tools."""

    @abstractmethod
    def tasks(self, split: str = "train") -> list[Task]: ...

    @abstractmethod
    def start(self, task: Task) -> Episode: ...

    def grader_spec(self) -> dict[str, Any]:
        """The default grader of this environment as an OpenAI-style grader spec (see agentrft.graders).

        The final answer must match `item.answer` within 1% (percent <-> fraction, units and
        separators handled by the numeric grader); FinQA answers are rounded to 5 decimals.
        """
        return {
            "type": "numeric",
            "name": "answer",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "rel_tol": 0.01,
        }

    def expert(self) -> Expert | None:
        """An expert that solves this environment's tasks (the `oracle` policy), or None where there is none."""
        return None

    def task_tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        """The tools one task's episode is offered (its prompt and its episode): all of them unless an
        environment that serves several kinds of task says otherwise."""
        return self.tool_schemas()

    def task_parse_schemas(self, task: Task) -> list[dict[str, Any]]:
        """Every tool one task's episode may come to offer, so the tool-call format can read calls to each (an
        environment that offers more tools mid-episode, as BFCL's miss_func does, names them all here); the
        prompt lists `task_tool_schemas` only."""
        return self.task_tool_schemas(task)

    def task_limits(self, task: Task) -> EnvLimits:
        """One task's episode limits (turns, tokens, wall time): the environment's unless it says otherwise."""
        return self.limits

    def few_shot(self) -> list[Message]:
        """Worked examples as OpenAI messages (assistant tool_calls + tool results); rendered by the agent loop."""
        return []

    def initial_messages(self, task: Task) -> list[Message]:
        system = Message(role="system", content=self.system_prompt())
        return [system, *self.few_shot(), *task.messages]

    def tool_schema_hash(self) -> str:
        from agentrft.tools.schema import schema_hash

        return schema_hash(self.tool_schemas())

    def ref(self) -> EnvRef:
        return EnvRef(name=self.name, version=self.version, tool_schema_hash=self.tool_schema_hash())


class EnvironmentWrapper(Environment):
    """An environment that is ``inner`` in every respect (what a particular one adds too) but what a subclass
    overrides: usually `start`, to wrap each episode (`envs.faults`: seeded tool faults)."""

    def __init__(self, inner: Environment) -> None:
        self.inner = inner
        self.name, self.version = inner.name, inner.version

    @property
    def limits(self) -> EnvLimits:  # type: ignore[override]
        return self.inner.limits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, task: Task) -> Episode:
        return self.inner.start(task)

    def system_prompt(self) -> str:
        return self.inner.system_prompt()

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.inner.tool_schemas()

    def tasks(self, split: str = "train") -> list[Task]:
        return self.inner.tasks(split)

    def grader_spec(self) -> dict[str, Any]:
        return self.inner.grader_spec()

    def expert(self) -> Expert | None:
        return self.inner.expert()

    def task_tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return self.inner.task_tool_schemas(task)

    def task_parse_schemas(self, task: Task) -> list[dict[str, Any]]:
        return self.inner.task_parse_schemas(task)

    def task_limits(self, task: Task) -> EnvLimits:
        return self.inner.task_limits(task)

    def few_shot(self) -> list[Message]:
        return self.inner.few_shot()

    def initial_messages(self, task: Task) -> list[Message]:
        return self.inner.initial_messages(task)

    def ref(self) -> EnvRef:
        return self.inner.ref()

"""``bfcl:CATEGORY[,CATEGORY...]``: the Berkeley Function Calling Leaderboard (v4, package bfcl-eval) as tasks.

Categories: multi-turn ``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
``multi_turn_long_context`` (short names ``base``, ``miss_func``, ``miss_param``, ``long_context``) and
single-turn ``simple`` (``simple_python``), ``multiple``, ``parallel``, ``parallel_multiple``, ``irrelevance``
and their ``live_`` versions. A task's ``level`` is its category's position in the spec.

An episode is played as the benchmark defines it, in the policy's tool-call format:

- single-turn: the task's question with its functions as tools; the episode ends after the first turn (its
  calls are recorded, not executed, as the benchmark's AST check needs them), or with a reply that calls
  nothing (what ``irrelevance`` wants);
- multi-turn: the benchmark's stateful API classes (file system, trading bot, travel booking, vehicle control,
  messaging, posting, ticketing, math) are built from the task's initial config by the package's own executor
  and the policy's calls run on them; a reply without a call ends the user's turn and the next user turn
  follows, until the last one. In ``miss_func`` the held-out functions arrive at their turn as the benchmark's
  prompting message that lists them, and calls to them are accepted from then on.

Grading is the package's own evaluator on the episode's calls (``bfcl`` grader, `grader.py`), so a score here
is the official one on the same outputs. Split: a task is ``held-out`` when the SHA-256 of its id is 0 mod 4
(about a quarter of each category), else ``train``; fixed by id, whatever the categories named. ``?shots=N``
(1 to 3) puts N worked examples in the prompt, on functions none of these categories offers (the first's name
is also offered, with other parameters, by ``live_irrelevance``); the benchmark's own prompt is zero-shot, the
default. An example is the question and the reply the task's category expects: for a single-turn category
the call alone (its first turn is the whole answer), for a multi-turn one the call, its result and the plain
reply that ends the user's turn.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentrft.envs.base import Environment, EnvLimits, Episode
from agentrft.envs.bfcl import package
from agentrft.envs.plugins import EnvSpec
from agentrft.inputs import InputError
from agentrft.tools.base import ToolResult
from agentrft.tools.registry import error_result
from agentrft.types import Message, Task, ToolCall, ToolCallFunction

SPLITS = ("train", "held-out")
SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the functions you are given. "
    "Call the functions a request needs, with the arguments the user gave. When the request is done, or when "
    "no function fits it or an argument is missing, reply in plain text without a function call."
)
RECORDED = "The call was recorded."
# Worked examples of the call format (`?shots=N`): question, call, the call's result, the reply after it. The
# benchmark itself prompts zero-shot (the default).
EXAMPLES: tuple[tuple[str, str, dict[str, Any], str, str], ...] = (
    (
        "What will the weather be in Paris tomorrow, in celsius?",
        "get_weather_forecast",
        {"city": "Paris", "days_ahead": 1, "unit": "celsius"},
        '{"high": 21, "low": 13}',
        "Tomorrow in Paris: a high of 21 and a low of 13 degrees celsius.",
    ),
    (
        "Book a table for 4 at Luigi's at 19:30.",
        "book_table_reservation",
        {"restaurant": "Luigi's", "party_size": 4, "time": "19:30"},
        '{"confirmed": true, "reference": "L-2291"}',
        "Your table for 4 at Luigi's is booked for 19:30 (reference L-2291).",
    ),
    (
        "Set the thermostat to heat the house to 21 degrees.",
        "set_thermostat_mode",
        {"mode": "heat", "target_celsius": 21},
        '{"mode": "heat", "target_celsius": 21}',
        "The thermostat now heats to 21 degrees.",
    ),
)
# The episode's assistant turns: 5 per user turn on average, in one budget for the whole episode (the benchmark
# allows 20 steps within each user turn; a small model that loops would fill an 8k context long before).
STEPS_PER_TURN = 5


def held_out(task_id: str) -> bool:
    return hashlib.sha256(task_id.encode()).digest()[0] % 4 == 0


class BfclEnv(Environment):
    name = "bfcl"
    version = "4"

    def __init__(self, categories: list[str], *, shots: int = 0, limits: EnvLimits | None = None) -> None:
        self.categories = [package.category_name(c) for c in categories]
        if not 0 <= shots <= len(EXAMPLES):
            raise InputError(f"bfcl shots must be 0 to {len(EXAMPLES)} (worked examples of a call), got {shots}")
        self.shots = shots
        self.limits = limits or EnvLimits(
            max_turns=1, max_tokens_per_turn=256, max_total_tokens=8192, max_tool_calls=16
        )
        self._limits_given = limits is not None
        self._tasks: dict[str, list[Task]] | None = None
        self._schemas: dict[str, list[dict[str, Any]]] = {}

    @classmethod
    def from_spec(cls, spec: EnvSpec, **kwargs: Any) -> BfclEnv:
        spec.known("shots")
        names = [n.strip() for n in spec.arg.split(",") if n.strip()]
        if not names:
            raise spec.error("name one or more BFCL categories, e.g. bfcl:multi_turn_base")
        try:
            env = cls(names, shots=spec.int_option("shots", 0), **kwargs)
            package.bfcl()  # a missing package fails here, before any model loads
        except InputError as exc:
            raise spec.error(str(exc)) from None
        return env

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Empty: every task brings its own functions (`task_tool_schemas`)."""
        return []

    def task_tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        if task.id not in self._schemas:
            self._schemas[task.id] = package.tool_schemas(task.data["bfcl"]["function"])
        return self._schemas[task.id]

    def task_parse_schemas(self, task: Task) -> list[dict[str, Any]]:
        """The task's functions and those miss_func holds back until their turn: a call to either is read as a
        call (the benchmark executes any function of the involved classes, offered yet or not)."""
        missed = [f for fs in (task.data["bfcl"].get("missed_function") or {}).values() for f in fs]
        return self.task_tool_schemas(task) + (package.tool_schemas(missed) if missed else [])

    def task_limits(self, task: Task) -> EnvLimits:
        if self._limits_given or task.data["category"] not in package.MULTI_TURN:
            return self.limits
        return self.limits.model_copy(update={"max_turns": STEPS_PER_TURN * len(task.data["bfcl"]["question"])})

    def few_shot(self, single_turn: bool = False) -> list[Message]:
        """The ``shots`` worked examples (`EXAMPLES`): each the question and its call, then, unless
        `single_turn`, the call's result and the plain reply after it."""
        out: list[Message] = []
        for i, (question, name, arguments, result, answer) in enumerate(EXAMPLES[: self.shots], 1):
            call = ToolCall(id=f"example_{i}", function=ToolCallFunction(name=name, arguments=json.dumps(arguments)))
            out += [Message(role="user", content=question), Message(role="assistant", content=None, tool_calls=[call])]
            if not single_turn:
                out += [
                    Message(role="tool", tool_call_id=call.id, name=name, content=result),
                    Message(role="assistant", content=answer),
                ]
        return out

    def initial_messages(self, task: Task) -> list[Message]:
        """The system prompt (with a system message the task brings, as the live categories do), the worked
        examples where asked for, then the task's messages."""
        system = [self.system_prompt(), *(m.text() for m in task.messages if m.role == "system")]
        own = [m for m in task.messages if m.role != "system"]
        examples = self.few_shot(single_turn=task.data["category"] not in package.MULTI_TURN)
        return [Message(role="system", content="\n\n".join(system)), *examples, *own]

    def grader_spec(self) -> dict[str, Any]:
        return {"type": "bfcl", "name": "bfcl"}

    def _load(self) -> dict[str, list[Task]]:
        if self._tasks is None:
            self._tasks = {split: [] for split in SPLITS}
            for level, category in enumerate(self.categories, 1):
                for entry, truth in package.load_category(category):
                    first = entry["question"][0] if entry["question"] else []
                    task = Task(
                        id=entry["id"],
                        env=self.name,
                        messages=[Message(role=m["role"], content=m["content"]) for m in first],
                        data={"bfcl": entry, "truth": truth, "category": category, "level": level},
                    )
                    self._tasks["held-out" if held_out(entry["id"]) else "train"].append(task)
        return self._tasks

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise InputError(f"unknown BFCL split {split!r}; valid splits: {', '.join(SPLITS)}")
        return self._load()[split]

    def start(self, task: Task) -> Episode:
        if task.data["category"] in package.MULTI_TURN:
            return MultiTurnEpisode(task)
        return SingleTurnEpisode(task)


class SingleTurnEpisode(Episode):
    """The first turn's calls are the answer: recorded, and the episode ends after them. A call is refused
    (an error result) when its name is not offered, or its arguments are not among the function's parameters
    or leave a required one out; the grade reads the calls, not these results, so they only tell a training
    reward (``tool_called``) which calls were well formed."""

    def __init__(self, task: Task) -> None:
        self.task = task
        functions = task.data["bfcl"]["function"]
        self.allowed = package.allowed_calls(functions)
        self.required = package.allowed_calls(functions, key="required")

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        self.finished = True
        if name not in self.allowed:
            return error_result(f"Error: unknown function {name!r}.", "unknown_tool")
        given = set(arguments) if isinstance(arguments, dict) else None
        if given is None or not given <= self.allowed[name] or not self.required[name] <= given:
            return error_result(
                f"Error: {name} takes arguments among {', '.join(sorted(self.allowed[name])) or 'none'}, "
                f"needing {', '.join(sorted(self.required[name])) or 'none'}.",
                "bad_arguments",
            )
        return ToolResult(content=RECORDED)


class MultiTurnEpisode(Episode):
    """The benchmark's API instances for one episode; user turns follow the policy's plain replies. No call
    budget (`EnvLimits.max_tool_calls` does not apply): the benchmark refuses no call, and a refused call would
    leave the episode's state apart from the one the grade replays."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.entry: dict[str, Any] = task.data["bfcl"]
        self.allowed = package.entry_calls(self.entry)
        self.instances = package.Instances(self.entry)
        self.instances.execute([])  # builds the instances from the initial config now, not at the first call
        self.turn = 0

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        if name not in self.allowed:
            return error_result(f"Error: unknown function {name!r}.", "unknown_tool")
        call = package.safe_call(name, arguments, self.allowed)
        if call is None:
            return error_result(
                f"Error: arguments for {name} must be a JSON object with keys among: "
                f"{', '.join(sorted(self.allowed[name])) or 'none'}.",
                "bad_arguments",
            )
        (result,) = self.instances.execute([call])
        return ToolResult(content=result, error=result if result.startswith("Error during execution") else None)

    async def reply(self, text: str) -> list[Message] | None:
        self.turn += 1
        questions = self.entry["question"]
        if self.turn >= len(questions):
            return None
        missed = self.entry.get("missed_function", {}).get(str(self.turn))
        if missed:  # the benchmark's prompting message for functions that arrive at this turn
            template = package.bfcl().prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
            return [Message(role="user", content=template.format(functions=json.dumps(package.tool_schemas(missed))))]
        return [Message(role=m["role"], content=m["content"]) for m in questions[self.turn]]

    def outcome(self) -> dict[str, Any]:
        turns = len(self.entry["question"])
        return {"user_turns_served": min(self.turn + 1, turns), "user_turns": turns}

    def close(self) -> None:
        self.instances.close()

"""`FinqaLiteEnv`: the default environment, FinQA-style questions over the synthetic corpus.

Tools: `search`, `open`, `calculate` (see `agentrft.envs.finqa.tools`). Limits
grow with the level: level 1 needs one calculation, level 4 two searches, two
opens and a calculation. The env's `limits` are the most generous of its
levels; each episode's limits (turns, tokens, tool budget: `task_limits`) are its
task's level's unless other `limits` were given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from agentrft.envs.base import Environment, EnvLimits
from agentrft.envs.finqa.curriculum import LEVELS, FinqaLite, answer_text
from agentrft.envs.finqa.expert import (
    CALCULATOR_ONLY_LEVELS,
    DECOMPOSED_LEVEL,
    FinqaExpert,
    decomposes,
    difference_program,
    plan_text,
    report_programs,
)
from agentrft.envs.finqa.program import program_to_infix
from agentrft.envs.finqa.shots import parse_shots
from agentrft.envs.finqa.tools import DocumentIndex, FinqaToolState, finqa_tool_schemas, finqa_toolbox
from agentrft.envs.plugins import EnvSpec
from agentrft.envs.toolbox_episode import ToolboxEpisode
from agentrft.inputs import InputError
from agentrft.types import Message, Task, ToolCall, ToolCallFunction

LEVEL_LIMITS: dict[int, EnvLimits] = {
    1: EnvLimits(max_turns=3, max_tokens_per_turn=128, max_total_tokens=2048, max_tool_calls=2),
    2: EnvLimits(max_turns=3, max_tokens_per_turn=128, max_total_tokens=3072, max_tool_calls=3),
    3: EnvLimits(max_turns=6, max_tokens_per_turn=128, max_total_tokens=6144, max_tool_calls=6),
    4: EnvLimits(max_turns=10, max_tokens_per_turn=192, max_total_tokens=8192, max_tool_calls=10),
}

# The tools themselves are described by the agent loop's tool-call format, from their schemas.
SYSTEM_PROMPT = """You answer questions about companies' annual reports. Amounts are in millions of dollars.
Use the tools to find figures and to compute. When you know the answer, reply without a tool call: "The answer is <number>."
Give ratios and percentage changes as decimals (0.0164, not 1.64%)."""

# Several worked examples teach the call's shape.
EXAMPLE_TEMPLATES: dict[int, tuple[str, ...]] = {
    1: ("revenue_growth", "gross_margin", "net_income_change"),
    2: ("revenue_growth",),
    3: ("revenue_growth",),
    4: ("revenue_growth",),
}


def _schemas(levels: Iterable[int]) -> list[dict[str, Any]]:
    """The tools levels need: `calculate` alone where every figure is in the question (levels 1-2)."""
    schemas = finqa_tool_schemas()
    if set(levels) <= set(CALCULATOR_ONLY_LEVELS):
        schemas = [s for s in schemas if s["function"]["name"] == "calculate"]
    return schemas


def merged_limits(levels: Iterable[int]) -> EnvLimits:
    """The most generous limits over `levels`, field by field."""
    chosen = [LEVEL_LIMITS[lv] for lv in levels]
    fields = EnvLimits.model_fields
    return EnvLimits(**{f: max(getattr(lim, f) for lim in chosen) for f in fields})


def parse_levels(levels: Iterable[int] | int) -> tuple[int, ...]:
    out = (levels,) if isinstance(levels, int) else tuple(sorted(set(levels)))
    bad = [lv for lv in out if lv not in LEVELS]
    if not out or bad:
        raise InputError(f"finqa-lite levels must be among 1, 2, 3, 4; got {list(out)}")
    return out


class _Calls:
    """Builds assistant tool-call messages with sequential ids for worked examples."""

    def __init__(self, prefix: str):
        self.prefix, self.n = prefix, 0

    def call(self, name: str, arguments: dict[str, Any], result: str) -> list[Message]:
        self.n += 1
        call_id = f"{self.prefix}_{self.n}"
        fn = ToolCallFunction(name=name, arguments=json.dumps(arguments))
        return [
            Message(role="assistant", content=None, tool_calls=[ToolCall(id=call_id, function=fn)]),
            Message(role="tool", tool_call_id=call_id, name=name, content=result),
        ]


class FinqaLiteEnv(Environment):
    name = "finqa-lite"
    version = "1"

    def __init__(
        self,
        levels: Iterable[int] | int = LEVELS,
        seed: int = 0,
        *,
        n_companies: int = 240,
        counts: dict[str, int] | None = None,
        page_chars: int = 1500,
        limits: EnvLimits | None = None,
        tool_max_output_chars: int = 2000,
        shots: int | dict[int, int] | None = None,
    ):
        self.levels = parse_levels(levels)
        given = list(shots.values()) if isinstance(shots, dict) else [shots or 0]
        if min(given, default=0) < 0 or (isinstance(shots, dict) and not set(shots) <= set(LEVELS)):
            raise InputError(f"finqa-lite shots must be >= 0 (worked examples per level 1-4), got {shots}")
        # None: every worked example of the level (EXAMPLE_TEMPLATES); 0: a zero-shot prompt, for a policy that
        # has learned the task (the worked example is ~80 % of the tokens before a level-3 question, ~87 % at level 4);
        # a dict: per level (a level not named: all of its own), e.g. {1: 0, 2: 0, 3: 0, 4: 1}, the worked example
        # where a level is told apart from another only by it
        self.shots = shots
        self.seed = seed
        self.data = (
            FinqaLite(seed=seed, n_companies=n_companies, counts=counts)
            if counts
            else FinqaLite(seed=seed, n_companies=n_companies)
        )
        self._merged_limits = merged_limits(self.levels)
        self.limits = limits or self._merged_limits
        self.index = DocumentIndex(self.data.documents(), page_chars=page_chars)
        self.tool_max_output_chars = tool_max_output_chars
        self._examples: dict[int, list[Message]] = {}

    @classmethod
    def from_spec(cls, spec: EnvSpec, **kwargs: Any) -> FinqaLiteEnv:
        """``finqa-lite[:LEVELS][?shots=N[,LEVEL:N...]]``, e.g. ``finqa-lite:1,2?shots=0``."""
        if spec.arg:
            try:
                kwargs["levels"] = tuple(int(x) for x in spec.arg.split(","))
            except ValueError:
                raise spec.error("levels must be integers 1-4 separated by commas") from None
        shots = spec.known("shots").get("shots")
        if shots is not None:
            try:
                kwargs["shots"] = parse_shots(shots)
            except InputError as err:
                raise spec.error(str(err)) from None
        return cls(**kwargs)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tool_schemas(self) -> list[dict[str, Any]]:
        return _schemas(self.levels)

    def _level(self, task: Task) -> int | None:
        """The task's level when it is one this environment serves (then its episode is that level's)."""
        level = task.data.get("level")
        return level if isinstance(level, int) and level in self.levels else None

    # A task's episode is the same whatever levels the environment serves: the prompt (worked examples,
    # tools), the tools offered and the limits are its own level's, as `finqa-lite:LEVEL` gives them. So a
    # curriculum over `finqa-lite:1,2,3,4` trains on exactly the prompts each level is evaluated on.
    def task_tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        level = self._level(task)
        return self.tool_schemas() if level is None else _schemas((level,))

    def task_limits(self, task: Task) -> EnvLimits:
        """The task's level's limits, unless limits were given (to the constructor, or set on `limits`
        since): those apply to every task."""
        level = self._level(task)
        given = self.limits != self._merged_limits
        return self.limits if given or level is None else LEVEL_LIMITS[level]

    def initial_messages(self, task: Task) -> list[Message]:
        level = self._level(task)
        examples = self.few_shot() if level is None else self._level_examples(level)
        return [Message(role="system", content=self.system_prompt()), *examples, *task.messages]

    def tasks(self, split: str = "train") -> list[Task]:
        return self.data.tasks(split, self.levels)

    def start(self, task: Task) -> ToolboxEpisode:
        state = FinqaToolState(self.index)
        limits = self.task_limits(task)
        toolbox = finqa_toolbox(state, timeout_s=limits.tool_timeout_s, max_output_chars=self.tool_max_output_chars)
        offered = {s["function"]["name"] for s in self.task_tool_schemas(task)}
        return ToolboxEpisode(task, toolbox.only(offered), limits.max_tool_calls, state)

    def expert(self) -> FinqaExpert:
        """Solves any finqa-lite task from its gold data through the tools (`envs/finqa/expert.py`)."""
        return FinqaExpert()

    # ------------------------------------------------------------ worked examples

    def few_shot(self) -> list[Message]:
        """Worked examples of every level served (EXAMPLE_TEMPLATES, the first `shots` of each level's), on the
        company kept out of every split; tool outputs are real. A task's own prompt shows its level's only
        (`initial_messages`)."""
        return [m for level in self.levels for m in self._level_examples(level)]

    def _level_examples(self, level: int) -> list[Message]:
        if level not in self._examples:
            shots = self.shots.get(level) if isinstance(self.shots, dict) else self.shots
            templates = EXAMPLE_TEMPLATES[level][:shots]
            self._examples[level] = [m for template in templates for m in self._example(level, template)]
        return [m.model_copy(deep=True) for m in self._examples[level]]

    def _example(self, level: int, template: str) -> list[Message]:
        task = self.data.example_task(level, template)
        state = FinqaToolState(self.index)
        calls = _Calls(f"example{level}_{template}")
        messages = [task.messages[0].model_copy()]
        # level 4 as the expert does it: each report's own calculation once it is open, then their difference
        parts = report_programs(task.data) if level == DECOMPOSED_LEVEL and decomposes(task.data) else []
        results: list[str] = []
        if level >= 3:
            start = len(messages)
            for j, (company, year, doc_id) in enumerate(
                zip(task.data["companies"], task.data["years"], task.data["doc_ids"], strict=True)
            ):
                query = f"{company} {year}"
                messages += calls.call("search", {"query": query}, state.search(query))
                messages += calls.call("open", {"doc_id": doc_id}, state.open(doc_id))
                if parts:
                    results.append(state.calculate(parts[j]))
                    messages += calls.call("calculate", {"expression": parts[j]}, results[-1])
            messages[start].content = plan_text(task.data)  # the expert's first words (expert.plan_text)
        if parts:
            expression = difference_program(results[0], results[1])
            messages += calls.call("calculate", {"expression": expression}, state.calculate(expression))
            messages.append(Message(role="assistant", content=f"The answer is {messages[-1].text()}."))
            return messages
        program = task.data["program"]
        # infix arithmetic where the figures are in the prompt; the FinQA program form once documents are open
        expression = (program_to_infix(program) if level in CALCULATOR_ONLY_LEVELS else None) or program
        messages += calls.call("calculate", {"expression": expression}, state.calculate(expression))
        messages.append(Message(role="assistant", content=f"The answer is {answer_text(task.data['answer'])}."))
        return messages

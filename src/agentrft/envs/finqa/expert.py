"""The finqa-lite expert: solves a task from its gold data through the same tools a model uses.

It decides each turn from the task's gold data (`program`, `doc_ids`, `companies`, `years`,
`level`, `template`) and what the tools have returned so far:

* levels 1–2 (every figure in the prompt): `calculate` the gold program as infix arithmetic
  (the program form where it has no infix form), like the worked examples;
* levels 3–4, for each gold report in turn: `search` "<company> <year>" until its results list
  the report's doc_id (a second, longer query if the first misses; after that it opens the
  doc_id it knows), `open` it, and open the next page while a figure of the gold program that belongs to
  this report is not yet on a page shown; then `calculate` the gold program (FinQA form);
* finally answer "The answer is <the calculator's result>." (the gold answer only if the
  calculation failed, which the tests show does not happen on the shipped splits).

The worked examples of `FinqaLiteEnv.few_shot` follow the same steps, so a demonstration and
a prompt example read alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrft.envs.finqa.curriculum import answer_text, numbers_in
from agentrft.envs.finqa.program import parse_steps, program_to_infix, program_to_tokens
from agentrft.envs.finqa.templates import TEMPLATES_BY_NAME
from agentrft.types import Message, Task, ToolCall, ToolCallFunction

# Levels 1-2 put every figure in the prompt: the agent needs only the calculator, and a small
# model follows a short tool list far better (the env offers only `calculate` there).
CALCULATOR_ONLY_LEVELS = (1, 2)
MAX_SEARCHES_PER_REPORT = 2
_PAGE = re.compile(r"\[page (\d+) of (\d+)")


def search_query(company: str, year: int, attempt: int) -> str:
    """The expert's query for a report: "<company> <year>", then with "annual report" added."""
    return f"{company} {year}" if attempt == 0 else f"{company} annual report {year}"


def report_operands(data: Mapping[str, Any]) -> list[set[float]]:
    """Per gold report (in `doc_ids` order), the figures the gold program reads from it; `data` is a
    finqa-lite task's `data` (the grading item).

    A level-4 program is the first report's steps, then the second's, then their difference
    (`templates.compose_difference`); a template's operand arguments `o<i>` are the figures.
    """
    steps = parse_steps(program_to_tokens(str(data["program"])))
    template = TEMPLATES_BY_NAME[str(data["template"])]
    n = len(template.steps)
    out: list[set[float]] = []
    for j in range(len(data["doc_ids"])):
        figures: set[float] = set()
        for (_, a, b), step in zip(template.steps, steps[j * n : (j + 1) * n], strict=True):
            for token, arg in ((a, step.arg1), (b, step.arg2)):
                if token.startswith("o"):
                    figures.add(float(arg.replace(",", "")))
        out.append(figures)
    return out


@dataclass
class _Seen:
    """What the episode's tool results have shown so far."""

    queries: list[str] = field(default_factory=list)
    search_results: list[tuple[str, str]] = field(default_factory=list)  # (query, result) of those that worked
    pages: dict[str, dict[int, str]] = field(default_factory=dict)  # doc_id -> page -> text
    page_counts: dict[str, int] = field(default_factory=dict)
    calculation: str | None = None  # the last successful calculate result
    calculated: bool = False


def _args(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def read_turns(turns: list[Message]) -> _Seen:
    """Pair each tool call of the assistant turns with its tool message; errors count as not shown."""
    seen = _Seen()
    calls: dict[str, ToolCall] = {c.id: c for m in turns if m.role == "assistant" for c in m.tool_calls or []}
    for m in turns:
        if m.role != "tool" or m.tool_call_id not in calls:
            continue
        call, text = calls[m.tool_call_id], m.text()
        args = _args(call)
        ok = not text.startswith("Error")
        if call.function.name == "search":
            query = str(args.get("query", ""))
            seen.queries.append(query)
            if ok:
                seen.search_results.append((query, text))
        elif call.function.name == "open" and ok:
            doc_id = str(args.get("doc_id", ""))
            match = _PAGE.search(text)
            if match:
                seen.pages.setdefault(doc_id, {})[int(match.group(1))] = text
                seen.page_counts[doc_id] = int(match.group(2))
        elif call.function.name == "calculate":
            seen.calculated = True
            if ok:
                seen.calculation = text.strip()
    return seen


class FinqaExpert:
    """`envs.base.Expert` for finqa-lite (module docstring)."""

    def next_turn(self, task: Task, turns: list[Message]) -> Message:
        seen = read_turns(turns)
        data = task.data
        level = int(data["level"])
        if not seen.calculated:
            if level not in CALCULATOR_ONLY_LEVELS:
                step = self._report_step(task, seen)
                if step is not None:
                    return step
            program = str(data["program"])
            infix = program_to_infix(program) if level in CALCULATOR_ONLY_LEVELS else None
            return _call(len(turns), "calculate", {"expression": infix or program})
        value = seen.calculation if seen.calculation is not None else answer_text(data["answer"])
        return Message(role="assistant", content=f"The answer is {value}.")

    def _report_step(self, task: Task, seen: _Seen) -> Message | None:
        """The next search or open on the way to every gold figure, or None when all are shown."""
        data = task.data
        n = len(seen.queries) + sum(len(p) for p in seen.pages.values())
        for j, (doc_id, company, year) in enumerate(
            zip(data["doc_ids"], data["companies"], data["years"], strict=True)
        ):
            pages = seen.pages.get(doc_id, {})
            if not pages:
                asked = [search_query(company, year, a) for a in range(MAX_SEARCHES_PER_REPORT)]
                # a report's own search, as in the worked examples, even where another one listed it already
                listed = any(f"doc_id={doc_id} " in r for q, r in seen.search_results if q in asked)
                tried = sum(q in asked for q in seen.queries)
                if not listed and tried < MAX_SEARCHES_PER_REPORT:
                    return _call(n, "search", {"query": asked[tried]})
                return _call(n, "open", {"doc_id": doc_id})
            shown = set().union(*(numbers_in(text) for text in pages.values()))
            missing = report_operands(data)[j] - shown
            following = max(pages) + 1
            if missing and following <= seen.page_counts.get(doc_id, 0):
                return _call(n, "open", {"doc_id": doc_id, "page": following})
        return None


def _call(n: int, name: str, arguments: dict[str, Any]) -> Message:
    call = ToolCall(id=f"expert_{n + 1}", function=ToolCallFunction(name=name, arguments=json.dumps(arguments)))
    return Message(role="assistant", content=None, tool_calls=[call])

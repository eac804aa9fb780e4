"""The finqa-lite expert: solves a task from its gold data through the same tools a model uses.

It decides each turn from the task's gold data (`program`, `doc_ids`, `companies`, `years`,
`level`, `template`) and what the tools have returned so far:

* levels 1–2 (every figure in the prompt): `calculate` the gold program as infix arithmetic
  (the program form where it has no infix form), like the worked examples;
* levels 3–4, for each gold report in turn: `search` "<company> <year>" until its results list
  the report's doc_id (a second, longer query if the first misses; after that it opens the
  doc_id it knows), `open` it, and open the next page while a figure of the gold program that belongs to
  this report is not yet on a page shown; then, at level 3, `calculate` the gold program (FinQA form);
* level 4 works one report at a time: right after a report's figures are shown it `calculate`s that
  report's part of the gold program (`report_programs`: a level-3 calculation), and once both parts
  are known, `subtract(<first result>, <second result>)` with the calculator's results as written
  (where that rounding would miss the gold answer, `decomposes`, it writes the whole program at once).
  The five-step composition in one call is what a 135M model failed to write after imitation (it wrote
  one or two steps); the parts are the level-3 calculation it had learned;
* at levels 3–4 the first call carries the plan as its text, the reports the task needs
  (`plan_text`: "I need two reports: A's 2022 annual report and B's 2022 annual report."), so the
  turn after a report's calculation (answer, or look up the next report) can follow from the
  episode's own opening; without it a 135M policy imitated level 3 or level 4, not both;
* finally answer "The answer is <the calculator's last result>." (the gold answer only if a
  calculation failed, which the tests show does not happen on the shipped splits).

The worked examples of `FinqaLiteEnv.few_shot` follow the same steps, so a demonstration and
a prompt example read alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrft.envs.finqa.calc import CalcError, calculate
from agentrft.envs.finqa.curriculum import answer_text, numbers_in
from agentrft.envs.finqa.program import Step, parse_steps, program_to_infix, program_to_tokens
from agentrft.envs.finqa.templates import TEMPLATES_BY_NAME, render_steps
from agentrft.types import Message, Task, ToolCall, ToolCallFunction

# Levels 1-2 put every figure in the prompt: the agent needs only the calculator, and a small
# model follows a short tool list far better (the env offers only `calculate` there).
CALCULATOR_ONLY_LEVELS = (1, 2)
MAX_SEARCHES_PER_REPORT = 2
DECOMPOSED_LEVEL = 4  # one calculation per report, then their difference
_PAGE = re.compile(r"\[page (\d+) of (\d+)")


def search_query(company: str, year: int, attempt: int) -> str:
    """The expert's query for a report: "<company> <year>", then with "annual report" added."""
    return f"{company} {year}" if attempt == 0 else f"{company} annual report {year}"


def _report_steps(data: Mapping[str, Any]) -> list[list[Step]]:
    """The gold program's steps per gold report (in `doc_ids` order): a level-4 program is the first report's
    steps, then the second's, then their difference (`templates.compose_difference`)."""
    steps = parse_steps(program_to_tokens(str(data["program"])))
    n = len(TEMPLATES_BY_NAME[str(data["template"])].steps)
    return [steps[j * n : (j + 1) * n] for j in range(len(data["doc_ids"]))]


def report_operands(data: Mapping[str, Any]) -> list[set[float]]:
    """Per gold report (in `doc_ids` order), the figures the gold program reads from it; `data` is a
    finqa-lite task's `data` (the grading item). A template's operand arguments `o<i>` are the figures."""
    template = TEMPLATES_BY_NAME[str(data["template"])]
    out: list[set[float]] = []
    for part in _report_steps(data):
        figures: set[float] = set()
        for (_, a, b), step in zip(template.steps, part, strict=True):
            for token, arg in ((a, step.arg1), (b, step.arg2)):
                if token.startswith("o"):
                    figures.add(float(arg.replace(",", "")))
        out.append(figures)
    return out


def report_programs(data: Mapping[str, Any]) -> list[str]:
    """Per gold report (in `doc_ids` order), its part of a level-4 gold program as a program of its own
    (step references re-based to 0): the parts `templates.compose_difference` joined."""
    out: list[str] = []
    for part in _report_steps(data):
        shift = len(part) * len(out)

        def arg(text: str, shift: int = shift) -> str:
            return f"#{int(text[1:]) - shift}" if text.startswith("#") else text

        out.append(render_steps([(s.op, arg(s.arg1), arg(s.arg2)) for s in part]))
    return out


def difference_program(first: str, second: str) -> str:
    """The last calculation of a per-report level-4 solution: the two parts' results as the calculator showed them."""
    return f"subtract({first}, {second})"


def decomposes(data: Mapping[str, Any]) -> bool:
    """True when the per-report calculations and their difference, each rounded as the calculator shows it,
    give the gold answer to 0.1%. 11 of the 420 level-4 tasks of seed 0 do not (one misses even the grader's 1%:
    0.18413 - 0.18315 = 0.00098, gold 0.00099); there the expert writes the whole program at once."""
    try:
        first, second = (calculate(part) for part in report_programs(data))
        value = float(calculate(difference_program(first, second)))
    except (CalcError, ValueError):
        return False
    return math.isclose(value, float(data["answer"]), rel_tol=1e-3, abs_tol=1e-9)


@dataclass
class _Seen:
    """What the episode's tool results have shown so far."""

    queries: list[str] = field(default_factory=list)
    search_results: list[tuple[str, str]] = field(default_factory=list)  # (query, result) of those that worked
    pages: dict[str, dict[int, str]] = field(default_factory=dict)  # doc_id -> page -> text
    page_counts: dict[str, int] = field(default_factory=dict)
    calculations: list[str | None] = field(default_factory=list)  # each calculate's result, None if it failed


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
            seen.calculations.append(text.strip() if ok else None)
    return seen


class FinqaExpert:
    """`envs.base.Expert` for finqa-lite (module docstring)."""

    def next_turn(self, task: Task, turns: list[Message]) -> Message:
        message = self._next_turn(task, turns)
        first = not any(m.tool_calls for m in turns if m.role == "assistant")
        if first and message.tool_calls and int(task.data["level"]) not in CALCULATOR_ONLY_LEVELS:
            message.content = plan_text(task.data)
        return message

    def _next_turn(self, task: Task, turns: list[Message]) -> Message:
        seen = read_turns(turns)
        data = task.data
        level = int(data["level"])
        results = [c for c in seen.calculations if c is not None]
        failed = len(results) < len(seen.calculations)
        if level == DECOMPOSED_LEVEL and not failed and decomposes(data):
            n = sum(len(m.tool_calls or []) for m in turns if m.role == "assistant")  # call ids stay unique
            parts = report_programs(data)
            for j in range(len(parts)):
                step = self._report_step(task, seen, reports=j + 1, n=n)
                if step is not None:
                    return step
                if len(seen.calculations) == j:
                    return _call(n, "calculate", {"expression": parts[j]})
            if len(results) == len(parts):
                return _call(n, "calculate", {"expression": difference_program(*results)})
        elif not seen.calculations:
            if level not in CALCULATOR_ONLY_LEVELS:
                step = self._report_step(task, seen)
                if step is not None:
                    return step
            program = str(data["program"])
            infix = program_to_infix(program) if level in CALCULATOR_ONLY_LEVELS else None
            return _call(len(turns), "calculate", {"expression": infix or program})
        value = results[-1] if results and not failed else answer_text(data["answer"])
        return Message(role="assistant", content=f"The answer is {value}.")

    def _report_step(self, task: Task, seen: _Seen, reports: int | None = None, n: int | None = None) -> Message | None:
        """The next search or open on the way to every gold figure of the first `reports` gold reports
        (all by default), or None when all are shown; `n` numbers the call (default: searches + pages)."""
        data = task.data
        if n is None:
            n = len(seen.queries) + sum(len(p) for p in seen.pages.values())
        for j, (doc_id, company, year) in enumerate(
            zip(data["doc_ids"][:reports], data["companies"], data["years"], strict=False)
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


def plan_text(data: Mapping[str, Any]) -> str:
    """The expert's first words at levels 3-4: the reports it needs, so the turn after a report's calculation
    (answer, or look up the next report) follows from the episode's own opening, not from a question far back."""
    reports = [f"{c}'s {y} annual report" for c, y in zip(data["companies"], data["years"], strict=True)]
    if len(reports) == 1:
        return f"I need one report: {reports[0]}."
    if len(reports) == 2:
        return f"I need two reports: {reports[0]} and {reports[1]}."
    raise ValueError(f"a finqa-lite task names one or two reports, this one {len(reports)}")


def _call(n: int, name: str, arguments: dict[str, Any]) -> Message:
    call = ToolCall(id=f"expert_{n + 1}", function=ToolCallFunction(name=name, arguments=json.dumps(arguments)))
    return Message(role="assistant", content=None, tool_calls=[call])

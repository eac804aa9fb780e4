"""`finqa_process`: credit for the steps of a finqa-lite episode that mattered, one reward per assistant turn.

The item is the finqa-lite task's `data` (gold `program`, `doc_ids`, `template`, `level`). The
milestones of a task are: for each gold report (levels 3–4 only; levels 1–2 have the figures in
the prompt), *retrieving* it and *reading* its figures; and a *calculation* on the gold figures.
Each tool call of turn k adds to ``turn_rewards[k]``:

| call | reward |
| --- | --- |
| `search` whose results list a gold report's doc_id, the first search to list it | `retrieved` per such report |
| `open` of a gold report showing figures the gold program reads from it (`envs/finqa/expert.report_operands`) | `opened` × the share of that report's figures this page shows first |
| successful `calculate` | `calculation` × the share of the gold figures it is the first calculation to write |
| malformed call (unreadable text, unknown tool, bad arguments) | `malformed` (a penalty) |
| any other failed call (no such document, calculator error, past the budget, timeout) | `tool_error` |

A level-4 episode may calculate each report's part on its own, then their difference (as the expert does,
`envs/finqa/expert.py`): each part's calculation is paid for its report's figures, the difference (written
with the parts' results, no gold figure) for nothing. Every milestone pays once, by shares, so repeating a
good call earns nothing and a long episode
cannot collect more than a short one that reaches the same milestones; the final-answer turn
earns `answer_turn` (the outcome is the outcome grader's), and the first one after every milestone is
reached earns `answer_when_done` besides: the turn after a report's calculation is where level 3 answers and
level 4 goes on to its second report, and without this credit only level 4's side of that decision is paid
(the second report's search), so RL on both pushed every level towards going on (docs/agentic.md). With
``done_needs_result`` the work is done only once a calculation's result is the gold answer: otherwise half a
program that writes every gold figure (``subtract(a, b)`` for a percentage change) reaches every milestone, and
GRPO on level 3 learned exactly that (docs/benchmarks.md). The
scalar reward is the sum of the turn rewards divided by the milestones' total (`retrieved` + `opened` per
gold report, plus `calculation` and `answer_when_done`): 1.0 when every milestone is reached without a
penalty and the answer follows. Use it alone, or beside
the outcome grader in `multi` (whose turn rewards are summed) with ``algorithm.turn_level``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.types import ToolCallEvent, Trajectory

_MALFORMED = {"malformed", "unknown_tool", "bad_arguments"}
_REFERENCES = re.compile(r"#\d+|const_[\w]+")  # step references and constants are not figures
DOCUMENT_LEVELS = (3, 4)


class FinqaProcessSpec(SpecBase):
    type: Literal["finqa_process"]
    retrieved: float = Field(default=1.0, ge=0, description="a search that lists a gold report (once per report)")
    opened: float = Field(default=1.0, ge=0, description="opening a gold report's figures (shared over its pages)")
    calculation: float = Field(default=1.0, ge=0, description="a calculation on the gold figures (by share)")
    malformed: float = Field(default=-1.0, le=0, description="per malformed call")
    tool_error: float = Field(default=-0.5, le=0, description="per other failed call")
    answer_turn: float = Field(default=0.0, description="every turn without a tool call (the final answer's)")
    answer_when_done: float = Field(
        default=0.0,
        ge=0,
        description="the first turn without a tool call once every milestone is reached: answering when the work is "
        "done, and not before (level 3 answers after its report's calculation, level 4 goes on to the second report)",
    )
    done_needs_result: bool = Field(
        default=False,
        description="the work is done only once a calculation's result is the gold answer (within 1 %): without it, "
        "a half or wrong program that writes every gold figure (subtract(a, b) for a percentage change) reaches "
        "every milestone, and answer_when_done pays for answering its wrong number",
    )


def expression_figures(expression: str) -> set[float]:
    """The numbers an arithmetic expression or FinQA program writes (`#k` and `const_*` left out)."""
    from agentrft.envs.finqa.curriculum import numbers_in  # the finqa env loads with the grader's first use

    return numbers_in(_REFERENCES.sub(" ", expression))


class _Milestones:
    """What the episode has reached so far, and what each new call adds."""

    def __init__(self, item: dict[str, Any], spec: FinqaProcessSpec) -> None:
        from agentrft.envs.finqa.expert import report_operands

        try:
            level = int(item["level"])
            figures = report_operands(item)
            doc_ids = [str(d) for d in item["doc_ids"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GraderFailure(
                "invalid_variable_error", f"item is not a finqa-lite task's data ({type(exc).__name__}: {exc})"
            ) from None
        self.spec = spec
        self.reports = dict(zip(doc_ids, figures, strict=True)) if level in DOCUMENT_LEVELS else {}
        self.all_figures: set[float] = set().union(*figures) if figures else set()
        self.retrieved: set[str] = set()
        self.shown: dict[str, set[float]] = {d: set() for d in self.reports}
        self.written: set[float] = set()  # gold figures written by successful calculations so far
        answer = item.get("answer")
        self.answer = float(answer) if isinstance(answer, int | float) else None  # yes/no answers: never computed
        self.computed = False  # a successful calculation's result was the gold answer

    @property
    def calculated(self) -> float:
        """The share of the gold figures that successful calculations have written."""
        return len(self.written) / len(self.all_figures) if self.all_figures else 0.0

    @property
    def total(self) -> float:
        s = self.spec
        return len(self.reports) * (s.retrieved + s.opened) + s.calculation + s.answer_when_done

    @property
    def done(self) -> bool:
        """Every milestone reached: each gold report listed and all its figures shown, every gold figure written
        (and, with ``done_needs_result``, the gold answer computed)."""
        shown = all(self.shown[d] >= figures for d, figures in self.reports.items())
        computed = self.computed or not self.spec.done_needs_result
        return self.retrieved == set(self.reports) and shown and self.written >= self.all_figures and computed

    def reward(self, e: ToolCallEvent) -> float:
        s = self.spec
        if e.error is not None:
            return s.malformed if e.error_kind in _MALFORMED else s.tool_error
        args = e.arguments if isinstance(e.arguments, dict) else {}
        text = e.result or ""
        if e.name == "search":
            listed = {d for d in self.reports if f"doc_id={d} " in text} - self.retrieved
            self.retrieved |= listed
            return s.retrieved * len(listed)
        if e.name == "open":
            doc = gold_doc_id(str(args.get("doc_id", "")), self.reports)
            if doc is None or not self.reports[doc]:
                return 0.0
            from agentrft.envs.finqa.curriculum import numbers_in

            new = (numbers_in(text) & self.reports[doc]) - self.shown[doc]
            self.shown[doc] |= new
            return s.opened * len(new) / len(self.reports[doc])
        if e.name == "calculate" and self.all_figures:
            new = (expression_figures(str(args.get("expression", ""))) & self.all_figures) - self.written
            self.written |= new
            self.computed = self.computed or self._is_answer(text)
            return s.calculation * len(new) / len(self.all_figures)
        return 0.0

    def _is_answer(self, result: str) -> bool:
        """Whether a calculator's result (one number, `calc.format_number`) is the gold answer (1 % relative
        tolerance, as the outcome's)."""
        from agentrft.envs.finqa.program import str_to_num

        value = str_to_num(result.strip())
        if value is None or self.answer is None:
            return False
        return math.isclose(value, self.answer, rel_tol=0.01, abs_tol=1e-9)


def gold_doc_id(doc_id: str, gold: Iterable[str]) -> str | None:
    """The gold doc_id that `open` resolved `doc_id` to (it matches case-insensitively), or None."""
    key = doc_id.strip().lower()
    return next((d for d in gold if d.lower() == key), None)


def turn_count(traj: Trajectory) -> int:
    """Assistant turns of the episode (a turn is counted even where its events are missing)."""
    last_event_turn = max((e.turn for e in traj.tool_calls), default=-1)
    return max(traj.num_turns, last_event_turn + 1)


@register_grader("finqa_process")
class FinqaProcessGrader(Grader):
    """Per-turn process rewards for finqa-lite (module docstring)."""

    Spec = FinqaProcessSpec

    def __init__(self, name: str, spec: FinqaProcessSpec) -> None:
        super().__init__(name, spec.pass_threshold, max_reward=1.0)
        self.spec = spec

    @classmethod
    def build(cls, spec: FinqaProcessSpec, where: str, options: LoadOptions) -> FinqaProcessGrader:
        return cls(spec.name or "finqa_process", spec)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        traj = sample.trajectory
        if traj is None:
            raise GraderFailure("sample_parse_error", f"{self.name} needs a trajectory (tool calls), got a sample")
        milestones = _Milestones(item, self.spec)
        turns = [0.0] * turn_count(traj)
        calls: dict[int, list[ToolCallEvent]] = {}
        for e in traj.tool_calls:
            calls.setdefault(e.turn, []).append(e)
        paid_done = False
        for k in range(len(turns)):  # in turn order, so "done" is what the turns before k reached
            if k in calls:
                turns[k] = sum(milestones.reward(e) for e in calls[k])
                continue
            turns[k] = self.spec.answer_turn
            if milestones.done and not paid_done:
                turns[k] += self.spec.answer_when_done
                paid_done = True
        value = sum(turns) / milestones.total if milestones.total > 0 else 0.0
        detail = {"retrieved": sorted(milestones.retrieved), "calculated_share": milestones.calculated}
        return Score(value, turn_rewards=turns, metadata={"milestones": detail})

"""Graders of how an agent worked, read from its trajectory (tool calls, turns, tokens).

- `answered`: 1 when the episode ended with a non-empty final answer.
- `tool_called`: 1 when tool `tool` (any tool when `tool` is not given) was called at least `min_calls` times
  (successful ones only if `successful`). Capped at 1: repeating a call never earns more.
- `tool_arguments_match`: 1 when some call of `tool` has every expected argument (values templated,
  compared after JSON normalisation; strings case-insensitively if `ignore_case`).
- `no_tool_errors`: 1 when no tool call failed (`mode: all`), or the fraction that succeeded (`fraction`);
  1 when there were no calls.
- `within_tool_budget`: 1 when the number of calls (of `tool`, or all) is at most `max_calls`.
- `efficiency`: a penalty ≤ 0 for tool calls past `free_tool_calls` and completion tokens past
  `token_budget`, capped at `max_penalty`; meant to be added to an outcome reward in `multi`.
  Its best value is 0, so `success` means "no penalty".
- `tool_process` (process reward): one reward per assistant turn in `Grade.turn_rewards`. A turn
  with tool calls earns `good` when every call in it was well-formed and succeeded and none repeats
  an earlier call (same name + arguments), else `bad`; the final-answer turn earns `answer_turn`.
  The scalar reward is the mean over tool-call turns (1.0 when there were none), so farming
  repeated calls cannot raise it.

These graders need a trajectory; given a plain sample they fall back to its `output_tools` where
that is enough (`tool_called`, `tool_arguments_match`, `within_tool_budget`) and otherwise flag
`sample_parse_error`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.graders.template import Template, compile_template
from agentrft.types import ModelCallEvent, ToolCallEvent

_MALFORMED = {"malformed", "unknown_tool", "bad_arguments"}


def _calls(sample: Sample, needs_results: bool, grader: str) -> list[tuple[str, Any, bool]]:
    """(name, parsed arguments, succeeded) per tool call."""
    if sample.trajectory is not None:
        return [(e.name, e.arguments, e.error is None) for e in sample.trajectory.tool_calls]
    if needs_results:
        raise GraderFailure("sample_parse_error", f"{grader} needs a trajectory (tool results), got a plain sample")
    out = []
    for tc in sample.output_tools:
        fn = tc.get("function", {}) if isinstance(tc, dict) else {}
        out.append((str(fn.get("name", "")), _parse_args(fn.get("arguments")), True))
    return out


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _norm(v: Any, ignore_case: bool) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return s.casefold() if ignore_case else s
    if isinstance(v, list):
        return [_norm(x, ignore_case) for x in v]
    if isinstance(v, dict):
        return {k: _norm(x, ignore_case) for k, x in v.items()}
    return v


class _Simple(Grader):
    def __init__(self, name: str, pass_threshold: float | None, max_reward: float = 1.0) -> None:
        super().__init__(name, pass_threshold, max_reward)


class AnsweredSpec(SpecBase):
    type: Literal["answered"]


@register_grader("answered")
class AnsweredGrader(_Simple):
    Spec = AnsweredSpec

    @classmethod
    def build(cls, spec: AnsweredSpec, where: str, options: LoadOptions) -> AnsweredGrader:
        return cls(spec.name or "answered", spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        return Score(1.0 if sample.output_text.strip() else 0.0)


class ToolCalledSpec(SpecBase):
    type: Literal["tool_called"]
    tool: str | None = None  # None: any tool (with `successful`, any tool the episode offered and ran)
    min_calls: int = Field(default=1, ge=1)
    successful: bool = False


@register_grader("tool_called")
class ToolCalledGrader(_Simple):
    Spec = ToolCalledSpec

    def __init__(
        self, name: str, tool: str | None, min_calls: int, successful: bool, pass_threshold: float | None
    ) -> None:
        super().__init__(name, pass_threshold)
        self.tool, self.min_calls, self.successful = tool, min_calls, successful

    @classmethod
    def build(cls, spec: ToolCalledSpec, where: str, options: LoadOptions) -> ToolCalledGrader:
        return cls(spec.name or "tool_called", spec.tool, spec.min_calls, spec.successful, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        n = sum(
            1
            for name, _, ok in _calls(sample, self.successful, self.name)
            if (self.tool is None or name == self.tool) and (ok or not self.successful)
        )
        return Score(1.0 if n >= self.min_calls else 0.0)


class ToolArgsSpec(SpecBase):
    type: Literal["tool_arguments_match"]
    tool: str
    arguments: dict[str, Any]
    ignore_case: bool = False


@register_grader("tool_arguments_match")
class ToolArgumentsMatchGrader(_Simple):
    Spec = ToolArgsSpec

    def __init__(
        self,
        name: str,
        tool: str,
        arguments: dict[str, Any],
        ignore_case: bool,
        where: str,
        pass_threshold: float | None,
    ) -> None:
        super().__init__(name, pass_threshold)
        self.tool, self.ignore_case = tool, ignore_case
        pre = f"{where}." if where else ""
        self.expected: dict[str, Template | Any] = {
            k: compile_template(v, f"{pre}arguments.{k}") if isinstance(v, str) else v for k, v in arguments.items()
        }

    @classmethod
    def build(cls, spec: ToolArgsSpec, where: str, options: LoadOptions) -> ToolArgumentsMatchGrader:
        return cls(
            spec.name or "tool_arguments_match", spec.tool, spec.arguments, spec.ignore_case, where, spec.pass_threshold
        )

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        want = {
            k: _norm(v.value(sample, item) if isinstance(v, Template) else v, self.ignore_case)
            for k, v in self.expected.items()
        }
        for name, args, _ in _calls(sample, False, self.name):
            if name != self.tool or not isinstance(args, dict):
                continue
            if all(k in args and _norm(args[k], self.ignore_case) == v for k, v in want.items()):
                return Score(1.0)
        return Score(0.0)


class NoToolErrorsSpec(SpecBase):
    type: Literal["no_tool_errors"]
    mode: Literal["all", "fraction"] = "all"


@register_grader("no_tool_errors")
class NoToolErrorsGrader(_Simple):
    Spec = NoToolErrorsSpec

    def __init__(self, name: str, mode: str, pass_threshold: float | None) -> None:
        super().__init__(name, pass_threshold)
        self.mode = mode

    @classmethod
    def build(cls, spec: NoToolErrorsSpec, where: str, options: LoadOptions) -> NoToolErrorsGrader:
        return cls(spec.name or "no_tool_errors", spec.mode, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        calls = _calls(sample, True, self.name)
        if not calls:
            return Score(1.0)
        ok = sum(1 for _, _, good in calls if good)
        return Score(ok / len(calls) if self.mode == "fraction" else float(ok == len(calls)))


class BudgetSpec(SpecBase):
    type: Literal["within_tool_budget"]
    max_calls: int = Field(ge=0)
    tool: str | None = None


@register_grader("within_tool_budget")
class WithinToolBudgetGrader(_Simple):
    Spec = BudgetSpec

    def __init__(self, name: str, max_calls: int, tool: str | None, pass_threshold: float | None) -> None:
        super().__init__(name, pass_threshold)
        self.max_calls, self.tool = max_calls, tool

    @classmethod
    def build(cls, spec: BudgetSpec, where: str, options: LoadOptions) -> WithinToolBudgetGrader:
        return cls(spec.name or "within_tool_budget", spec.max_calls, spec.tool, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        n = sum(1 for name, _, _ in _calls(sample, False, self.name) if self.tool is None or name == self.tool)
        return Score(1.0 if n <= self.max_calls else 0.0, metadata={"tool_calls": n})


class EfficiencySpec(SpecBase):
    type: Literal["efficiency"]
    per_tool_call: float = Field(default=0.0, ge=0)
    free_tool_calls: int = Field(default=0, ge=0)
    per_token: float = Field(default=0.0, ge=0)
    token_budget: int = Field(default=0, ge=0)
    max_penalty: float = Field(default=1.0, ge=0)


@register_grader("efficiency")
class EfficiencyGrader(Grader):
    Spec = EfficiencySpec

    def __init__(self, name: str, spec: EfficiencySpec) -> None:
        super().__init__(name, spec.pass_threshold, max_reward=0.0)
        self.spec = spec

    @classmethod
    def build(cls, spec: EfficiencySpec, where: str, options: LoadOptions) -> EfficiencyGrader:
        return cls(spec.name or "efficiency", spec)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        s = self.spec
        calls = len(_calls(sample, False, self.name))
        tokens = 0
        if sample.trajectory is not None:
            tokens = sum(e.completion_tokens for e in sample.trajectory.events if isinstance(e, ModelCallEvent))
        penalty = s.per_tool_call * max(0, calls - s.free_tool_calls) + s.per_token * max(0, tokens - s.token_budget)
        return Score(-min(penalty, s.max_penalty), metadata={"tool_calls": calls, "completion_tokens": tokens})


class ProcessSpec(SpecBase):
    type: Literal["tool_process"]
    good: float = 1.0
    bad: float = 0.0
    answer_turn: float = 0.0


@register_grader("tool_process")
class ToolProcessGrader(Grader):
    Spec = ProcessSpec

    def __init__(self, name: str, good: float, bad: float, answer_turn: float, pass_threshold: float | None) -> None:
        super().__init__(name, pass_threshold, max_reward=good)
        self.good, self.bad, self.answer_turn = good, bad, answer_turn

    @classmethod
    def build(cls, spec: ProcessSpec, where: str, options: LoadOptions) -> ToolProcessGrader:
        return cls(spec.name or "tool_process", spec.good, spec.bad, spec.answer_turn, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        traj = sample.trajectory
        if traj is None:
            raise GraderFailure("sample_parse_error", f"{self.name} needs a trajectory, got a plain sample")
        by_turn: dict[int, list[ToolCallEvent]] = {}
        for e in traj.tool_calls:
            by_turn.setdefault(e.turn, []).append(e)
        seen: set[str] = set()
        turns: list[float] = []
        tool_turn_rewards: list[float] = []
        n_turns = max(traj.num_turns, max(by_turn, default=-1) + 1)
        for t in range(n_turns):
            events = by_turn.get(t)
            if not events:
                turns.append(self.answer_turn)
                continue
            good = True
            for e in events:
                key = e.name + "\x00" + json.dumps(e.arguments, sort_keys=True, default=str)
                if e.error is not None or e.error_kind in _MALFORMED or key in seen:
                    good = False
                seen.add(key)
            r = self.good if good else self.bad
            turns.append(r)
            tool_turn_rewards.append(r)
        value = sum(tool_turn_rewards) / len(tool_turn_rewards) if tool_turn_rewards else self.good
        return Score(value, turn_rewards=turns)

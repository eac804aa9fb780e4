"""Composite graders: `multi` (spec: named sub-graders + formula) and `combine` (Python API: weights).

Shared rules (documented):
- Every sub-grader runs (concurrently when async). `sub_rewards[key]` is its
  reward, or None when it errored.
- If any sub-grader errored, the composite reward is 0 **with** the sub-grader's
  flag(s) (grader = the sub-grader's key): never a silent average.
- `turn_rewards` of sub-graders that give them are summed element-wise
  (multi) or weighted (combine); shorter lists are padded with 0.
- Default success: reward ≥ 1.0 for `multi` (set `pass_threshold` otherwise);
  for `combine`, reward ≥ Σ weight·max_reward over positive weights.

Python API::

    def acc(sample, item):            # float, or None = "cannot grade this" (flagged, not 0)
        return float(sample.output_text.strip() == item["answer"])
    grader = combine({"acc": (acc, 0.8), "fmt": (load_grader(fmt_spec), 0.2)})
    grade = grader.grade({"output_text": "42"}, {"answer": "42"})
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.formula import Formula
from agentrft.graders.registry import LoadOptions, SpecBase, build_grader, register_grader
from agentrft.types import GradeError

GradeFn = Callable[[Sample, dict[str, Any]], float | None]


class _Composite(Grader):
    def __init__(self, name: str, parts: dict[str, Grader], pass_threshold: float | None, max_reward: float) -> None:
        super().__init__(name, pass_threshold, max_reward)
        self.parts = parts

    @property
    def is_async(self) -> bool:  # type: ignore[override]
        return any(g.is_async for g in self.parts.values())

    def _value(self, values: dict[str, float]) -> float:
        raise NotImplementedError

    def _turn_weight(self, key: str) -> float:
        return 1.0

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        if self.is_async:
            return super().score(sample, item)
        return self._merge({k: g.safe_score(sample, item) for k, g in self.parts.items()})

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        keys = list(self.parts)
        scores = await asyncio.gather(*(self.parts[k].safe_ascore(sample, item) for k in keys))
        return self._merge(dict(zip(keys, scores, strict=True)))

    def _merge(self, scores: dict[str, Score]) -> Score:
        errors: list[GradeError] = []
        sub: dict[str, float | None] = {}
        for k, s in scores.items():
            if s.errors:
                errors.extend(s.errors)
                sub[k] = None
            else:
                sub[k] = s.value
        turn_lists = [(k, s.turn_rewards) for k, s in scores.items() if s.turn_rewards is not None and not s.errors]
        turns = None
        if turn_lists:
            n = max(len(t) for _, t in turn_lists)
            turns = [sum(self._turn_weight(k) * (t[i] if i < len(t) else 0.0) for k, t in turn_lists) for i in range(n)]
        meta = {k: s.metadata for k, s in scores.items() if s.metadata}
        if errors:
            return Score(0.0, errors, sub, turns, meta or None)
        try:
            value = self._value({k: v for k, v in sub.items() if v is not None})
        except (ArithmeticError, ValueError, TypeError) as e:
            err = GradeError(flag="other_error", grader=self.name, message=f"formula evaluation failed: {e}")
            return Score(0.0, [err], sub, turns, meta or None)
        return Score(value, None, sub, turns, meta or None)


class MultiSpec(SpecBase):
    type: Literal["multi"]
    graders: dict[str, dict[str, Any]]
    calculate_output: str


@register_grader("multi")
class MultiGrader(_Composite):
    """Named sub-graders combined by a safe formula (`agentrft.graders.formula`). No nested multi."""

    Spec = MultiSpec

    def __init__(self, name: str, parts: dict[str, Grader], formula: Formula, pass_threshold: float | None) -> None:
        super().__init__(name, parts, pass_threshold, 1.0)
        self.formula = formula

    @classmethod
    def build(cls, spec: MultiSpec, where: str, options: LoadOptions) -> MultiGrader:
        pre = f"{where}." if where else ""
        if not spec.graders:
            from agentrft.graders.base import GraderSpecError

            raise GraderSpecError(f"{pre}graders", "needs at least one sub-grader")
        parts: dict[str, Grader] = {}
        for key, sub in spec.graders.items():
            g = build_grader(sub, f"{pre}graders.{key}", options, allow_multi=False)
            g.name = key  # sub-rewards and error records are keyed by the formula's names
            parts[key] = g
        formula = Formula(spec.calculate_output, parts, f"{pre}calculate_output")
        return cls(spec.name or "multi", parts, formula, spec.pass_threshold)

    def _value(self, values: dict[str, float]) -> float:
        return self.formula.evaluate(values)


class FunctionGrader(Grader):
    """A plain function `fn(sample, item) -> float | None` as a grader.

    None means "this sample cannot be graded" → flagged `sample_parse_error`
    (not a 0). A non-number or non-finite return is `other_error`.
    """

    def __init__(
        self, fn: GradeFn, name: str | None = None, pass_threshold: float | None = None, max_reward: float = 1.0
    ) -> None:
        fn_name = getattr(fn, "__name__", None)  # a callable object or a partial has no __name__
        super().__init__(name or (fn_name if isinstance(fn_name, str) else "function"), pass_threshold, max_reward)
        self.fn = fn

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        out = self.fn(sample, item)
        if out is None:
            raise GraderFailure("sample_parse_error", f"{self.name} returned None (sample not gradable)")
        if isinstance(out, bool) or not isinstance(out, (int, float)) or not math.isfinite(out):
            raise GraderFailure("other_error", f"{self.name} returned {out!r}, expected a finite float")
        return Score(float(out))


class WeightedGrader(_Composite):
    """Σ weight·reward over named parts; see `combine`."""

    def __init__(
        self, parts: dict[str, Grader], weights: dict[str, float], name: str, pass_threshold: float | None
    ) -> None:
        best = sum(w * parts[k].max_reward for k, w in weights.items() if w > 0)
        super().__init__(name, parts, pass_threshold, best)
        self.weights = weights

    def _value(self, values: dict[str, float]) -> float:
        return sum(self.weights[k] * v for k, v in values.items())

    def _turn_weight(self, key: str) -> float:
        return self.weights[key]


def combine(
    parts: Mapping[str, tuple[GradeFn | Grader, float]], *, name: str = "combined", pass_threshold: float | None = None
) -> WeightedGrader:
    """Weighted sum of functions and/or graders: `combine({"acc": (fn, 0.8), "fmt": (g, 0.2)})`."""
    if not parts:
        raise ValueError("combine() needs at least one part")
    graders: dict[str, Grader] = {}
    weights: dict[str, float] = {}
    for key, (g, w) in parts.items():
        if isinstance(g, Grader):
            g.name = key
            graders[key] = g
        elif callable(g):
            graders[key] = FunctionGrader(g, key)
        else:
            raise TypeError(f"combine: part {key!r} is neither a Grader nor a function")
        weights[key] = float(w)
    return WeightedGrader(graders, weights, name, pass_threshold)

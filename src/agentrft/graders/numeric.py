"""Numeric answers: `numeric` (free-text number match) and `finqa_program` (FinQA execution accuracy).

Which number is the answer (`extract_answer`): the content of the last
`\\boxed{…}` if any; else the first number after the last "answer is" /
"answer:" / "final answer"; else the last number in the text. Understood:
thousands separators (`1,234.5`), `$ € £ ¥`, unicode minus, parenthesised
negatives `(123)` → -123, `%`/"percent", scale words `thousand million billion
trillion bn mn` and attached `k/M/B` (`$5M`). Words inside identifiers (`Q3`,
`FY2019`) are not numbers.

Match rule (documented, SPECS §2 "numeric match"): with `rel_tol` (default
1e-2, which accepts rounding to three significant figures) and `abs_tol`
(default 1e-9), the answer matches when any pair of candidate values is close:

- the answer's candidates are `{x}`; with a `%` sign `{x/100, x}` (a fraction
  reference or a reference in percent points); with a scale word
  `{x·scale, x}` (the reference may be in the table's units);
- the reference's candidates are `{r}`; a string reference with a `%` sign
  gives `{r/100, r}`.
A bare number is never rescaled against a bare reference: `0.0164` does not
match `1.64`, and `1200000` does not match `1.2`. Each unit the answer *states*
buys one alternative reading, so an answer cannot get extra shots by omitting
units. References "yes"/"no" (FinQA `greater`) compare with the last yes/no
word of the answer.

An empty answer or one with no number scores 0 (a wrong answer, not an error);
a reference that is not a number is a dataset fault: `other_error`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, NamedTuple

from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.graders.template import compile_template

_SCALES = {
    "thousand": 1e3,
    "k": 1e3,
    "million": 1e6,
    "mn": 1e6,
    "m": 1e6,
    "billion": 1e9,
    "bn": 1e9,
    "b": 1e9,
    "trillion": 1e12,
}
_NUMBER = re.compile(
    r"""(?<![\w.])
    (?P<open>\(\s*)?
    (?P<sign>[-+\u2212])?\s?
    (?P<cur>[$\u20ac\u00a3\u00a5])?\s?
    (?P<sign2>[-+\u2212])?
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)
    (?=[kKmMbB]\b|\W|$)
    (?:\s?(?P<pct>%|percent\b|per\s?cent\b))?
    (?:\s?(?P<scale>thousand|million|billion|trillion|bn|mn)\b|(?P<short>[kKmMbB])\b)?
    (?:\s?(?P<pct2>%))?
    (?P<close>\s*\))?""",
    re.X | re.I,
)
_MARKER = re.compile(r"(?:final\s+answer|answer\s+is|answer\s*[:=])", re.I)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_YESNO = re.compile(r"\b(yes|no)\b", re.I)


class Number(NamedTuple):
    value: float
    percent: bool = False
    scale: float = 1.0


def _to_number(m: re.Match[str]) -> Number:
    opening, sign, sign2, num, pct, scale_word, short, pct2, close = m.group(
        "open", "sign", "sign2", "num", "pct", "scale", "short", "pct2", "close"
    )
    value = float(num.replace(",", "")) if "," in num else float(num)
    neg = (sign or sign2 or "") in ("-", "\u2212")
    if opening and close:
        neg = not neg  # accounting negative: (123) = -123
    scale = 1.0
    if scale_word:
        scale = _SCALES[scale_word.lower()]
    elif short:
        scale = _SCALES[short.lower()]
    return Number(-value if neg else value, bool(pct or pct2), scale)


def find_numbers(text: str) -> list[Number]:
    return [_to_number(m) for m in _NUMBER.finditer(text)]


def extract_answer(text: str) -> Number | None:
    """The answer number in free text, by the rule in the module docstring (None when there is none)."""
    boxed = _BOXED.findall(text) if "\\boxed" in text else None
    if boxed:
        nums = find_numbers(boxed[-1])
        if nums:
            return nums[-1]
    markers = list(_MARKER.finditer(text))
    if markers:
        m = _NUMBER.search(text, markers[-1].end())
        if m is not None:
            return _to_number(m)
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    return None if last is None else _to_number(last)


def _yes_no(text: str) -> str | None:
    markers = list(_MARKER.finditer(text))
    if markers:
        m = _YESNO.search(text, markers[-1].end())
        if m:
            return m.group(1).lower()
    found = _YESNO.findall(text)
    return found[-1].lower() if found else None


def reference_candidates(ref: Any) -> tuple[float, ...] | str:
    """Candidate values of a reference, or "yes"/"no". Raises GraderFailure when it is not a number."""
    if isinstance(ref, bool):
        return "yes" if ref else "no"
    if type(ref) is float or type(ref) is int:  # hot path
        return (float(ref),)
    if isinstance(ref, (int, float)):
        return (float(ref),)
    text = str(ref).strip()
    if text.lower() in ("yes", "no"):
        return text.lower()
    nums = find_numbers(text)
    if len(nums) != 1:
        raise GraderFailure("other_error", f"reference {text!r} is not a single number")
    n = nums[0]
    v = n.value * n.scale
    return (v / 100.0, v) if n.percent else (v,)


def answer_candidates(n: Number) -> tuple[float, ...]:
    values = (n.value * n.scale, n.value) if n.scale != 1.0 else (n.value,)
    if n.percent:
        return tuple(x / 100.0 for x in values) + values
    return values


def numbers_match(answer: Number, ref: tuple[float, ...], rel_tol: float, abs_tol: float) -> bool:
    isclose = math.isclose
    for a in answer_candidates(answer):
        for r in ref:
            if isclose(a, r, rel_tol=rel_tol, abs_tol=abs_tol):
                return True
    return False


class NumericSpec(SpecBase):
    type: Literal["numeric"]
    input: str = "{{ sample.output_text }}"
    reference: str
    rel_tol: float = 1e-2
    abs_tol: float = 1e-9


@register_grader("numeric")
class NumericGrader(Grader):
    """1.0 when the answer's number matches the reference (see module docstring), else 0.0."""

    Spec = NumericSpec

    def __init__(
        self,
        name: str,
        input: str,
        reference: str,
        rel_tol: float = 1e-2,
        abs_tol: float = 1e-9,
        where: str = "",
        pass_threshold: float | None = None,
    ) -> None:
        super().__init__(name, pass_threshold)
        pre = f"{where}." if where else ""
        self.input = compile_template(input, f"{pre}input")
        self.reference = compile_template(reference, f"{pre}reference")
        self.rel_tol, self.abs_tol = rel_tol, abs_tol

    @classmethod
    def build(cls, spec: NumericSpec, where: str, options: LoadOptions) -> NumericGrader:
        return cls(
            spec.name or "numeric", spec.input, spec.reference, spec.rel_tol, spec.abs_tol, where, spec.pass_threshold
        )

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        ref = reference_candidates(self.reference.value(sample, item))
        text = self.input.render(sample, item)
        if isinstance(ref, str):
            got = _yes_no(text)
            return Score(1.0 if got == ref else 0.0, metadata=None if got else {"reason": "no yes/no answer"})
        answer = extract_answer(text)
        if answer is None:
            return Score(0.0, metadata={"reason": "no number in the answer"})
        return Score(1.0 if numbers_match(answer, ref, self.rel_tol, self.abs_tol) else 0.0)


class FinqaProgramSpec(SpecBase):
    type: Literal["finqa_program"]
    input: str = "{{ sample.output_text }}"
    reference: str = "{{ item.exe_ans }}"
    table: str | None = "{{ item.table }}"


_PROGRAM = re.compile(
    r"(?:(?:add|subtract|multiply|divide|exp|greater|table_sum|table_average|table_max|"
    r"table_min)\([^()]*\)(?:,\s*)?)+"
)


@register_grader("finqa_program")
class FinqaProgramGrader(Grader):
    """FinQA execution accuracy: the program in the answer executes (official semantics) to `exe_ans`.

    The program is the last `op(a, b), op(#0, c)` run found in the input (so it
    may be wrapped in prose). Equality is exact after the executor's 5-decimal
    rounding, as in the official evaluator. An invalid program scores 0 with
    the executor's reason in metadata (the policy's fault, not a grader error).
    """

    Spec = FinqaProgramSpec

    def __init__(
        self,
        name: str,
        input: str,
        reference: str,
        table: str | None,
        where: str = "",
        pass_threshold: float | None = None,
    ) -> None:
        super().__init__(name, pass_threshold)
        pre = f"{where}." if where else ""
        self.input = compile_template(input, f"{pre}input")
        self.reference = compile_template(reference, f"{pre}reference")
        self.table = compile_template(table, f"{pre}table") if table else None

    @classmethod
    def build(cls, spec: FinqaProgramSpec, where: str, options: LoadOptions) -> FinqaProgramGrader:
        return cls(spec.name or "finqa_program", spec.input, spec.reference, spec.table, where, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        from agentrft.envs.finqa.program import ProgramError, execute_program  # lazy: layer 3, optional here

        gold = self.reference.value(sample, item)
        table = None
        if self.table is not None and self.table.single is not None:
            ns, path, _ = self.table.single
            # `{{ item[0] }}` indexes nothing in a dict (as in `resolve`): only a name segment is a key
            table = item.get(path[0]) if ns == "item" and len(path) == 1 and isinstance(path[0], str) else None
        text = self.input.render(sample, item)
        found = _PROGRAM.findall(text)
        if not found:
            return Score(0.0, metadata={"reason": "no program in the answer"})
        program = found[-1].strip().rstrip(",").strip()
        try:
            result = execute_program(program, table)
        except ProgramError as e:
            return Score(0.0, metadata={"reason": f"invalid program: {e}", "program": program})
        if isinstance(gold, str) and gold.strip().lower() not in ("yes", "no"):
            try:
                gold = float(gold)
            except ValueError:
                raise GraderFailure("other_error", f"exe_ans {gold!r} is neither a number nor yes/no") from None
        ok = result == (gold.strip().lower() if isinstance(gold, str) else gold)
        return Score(1.0 if ok else 0.0, metadata={"program": program, "result": result})

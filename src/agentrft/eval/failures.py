"""Failure attribution: for a failed trajectory, the FIRST step where it went wrong.

The trajectory's events are walked in order; the first tool call that is wrong
names the category. When every tool call looks fine, the ending decides
(ran out of budget, no answer, arithmetic slip, plain wrong answer).

Categories, in the order a step is examined:

* ``malformed_tool_call`` — the call could not be parsed (``error_kind == "malformed"``).
* ``unknown_tool`` — a tool the environment does not have.
* ``over_budget`` — a call past the tool-call budget, or the episode hit its
  turn / token limit (status ``max_turns`` / ``truncated``).
* ``tool_error`` — any other failed call (bad arguments, timeout, exception).
* ``wrong_document`` — ``open`` of a document not in the task's ``doc_ids``.
* ``wrong_operands`` — a ``calculate`` call uses a number that is neither a
  gold operand nor a gold intermediate result (see ``_allowed_numbers``).
* ``no_tool_call`` — the agent answered without calling any tool although the
  task needs evidence (it has ``doc_ids`` or a ``program``).
* ``no_final_answer`` — the episode ended without an answer text.
* ``arithmetic_slip`` — every gold operand was used and no wrong one, yet the
  answer is wrong (right operands, wrong result: wrong operation, misread or
  mis-copied result).
* ``wrong_answer`` — the fallback.

Number matching uses a relative tolerance of 0.5% (or 0.005 absolute) because
agents round intermediate results to two decimals; percent and fraction forms
(12% ↔ 0.12) and the factor 100 used to convert them are accepted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from agentrft.types import ToolCallEvent, Trajectory

FailureCategory = Literal[
    "no_tool_call",
    "malformed_tool_call",
    "unknown_tool",
    "tool_error",
    "wrong_document",
    "wrong_operands",
    "arithmetic_slip",
    "no_final_answer",
    "over_budget",
    "wrong_answer",
]
FAILURE_CATEGORIES: tuple[str, ...] = FailureCategory.__args__  # type: ignore[attr-defined]

_NUMBER = re.compile(r"(?<![\w.#])\d[\d,]*(?:\.\d+)?%?|(?<![\w.#])\.\d+%?")
_STEP = re.compile(r"([a-z_]+)\(([^()]*)\)")
_DOC_KEYS = ("doc_id", "document_id", "id", "doc", "document", "name", "filename")
_OPEN_TOOLS = ("open", "open_document", "read", "read_document")
_CALC_TOOLS = ("calculate", "calculator", "calc")


def parse_numbers(text: str) -> list[float]:
    """Unsigned numbers in ``text`` (commas dropped, ``x%`` kept as x; signs ignored)."""
    out = []
    for tok in _NUMBER.findall(text):
        try:
            out.append(float(tok.rstrip("%").replace(",", "")))
        except ValueError:  # e.g. a lone "1,," fragment
            continue
    return out


def _const(arg: str) -> float | None:
    if arg == "const_m1":
        return -1.0
    if arg.startswith("const_"):
        try:
            return float(arg[len("const_") :])
        except ValueError:
            return None
    return None


def _num(arg: str) -> float | None:
    arg = arg.strip()
    c = _const(arg)
    if c is not None:
        return c
    try:
        if arg.endswith("%"):
            return float(arg[:-1].replace(",", "")) / 100
        return float(arg.replace(",", ""))
    except ValueError:
        return None


_BINARY: dict[str, Callable[[float, float], float]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "exp": lambda a, b: a**b,
}


def gold_numbers(program: str) -> tuple[list[float], list[float]]:
    """(leaf operands, intermediate results) of a FinQA program such as
    ``subtract(5829, 5735), divide(#0, 5735)``.

    Constants count as operands; table ops and ``greater`` give no intermediate
    (their inputs are rows, not numbers). A step that cannot be evaluated leaves
    later references unknown instead of failing: attribution is best effort.
    """
    operands: list[float] = []
    results: list[float | None] = []
    for op, args_text in _STEP.findall(program):
        args = [a.strip() for a in args_text.split(",")]
        values: list[float | None] = []
        for a in args:
            if a.startswith("#"):
                idx = int(a[1:]) if a[1:].isdigit() else -1
                values.append(results[idx] if 0 <= idx < len(results) else None)
            elif a == "none":
                values.append(None)
            else:
                v = _num(a)
                if v is not None:
                    operands.append(v)
                values.append(v)
        fn = _BINARY.get(op)
        x, y = (values[0], values[1]) if len(values) == 2 else (None, None)
        try:
            if fn is not None and x is not None and y is not None:
                results.append(float(fn(x, y)))
            else:
                results.append(None)
        except (ZeroDivisionError, OverflowError):
            results.append(None)
    return operands, [r for r in results if r is not None]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(0.005, 5e-3 * abs(b))


def _allowed_numbers(operands: Iterable[float], results: Iterable[float]) -> list[float]:
    base = [abs(x) for x in (*operands, *results)]
    return [*base, *(x * 100 for x in base), *(x / 100 for x in base), 100.0, 1.0]


def _doc_arg(args: dict[str, Any] | str) -> str | None:
    if isinstance(args, str):
        return args.strip() or None
    for key in _DOC_KEYS:
        if isinstance(args.get(key), str):
            return args[key]
    strings = [v for v in args.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 else None


def _arg_text(args: dict[str, Any] | str) -> str:
    if isinstance(args, str):
        return args
    return " ".join(str(v) for v in args.values())


def classify_failure(traj: Trajectory, task_data: Mapping[str, Any] | None = None) -> FailureCategory | None:
    """The failure category of ``traj``, or None when it succeeded (``grade.success``)."""
    if traj.grade is not None and traj.grade.success:
        return None
    data = task_data or {}
    doc_ids = {str(d) for d in data.get("doc_ids") or []}
    program = data.get("program")
    operands, results = gold_numbers(program) if isinstance(program, str) else ([], [])
    allowed = _allowed_numbers(operands, results)
    used: list[float] = []

    for ev in traj.events:
        if not isinstance(ev, ToolCallEvent):
            continue
        if ev.error is not None or ev.error_kind is not None:
            kind = ev.error_kind
            if kind == "malformed":
                return "malformed_tool_call"
            if kind == "unknown_tool":
                return "unknown_tool"
            if kind == "budget":
                return "over_budget"
            return "tool_error"
        if ev.name in _OPEN_TOOLS and doc_ids:
            doc = _doc_arg(ev.arguments)
            if doc is not None and doc not in doc_ids:
                return "wrong_document"
        if ev.name in _CALC_TOOLS and operands:
            nums = parse_numbers(_arg_text(ev.arguments))
            if any(not any(_close(n, a) for a in allowed) for n in nums):
                return "wrong_operands"
            used.extend(nums)

    if traj.status in ("max_turns", "truncated", "timeout"):
        return "over_budget"
    if not traj.tool_calls and (doc_ids or program):
        return "no_tool_call"
    answer = traj.final_answer
    if answer is None or not answer.strip():
        return "no_final_answer"
    if operands and used and all(any(_close(abs(o), u) for u in used) for o in operands if _const_free(o, program)):
        return "arithmetic_slip"
    return "wrong_answer"


def _const_free(value: float, program: Any) -> bool:
    """Constants (const_100 ...) need not appear in the agent's calls: they are conventions, not data."""
    if not isinstance(program, str):
        return True
    consts = {_const(tok) for tok in re.findall(r"const_\w+", program)}
    return value not in consts


def count_failures(trajectories: Iterable[Trajectory], task_data: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Failure counts per category (every category present, zeros included)."""
    counts: Counter[str] = Counter({c: 0 for c in FAILURE_CATEGORIES})
    for t in trajectories:
        cat = classify_failure(t, task_data.get(t.task_id))
        if cat is not None:
            counts[cat] += 1
    return {c: counts[c] for c in FAILURE_CATEGORIES}


__all__ = [
    "FAILURE_CATEGORIES",
    "FailureCategory",
    "classify_failure",
    "count_failures",
    "gold_numbers",
    "parse_numbers",
]

"""Program accuracy: symbolic equivalence of a predicted FinQA program to the gold one.

Follows `equal_program` of the official FinQA evaluator, reimplemented:

1. Every distinct gold operand (text after stripping, e.g. ``"5829"``, ``"const_100"``) and every
   gold table step becomes a symbol ``a0, a1, …`` in order of first appearance.
2. The prediction must be well-formed, use only those operands / table steps, and reference
   only earlier steps (``#n`` with n < its own index); otherwise it is not equal.
3. Both last steps are expanded into infix expressions over the symbols, passed through
   ``sympy.simplify`` and compared structurally. So ``add``/``multiply`` argument swaps are
   equal and ``subtract``/``divide``/``exp``/``greater`` swaps are not; operands are compared as
   text (``"5,829"`` and ``"5829"`` are different symbols). Only the final expression counts.

Reproduced quirk: the official script keys a table step by its raw text, in which every step but
the first carries a leading separator, so the same table step at position 0 in one program and
elsewhere in the other does not match. The key here includes "is first step" for that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrft.envs.finqa.program import ProgramError, Step, parse_steps

_OperandKey = tuple[str, str]
_TableKey = tuple[str, bool, str, str, str]


def _table_key(index: int, step: Step) -> _TableKey:
    return ("table", index == 0, step.op, step.arg1, step.arg2)


def _operand_key(arg: str) -> _OperandKey:
    return ("operand", arg.strip())


def _ref(arg: str) -> int | None:
    """Step index of a ``#n`` argument, None for an operand; ValueError if unreadable."""
    text = arg.strip()
    if "#" not in text:
        return None
    return int(text.replace("#", ""))


def _symbol_map(gold: Sequence[Step]) -> dict[Any, Any]:
    import sympy

    keys: list[Any] = []
    for index, step in enumerate(gold):
        candidates: list[Any] = (
            [_table_key(index, step)]
            if step.is_table
            else [_operand_key(arg) for arg in (step.arg1, step.arg2) if "#" not in arg]
        )
        for key in candidates:
            if key not in keys:
                keys.append(key)
    return {key: sympy.Symbol(f"a{i}") for i, key in enumerate(keys)}


def _expression(steps: Sequence[Step], index: int, symbols: dict[Any, Any]) -> Any:
    """Infix sympy expression of step `index` (references already checked to point backwards)."""
    step = steps[index]
    if step.is_table:
        return symbols[_table_key(index, step)]
    parts = []
    for arg in (step.arg1, step.arg2):
        ref = _ref(arg)
        parts.append(symbols[_operand_key(arg)] if ref is None else _expression(steps, ref, symbols))
    a, b = parts
    if step.op == "add":
        return a + b
    if step.op == "subtract":
        return a - b
    if step.op == "multiply":
        return a * b
    if step.op == "divide":
        return a / b
    if step.op == "exp":
        return a**b
    return a > b  # greater: a sympy relation


def _check_backward_refs(steps: Sequence[Step]) -> bool:
    for index, step in enumerate(steps):
        if step.is_table:
            continue
        for arg in (step.arg1, step.arg2):
            try:
                ref = _ref(arg)
            except ValueError:
                return False
            if ref is not None and not 0 <= ref < index:
                return False
    return True


def equal_programs(gold_tokens: Sequence[str], pred_tokens: Sequence[str]) -> bool:
    """True when the prediction is symbolically the gold program; ProgramError if the gold is malformed."""
    import sympy

    try:
        gold = parse_steps(gold_tokens)
    except ProgramError as err:
        raise ProgramError(f"gold program is malformed: {err}") from None
    if not _check_backward_refs(gold):
        raise ProgramError("gold program is malformed: a #n reference does not point to an earlier step")
    symbols = _symbol_map(gold)

    try:
        pred = parse_steps(pred_tokens)
    except ProgramError:
        return False
    if not _check_backward_refs(pred):
        return False
    for index, step in enumerate(pred):
        if step.is_table:
            if _table_key(index, step) not in symbols:
                return False
        elif any(_operand_key(a) not in symbols for a in (step.arg1, step.arg2) if "#" not in a):
            return False

    try:
        gold_expr = _expression(gold, len(gold) - 1, symbols)
    except (TypeError, ValueError) as err:  # e.g. arithmetic on a `greater` relation
        raise ProgramError(f"gold program has no symbolic form: {err}") from None
    if pred == gold:  # identical steps simplify identically; skips ~30 ms of sympy per call
        return True
    try:
        pred_expr = _expression(pred, len(pred) - 1, symbols)
    except (TypeError, ValueError):
        return False
    try:
        gold_simple = sympy.simplify(gold_expr)
    except Exception as err:
        raise ProgramError(f"gold program could not be simplified: {err}") from None
    try:
        pred_simple = sympy.simplify(pred_expr)
    except Exception:
        return False
    return bool(gold_simple == pred_simple)

"""The agent's calculator: arithmetic expressions and FinQA programs, evaluated without eval().

Two input forms, told apart by syntax:

* **Arithmetic**: ``+ - * /``, ``^`` or ``**`` (power, right-associative, binds tighter than unary
  minus: ``-2^2`` is -4), parentheses, unary ``+``/``-``, numbers with thousands commas
  (``5,829``), an optional ``$`` before a number, and a *postfix percent sign*: ``12%`` is 0.12 and
  ``(94/5735)%`` is 0.0001639…. ``%`` is never modulo, so ``a % b`` is an error that says so.
* **FinQA program** (input starting with an operation name and ``(``):
  ``subtract(5829, 5735), divide(#0, 5735)``, executed with the official semantics of
  :mod:`agentrft.envs.finqa.program` (so the answer is rounded to 5 decimals), including
  ``table_sum/average/max/min(row name, none)`` when a table is in scope. Arguments are separated
  by a comma and a space (or by bare commas when no argument contains one); ``$`` is dropped from
  numeric arguments; a table op may omit its ``none`` argument.

Results are text: integers without ``.0``, other numbers with at most 6 decimals (trailing zeros
dropped; scientific notation for magnitudes below 1e-6), or ``yes``/``no``. Any problem raises
:class:`CalcError` with a message meant to be shown to the model.

Arithmetic is parsed by the shared :mod:`agentrft.arith` (in its percent / money / ``**`` dialect).
Guards against abuse: input length, nesting depth, exponent size and result magnitude are capped,
and everything is computed in floats (no unbounded integers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from agentrft.arith import ArithError, Limits, Syntax, evaluate, parse
from agentrft.envs.finqa.program import ALL_OPS, TABLE_OPS, ProgramError, Step, run_steps

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 64  # nested parentheses / unary signs / exponents
MAX_EXPONENT = 1000.0
MAX_MAGNITUDE = 1e30


class CalcError(ValueError):
    """The expression could not be evaluated; the message is written for the model to read."""


def format_number(value: float | str) -> str:
    """Compact text for a result: ``"3"``, ``"0.016391"``, ``"1.5e-08"``, ``"yes"``."""
    if isinstance(value, str):
        return value
    if not math.isfinite(value):
        raise CalcError("result is not a finite number")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1e15:
        return f"{value:.6g}"
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    if text in ("0", "-0"):  # too small for 6 decimals: keep 6 significant digits instead
        return f"{value:.6g}"
    return text


# ---------------------------------------------------------------- arithmetic

# The calculator's dialect of the shared parser: what a model writes after reading a report.
SYNTAX = Syntax(percent=True, money=True, double_star=True, max_chars=MAX_EXPRESSION_CHARS, max_depth=MAX_DEPTH)
LIMITS = Limits(max_exponent=MAX_EXPONENT, max_magnitude=MAX_MAGNITUDE)


# ---------------------------------------------------------------- programs

_PROGRAM_START = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")


def _split_args(content: str) -> list[str]:
    """Top-level comma split: on ", " when present (so 5,829 stays whole), else on bare commas."""
    pieces: list[str] = []
    depth = 0
    start = 0
    has_spaced = any(
        content[i] == "," and i + 1 < len(content) and content[i + 1].isspace() for i in range(len(content))
    )
    for i, char in enumerate(content):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0 and (not has_spaced or (i + 1 < len(content) and content[i + 1].isspace())):
            pieces.append(content[start:i])
            start = i + 1
    pieces.append(content[start:])
    return [piece.strip() for piece in pieces]


def _parse_program(text: str) -> list[Step]:
    steps: list[Step] = []
    pos = 0
    while True:
        head = _PROGRAM_START.match(text, pos)
        if head is None:
            raise CalcError(f"expected an operation such as add( at position {pos}")
        op = head.group(1)
        if op not in ALL_OPS:
            raise CalcError(f"unknown operation {op!r}; programs use {', '.join(ALL_OPS)}")
        depth, close = 1, head.end()
        while close < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[close], 0)
            close += 1
        if depth:
            raise CalcError(f"step {len(steps)}: missing ')' after {op}(")
        args = _split_args(text[head.end() : close - 1])
        if op in TABLE_OPS and len(args) == 1:
            args.append("none")
        if len(args) != 2:
            raise CalcError(f"step {len(steps)}: {op} takes 2 arguments separated by ', ', got {len(args)}: {args}")
        if op not in TABLE_OPS:
            args = [arg.replace("$", "") for arg in args]
        steps.append(Step(op, args[0], args[1]))
        rest = text[close:].lstrip()
        if not rest:
            return steps
        if not rest.startswith(","):
            raise CalcError(f"expected ', ' and the next step after step {len(steps) - 1}, got {rest[:20]!r}")
        pos = len(text) - len(rest) + 1


# ---------------------------------------------------------------- entry point


def calculate(expression: str, table: Sequence[Sequence[str]] | None = None) -> str:
    """Evaluate an arithmetic expression or a FinQA program; the result as compact text."""
    if not isinstance(expression, str):
        raise CalcError("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression too long ({len(expression)} characters, limit {MAX_EXPRESSION_CHARS})")
    if not expression.strip():
        raise CalcError("empty expression")
    if _PROGRAM_START.match(expression):
        try:
            return format_number(run_steps(_parse_program(expression), table))
        except ProgramError as err:
            raise CalcError(str(err)) from None
    try:
        return format_number(evaluate(parse(expression, SYNTAX), limits=LIMITS))
    except ArithError as err:
        raise CalcError(str(err)) from None

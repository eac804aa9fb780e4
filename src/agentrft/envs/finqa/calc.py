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

Guards against abuse: input length, nesting depth, exponent size and result magnitude are capped,
and everything is computed in floats (no unbounded integers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentrft.envs.finqa.program import ALL_OPS, TABLE_OPS, ProgramError, Step, run_steps

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 64  # nested parentheses / unary signs
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

_NUMBER = re.compile(r"\$?\s*(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_]\w*")
_OPERATORS = ("**", "+", "-", "*", "/", "^", "(", ")", "%")


@dataclass(frozen=True)
class _Token:
    kind: str  # "num" | "op" | "end"
    text: str
    pos: int
    value: float = 0.0


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
            continue
        number = _NUMBER.match(text, pos)
        if number:
            raw = number.group().lstrip("$").strip()
            if "," in raw and not _THOUSANDS.fullmatch(raw):
                raise CalcError(f"{raw!r} at position {pos} is not a number: commas may only separate thousands")
            tokens.append(_Token("num", raw, pos, float(raw.replace(",", ""))))
            pos = number.end()
            continue
        name = _NAME.match(text, pos)
        if name:
            raise CalcError(f"unknown name {name.group()!r} at position {pos}")
        operator = next((op for op in _OPERATORS if text.startswith(op, pos)), None)
        if operator is None:
            raise CalcError(f"unexpected character {char!r} at position {pos}")
        tokens.append(_Token("op", operator, pos))
        pos += len(operator)
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _checked(value: float) -> float:
    if isinstance(value, complex):
        raise CalcError("a negative number to a fractional power has no real result")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"result too large (limit {MAX_MAGNITUDE:g})")
    return value


class _Parser:
    """Recursive descent: expr → term (+|- term)*; term → unary (*|/ unary)*;
    unary → (+|-) unary | power; power → postfix ((^|**) unary)?; postfix → primary %*."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    @property
    def current(self) -> _Token:
        return self.tokens[self.index]

    def _take(self, *ops: str) -> _Token | None:
        token = self.current
        if token.kind == "op" and token.text in ops:
            self.index += 1
            return token
        return None

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError(f"expression nested too deeply (limit {MAX_DEPTH})")

    def parse(self) -> float:
        value = self.expr()
        token = self.current
        if token.kind != "end":
            hint = "; '%' is a postfix percent sign (12% = 0.12), not modulo" if self._after_percent() else ""
            raise CalcError(f"unexpected {token.text!r} at position {token.pos}: expected an operator{hint}")
        return value

    def _after_percent(self) -> bool:
        return self.index > 0 and self.tokens[self.index - 1].text == "%"

    def expr(self) -> float:
        value = self.term()
        while op := self._take("+", "-"):
            right = self.term()
            value = _checked(value + right if op.text == "+" else value - right)
        return value

    def term(self) -> float:
        value = self.unary()
        while op := self._take("*", "/"):
            right = self.unary()
            if op.text == "*":
                value = _checked(value * right)
            elif right == 0:
                raise CalcError(f"division by zero at position {op.pos}")
            else:
                value = _checked(value / right)
        return value

    def unary(self) -> float:
        if op := self._take("+", "-"):
            self._enter()
            value = self.unary()
            self.depth -= 1
            return -value if op.text == "-" else value
        return self.power()

    def power(self) -> float:
        base = self.postfix()
        if op := self._take("^", "**"):
            self._enter()
            exponent = self.unary()
            self.depth -= 1
            if abs(exponent) > MAX_EXPONENT:
                raise CalcError(f"exponent {exponent:g} too large (limit {MAX_EXPONENT:g})")
            if base == 0 and exponent < 0:
                raise CalcError(f"division by zero: 0 to a negative power at position {op.pos}")
            try:
                return _checked(base**exponent)
            except OverflowError:
                raise CalcError(f"result too large (limit {MAX_MAGNITUDE:g})") from None
        return base

    def postfix(self) -> float:
        value = self.primary()
        while self._take("%"):
            value = value / 100.0
        return value

    def primary(self) -> float:
        token = self.current
        if token.kind == "num":
            self.index += 1
            return _checked(token.value)
        if self._take("("):
            self._enter()
            value = self.expr()
            self.depth -= 1
            if not self._take(")"):
                raise CalcError(f"missing ')' at position {self.current.pos}")
            return value
        if token.kind == "end":
            raise CalcError("expression ends too early: expected a number or '('")
        raise CalcError(f"unexpected {token.text!r} at position {token.pos}: expected a number or '('")


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
            raise CalcError(
                f"step {len(steps)}: {op} takes 2 arguments separated by ', ', got {len(args)}: {args}"
            )
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
    return format_number(_Parser(_tokenize(expression)).parse())

"""Safe arithmetic without eval(): one recursive-descent parser shared by the agent's calculator
(:mod:`agentrft.envs.finqa.calc`) and the multi grader's formulas (:mod:`agentrft.graders.formula`).

Grammar (``^`` binds tighter than unary minus and is right-associative, so ``-2^2`` is -4 and
``2^3^2`` is 512; ``%`` is never modulo):

    expr    := term (('+' | '-') term)*
    term    := unary (('*' | '/') unary)*
    unary   := ('+' | '-') unary | power
    power   := postfix (POW unary)?         POW: '^', and '**' with Syntax.double_star
    postfix := atom '%'*                    only with Syntax.percent: 12% is 0.12
    atom    := NUMBER | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

A :class:`Syntax` says which optional forms a caller accepts (postfix percent, ``$`` and thousands
commas in numbers, ``**``, named variables, functions) and caps input length and nesting depth.
:func:`parse` turns text into an :class:`Expr` tree once; :func:`evaluate` computes it in floats,
any number of times, under :class:`Limits` (exponent and magnitude caps). Every problem, at parse
or evaluation time, is an :class:`ArithError` whose message names the position and is meant to be
read by whoever wrote the expression (a model or a spec author). No torch, no agentrft imports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

MAX_CHARS = 2000
MAX_DEPTH = 64  # nested parentheses, unary signs, exponents and calls: bounds recursion in parse and evaluate


class ArithError(ValueError):
    """The text is not a valid expression, or evaluating it failed; the message is for the expression's author."""


@dataclass(frozen=True)
class Function:
    """A function callable from expressions, taking ``min_args`` to ``max_args`` (None: any number) floats."""

    fn: Callable[..., float]
    min_args: int = 1
    max_args: int | None = 1


# The functions multi-grader formulas have always had; `log` is the natural logarithm.
FUNCTIONS: Mapping[str, Function] = {
    "min": Function(min, 1, None),
    "max": Function(max, 1, None),
    "abs": Function(abs),
    "floor": Function(lambda x: float(math.floor(x))),
    "ceil": Function(lambda x: float(math.ceil(x))),
    "exp": Function(math.exp),
    "sqrt": Function(math.sqrt),
    "log": Function(math.log),
}


@dataclass(frozen=True)
class Syntax:
    """What an expression may contain. The defaults accept plain arithmetic only: numbers, ``+ - * / ^`` and parentheses."""

    percent: bool = False  # postfix percent sign: 12% is 0.12
    money: bool = False  # an optional `$` before a number, and thousands commas (5,829)
    double_star: bool = False  # `**` as a synonym of `^`
    names: frozenset[str] = frozenset()  # variables, given values at evaluation
    functions: Mapping[str, Function] = field(default_factory=dict)
    max_chars: int = MAX_CHARS
    max_depth: int = MAX_DEPTH

    def __post_init__(self) -> None:
        # With thousands commas, `min(1,2)` would read as min(12): the two cannot share a comma.
        if self.money and self.functions:
            raise ValueError(
                "Syntax: money (thousands commas) and functions (comma-separated arguments) exclude each other"
            )


@dataclass(frozen=True)
class Limits:
    """Evaluation caps; the defaults only insist on finite real results."""

    max_exponent: float = math.inf
    max_magnitude: float = math.inf


# ---------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Num:
    value: float
    pos: int


@dataclass(frozen=True)
class Name:
    name: str
    pos: int


@dataclass(frozen=True)
class Neg:
    operand: Expr
    pos: int


@dataclass(frozen=True)
class Percent:
    operand: Expr


@dataclass(frozen=True)
class Chain:
    """A left-associative run ``first op1 x1 op2 x2 …`` of one precedence level, kept flat so that
    evaluating a long sum loops instead of recursing once per operator."""

    first: Expr
    rest: tuple[tuple[str, int, Expr], ...]  # (operator, its position, right operand)


@dataclass(frozen=True)
class Power:
    base: Expr
    exponent: Expr
    pos: int


@dataclass(frozen=True)
class Call:
    name: str
    function: Function  # resolved at parse time, so a tree evaluates without its Syntax
    args: tuple[Expr, ...]
    pos: int


Expr = Num | Name | Neg | Percent | Chain | Power | Call


# ---------------------------------------------------------------- tokens

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPONENT = r"(?:[eE][+-]?\d+)?"
_PLAIN_NUMBER = re.compile(rf"(?:\d+(?:\.\d*)?|\.\d+){_EXPONENT}")
_MONEY_NUMBER = re.compile(rf"\$?\s*(?:\d[\d,]*(?:\.\d*)?|\.\d+){_EXPONENT}")
_THOUSANDS = re.compile(rf"\d{{1,3}}(?:,\d{{3}})+(?:\.\d*)?{_EXPONENT}")


@dataclass(frozen=True)
class _Token:
    kind: str  # "num" | "name" | "op" | "end"
    text: str
    pos: int
    value: float = 0.0


def _operators(syntax: Syntax) -> tuple[str, ...]:
    ops: tuple[str, ...] = ("**",) if syntax.double_star else ()  # before "*", so that "**" is one token
    ops += ("+", "-", "*", "/", "^", "(", ")")
    ops += ("%",) if syntax.percent else ()
    ops += (",",) if syntax.functions else ()
    return ops


def _tokenize(text: str, syntax: Syntax) -> list[_Token]:
    number = _MONEY_NUMBER if syntax.money else _PLAIN_NUMBER
    operators = _operators(syntax)
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
            continue
        if match := number.match(text, pos):
            raw = match.group().lstrip("$").strip()
            if "," in raw and not _THOUSANDS.fullmatch(raw):
                raise ArithError(f"{raw!r} at position {pos} is not a number: commas may only separate thousands")
            tokens.append(_Token("num", raw, pos, float(raw.replace(",", ""))))
            pos = match.end()
            continue
        if match := _NAME.match(text, pos):
            # Checked here, not in the parser, so that errors come in the order they appear in the text.
            name = match.group()
            if name not in syntax.names and name not in syntax.functions:
                known = sorted(syntax.names) + [f"{f}()" for f in sorted(syntax.functions)]
                hint = f"; known names: {', '.join(known)}" if known else ""
                raise ArithError(f"unknown name {name!r} at position {pos}{hint}")
            tokens.append(_Token("name", name, pos))
            pos = match.end()
            continue
        operator = next((op for op in operators if text.startswith(op, pos)), None)
        if operator is None:
            raise ArithError(f"unexpected character {char!r} at position {pos}")
        tokens.append(_Token("op", operator, pos))
        pos += len(operator)
    tokens.append(_Token("end", "", len(text)))
    return tokens


# ---------------------------------------------------------------- parsing


class _Parser:
    def __init__(self, tokens: list[_Token], syntax: Syntax) -> None:
        self.tokens = tokens
        self.syntax = syntax
        self.index = 0
        self.depth = 0
        self.power_ops = ("^", "**") if syntax.double_star else ("^",)

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
        if self.depth > self.syntax.max_depth:
            raise ArithError(f"expression nested too deeply (limit {self.syntax.max_depth})")

    def _expected_operand(self) -> str:
        return "a number, a name or '('" if self.syntax.names or self.syntax.functions else "a number or '('"

    def parse(self) -> Expr:
        if self.current.kind == "end":
            raise ArithError("empty expression")
        tree = self.expr()
        token = self.current
        if token.kind != "end":
            after_percent = self.index > 0 and self.tokens[self.index - 1].text == "%"
            hint = "; '%' is a postfix percent sign (12% = 0.12), not modulo" if after_percent else ""
            raise ArithError(f"unexpected {token.text!r} at position {token.pos}: expected an operator{hint}")
        return tree

    def _chain(self, operand: Callable[[], Expr], ops: tuple[str, ...]) -> Expr:
        first = operand()
        rest: list[tuple[str, int, Expr]] = []
        while op := self._take(*ops):
            rest.append((op.text, op.pos, operand()))
        return Chain(first, tuple(rest)) if rest else first

    def expr(self) -> Expr:
        return self._chain(self.term, ("+", "-"))

    def term(self) -> Expr:
        return self._chain(self.unary, ("*", "/"))

    def unary(self) -> Expr:
        if op := self._take("+", "-"):
            self._enter()
            operand = self.unary()
            self.depth -= 1
            return Neg(operand, op.pos) if op.text == "-" else operand
        return self.power()

    def power(self) -> Expr:
        base = self.postfix()
        if op := self._take(*self.power_ops):
            self._enter()
            exponent = self.unary()
            self.depth -= 1
            return Power(base, exponent, op.pos)
        return base

    def postfix(self) -> Expr:
        value = self.atom()
        while self.syntax.percent and self._take("%"):
            value = Percent(value)
        return value

    def atom(self) -> Expr:
        token = self.current
        if token.kind == "num":
            self.index += 1
            return Num(token.value, token.pos)
        if token.kind == "name":
            self.index += 1
            return self._name(token)
        if self._take("("):
            self._enter()
            inner = self.expr()
            self.depth -= 1
            self._close()
            return inner
        if token.kind == "end":
            raise ArithError(f"expression ends too early: expected {self._expected_operand()}")
        raise ArithError(f"unexpected {token.text!r} at position {token.pos}: expected {self._expected_operand()}")

    def _close(self) -> None:
        if not self._take(")"):
            raise ArithError(f"missing ')' at position {self.current.pos}")

    def _name(self, token: _Token) -> Expr:
        function = self.syntax.functions.get(token.text)
        if function is not None and self._take("("):
            return self._call(token, function)
        if token.text in self.syntax.names:
            return Name(token.text, token.pos)
        raise ArithError(f"{token.text} at position {token.pos} is a function: expected '(' after it")

    def _call(self, token: _Token, function: Function) -> Call:
        self._enter()
        args: list[Expr] = []
        if self.current.text != ")":
            args.append(self.expr())
            while self._take(","):
                args.append(self.expr())
        self.depth -= 1
        self._close()
        low, high = function.min_args, function.max_args
        if len(args) < low or (high is not None and len(args) > high):
            wanted = f"at least {low}" if high is None else f"{low}" if low == high else f"{low} to {high}"
            raise ArithError(f"{token.text}() at position {token.pos} takes {wanted} argument(s), got {len(args)}")
        return Call(token.text, function, tuple(args), token.pos)


def parse(text: str, syntax: Syntax = Syntax()) -> Expr:
    """The tree of ``text``; :class:`ArithError` names the first problem and its position."""
    if len(text) > syntax.max_chars:
        raise ArithError(f"expression too long ({len(text)} characters, limit {syntax.max_chars})")
    return _Parser(_tokenize(text, syntax), syntax).parse()


# ---------------------------------------------------------------- evaluation


def _checked(value: float, limits: Limits) -> float:
    if not math.isfinite(value) or abs(value) > limits.max_magnitude:
        if math.isinf(limits.max_magnitude):
            raise ArithError("result is not a finite number")
        raise ArithError(f"result too large (limit {limits.max_magnitude:g})")
    return value


def _binary(op: str, pos: int, left: float, right: float, limits: Limits) -> float:
    if op == "+":
        return _checked(left + right, limits)
    if op == "-":
        return _checked(left - right, limits)
    if op == "*":
        return _checked(left * right, limits)
    if right == 0:
        raise ArithError(f"division by zero at position {pos}")
    return _checked(left / right, limits)


def _power(base: float, exponent: float, pos: int, limits: Limits) -> float:
    # Checked before computing: 9^9^9 must fail fast, not build a huge float or hang.
    if abs(exponent) > limits.max_exponent:
        raise ArithError(f"exponent {exponent:g} too large (limit {limits.max_exponent:g})")
    if base == 0 and exponent < 0:
        raise ArithError(f"division by zero: 0 to a negative power at position {pos}")
    try:
        result = base**exponent
    except OverflowError:
        return _checked(math.inf, limits)
    if isinstance(result, complex):  # a negative base to a fractional power
        raise ArithError("a negative number to a fractional power has no real result")
    return _checked(result, limits)


def evaluate(tree: Expr, values: Mapping[str, float] | None = None, limits: Limits = Limits()) -> float:
    """The value of ``tree`` with ``values`` for its names; every intermediate result is checked against ``limits``."""
    env = values or {}
    match tree:
        case Num(value=value):
            return _checked(value, limits)
        case Name(name=name, pos=pos):
            if name not in env:
                raise ArithError(f"no value for {name!r} at position {pos}")
            return _checked(float(env[name]), limits)
        case Neg(operand=operand):
            return -evaluate(operand, env, limits)
        case Percent(operand=operand):
            return evaluate(operand, env, limits) / 100.0
        case Chain(first=first, rest=rest):
            value = evaluate(first, env, limits)
            for op, pos, operand in rest:
                value = _binary(op, pos, value, evaluate(operand, env, limits), limits)
            return value
        case Power(base=base, exponent=exponent, pos=pos):
            return _power(evaluate(base, env, limits), evaluate(exponent, env, limits), pos, limits)
        case Call(name=name, function=function, args=args, pos=pos):
            arguments = [evaluate(arg, env, limits) for arg in args]
            try:
                result = function.fn(*arguments)
            except (ValueError, OverflowError, ZeroDivisionError) as err:  # math.log(0), math.exp(1000), …
                raise ArithError(f"{name}() at position {pos}: {err}") from None
            return _checked(float(result), limits)
    raise TypeError(f"not an arithmetic tree: {tree!r}")

"""Safe arithmetic for `multi.calculate_output`: a hand-written recursive-descent parser (no eval).

Grammar (`^` binds tighter than unary minus and is right-associative, so
`-2^2 = -4` and `2^3^2 = 512`):

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('+' | '-') unary | power
    power  := atom ('^' unary)?
    atom   := NUMBER | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

Functions: min, max (one or more arguments), abs floor ceil exp sqrt log (one;
`log` is natural). Names must be sub-grader keys — checked at load time, so an
unknown name is a `formula_parse_error` before anything runs. Evaluation errors
(division by zero, log of 0, overflow) raise `ArithmeticError`/`ValueError`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

from agentrft.graders.base import GraderSpecError

Env = dict[str, float]
Node = Callable[[Env], float]

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(.))")
_UNARY_FUNCS: dict[str, Callable[[float], float]] = {
    "abs": abs, "floor": lambda x: float(math.floor(x)), "ceil": lambda x: float(math.ceil(x)),
    "exp": math.exp, "sqrt": math.sqrt, "log": math.log,
}
_NARY_FUNCS: dict[str, Callable[..., float]] = {"min": min, "max": max}
_BINARY: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "^": lambda a, b: float(a ** b),
}


class Formula:
    """A compiled formula; `evaluate(values)` with one float per sub-grader key."""

    def __init__(self, text: str, names: Iterable[str], where: str) -> None:
        self.text = text
        self._names = set(names)
        self._where = where
        self._tokens = self._tokenize(text)
        self._pos = 0
        self.used: set[str] = set()
        node = self._expr()
        if self._pos != len(self._tokens):
            self._fail(f"unexpected {self._tokens[self._pos][1]!r}")
        self._node = node

    def evaluate(self, values: Env) -> float:
        out = self._node(values)
        if isinstance(out, complex) or not math.isfinite(out):
            raise ArithmeticError(f"formula {self.text!r} gave a non-finite value")
        return float(out)

    # ---- parsing
    def _fail(self, msg: str) -> None:
        raise GraderSpecError(self._where, f"bad formula {self.text!r}: {msg}", flag="formula_parse_error")

    def _tokenize(self, text: str) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            assert m is not None  # the pattern's last branch matches any character
            num, name, op = m.groups()
            if num is not None:
                tokens.append(("num", num))
            elif name is not None:
                tokens.append(("name", name))
            elif op in "+-*/^(),":
                tokens.append(("op", op))
            else:
                self._fail(f"unexpected character {op!r}")
            pos = m.end()
        if not tokens:
            self._fail("empty formula")
        return tokens

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _accept(self, op: str) -> bool:
        tok = self._peek()
        if tok == ("op", op):
            self._pos += 1
            return True
        return False

    def _expect(self, op: str) -> None:
        if not self._accept(op):
            tok = self._peek()
            self._fail(f"expected {op!r}, found {'end' if tok is None else repr(tok[1])}")

    def _expr(self) -> Node:
        node = self._term()
        while (tok := self._peek()) is not None and tok in (("op", "+"), ("op", "-")):
            self._pos += 1
            node = _bin(tok[1], node, self._term())
        return node

    def _term(self) -> Node:
        node = self._unary()
        while (tok := self._peek()) is not None and tok in (("op", "*"), ("op", "/")):
            self._pos += 1
            node = _bin(tok[1], node, self._unary())
        return node

    def _unary(self) -> Node:
        if self._accept("-"):
            inner = self._unary()
            return lambda env: -inner(env)
        if self._accept("+"):
            return self._unary()
        return self._power()

    def _power(self) -> Node:
        base = self._atom()
        if self._accept("^"):
            return _bin("^", base, self._unary())
        return base

    def _atom(self) -> Node:
        tok = self._peek()
        if tok is None:
            self._fail("unexpected end")
            raise AssertionError  # unreachable; _fail raises
        self._pos += 1
        kind, text = tok
        if kind == "num":
            value = float(text)
            return lambda env: value
        if kind == "op":
            if text == "(":
                node = self._expr()
                self._expect(")")
                return node
            self._fail(f"unexpected {text!r}")
        if text in _UNARY_FUNCS or text in _NARY_FUNCS:
            self._expect("(")
            args = [self._expr()]
            while self._accept(","):
                args.append(self._expr())
            self._expect(")")
            if text in _UNARY_FUNCS:
                if len(args) != 1:
                    self._fail(f"{text}() takes one argument, got {len(args)}")
                f, a = _UNARY_FUNCS[text], args[0]
                return lambda env: f(a(env))
            g = _NARY_FUNCS[text]
            return lambda env: g(x(env) for x in args)
        if text not in self._names:
            known = ", ".join(sorted(self._names)) or "(none)"
            self._fail(f"unknown name {text!r}; sub-graders are: {known}")
        self.used.add(text)
        return lambda env: env[text]


def _bin(op: str, a: Node, b: Node) -> Node:
    f = _BINARY[op]
    return lambda env: f(a(env), b(env))

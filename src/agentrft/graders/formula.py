"""Safe arithmetic for `multi.calculate_output`, parsed by the shared :mod:`agentrft.arith` (no eval).

Grammar (`^` binds tighter than unary minus and is right-associative, so
`-2^2 = -4` and `2^3^2 = 512`):

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('+' | '-') unary | power
    power  := atom ('^' unary)?
    atom   := NUMBER | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

Functions: min, max (one or more arguments), abs floor ceil exp sqrt log (one;
`log` is natural). Names must be sub-grader keys — checked at load time, so an
unknown name, like any syntax error or a formula past 2000 characters or 64
levels of nesting, is a `formula_parse_error` before anything runs. No `%`,
`**`, `$` or thousands commas (those are the calculator's dialect). Evaluation
errors (division by zero, log of 0, a non-finite result) raise `ArithError`, a
`ValueError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agentrft.arith import FUNCTIONS, ArithError, Syntax, evaluate, parse
from agentrft.graders.base import GraderSpecError


class Formula:
    """A compiled formula; `evaluate(values)` with one float per sub-grader key."""

    def __init__(self, text: str, names: Iterable[str], where: str) -> None:
        self.text = text
        try:
            self._tree = parse(text, Syntax(names=frozenset(names), functions=FUNCTIONS))
        except ArithError as err:
            raise GraderSpecError(where, f"bad formula {text!r}: {err}", flag="formula_parse_error") from None

    def evaluate(self, values: Mapping[str, float]) -> float:
        return evaluate(self._tree, values)

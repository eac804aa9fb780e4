"""FinQA programs: tokenisation and execution with the official evaluator's semantics.

Follows `code/evaluate/evaluate.py` of the FinQA repository (Chen et al. 2021), reimplemented:

* A program is a flat token list, four tokens per step — ``op(``, arg, arg, ``)`` — ending in
  ``EOF``: ``["subtract(", "5829", "5735", ")", "divide(", "#0", "5735", ")", "EOF"]``.
* Numbers lose their commas; ``x%`` means x/100; ``const_k`` is k and ``const_m1`` is -1;
  ``#n`` is the result of step n (0-based), and must name an earlier step.
* ``table_sum/average/max/min(row name, none)`` read the table row whose first cell equals the
  argument exactly (when names repeat, the last such row wins, as in the official dict); each
  other cell loses ``$`` and everything from its first ``(``, and must then be a number.
* The answer is the last step's result rounded to 5 decimals (``greater`` gives ``"yes"``/``"no"``,
  not rounded). Anything the official script would turn into its ``invalid_flag`` (including any
  exception: division by zero, overflow, a complex answer) raises :class:`ProgramError` here.
  Oddities that the answer never uses (a complex intermediate, ``add`` of two yes/no results,
  which concatenates) do not invalidate the program there, and do not here.

Checked against a scratch copy of the official functions by differential fuzzing (random
programs and mutated predictions over a small table): identical validity, answers and program
equivalence outside the departures below.

Deliberate departures, all in corners the official script handles by accident:

* A trailing incomplete step (tokens after the last ``)``) is invalid here; the official script
  silently ignores it.
* A table op whose argument is a ``#n`` reference is invalid here; the official script reuses the
  row of an earlier table step (a leftover variable).
* An empty program is invalid here; there it yields "n/a", which never matches a gold answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BINARY_OPS: tuple[str, ...] = ("add", "subtract", "multiply", "divide", "exp", "greater")
TABLE_OPS: tuple[str, ...] = ("table_max", "table_min", "table_sum", "table_average")
ALL_OPS: tuple[str, ...] = BINARY_OPS + TABLE_OPS
EOF = "EOF"
ANSWER_DECIMALS = 5

# A step result: a number, or "yes"/"no" from `greater`. Complex numbers (a negative base to a
# fractional power) and other strings can exist mid-program, as in the official script, but make
# the program invalid if they reach the answer.
Value = float | complex | str
Table = Sequence[Sequence[str]]


class ProgramError(ValueError):
    """The program is invalid under the official executor's rules; the message says why."""


@dataclass(frozen=True)
class Step:
    """One ``op(arg1, arg2)`` step; args are the raw tokens (the official script strips them on use)."""

    op: str
    arg1: str
    arg2: str

    @property
    def is_table(self) -> bool:
        return self.op in TABLE_OPS


# ---------------------------------------------------------------- tokenisation


def program_to_tokens(program: str) -> list[str]:
    """Tokenise a program string exactly as the official script tokenises gold programs.

    Steps and arguments are separated by ``", "`` (comma + space); ``(`` ends a token and ``)``
    is a token of its own. ``"subtract(5829, 5735), divide(#0, 5735)"`` →
    ``["subtract(", "5829", "5735", ")", "divide(", "#0", "5735", ")", "EOF"]``.
    """
    tokens: list[str] = []
    for piece in program.split(", "):
        current = ""
        for char in piece:
            if char == ")" and current:
                tokens.append(current)
                current = ""
            current += char
            if char in "()":
                tokens.append(current)
                current = ""
        if current:
            tokens.append(current)
    tokens.append(EOF)
    return tokens


def tokens_to_program(tokens: Sequence[str]) -> str:
    """Inverse of :func:`program_to_tokens` for well-formed token lists (trailing ``EOF`` optional)."""
    steps = parse_steps(tokens)
    return ", ".join(f"{s.op}({s.arg1}, {s.arg2})" for s in steps)


def strip_eof(tokens: Sequence[str]) -> list[str]:
    """Drop one trailing ``EOF`` if present (a list without it is accepted as already stripped)."""
    body = list(tokens)
    if body and body[-1] == EOF:
        body.pop()
    return body


def parse_steps(tokens: Sequence[str]) -> list[Step]:
    """Split tokens into 4-token steps, checking the structure the official script checks."""
    body = strip_eof(tokens)
    if not body:
        raise ProgramError("empty program: no steps before EOF")
    for token in body:
        if not isinstance(token, str):
            raise ProgramError(f"token {token!r} is not a string")
    if len(body) % 4:
        raise ProgramError(
            f"{len(body)} tokens is not a whole number of 4-token steps (op(, arg, arg, ')')); "
            "every step needs exactly two arguments"
        )
    steps: list[Step] = []
    for k in range(len(body) // 4):
        op_token, arg1, arg2, close = body[4 * k : 4 * k + 4]
        if not op_token.endswith("(") or op_token[:-1] not in ALL_OPS:
            raise ProgramError(
                f"step {k}: {op_token!r} is not an operation; expected one of " + ", ".join(op + "(" for op in ALL_OPS)
            )
        if close != ")":
            raise ProgramError(f"step {k}: expected ')' after two arguments, got {close!r}")
        for arg in (arg1, arg2):
            # The official script splits the joined tokens on these characters, so an argument
            # holding one of them can never execute there.
            if any(char in arg for char in "()|"):
                raise ProgramError(f"step {k}: argument {arg!r} may not contain '(', ')' or '|'")
        steps.append(Step(op_token[:-1], arg1, arg2))
    return steps


# ---------------------------------------------------------------- numbers


def str_to_num(text: str) -> float | None:
    """The official number reading: commas dropped, ``x%`` → x/100, ``const_k`` → k; None if not a number."""
    text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        pass
    if "%" in text:
        try:
            return float(text.replace("%", "")) / 100.0
        except ValueError:
            return None
    if "const" in text:
        body = text.replace("const_", "")
        if body == "m1":
            body = "-1"
        try:
            return float(body)
        except ValueError:  # the official script raises here, which also makes the program invalid
            return None
    return None


def clean_cell(cell: str) -> str:
    """A table cell as the official table ops read it: no ``$``, nothing from the first ``(``."""
    return cell.replace("$", "").strip().split("(")[0].strip()


def row_numbers(row_name: str, table: Table | None) -> list[float]:
    """The numeric cells (all but the first) of the row named `row_name`; ProgramError if unusable."""
    if table is None:
        raise ProgramError(f"table operation on row {row_name!r} but no table is given")
    rows: dict[str, Sequence[str]] = {}
    for index, row in enumerate(table):
        if len(row) == 0:
            raise ProgramError(f"table row {index} is empty")
        rows[row[0]] = row[1:]  # later rows with the same name win, as in the official dict
    if row_name not in rows:
        names = ", ".join(repr(name) for name in list(rows)[:12])
        raise ProgramError(f"no table row named {row_name!r} (rows: {names})")
    numbers: list[float] = []
    for cell in rows[row_name]:
        value = str_to_num(clean_cell(cell))
        if value is None:
            raise ProgramError(f"table row {row_name!r}: cell {cell!r} is not a number")
        numbers.append(value)
    return numbers


# ---------------------------------------------------------------- execution


def _operand(arg: str, results: list[Value], step: int) -> Value:
    arg = arg.strip()
    if "#" in arg:
        try:
            ref = int(arg.replace("#", ""))
        except ValueError:
            raise ProgramError(f"step {step}: bad step reference {arg!r}") from None
        if not 0 <= ref < len(results):
            raise ProgramError(
                f"step {step}: {arg!r} refers to a step that has not run yet (only #0..#{step - 1} exist)"
                if step
                else f"step 0: {arg!r} refers to a step that has not run yet (no earlier steps)"
            )
        return results[ref]
    value = str_to_num(arg)
    if value is None:
        raise ProgramError(f"step {step}: {arg!r} is not a number, percentage, constant or #n reference")
    return value


def _binary(op: str, a: Value, b: Value, step: int) -> Value:
    if op == "greater":
        if isinstance(a, complex) or isinstance(b, complex):
            raise ProgramError(f"step {step}: greater of a complex number (negative base to a fractional power)")
        if isinstance(a, str) != isinstance(b, str):
            raise ProgramError(f"step {step}: greater compares a yes/no result with a number")
        return "yes" if a > b else "no"  # type: ignore[operator]  # both str or both float
    if isinstance(a, str) or isinstance(b, str):
        if op == "add" and isinstance(a, str) and isinstance(b, str):
            return a + b  # the official script concatenates; only an unused or compared result survives
        raise ProgramError(f"step {step}: {op} of a yes/no result")
    try:
        if op == "add":
            return a + b
        if op == "subtract":
            return a - b
        if op == "multiply":
            return a * b
        if op == "divide":
            return a / b
        return a**b  # exp; a negative base to a fractional power gives a complex number
    except ZeroDivisionError:
        raise ProgramError(f"step {step}: division by zero in {op}") from None
    except OverflowError:
        raise ProgramError(f"step {step}: {op} overflows") from None


def _table(op: str, arg: str, table: Table | None, step: int) -> float:
    row_name = arg.strip()
    if "#" in row_name:
        raise ProgramError(f"step {step}: {op} takes a table row name, not a step reference {row_name!r}")
    try:
        numbers = row_numbers(row_name, table)
    except ProgramError as err:
        raise ProgramError(f"step {step}: {err}") from None
    if op == "table_sum":
        return float(sum(numbers))
    if not numbers:
        raise ProgramError(f"step {step}: {op} of row {row_name!r}, which has no cells")
    if op == "table_max":
        return max(numbers)
    if op == "table_min":
        return min(numbers)
    return sum(numbers) / len(numbers)


def run_steps(steps: Sequence[Step], table: Table | None) -> float | str:
    """Execute parsed steps; the last result, rounded to 5 decimals unless it is yes/no."""
    if not steps:
        raise ProgramError("empty program: no steps")
    results: list[Value] = []
    for k, step in enumerate(steps):
        if step.is_table:
            results.append(_table(step.op, step.arg1, table, k))
        else:
            a = _operand(step.arg1, results, k)
            b = _operand(step.arg2, results, k)
            results.append(_binary(step.op, a, b, k))
    answer = results[-1]
    if isinstance(answer, complex):
        raise ProgramError("the answer is a complex number (a negative base to a fractional power)")
    if isinstance(answer, str):
        if answer not in ("yes", "no"):
            raise ProgramError(f"the answer {answer!r} is neither a number nor yes/no")
        return answer
    return round(answer, ANSWER_DECIMALS)


def execute_tokens(tokens: Sequence[str], table: Table | None = None) -> float | str:
    """Execute a token list (trailing ``EOF`` optional) against `table`; ProgramError when invalid."""
    return run_steps(parse_steps(tokens), table)


def execute_program(program: str, table: Table | None = None) -> float | str:
    """Execute a program string such as ``"subtract(5829, 5735), divide(#0, 5735)"``."""
    return execute_tokens(program_to_tokens(program), table)


# ---------------------------------------------------------------- accuracies


def execution_accuracy(pred_tokens: Sequence[str], gold_exe_ans: float | str, table: Table | None) -> bool:
    """True when the prediction is valid and its result ``==`` the gold answer (no tolerance)."""
    try:
        result = execute_tokens(pred_tokens, table)
    except ProgramError:
        return False
    return result == gold_exe_ans


def program_accuracy(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> bool:
    """Symbolic equivalence of the prediction to the gold program (see :mod:`agentrft.envs.finqa.symbolic`).

    Raises ProgramError only when the *gold* program is malformed.
    """
    from agentrft.envs.finqa.symbolic import equal_programs  # sympy is imported only when needed

    return equal_programs(gold_tokens, pred_tokens)


__all__ = [
    "ALL_OPS",
    "BINARY_OPS",
    "EOF",
    "TABLE_OPS",
    "ProgramError",
    "Step",
    "clean_cell",
    "execute_program",
    "execute_tokens",
    "execution_accuracy",
    "parse_steps",
    "program_accuracy",
    "program_to_tokens",
    "row_numbers",
    "run_steps",
    "str_to_num",
    "tokens_to_program",
]


# ---------------------------------------------------------------- infix form

_INFIX_OPS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "exp": "^"}


def program_to_infix(program: str) -> str | None:
    """The arithmetic expression a calculator reads for `program`, or None when it has no infix form.

    ``subtract(5829, 5735), divide(#0, 5735)`` -> ``(5829 - 5735) / 5735``. Small models
    imitate infix arithmetic far more reliably than FinQA's program syntax, so worked
    examples for the simple levels use this form. Table ops and `greater` have none.
    """
    steps = parse_steps(program_to_tokens(program))
    exprs: list[str] = []
    for step in steps:
        if step.op not in _INFIX_OPS:
            return None
        args = []
        for raw in (step.arg1.strip(), step.arg2.strip()):
            if raw.startswith("#"):
                inner = exprs[int(raw[1:])]
                args.append(inner if " " not in inner else f"({inner})")
            elif raw.startswith("const_"):
                args.append("-1" if raw == "const_m1" else raw[len("const_") :])
            else:
                args.append(raw)
        exprs.append(f"{args[0]} {_INFIX_OPS[step.op]} {args[1]}")
    return exprs[-1] if exprs else None

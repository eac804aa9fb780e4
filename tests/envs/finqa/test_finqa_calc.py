"""The calculator tool core: arithmetic, programs, formatting, errors and abuse guards."""

from __future__ import annotations

import pytest

from agentrft.envs.finqa.calc import CalcError, calculate, format_number

TABLE = [["", "2019", "2018"], ["net revenue", "$ 1,200", "$ 1,000"], ["notes", "n/a", "5"]]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("10 - 4 - 3", "3"),  # left-associative
        ("100 / 10 / 5", "2"),
        ("2 ^ 3 ^ 2", "512"),  # right-associative power
        ("2 ** 10", "1024"),
        ("-2 ^ 2", "-4"),  # power binds tighter than unary minus
        ("(-2) ^ 2", "4"),
        ("2 ^ -1", "0.5"),
        ("-(3 - 5)", "2"),
        ("--3", "3"),
        ("+4", "4"),
        ("5,829 - 5,735", "94"),
        ("$1,200 + $ 800", "2000"),
        ("-$5", "-5"),
        ("12%", "0.12"),
        ("50% * 200", "100"),
        ("(94 / 5735) * 100%", "0.016391"),
        ("(5829 - 5735) / 5735", "0.016391"),  # 0.0163905843...
        ("1 / 3", "0.333333"),
        ("2 / 3", "0.666667"),
        ("1.5e3", "1500"),
        (".5 + .25", "0.75"),
        ("0.1 + 0.2", "0.3"),
        ("1 / 8000000", "1.25e-07"),  # too small for 6 decimals: significant digits kept
        ("  7  ", "7"),
    ],
)
def test_arithmetic(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("program", "table", "expected"),
    [
        ("subtract(5829, 5735), divide(#0, 5735)", None, "0.01639"),  # official rounding to 5 decimals
        ("greater(3, 2)", None, "yes"),
        ("greater(2, 3)", None, "no"),
        ("add(1,2)", None, "3"),  # bare commas accepted when no ", " is used
        ("add(5,829, 1)", None, "5830"),  # with ", " separators, 5,829 is one number
        ("multiply($1,000, 12%)", None, "120"),
        ("divide(1, const_1000)", None, "0.001"),
        ("multiply(4, const_m1)", None, "-4"),
        ("table_sum(net revenue, none)", TABLE, "2200"),
        ("table_average(net revenue)", TABLE, "1100"),  # `none` may be omitted
        ("table_max(net revenue, none), subtract(#0, 200)", TABLE, "1000"),
        (" add ( 1, 2 ) , multiply(#0, 2)", None, "6"),
    ],
)
def test_programs(program: str, table: list[list[str]] | None, expected: str) -> None:
    assert calculate(program, table) == expected


@pytest.mark.parametrize(
    ("expression", "table", "message"),
    [
        ("1 / 0", None, "division by zero"),
        ("0 ^ -1", None, "division by zero"),
        ("12 % 5", None, "not modulo"),
        ("foo + 1", None, "unknown name 'foo' at position 0"),
        ("2 * x", None, "unknown name 'x' at position 4"),
        ("1 + ", None, "ends too early"),
        ("(1 + 2", None, "missing '\\)'"),
        ("1 + 2)", None, "unexpected '\\)'"),
        ("2(3)", None, "expected an operator"),
        ("1,2 + 3", None, "commas may only separate thousands"),
        ("1 # 2", None, "unexpected character '#'"),
        ("", None, "empty expression"),
        ("   ", None, "empty expression"),
        ("(-8) ^ 0.5", None, "no real result"),
        ("divide(1, 0)", None, "division by zero"),
        ("add(1, 2, 3)", None, "takes 2 arguments"),
        ("add(1, 2) multiply(#0, 2)", None, "expected ', '"),
        ("add(1, #1)", None, "not run yet"),
        ("modulo(5, 2)", None, "unknown operation 'modulo'"),
        ("add(1, 2", None, "missing '\\)'"),
        ("table_sum(net revenue, none)", None, "no table"),
        ("table_sum(Net Revenue, none)", TABLE, "no table row named 'Net Revenue'"),
        ("table_sum(notes, none)", TABLE, "'n/a' is not a number"),
    ],
)
def test_errors_are_calc_errors_with_model_readable_messages(
    expression: str, table: list[list[str]] | None, message: str
) -> None:
    with pytest.raises(CalcError, match=message):
        calculate(expression, table)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('echo hacked')",
        "open('/etc/passwd').read()",
        "().__class__.__bases__[0]",
        "exec('1')",
        "lambda: 1",
        "[1, 2]",
        "'a' * 3",
        "1; 2",
    ],
)
def test_no_code_execution(expression: str) -> None:
    with pytest.raises(CalcError):
        calculate(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("10 ^ 10000", "exponent 10000 too large"),
        ("9 ^ 9 ^ 9", "too large"),
        ("1e400", "too large"),
        ("1e20 * 1e11", "too large"),
        ("10 ^ 999", "too large"),
        ("(" * 100 + "1" + ")" * 100, "nested too deeply"),
        ("-" * 100 + "1", "nested too deeply"),
        ("1+" * 1500 + "1", "expression too long"),
    ],
)
def test_abuse_guards(expression: str, message: str) -> None:
    with pytest.raises(CalcError, match=message):
        calculate(expression)


def test_calc_error_is_a_value_error() -> None:
    assert issubclass(CalcError, ValueError)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.0, "3"),
        (-0.0, "0"),
        (0.01639, "0.01639"),
        (1234567.891234567, "1234567.891235"),
        (2e15, "2e+15"),
        ("no", "no"),
    ],
)
def test_format_number(value: float | str, text: str) -> None:
    assert format_number(value) == text

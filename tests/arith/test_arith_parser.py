"""The shared arithmetic parser: grammar, the optional forms of each dialect, limits, errors."""

from __future__ import annotations

import pytest

from agentrft.arith import FUNCTIONS, ArithError, Chain, Function, Limits, Num, Syntax, evaluate, parse

CALC = Syntax(percent=True, money=True, double_star=True)  # the calculator's dialect
FORMULA = Syntax(names=frozenset({"a", "b"}), functions=FUNCTIONS)  # the multi grader's dialect


def value(
    text: str, syntax: Syntax = Syntax(), values: dict[str, float] | None = None, limits: Limits = Limits()
) -> float:
    return evaluate(parse(text, syntax), values, limits)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("10 - 4 - 3", 3.0),  # left-associative
        ("100 / 10 / 5", 2.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative
        ("-2 ^ 2", -4.0),  # power binds tighter than unary minus
        ("(-2) ^ 2", 4.0),
        ("2 ^ -1", 0.5),
        ("--3", 3.0),
        ("+4", 4.0),
        ("1.5e3 + .5", 1500.5),
        ("2.", 2.0),
    ],
)
def test_plain_arithmetic(text: str, expected: float) -> None:
    assert value(text) == expected


@pytest.mark.parametrize(
    ("text", "enabled", "expected"),
    [
        ("12%", Syntax(percent=True), 0.12),
        ("50%%", Syntax(percent=True), 0.005),
        ("2 ** 10", Syntax(double_star=True), 1024.0),
        ("$1,200 + $ 800", Syntax(money=True), 2000.0),
        ("1,234.5", Syntax(money=True), 1234.5),
        ("max(1, 2, 3) + min(4, 5)", Syntax(functions=FUNCTIONS), 7.0),
    ],
)
def test_optional_forms_only_in_the_dialects_that_enable_them(text: str, enabled: Syntax, expected: float) -> None:
    assert value(text, enabled) == pytest.approx(expected, rel=1e-15)
    with pytest.raises(ArithError):
        value(text)  # the default syntax accepts none of them


def test_calculator_and_formula_dialects_differ() -> None:
    assert value("$5,829 - 5,735", CALC) == 94.0
    assert value("min(a, b) ^ 2", FORMULA, {"a": 3.0, "b": 4.0}) == 9.0
    with pytest.raises(ArithError, match="unknown name 'min' at position 0$"):
        value("min(1, 2)", CALC)
    with pytest.raises(ArithError, match="unexpected '\\*' at position 3"):
        value("a ** 2", FORMULA, {"a": 1.0})


def test_thousands_commas_and_argument_commas_cannot_mix() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        Syntax(money=True, functions=FUNCTIONS)


def test_a_tree_is_parsed_once_and_evaluated_with_new_values() -> None:
    tree = parse("(a + b) / 2", FORMULA)
    assert [evaluate(tree, {"a": x, "b": 1.0}) for x in (1.0, 3.0)] == [1.0, 2.0]
    with pytest.raises(ArithError, match="no value for 'b' at position 5"):
        evaluate(tree, {"a": 1.0})


def test_names_and_functions() -> None:
    syntax = Syntax(names=frozenset({"log"}), functions=FUNCTIONS)
    assert value("log + log(1)", syntax, {"log": 2.0}) == 2.0  # a name is a call only when '(' follows
    with pytest.raises(ArithError, match="unknown name 'c' at position 4; known names: a, b, abs\\(\\)"):
        value("a + c", FORMULA)
    with pytest.raises(ArithError, match="sqrt at position 0 is a function: expected '\\(' after it"):
        value("sqrt + 1", FORMULA)
    with pytest.raises(ArithError, match="abs\\(\\) at position 0 takes 1 argument\\(s\\), got 2"):
        value("abs(1, 2)", FORMULA)
    with pytest.raises(ArithError, match="max\\(\\) at position 2 takes at least 1 argument\\(s\\), got 0"):
        value("1+max()", FORMULA)
    between = Syntax(
        functions={
            "clip": Function(lambda x, lo, hi: min(max(x, lo), hi), 3, 3),
            "hyp": Function(lambda *xs: sum(x * x for x in xs) ** 0.5, 2, 3),
        }
    )
    assert value("clip(5, 0, 1) + hyp(3, 4)", between) == 6.0
    with pytest.raises(ArithError, match="takes 2 to 3 argument\\(s\\), got 1"):
        value("hyp(3)", between)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty expression"),
        ("  ", "empty expression"),
        ("1 + ", "ends too early: expected a number or '\\('"),
        ("(1 + 2", "missing '\\)' at position 6"),
        ("1 + 2)", "unexpected '\\)' at position 5: expected an operator"),
        ("2(3)", "unexpected '\\(' at position 1: expected an operator"),
        ("1 # 2", "unexpected character '#' at position 2"),
        ("x", "unknown name 'x' at position 0$"),
        ("__import__('os')", "unknown name '__import__'"),
        ("1; 2", "unexpected character ';'"),
    ],
)
def test_syntax_errors_name_the_position(text: str, message: str) -> None:
    with pytest.raises(ArithError, match=message):
        parse(text)


def test_percent_hint_and_thousands_check() -> None:
    with pytest.raises(ArithError, match="not modulo"):
        parse("12 % 5", CALC)
    with pytest.raises(ArithError, match="'1,2' at position 0 is not a number: commas may only separate thousands"):
        parse("1,2 + 3", CALC)
    with pytest.raises(ArithError, match="unexpected character ','"):
        parse("1 , 2", CALC)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 / 0", "division by zero at position 2"),
        ("1 / (2 - 2)", "division by zero at position 2"),
        ("0 ^ -1", "0 to a negative power at position 2"),
        ("(-8) ^ 0.5", "no real result"),
        ("1e400", "not a finite number"),
        ("1e200 * 1e200", "not a finite number"),
        ("10 ^ 400", "not a finite number"),  # OverflowError in float power
        ("sqrt(-1)", "sqrt\\(\\) at position 0: math domain error"),
        ("log(0)", "log\\(\\) at position 0"),
        ("exp(1000)", "exp\\(\\) at position 0: math range error"),
    ],
)
def test_evaluation_errors(text: str, message: str) -> None:
    tree = parse(text, Syntax(functions=FUNCTIONS))  # parsing succeeds: these fail only when computed
    with pytest.raises(ArithError, match=message):
        evaluate(tree)


def test_limits() -> None:
    capped = Limits(max_exponent=10, max_magnitude=1000)
    assert value("10 ^ 3", limits=capped) == 1000.0
    with pytest.raises(ArithError, match="result too large \\(limit 1000\\)"):
        value("10 ^ 3 + 1", limits=capped)
    with pytest.raises(ArithError, match="result too large"):
        value("1001", limits=capped)  # literals are checked too
    with pytest.raises(ArithError, match="exponent 11 too large \\(limit 10\\)"):
        value("1 ^ 11", limits=capped)
    with pytest.raises(ArithError, match="exponent 3.8742e\\+08 too large"):
        value("9 ^ 9 ^ 9", limits=Limits(max_exponent=1000))  # refused before computing


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("(" * 65 + "1" + ")" * 65, "((1))"),
        ("-" * 65 + "1", "--1"),
        ("2^" * 65 + "2", "2^2^2"),
        ("abs(" * 65 + "1" + ")" * 65, "abs(abs(1))"),
    ],
)
def test_depth_limit_covers_parentheses_signs_exponents_and_calls(text: str, ok: str) -> None:
    with pytest.raises(ArithError, match="nested too deeply \\(limit 64\\)"):
        parse(text, Syntax(functions=FUNCTIONS))
    parse(ok, Syntax(functions=FUNCTIONS, max_depth=2))
    with pytest.raises(ArithError, match="nested too deeply \\(limit 1\\)"):
        parse(ok, Syntax(functions=FUNCTIONS, max_depth=1))


def test_length_limit_and_flat_chains() -> None:
    with pytest.raises(ArithError, match="expression too long \\(2001 characters, limit 2000\\)"):
        parse("1" * 2001)
    # a long sum is one flat Chain: evaluating it loops instead of recursing once per '+'
    text = "1+" * 5000 + "1"
    tree = parse(text, Syntax(max_chars=len(text)))
    assert isinstance(tree, Chain) and len(tree.rest) == 5000 and tree.first == Num(1.0, 0)
    assert evaluate(tree) == 5001.0


def test_arith_error_is_a_value_error() -> None:
    assert issubclass(ArithError, ValueError)

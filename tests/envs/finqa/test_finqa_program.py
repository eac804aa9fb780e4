"""Executor tests built from the official FinQA evaluate.py rules (hand-computed answers)."""

from __future__ import annotations

import pytest

from agentrft.envs.finqa.program import (
    ProgramError,
    execute_program,
    execute_tokens,
    execution_accuracy,
    program_to_tokens,
    str_to_num,
    tokens_to_program,
)

TABLE = [
    ["", "2019", "2018", "2017"],
    ["net revenue", "$ 1,200", "$ 1,000", "$ 800"],
    ["interest expense", "30 ( 2 )", "$ 20 (restated)", "10"],
    ["margin", "12%", "10%", "8%"],
    ["notes", "n/a", "5", "6"],
    ["dup", "1", "1", "1"],
    ["dup", "2", "4", "6"],
    ["single", "7"],
    ["empty"],
]


# ---------------------------------------------------------------- tokenisation


def test_tokenisation_matches_official_form() -> None:
    tokens = program_to_tokens("subtract(5829, 5735), divide(#0, 5735)")
    assert tokens == ["subtract(", "5829", "5735", ")", "divide(", "#0", "5735", ")", "EOF"]
    assert tokens_to_program(tokens) == "subtract(5829, 5735), divide(#0, 5735)"


def test_tokenisation_keeps_table_row_names_and_only_splits_on_comma_space() -> None:
    assert program_to_tokens("table_sum(net revenue, none)") == ["table_sum(", "net revenue", "none", ")", "EOF"]
    # a bare comma is not a separator: the arguments stay one token, so the step is malformed
    assert program_to_tokens("add(1,2)") == ["add(", "1,2", ")", "EOF"]
    with pytest.raises(ProgramError, match="4-token"):
        execute_program("add(1,2)")


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5,829", 5829.0),
        ("-3.5", -3.5),
        ("12%", 0.12),
        ("1,250%", 12.5),
        ("const_1", 1.0),
        ("const_100", 100.0),
        ("const_1000", 1000.0),
        ("const_1000000000", 1e9),
        ("const_m1", -1.0),
        ("abc", None),
        ("const_x", None),
        ("x%", None),
        ("", None),
    ],
)
def test_str_to_num(text: str, expected: float | None) -> None:
    assert str_to_num(text) == expected


# ---------------------------------------------------------------- arithmetic steps


def test_reference_answer_is_rounded_to_5_decimals() -> None:
    # 94 / 5735 = 0.016390584...
    assert execute_program("subtract(5829, 5735), divide(#0, 5735)") == 0.01639


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("add(1,234, 766)", 2000.0),  # only ", " separates, so 1,234 stays one token
        ("add(5%, 10%)", 0.15),
        ("subtract(5, 7)", -2.0),
        ("multiply(const_m1, 7)", -7.0),
        ("divide(5, const_1000)", 0.005),
        ("exp(2, 10)", 1024.0),
        ("exp(1.1, 2)", 1.21),
        ("divide(2, 3)", 0.66667),
        ("divide(1, 3), multiply(#0, 3)", 1.0),  # rounding happens only at the end
        ("add(1, 2), add(#0, 3), multiply(#1, #0)", 18.0),
    ],
)
def test_arithmetic(program: str, expected: float) -> None:
    assert execute_program(program) == expected


def test_commas_inside_a_token_are_dropped() -> None:
    assert execute_tokens(["add(", "1,234", "766", ")", "EOF"]) == 2000.0


def test_greater_gives_yes_or_no() -> None:
    assert execute_program("greater(3, 2)") == "yes"
    assert execute_program("greater(2, 3)") == "no"
    assert execute_program("greater(2, 2)") == "no"
    assert execute_program("subtract(10, 4), greater(#0, 5)") == "yes"


def test_unused_oddities_mid_program_do_not_invalidate_as_in_the_official_script() -> None:
    # a complex intermediate (negative base to a fractional power) that the answer never uses
    assert execute_program("exp(const_m1, 0.5), greater(3, 2)") == "yes"
    # "yes" + "no" concatenates there; unused, it does no harm
    assert execute_program("greater(1, 2), greater(3, 2), add(#0, #1), add(4, 5)") == 9.0
    # a complex value can flow through arithmetic and only fails at the end
    with pytest.raises(ProgramError, match="complex"):
        execute_program("exp(const_m1, 0.5), multiply(#0, 2)")


def test_eof_is_optional() -> None:
    assert execute_tokens(["add(", "1", "2", ")"]) == 3.0


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        (["add(", "1", ")", "EOF"], "4-token"),
        (["add(", "1", "2", "3", ")", "EOF"], "4-token"),
        (["add(", "1", "2", "3", "EOF"], "expected '\\)'"),
        (["add(", "1", "2", ")", "subtract(", "3", "EOF"], "4-token"),  # trailing partial step
        (["plus(", "1", "2", ")", "EOF"], "not an operation"),
        (["add", "1", "2", ")", "EOF"], "not an operation"),
        (["EOF"], "empty"),
        ([], "empty"),
        (["add(", "#0", "2", ")", "EOF"], "not run yet"),  # refers to itself
        (["add(", "1", "2", ")", "add(", "#2", "1", ")", "EOF"], "not run yet"),  # future step
        (["add(", "1", "2", ")", "add(", "#x", "1", ")", "EOF"], "bad step reference"),
        (["add(", "1", "2", ")", "add(", "#-1", "1", ")", "EOF"], "not run yet"),
        (["add(", "one", "2", ")", "EOF"], "not a number"),
        (["divide(", "1", "0", ")", "EOF"], "division by zero"),
        (["divide(", "1", "const_0", ")", "EOF"], "division by zero"),
        (["exp(", "10", "1000", ")", "EOF"], "overflows"),
        (["exp(", "-8", "0.5", ")", "EOF"], "complex"),
        (["exp(", "-8", "0.5", ")", "greater(", "#0", "1", ")", "EOF"], "complex"),
        (["greater(", "1", "2", ")", "greater(", "3", "2", ")", "add(", "#0", "#1", ")", "EOF"], "neither"),
        (["greater(", "1", "2", ")", "add(", "#0", "1", ")", "EOF"], "yes/no"),
    ],
)
def test_invalid_programs(tokens: list[str], reason: str) -> None:
    with pytest.raises(ProgramError, match=reason):
        execute_tokens(tokens)


# ---------------------------------------------------------------- table ops


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("table_sum(net revenue, none)", 3000.0),  # $ and commas stripped
        ("table_average(net revenue, none)", 1000.0),
        ("table_max(net revenue, none)", 1200.0),
        ("table_min(net revenue, none)", 800.0),
        ("table_sum(interest expense, none)", 60.0),  # everything from the first '(' dropped
        ("table_average(margin, none)", 0.1),  # percentages in cells
        ("table_max(dup, none)", 6.0),  # the last row of a repeated name wins
        ("table_average(single, none)", 7.0),
        ("table_sum(net revenue, none), divide(#0, 3)", 1000.0),
        ("table_sum(net revenue , none)", 3000.0),  # the argument is stripped before the lookup
        ("table_max(margin, none), multiply(#0, const_100)", 12.0),
    ],
)
def test_table_ops(program: str, expected: float) -> None:
    assert execute_program(program, TABLE) == expected


def test_table_op_on_header_row_uses_its_numbers() -> None:
    assert execute_tokens(["table_max(", "", "none", ")", "EOF"], TABLE) == 2019.0


def test_table_sum_of_a_row_without_cells_is_zero_but_other_ops_are_invalid() -> None:
    assert execute_program("table_sum(empty, none)", TABLE) == 0.0
    with pytest.raises(ProgramError):
        execute_program("table_average(empty, none)", TABLE)
    with pytest.raises(ProgramError):
        execute_program("table_max(empty, none)", TABLE)


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("table_sum(notes, none)", "'n/a' is not a number"),
        ("table_sum(Net revenue, none)", "no table row named 'Net revenue'"),  # exact match only
        ("add(1, 2), table_sum(#0, none)", "not a step reference"),
    ],
)
def test_invalid_table_ops(program: str, reason: str) -> None:
    with pytest.raises(ProgramError, match=reason):
        execute_program(program, TABLE)


def test_table_op_without_table_is_invalid() -> None:
    with pytest.raises(ProgramError, match="no table"):
        execute_program("table_sum(net revenue, none)", None)


def test_table_row_name_with_parenthesis_is_invalid_as_in_the_official_script() -> None:
    tokens = ["table_sum(", "net income (loss", "none", ")", "EOF"]
    with pytest.raises(ProgramError, match="may not contain"):
        execute_tokens(tokens, [["net income (loss", "1"]])


# ---------------------------------------------------------------- execution accuracy


def test_execution_accuracy_is_exact_after_rounding() -> None:
    tokens = program_to_tokens("subtract(5829, 5735), divide(#0, 5735)")
    assert execution_accuracy(tokens, 0.01639, None)
    assert not execution_accuracy(tokens, 0.0164, None)  # no tolerance
    assert not execution_accuracy(tokens, 0.016391, None)
    assert execution_accuracy(program_to_tokens("add(2, 3)"), 5, None)  # int gold equals 5.0
    assert execution_accuracy(program_to_tokens("greater(3, 2)"), "yes", None)
    assert not execution_accuracy(program_to_tokens("greater(3, 2)"), "no", None)
    assert not execution_accuracy(program_to_tokens("divide(1, 0)"), 0.0, None)  # invalid never matches
    assert execution_accuracy(program_to_tokens("table_sum(net revenue, none)"), 3000.0, TABLE)


def test_program_to_infix_matches_the_executor() -> None:
    from agentrft.envs.finqa.calc import calculate
    from agentrft.envs.finqa.program import execute_program, program_to_infix

    cases = {
        "subtract(5829, 5735), divide(#0, 5735)": "(5829 - 5735) / 5735",
        "add(1, 2), add(#0, 3), divide(#1, const_3)": "((1 + 2) + 3) / 3",
        "divide(9, 4), exp(#0, 0.5), subtract(#1, const_1)": "((9 / 4) ^ 0.5) - 1",
        "multiply(2, const_m1)": "2 * -1",
    }
    for program, infix in cases.items():
        assert program_to_infix(program) == infix
        assert float(calculate(infix)) == pytest.approx(execute_program(program), abs=1e-5)
    assert program_to_infix("divide(1, 2), greater(#0, 1)") is None
    assert program_to_infix("table_sum(revenue, none)") is None

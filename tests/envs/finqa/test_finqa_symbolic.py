"""Program accuracy: the official symbolic-equivalence rules."""

from __future__ import annotations

import pytest

from agentrft.envs.finqa.program import ProgramError, program_accuracy, program_to_tokens


def same(pred: str, gold: str) -> bool:
    return program_accuracy(program_to_tokens(pred), program_to_tokens(gold))


GOLD = "subtract(5829, 5735), divide(#0, 5735)"


def test_identical_program_is_equal() -> None:
    assert same(GOLD, GOLD)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("add(5, 3)", "add(3, 5)"),
        ("multiply(5, 3)", "multiply(3, 5)"),
        ("add(1, 2), multiply(3, #0)", "add(2, 1), multiply(#0, 3)"),
        # same expression built in a different order: (a + b) + c == a + (b + c)
        ("add(1, 2), add(#0, 3)", "add(2, 3), add(1, #0)"),
        # an unused extra step does not matter: only the last step's expression is compared
        ("add(5829, 5735), subtract(5829, 5735), divide(#1, 5735)", GOLD),
        # algebraically equal after simplification: (a + b) - b == (a / b) * b == a
        ("add(5829, 5735), subtract(#0, 5735)", "divide(5829, 5735), multiply(#0, 5735)"),
    ],
)
def test_equivalent_programs(pred: str, gold: str) -> None:
    assert same(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("subtract(5735, 5829), divide(#0, 5735)", GOLD),  # subtract swap
        ("subtract(5829, 5735), divide(5735, #0)", GOLD),  # divide swap
        ("exp(2, 3)", "exp(3, 2)"),
        ("greater(2, 3)", "greater(3, 2)"),
        ("subtract(5829, 5735), multiply(#0, 5735)", GOLD),  # different operation
        ("subtract(5829, 5735)", GOLD),  # missing step
        ("subtract(5829, 5735), divide(#0, 5829)", GOLD),  # different gold operand
        ("subtract(5829, 5736), divide(#0, 5735)", GOLD),  # operand not in gold
        ("subtract(5,829, 5735), divide(#0, 5735)", GOLD),  # operands compare as text
        ("subtract(5829, 5735), divide(#1, 5735)", GOLD),  # reference to itself
        ("subtract(5829, 5735), divide(#0, 5735", GOLD),  # malformed
        ("", GOLD),
        ("add(1, 2), subtract(5829, 5735), divide(#1, 5735)", GOLD),  # extra step with non-gold operands
    ],
)
def test_different_programs(pred: str, gold: str) -> None:
    assert not same(pred, gold)


def test_program_equivalence_does_not_look_at_values() -> None:
    # 2 + 2 == 2 * 2 numerically, but not symbolically
    assert not same("multiply(2, 2)", "add(2, 2)")


def test_table_steps_are_symbols() -> None:
    gold = "table_max(revenue, none), table_min(revenue, none), subtract(#0, #1)"
    assert same(gold, gold)
    assert not same("table_max(revenue, none), table_min(revenue, none), subtract(#1, #0)", gold)
    assert not same("table_max(costs, none), table_min(revenue, none), subtract(#0, #1)", gold)
    assert same("table_sum(revenue, none), divide(#0, const_2)", "table_sum(revenue, none), divide(#0, const_2)")


def test_table_step_key_depends_on_being_the_first_step_as_in_the_official_script() -> None:
    gold = "table_max(revenue, none), table_min(revenue, none), subtract(#0, #1)"
    # the same computation with the table steps in the other order does not match: the official
    # script keys non-first steps by text with a leading separator
    assert not same("table_min(revenue, none), table_max(revenue, none), subtract(#1, #0)", gold)


def test_raw_tokens_without_eof_and_empty_prediction() -> None:
    gold = program_to_tokens("add(3, 5)")
    assert program_accuracy(["add(", "5", "3", ")"], gold)
    assert not program_accuracy([], gold)


def test_malformed_gold_raises() -> None:
    with pytest.raises(ProgramError, match="gold"):
        program_accuracy(program_to_tokens("add(1, 2)"), ["add(", "1", ")", "EOF"])
    with pytest.raises(ProgramError, match="gold"):
        program_accuracy(program_to_tokens("add(1, 2)"), program_to_tokens("add(#0, 2)"))

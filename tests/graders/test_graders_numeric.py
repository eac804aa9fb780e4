"""numeric answer extraction and matching rule; finqa_program execution accuracy."""

from __future__ import annotations

import pytest

from agentrft.graders import load_grader
from agentrft.graders.numeric import extract_answer

NUM = {"type": "numeric", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"}


@pytest.mark.parametrize(
    ("text", "value", "percent", "scale"),
    [
        ("The answer is 42.", 42.0, False, 1.0),
        ("In 2019 sales rose; the answer is 1,234.5 and not 7", 1234.5, False, 1.0),
        ("We had 3 segments and 17 stores", 17.0, False, 1.0),
        ("net loss of (123)", -123.0, False, 1.0),
        ("change: \u22125.5%", -5.5, True, 1.0),
        ("revenue was $1.2 million", 1.2, False, 1e6),
        ("about \u20ac3 billion", 3.0, False, 1e9),
        ("grew 12 percent", 12.0, True, 1.0),
        ("$5M", 5.0, False, 1e6),
        ("final answer: -$0.25", -0.25, False, 1.0),
        ("so \\boxed{0.5} (checked against 7)", 0.5, False, 1.0),
        ("FY2019 and Q3", None, None, None),
        ("", None, None, None),
    ],
)
def test_extract_answer(text: str, value: float | None, percent: bool | None, scale: float | None) -> None:
    n = extract_answer(text)
    if value is None:
        assert n is None
    else:
        assert n is not None and (n.value, n.percent, n.scale) == (value, percent, scale)


@pytest.mark.parametrize(
    ("answer", "ref", "expected"),
    [
        ("The answer is 1.64%", 0.0164, 1.0),  # percent answer vs fraction reference
        ("The answer is 1.64%", 1.64, 1.0),  # percent answer vs percent-points reference
        ("The answer is 0.0164", 1.64, 0.0),  # bare numbers are never rescaled
        ("The answer is 0.0164", "1.64%", 1.0),  # the reference states it is a percent
        ("The answer is 1.64", "1.64%", 1.0),
        ("The answer is 164", "1.64%", 0.0),
        ("It is 1.6%", 0.01639, 0.0),  # 2.4% off: outside rel_tol 1e-2
        ("It is 1.64%", 0.01639, 1.0),  # 0.06% off
        ("$1.2 million", 1_200_000, 1.0),
        ("$1.2 million", 1.2, 1.0),  # reference in table units (millions)
        ("1200000", 1.2, 0.0),
        ("1,234,567", 1234567, 1.0),
        ("(45)", -45, 1.0),
        ("45", -45, 0.0),
        ("I cannot tell", 3, 0.0),
        ("", 3, 0.0),
        ("Yes, it is greater", "yes", 1.0),
        ("the answer is no", "yes", 0.0),
        ("0", 0, 1.0),
        ("0.001", 0, 0.0),
    ],
)
def test_numeric_match_rule(answer: str, ref: object, expected: float) -> None:
    g = load_grader(NUM)
    grade = g.grade({"output_text": answer}, {"answer": ref})
    assert grade.reward == expected
    assert grade.errors == []


def test_numeric_tolerances_configurable() -> None:
    g = load_grader({**NUM, "rel_tol": 0.0, "abs_tol": 0.05})
    assert g.grade("10.04", {"answer": 10}).reward == 1.0
    assert g.grade("10.06", {"answer": 10}).reward == 0.0


def test_numeric_bad_reference_is_flagged() -> None:
    grade = load_grader(NUM).grade("42", {"answer": "forty-two"})
    assert grade.reward == 0.0 and grade.error_flags == ["other_error"]


def test_finqa_program_execution_accuracy() -> None:
    pytest.importorskip("agentrft.envs.finqa.program")
    g = load_grader({"type": "finqa_program"})
    item = {"exe_ans": 0.01639, "table": [["", "2019"], ["revenue", "$5,829"]]}
    ok = g.grade("Program: subtract(5829, 5735), divide(#0, 5735)", item)
    assert ok.reward == 1.0 and ok.success
    assert g.grade("subtract(5829, 5735), divide(#0, 5829)", item).reward == 0.0
    invalid = g.grade("divide(1, 0)", item)
    assert invalid.reward == 0.0 and invalid.errors == [] and "invalid program" in invalid.metadata["reason"]
    assert g.grade("the answer is 1.64%", item).reward == 0.0  # no program: execution accuracy is 0
    yes = g.grade("greater(5, 3)", {"exe_ans": "yes"})
    assert yes.reward == 1.0
    table_item = {"exe_ans": 5829.0, "table": [["", "2019"], ["revenue", "$5,829"]]}
    assert g.grade("table_max(revenue, none)", table_item).reward == 1.0

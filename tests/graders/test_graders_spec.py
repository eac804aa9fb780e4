"""Spec loading, templates, string_check, text_similarity, json_schema, multi formulas, summaries."""

from __future__ import annotations

import json
import math

import pytest

from agentrft.graders import GraderSpecError, Sample, combine, load_grader, summarize_grades
from agentrft.graders.formula import Formula


def sc(op: str, inp: str = "{{ sample.output_text }}", ref: str = "{{ item.answer }}") -> dict:
    return {"type": "string_check", "input": inp, "reference": ref, "operation": op}


@pytest.mark.parametrize(
    ("op", "text", "ref", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("ne", "Rome", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "It is Paris.", "Paris", 1.0),
        ("like", "it is paris", "Paris", 0.0),
        ("ilike", "IT IS PARIS", "paris", 1.0),
        ("ilike", "Par%", "paris", 0.0),  # no wildcards
        ("like", "a_c", "a%c", 0.0),
    ],
)
def test_string_check_operations(op: str, text: str, ref: str, expected: float) -> None:
    g = load_grader(sc(op))
    grade = g.grade({"output_text": text}, {"answer": ref})
    assert grade.reward == expected
    assert grade.success is (expected == 1.0)
    assert grade.errors == []


def test_spec_error_names_json_path() -> None:
    spec = {"type": "multi", "graders": {"acc": sc("equals")}, "calculate_output": "acc"}
    with pytest.raises(GraderSpecError) as e:
        load_grader(spec)
    assert str(e.value) == "graders.acc.operation: must be one of eq, ne, like, ilike"
    with pytest.raises(GraderSpecError, match=r"^graders\.acc\.colour: unknown field"):
        load_grader({"type": "multi", "graders": {"acc": {**sc("eq"), "colour": 1}}, "calculate_output": "acc"})
    with pytest.raises(GraderSpecError, match="valid types: answered, bfcl, efficiency"):
        load_grader({"type": "regex"})
    with pytest.raises(GraderSpecError, match="^reference: required field is missing"):
        load_grader({"type": "string_check", "input": "x", "operation": "eq"})


def test_nested_multi_rejected() -> None:
    inner = {"type": "multi", "graders": {"a": sc("eq")}, "calculate_output": "a"}
    with pytest.raises(GraderSpecError, match=r"^graders\.x\.type: multi graders cannot be nested"):
        load_grader({"type": "multi", "graders": {"x": inner}, "calculate_output": "x"})


def test_load_from_file_and_text(tmp_path) -> None:
    p = tmp_path / "g.json"
    p.write_text(json.dumps(sc("eq")))
    assert load_grader(p).grade("a", {"answer": "a"}).reward == 1.0
    assert load_grader(str(p)).grade("a", {"answer": "b"}).reward == 0.0
    assert load_grader(json.dumps(sc("eq"))).grade("a", {"answer": "a"}).reward == 1.0
    y = tmp_path / "g.yaml"
    y.write_text("type: string_check\ninput: '{{ sample.output_text }}'\nreference: x\noperation: eqq\n")
    with pytest.raises(GraderSpecError, match=r"g\.yaml: operation: must be one of"):
        load_grader(y)
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(GraderSpecError, match=r"bad\.json:1: invalid JSON \(Expecting property name"):
        load_grader(bad)


def test_template_paths_and_json_rendering() -> None:
    sample = Sample(
        output_text="x",
        output_tools=[{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"q": 3}'}}],
    )
    g = load_grader(sc("eq", "{{ sample.output_tools[0].function.arguments }}", '{"q": 3}'))
    assert g.grade(sample, {}).reward == 1.0
    g = load_grader(sc("eq", "{{ item.meta.nums }}|{{ item.meta.nums[1] }}", "[1, 2.5]|2.5"))
    assert g.grade(sample, {"meta": {"nums": [1, 2.5]}}).reward == 1.0


@pytest.mark.parametrize("item", [{}, {"answer": None}, {"answer": []}])
def test_missing_variable_is_flagged_not_empty(item: dict) -> None:
    ref = "{{ item.answer }}" if item.get("answer") != [] else "{{ item.answer[0] }}"
    g = load_grader(sc("eq", ref=ref))
    grade = g.grade({"output_text": ""}, item)  # "" == "" would pass if missing rendered as empty
    assert grade.reward == 0.0 and not grade.success
    assert grade.error_flags == ["invalid_variable_error"]
    assert grade.sub_rewards == {"string_check": None}


def test_bad_template_namespace_rejected_at_load() -> None:
    with pytest.raises(GraderSpecError, match="^input: template variable .*must start with item. or sample."):
        load_grader(sc("eq", inp="{{ env.HOME }}"))
    with pytest.raises(GraderSpecError, match="unclosed"):
        load_grader(sc("eq", inp="{{ sample.output_text"))


@pytest.mark.parametrize(
    ("metric", "a", "b", "expected"),
    [
        ("fuzzy_match", "kitten", "sitting", 1 - 5 / 13),  # Indel distance 5 over 13 characters
        ("rouge_1", "the cat sat", "the cat ran", 2 / 3),
        ("rouge_2", "the cat sat", "the cat ran", 1 / 2),
        ("rouge_l", "a b c d", "a c d", 2 * (3 / 4) * 1 / (3 / 4 + 1)),
        ("bleu", "the quick brown fox", "the quick brown fox", 1.0),
        ("gleu", "the quick brown fox", "the quick brown fox", 1.0),
        ("meteor", "the cat sat on the mat", "the cat sat on the mat", 1 - 0.5 * (1 / 6) ** 3),  # 1 chunk / 6
        ("meteor", "cats sat", "cat sat", 1 - 0.5 * (1 / 2) ** 3),  # stem match: cats ~ cat
    ],
)
def test_text_similarity(metric: str, a: str, b: str, expected: float) -> None:
    g = load_grader(
        {"type": "text_similarity", "input": "{{ sample.output_text }}", "reference": b, "evaluation_metric": metric}
    )
    assert g.grade(a, {}).reward == pytest.approx(expected, abs=1e-6)


def test_text_similarity_threshold_and_cosine() -> None:
    spec = {
        "type": "text_similarity",
        "input": "{{ sample.output_text }}",
        "reference": "the cat sat",
        "evaluation_metric": "rouge_1",
        "pass_threshold": 0.6,
    }
    g = load_grader(spec)
    assert g.grade("the cat ran", {}).success is True  # 2/3 >= 0.6
    assert g.grade("a dog ran", {}).success is False
    with pytest.raises(GraderSpecError, match="^evaluation_metric: cosine needs an embedding"):
        load_grader({**spec, "evaluation_metric": "cosine"})


def test_json_schema_grader() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    g = load_grader({"type": "json_schema", "json_schema": schema})
    assert g.grade('{"a": 1}', {}).reward == 1.0
    assert g.grade('```json\n{"a": 1}\n```', {}).reward == 1.0
    wrong = g.grade('{"a": "x"}', {})
    assert wrong.reward == 0.0 and wrong.errors == [] and "schema violation" in wrong.metadata["reason"]
    assert g.grade("not json", {}).reward == 0.0
    with pytest.raises(GraderSpecError, match="^json_schema: invalid JSON schema"):
        load_grader({"type": "json_schema", "json_schema": {"type": "nonsense"}})


@pytest.mark.parametrize(
    ("formula", "values", "expected"),
    [
        ("a + b * 2", {"a": 1, "b": 3}, 7),
        ("(a + b) * 2", {"a": 1, "b": 3}, 8),
        ("-2^2", {}, -4),
        ("2^3^2", {}, 512),
        ("min(a, b, 0.5) + max(a, b)", {"a": 1, "b": 3}, 3.5),
        ("abs(-a) / 4", {"a": 2}, 0.5),
        ("floor(2.7) + ceil(2.1)", {}, 5),
        ("exp(0) + sqrt(16) + log(1)", {}, 5),
        ("a - -b", {"a": 1, "b": 2}, 3),
        ("1e1 + .5", {}, 10.5),
    ],
)
def test_formula_evaluates(formula: str, values: dict, expected: float) -> None:
    assert Formula(formula, values, "f").evaluate({k: float(v) for k, v in values.items()}) == pytest.approx(expected)


@pytest.mark.parametrize(
    "formula", ["a +", "a b", "(a", "a)", "foo(a)", "abs(a, a)", "__import__('os')", "a; b", "", "a ** 2", "a.b"]
)
def test_bad_formula_is_load_time_error(formula: str) -> None:
    spec = {"type": "multi", "graders": {"a": sc("eq")}, "calculate_output": formula}
    with pytest.raises(GraderSpecError) as e:
        load_grader(spec)
    assert e.value.flag == "formula_parse_error" and e.value.path == "calculate_output"


def test_multi_combines_and_flags_errored_sub_grader() -> None:
    spec = {
        "type": "multi",
        "calculate_output": "0.75 * acc + 0.25 * fmt",
        "graders": {"acc": sc("eq"), "fmt": sc("like", ref="{{ item.unit }}")},
    }
    g = load_grader(spec)
    grade = g.grade("42 km", {"answer": "42 km", "unit": "km"})
    assert grade.reward == 1.0 and grade.success and grade.sub_rewards == {"acc": 1.0, "fmt": 1.0}
    grade = g.grade("41 km", {"answer": "42 km", "unit": "km"})
    assert grade.reward == 0.25 and not grade.success
    # `unit` missing: fmt errors → reward 0 *with* the flag, acc's score still recorded
    grade = g.grade("42 km", {"answer": "42 km"})
    assert grade.reward == 0.0 and not grade.success
    assert [(e.flag, e.grader) for e in grade.errors] == [("invalid_variable_error", "fmt")]
    assert grade.sub_rewards == {"acc": 1.0, "fmt": None}


def test_multi_runtime_math_error_is_flagged() -> None:
    g = load_grader({"type": "multi", "graders": {"a": sc("eq")}, "calculate_output": "1 / a"})
    grade = g.grade("x", {"answer": "y"})
    assert grade.reward == 0.0 and grade.error_flags == ["other_error"]


def test_combine_python_functions() -> None:
    def acc(sample, item):
        return float(sample.output_text.strip() == item["answer"])

    def fmt(sample, item):
        return None if not sample.output_text else float(sample.output_text.isdigit())

    g = combine({"acc": (acc, 0.8), "fmt": (fmt, 0.2)})
    assert g.grade("42", {"answer": "42"}).reward == pytest.approx(1.0)
    assert g.grade("42", {"answer": "42"}).success
    assert g.grade("x", {"answer": "x"}).reward == pytest.approx(0.8)
    empty = g.grade("", {"answer": ""})
    assert empty.reward == 0.0 and empty.error_flags == ["sample_parse_error"] and empty.errors[0].grader == "fmt"


def test_summarize_grades_counts_errors_per_grader() -> None:
    g = load_grader(
        {
            "type": "multi",
            "calculate_output": "(acc + fmt) / 2",
            "graders": {"acc": sc("eq"), "fmt": sc("like", ref="{{ item.unit }}")},
        }
    )
    grades = [
        g.grade("1 km", {"answer": "1 km", "unit": "km"}),
        g.grade("2", {"answer": "1 km", "unit": "km"}),
        g.grade("1 km", {"answer": "1 km"}),
    ]
    s = summarize_grades(grades)
    assert s["n"] == 3 and s["reward_mean"] == pytest.approx(1 / 3)
    assert s["success_rate"] == pytest.approx(1 / 3)
    assert s["sub_reward_mean"] == {"acc": pytest.approx(2 / 3), "fmt": pytest.approx(0.5)}
    assert s["errors_by_grader"] == {"fmt": {"invalid_variable_error": 1}}
    assert s["error_count"] == 1 and s["errors_by_flag"] == {"invalid_variable_error": 1}
    assert summarize_grades([])["reward_mean"] is None
    assert not math.isnan(s["error_rate"])

"""`agentrft grade`: JSONL in, one JSON line per pair out; clear one-line errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrft.cli.main import app

runner = CliRunner()


def write(path, rows):  # type: ignore[no-untyped-def]
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


SPEC = {
    "type": "multi",
    "calculate_output": "acc",
    "graders": {"acc": {"type": "numeric", "reference": "{{ item.answer }}"}},
}


def test_grade_json_lines(tmp_path) -> None:
    g = write(tmp_path / "g.json", [SPEC])
    items = write(tmp_path / "items.jsonl", [{"answer": 12}, {"answer": 3}, {"answer": 5}])
    samples = write(
        tmp_path / "s.jsonl",
        [{"output_text": "The answer is 12"}, {"output_text": "score: 1.0"}, {"output_text": "5", "output_tools": []}],
    )
    res = runner.invoke(app, ["grade", "--grader", g, "--items", items, "--samples", samples, "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["reward"] for x in lines] == [1.0, 0.0, 1.0]
    assert lines[0]["sub_rewards"] == {"acc": 1.0} and lines[0]["errors"] == []


def test_grade_rejects_bad_spec_before_reading_samples(tmp_path) -> None:
    bad = {
        "type": "multi",
        "calculate_output": "acc",
        "graders": {"acc": {"type": "string_check", "input": "a", "reference": "b", "operation": "is"}},
    }
    g = write(tmp_path / "g.json", [bad])
    res = runner.invoke(app, ["grade", "--grader", g, "--items", "/nonexistent", "--samples", "/nonexistent"])
    assert res.exit_code == 2
    assert "g.json: graders.acc.operation: must be one of eq, ne, like, ilike" in res.stderr


def test_grade_bad_jsonl_line(tmp_path) -> None:
    g = write(tmp_path / "g.json", [SPEC])
    items = write(tmp_path / "items.jsonl", [{"answer": 1}])
    samples = write(tmp_path / "s.jsonl", [{"output_text": "1"}, "{oops"])
    res = runner.invoke(app, ["grade", "--grader", g, "--items", items, "--samples", samples])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {samples}:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
    ]
    samples = write(tmp_path / "s2.jsonl", [{"text": "1"}])
    res = runner.invoke(app, ["grade", "--grader", g, "--items", items, "--samples", samples])
    assert res.exit_code == 2 and "s2.jsonl:1: not a sample or trajectory (unknown sample field(s): text)" in res.stderr

"""`agentrft finqa evaluate` end to end through typer."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

GOLD = [
    {
        "pre_text": [],
        "post_text": [],
        "table": [["", "2019"], ["revenue", "$ 10"]],
        "filename": "X/2019/page_1.pdf",
        "id": "a",
        "qa": {"question": "q?", "program": "add(3, 5)", "exe_ans": 8.0},
    },
    {
        "pre_text": [],
        "post_text": [],
        "table": [["", "2019"], ["revenue", "$ 10"]],
        "filename": "X/2019/page_1.pdf",
        "id": "b",
        "qa": {"question": "q?", "program": "multiply(2, 2)", "exe_ans": 4.0},
    },
]
PRED = [
    {"id": "a", "predicted": ["add(", "5", "3", ")", "EOF"]},  # execution ✓ program ✓
    {"id": "b", "predicted": ["add(", "2", "2", ")", "EOF"]},  # execution ✓ program ✗
]


def _app() -> typer.Typer:
    from agentrft.cli.main import app  # the real root: it maps errors to exit codes for every command

    return app


def _files(tmp_path: Path) -> tuple[str, str]:
    pred = tmp_path / "pred.json"
    gold = tmp_path / "gold.json"
    pred.write_text(json.dumps(PRED), encoding="utf-8")
    gold.write_text(json.dumps(GOLD), encoding="utf-8")
    return str(pred), str(gold)


def test_evaluate_json_output(tmp_path: Path) -> None:
    pred, gold = _files(tmp_path)
    result = CliRunner().invoke(_app(), ["finqa", "evaluate", pred, gold, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"execution_accuracy": 1.0, "program_accuracy": 0.5, "n": 2}


def test_evaluate_table_output(tmp_path: Path) -> None:
    pred, gold = _files(tmp_path)
    result = CliRunner().invoke(_app(), ["finqa", "evaluate", pred, gold])
    assert result.exit_code == 0, result.output
    assert "execution accuracy  1.0000" in result.stdout
    assert "program accuracy    0.5000" in result.stdout


def test_gold_without_filename_is_evaluated(tmp_path: Path) -> None:
    """The official script never reads `filename`; a gold file without it must not be refused."""
    pred, _ = _files(tmp_path)
    gold = tmp_path / "gold_no_filename.json"
    gold.write_text(json.dumps([{k: v for k, v in r.items() if k != "filename"} for r in GOLD]), encoding="utf-8")
    result = CliRunner().invoke(_app(), ["finqa", "evaluate", pred, str(gold), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"execution_accuracy": 1.0, "program_accuracy": 0.5, "n": 2}


def test_bad_file_is_one_line_error_and_nonzero_exit(tmp_path: Path) -> None:
    _, gold = _files(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    result = CliRunner().invoke(_app(), ["finqa", "evaluate", str(bad), gold])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith(f"error: {bad}:1: invalid JSON (Expecting property name")
    assert "Traceback" not in result.output


def test_finqa_is_registered_in_the_main_cli() -> None:
    from agentrft.cli import main

    assert "finqa" in main._COMMAND_MODULES

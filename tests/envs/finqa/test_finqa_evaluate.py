"""evaluate_predictions and load_finqa_json on small hand-written files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrft.envs.finqa.dataset import FinqaDataError, FinqaRecord, load_finqa_json
from agentrft.envs.finqa.evaluate import evaluate_predictions

TABLE = [["", "2019", "2018", "2017"], ["net revenue", "$ 1,200", "$ 1,000", "$ 800"]]


def record(rid: str, program: str, exe_ans: float | str, table: list[list[str]] | None = None) -> dict[str, Any]:
    return {
        "pre_text": ["revenue grew ."],
        "post_text": ["see note 3 ."],
        "table": table if table is not None else TABLE,
        "filename": "ABC/2019/page_1.pdf",
        "id": rid,
        "table_ori": [["kept as an extra"]],
        "qa": {
            "question": f"question {rid}?",
            "program": program,
            "exe_ans": exe_ans,
            "gold_inds": {"table_1": "net revenue ..."},
            "steps": [],
        },
    }


GOLD = [
    record("a", "subtract(5829, 5735), divide(#0, 5735)", 0.01639),
    record("b", "table_sum(net revenue, none)", 3000.0),
    record("c", "greater(3, 2)", "yes"),
    record("d", "add(3, 5)", 8.0),
    record("e", "multiply(2, 2)", 4.0),
    record("f", "divide(10, 4)", 2.5),
    record("unused", "add(1, 1)", 2.0),
]

PREDICTIONS = [
    # exact gold program: execution ✓ program ✓
    {"id": "a", "predicted": ["subtract(", "5829", "5735", ")", "divide(", "#0", "5735", ")", "EOF"]},
    # table op: ✓ ✓
    {"id": "b", "predicted": ["table_sum(", "net revenue", "none", ")", "EOF"]},
    # swapped greater gives "no": ✗ ✗
    {"id": "c", "predicted": ["greater(", "2", "3", ")", "EOF"]},
    # commutative swap: ✓ ✓
    {"id": "d", "predicted": ["add(", "5", "3", ")", "EOF"]},
    # right value, different program: ✓ ✗
    {"id": "e", "predicted": ["add(", "2", "2", ")", "EOF"]},
    # no EOF: the last token (")") is dropped as the official script does, so invalid: ✗ ✗
    {"id": "f", "predicted": ["divide(", "10", "4", ")"]},
]


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_evaluate_predictions_hand_computed(tmp_path: Path) -> None:
    result = evaluate_predictions(write(tmp_path / "pred.json", PREDICTIONS), write(tmp_path / "gold.json", GOLD))
    # denominator = 6 predictions (the unused gold record does not count)
    assert result == {"execution_accuracy": 4 / 6, "program_accuracy": 3 / 6, "n": 6}


def test_missing_prediction_id_is_a_clear_error(tmp_path: Path) -> None:
    preds = [*PREDICTIONS, {"id": "zzz", "predicted": ["add(", "1", "1", ")", "EOF"]}]
    with pytest.raises(FinqaDataError, match=r"1 prediction id\(s\) not in .*'zzz'"):
        evaluate_predictions(write(tmp_path / "pred.json", preds), write(tmp_path / "gold.json", GOLD))


@pytest.mark.parametrize(
    ("preds", "message"),
    [
        ({"id": "a"}, "expected a JSON list of predictions"),
        ([], "no predictions"),
        (["a"], "prediction 0: expected a JSON object"),
        ([{"predicted": []}], "prediction 0: field id"),
        ([{"id": "a", "predicted": "add(1, 2)"}], r"prediction 0 \(id 'a'\): field predicted"),
    ],
)
def test_bad_prediction_files(tmp_path: Path, preds: Any, message: str) -> None:
    with pytest.raises(FinqaDataError, match=message):
        evaluate_predictions(write(tmp_path / "pred.json", preds), write(tmp_path / "gold.json", GOLD))


def test_duplicate_gold_id_and_missing_gold_program(tmp_path: Path) -> None:
    preds = write(tmp_path / "pred.json", PREDICTIONS[:1])
    with pytest.raises(FinqaDataError, match="record 1: duplicate id 'a'"):
        evaluate_predictions(preds, write(tmp_path / "gold.json", [GOLD[0], GOLD[0]]))
    no_program = record("a", "x", 1.0)
    del no_program["qa"]["program"]
    with pytest.raises(FinqaDataError, match="qa.program"):
        evaluate_predictions(preds, write(tmp_path / "gold2.json", [no_program]))
    bad_program = record("a", "add(1, 2", 3.0)
    with pytest.raises(FinqaDataError, match="record id 'a': field qa.program"):
        evaluate_predictions(preds, write(tmp_path / "gold3.json", [bad_program]))


def test_load_finqa_json_round_trips_and_keeps_extras(tmp_path: Path) -> None:
    records = load_finqa_json(write(tmp_path / "gold.json", GOLD))
    assert [r.id for r in records] == ["a", "b", "c", "d", "e", "f", "unused"]
    first = records[0]
    assert isinstance(first, FinqaRecord)
    assert first.qa.program == "subtract(5829, 5735), divide(#0, 5735)"
    assert first.qa.exe_ans == 0.01639
    assert records[2].qa.exe_ans == "yes"
    assert first.qa.gold_inds == {"table_1": "net revenue ..."}
    assert first.model_dump()["table_ori"] == [["kept as an extra"]]
    assert first.model_dump()["qa"]["steps"] == []


def test_filename_is_optional_and_read_when_present(tmp_path: Path) -> None:
    gold = json.loads(json.dumps(GOLD))
    del gold[0]["filename"]  # record "a": the official evaluation script never reads it
    records = load_finqa_json(write(tmp_path / "gold.json", gold))
    assert records[0].filename is None and records[1].filename == "ABC/2019/page_1.pdf"
    result = evaluate_predictions(write(tmp_path / "pred.json", PREDICTIONS), tmp_path / "gold.json")
    assert result == {"execution_accuracy": 4 / 6, "program_accuracy": 3 / 6, "n": 6}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("table"), r"record 1 \(id 'b'\): field table: Field required"),
        (lambda r: r["qa"].pop("question"), r"record 1 \(id 'b'\): field qa.question"),
        (lambda r: r.__setitem__("table", [["a", 1]]), r"record 1 \(id 'b'\): field table.0.1"),
        (lambda r: r.__setitem__("pre_text", "one string"), r"field pre_text"),
    ],
)
def test_load_finqa_json_errors_name_file_record_and_field(tmp_path: Path, mutate: Any, message: str) -> None:
    data = json.loads(json.dumps(GOLD[:3]))
    mutate(data[1])
    path = write(tmp_path / "gold.json", data)
    with pytest.raises(FinqaDataError, match=message) as info:
        load_finqa_json(path)
    assert str(path) in str(info.value)


def test_load_finqa_json_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FinqaDataError, match="no such file"):
        load_finqa_json(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"id": "a",]', encoding="utf-8")
    with pytest.raises(FinqaDataError, match=r"bad\.json:1: invalid JSON \(Expecting"):
        load_finqa_json(bad)
    with pytest.raises(FinqaDataError, match="expected a JSON list"):
        load_finqa_json(write(tmp_path / "obj.json", {"id": "a"}))
    with pytest.raises(FinqaDataError, match="record 0: expected a JSON object"):
        load_finqa_json(write(tmp_path / "list.json", [3]))

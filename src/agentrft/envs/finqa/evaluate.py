"""Official-style FinQA evaluation of a predictions file against a gold file.

Predictions: a JSON list of ``{"id": ..., "predicted": [tokens..., "EOF"]}`` (the format of the
FinQA generator's output). Gold: a FinQA JSON file. As in the official script, the denominator
is the number of predictions, the gold program is tokenised with
:func:`~agentrft.envs.finqa.program.program_to_tokens`, and the last predicted token is dropped as the
``EOF`` (whatever it is). Unlike the official script, a prediction whose id is not in the gold
file, a duplicate gold id, or an empty predictions list is a clear error instead of a crash.
The per-program departures (all in malformed corners) are listed in :mod:`agentrft.envs.finqa.program`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrft.envs.finqa.dataset import FinqaDataError, FinqaRecord, load_finqa_json, read_json
from agentrft.envs.finqa.program import EOF, ProgramError, execution_accuracy, program_accuracy, program_to_tokens


def _read_predictions(path: str | Path) -> list[tuple[str, list[str]]]:
    data = read_json(path)
    if not isinstance(data, list):
        raise FinqaDataError(f"{path}: expected a JSON list of predictions, got {type(data).__name__}")
    predictions: list[tuple[str, list[str]]] = []
    for index, item in enumerate(data):
        where = f"{path}: prediction {index}"
        if not isinstance(item, dict):
            raise FinqaDataError(f"{where}: expected a JSON object, got {type(item).__name__}")
        if not isinstance(item.get("id"), str):
            raise FinqaDataError(f"{where}: field id: missing or not a string")
        tokens = item.get("predicted")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise FinqaDataError(f"{where} (id {item['id']!r}): field predicted: expected a list of token strings")
        predictions.append((item["id"], tokens))
    if not predictions:
        raise FinqaDataError(f"{path}: no predictions")
    return predictions


def _index_gold(records: list[FinqaRecord], path: str | Path) -> dict[str, FinqaRecord]:
    gold: dict[str, FinqaRecord] = {}
    for index, record in enumerate(records):
        if record.id in gold:
            raise FinqaDataError(f"{path}: record {index}: duplicate id {record.id!r}")
        gold[record.id] = record
    return gold


def _as_official_prediction(tokens: list[str]) -> list[str]:
    # The official script drops the last token unconditionally; mark it as the EOF so that
    # execute_tokens (which drops only a literal trailing EOF) sees the same program.
    return [*tokens[:-1], EOF] if tokens else []


def evaluate_predictions(pred_path: str | Path, gold_path: str | Path) -> dict[str, Any]:
    """Execution and program accuracy of a predictions file: ``{"execution_accuracy", "program_accuracy", "n"}``."""
    predictions = _read_predictions(pred_path)
    gold = _index_gold(load_finqa_json(gold_path), gold_path)
    missing = [pid for pid, _ in predictions if pid not in gold]
    if missing:
        shown = ", ".join(repr(pid) for pid in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise FinqaDataError(f"{pred_path}: {len(missing)} prediction id(s) not in {gold_path}: {shown}")

    exe_correct = 0
    prog_correct = 0
    for pid, tokens in predictions:
        record = gold[pid]
        if record.qa.program is None or record.qa.exe_ans is None:
            raise FinqaDataError(f"{gold_path}: record id {pid!r}: field qa.program / qa.exe_ans is missing")
        pred = _as_official_prediction(tokens)
        if execution_accuracy(pred, record.qa.exe_ans, record.table):
            exe_correct += 1
        try:
            if program_accuracy(pred, program_to_tokens(record.qa.program)):
                prog_correct += 1
        except ProgramError as err:
            raise FinqaDataError(f"{gold_path}: record id {pid!r}: field qa.program: {err}") from None
    n = len(predictions)
    return {"execution_accuracy": exe_correct / n, "program_accuracy": prog_correct / n, "n": n}

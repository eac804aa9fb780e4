"""FinQA JSON files (train/dev/test.json of the FinQA release) as validated records.

A file is one JSON list of records. The fields this project reads are typed; every other key
the release carries (``table_ori``, ``qa.steps``, ``qa.program_re``, retriever outputs, …) is kept
as an extra so that nothing is lost on a round trip. ``qa.program`` and ``qa.exe_ans`` are
optional because the private test split ships without them; the evaluator insists on them.
``filename`` is optional because the official evaluation script never reads it (gold files cut
down to what it needs still evaluate); the environment uses it, when present, as the page's doc_id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrft import inputs
from agentrft.inputs import InputError, first_problem


class FinqaDataError(InputError):
    """A FinQA file could not be read; the message names the file, record and field."""


class FinqaQA(BaseModel):
    """The ``qa`` part of a record."""

    model_config = ConfigDict(extra="allow")

    question: str
    program: str | None = None  # e.g. "subtract(5829, 5735), divide(#0, 5735)"
    exe_ans: float | str | None = None  # rounded to 5 decimals, or "yes"/"no"
    answer: str | None = None  # the human-written answer text, e.g. "1.6%"
    gold_inds: dict[str, str] = Field(default_factory=dict)  # e.g. {"text_1": "...", "table_3": "..."}


class FinqaRecord(BaseModel):
    """One FinQA example: a report excerpt (text around a table) and a question with its program."""

    model_config = ConfigDict(extra="allow")

    id: str
    pre_text: list[str]
    post_text: list[str]
    table: list[list[str]]  # row 0 is the header, column 0 the row names
    filename: str | None = None  # e.g. "ADI/2009/page_49.pdf"; the page's doc_id in FinqaJsonEnv
    qa: FinqaQA


def _describe(error: ValidationError) -> str:
    p = first_problem(error)
    return f"field {p.field or '(record)'}: {p.message}{p.more}"


def parse_finqa_records(data: Any, source: str) -> list[FinqaRecord]:
    """Validate already-decoded JSON (a list of records); `source` names it in errors."""
    if not isinstance(data, list):
        raise FinqaDataError(f"{source}: expected a JSON list of FinQA records, got {type(data).__name__}")
    records: list[FinqaRecord] = []
    for index, item in enumerate(data):
        record_id = item.get("id") if isinstance(item, dict) else None
        where = f"{source}: record {index}" + (f" (id {record_id!r})" if record_id is not None else "")
        if not isinstance(item, dict):
            raise FinqaDataError(f"{where}: expected a JSON object, got {type(item).__name__}")
        try:
            records.append(FinqaRecord.model_validate(item))
        except ValidationError as err:
            raise FinqaDataError(f"{where}: {_describe(err)}") from None
    return records


def read_json(path: str | Path) -> Any:
    """Decode a JSON file strictly (`agentrft.inputs`): I/O, encoding and syntax problems become
    one-line FinqaDataError messages."""
    try:
        return inputs.read_json(path)
    except InputError as err:
        raise FinqaDataError(str(err)) from None


def load_finqa_json(path: str | Path) -> list[FinqaRecord]:
    """Read a FinQA JSON file into records; FinqaDataError names file, record index and field."""
    return parse_finqa_records(read_json(path), str(path))

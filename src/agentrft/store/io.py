"""Export and import of trajectories: JSONL, Parquet and OpenAI-style chat logs.

Imports run in ONE write transaction: a bad record (invalid JSON, failed
validation, id already stored) aborts the whole import with one message of the
form `FILE line N: field 'a.b': reason` and nothing is written. With
`skip_bad=True` the bad records are skipped and listed in the ImportReport.
Records are read as strictly as every other input (`agentrft.inputs`: no NaN
or Infinity, no integers past 64 bits, no lone surrogates), and a file
without any record is refused (a Parquet file of no rows, as exporting an
empty selection writes, imports as nothing).

Parquet layout: one row per trajectory with flat, queryable columns (ids,
status, reward, counts, final answer ...) plus `trajectory`, the full JSON
record, which is the source of truth on import so round-trips are exact.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from agentrft.inputs import decode_text, loads_json
from agentrft.store.chatlogs import ChatLogError, chat_record_to_trajectory
from agentrft.store.errors import BadRecordError, DuplicateIdError, StoreError
from agentrft.types import Trajectory

if TYPE_CHECKING:
    from agentrft.store.sqlite_store import Store

_MAX_MESSAGE = 300


class SkippedRecord(BaseModel):
    line: int = Field(description="1-based line (JSONL) or row (Parquet) number")
    message: str


class ImportReport(BaseModel):
    """What an import did: how many trajectories went in, which records were skipped and why."""

    path: str
    imported: int = 0
    skipped: int = 0
    ids: list[str] = Field(default_factory=list)
    problems: list[SkippedRecord] = Field(default_factory=list)

    def summary(self) -> str:
        text = f"imported {self.imported} trajectories from {self.path}"
        if self.skipped:
            text += f", skipped {self.skipped} bad records"
        return text


def describe_error(exc: BaseException) -> str:
    """One line naming the field and the reason, for a record that failed to load."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        first = errors[0]
        if first["type"] == "json_invalid":
            return f"not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        # Model validators report at the parent's location but name the field first
        # ("tokens.loss_mask has length ..."): point at that field.
        word = msg.split(" ", 1)[0].rstrip(",:")
        if loc and word.startswith(loc + "."):
            loc = word
        text = f"field '{loc}': {msg}" if loc else msg
        if len(errors) > 1:
            text += f" (+{len(errors) - 1} more errors)"
    elif isinstance(exc, json.JSONDecodeError):
        text = f"not valid JSON: {exc.msg} at column {exc.colno}"
    elif isinstance(exc, UnicodeDecodeError):
        text = f"not valid UTF-8 at byte {exc.start}"
    else:
        text = str(exc)
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _atomic_target(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


# ---------------------------------------------------------------- export


def export_jsonl(store: Store, path: str | Path, **filters: Any) -> int:
    """Write matching trajectories, one JSON record per line; returns how many."""
    path = Path(path)
    tmp = _atomic_target(path)
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for data in store.iter_trajectory_json(**filters):
                out.write(data)
                out.write("\n")
                count += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("run_id", pa.string()),
            ("task_id", pa.string()),
            ("group_id", pa.string()),
            ("env", pa.string()),
            ("policy", pa.string()),
            ("policy_version", pa.int64()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("num_turns", pa.int32()),
            ("num_tool_calls", pa.int32()),
            ("num_tokens", pa.int32()),
            ("final_answer", pa.string()),
            ("created_at", pa.float64()),
            ("trajectory", pa.string()),
        ]
    )


def _parquet_row(data: str) -> dict[str, Any]:
    t = Trajectory.model_validate_json(data)
    return {
        "id": t.id,
        "run_id": t.run_id,
        "task_id": t.task_id,
        "group_id": t.group_id,
        "env": t.env.name,
        "policy": t.policy,
        "policy_version": t.policy_version,
        "status": t.status,
        "reward": t.reward,
        "success": None if t.grade is None else t.grade.success,
        "num_turns": t.num_turns,
        "num_tool_calls": len(t.tool_calls),
        "num_tokens": None if t.tokens is None else len(t.tokens.ids),
        "final_answer": t.final_answer,
        "created_at": t.created_at,
        "trajectory": data,
    }


def export_parquet(store: Store, path: str | Path, *, batch_size: int = 1000, **filters: Any) -> int:
    """Write matching trajectories to a Parquet file (see module docstring); returns how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    tmp = _atomic_target(path)
    schema = _parquet_schema()
    count = 0
    batch: list[dict[str, Any]] = []
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for data in store.iter_trajectory_json(**filters):
                batch.append(_parquet_row(data))
                if len(batch) >= batch_size:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    count += len(batch)
                    batch = []
            if batch or count == 0:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


# ---------------------------------------------------------------- import

# A record source yields (line number, loader); calling the loader parses and validates.
_Records = Iterable[tuple[int, Callable[[], Trajectory]]]


def _run_import(
    store: Store,
    path: Path,
    records: _Records,
    *,
    skip_bad: bool,
    run_id: str | None,
    unit: str = "line",
    empty_ok: bool = False,
) -> ImportReport:
    report = ImportReport(path=str(path))
    seen = 0
    with store.transaction() as tx:
        if run_id is not None:
            tx.ensure_run(run_id, "import")
        for number, load in records:
            seen += 1
            try:
                traj = load()
                if run_id is not None and traj.run_id != run_id:
                    traj = traj.model_copy(update={"run_id": run_id})
                tx.add_trajectory(traj)
            except (ValueError, DuplicateIdError) as exc:
                message = f"{path.name} {unit} {number}: {describe_error(exc)}"
                if not skip_bad:
                    raise BadRecordError(message) from None
                report.problems.append(SkippedRecord(line=number, message=message))
                continue
            report.ids.append(traj.id)
        if not seen and not empty_ok:
            raise BadRecordError(f"{path.name}: empty file (no records)")
    report.imported = len(report.ids)
    report.skipped = len(report.problems)
    return report


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines of a file with their 1-based numbers (bytes: decoding is part of validation)."""
    if not path.is_file():
        raise StoreError(f"{path}: no such file")
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line


# What pydantic's JSON parser would let through but `inputs.check_value` refuses: NaN/Infinity,
# escapes of surrogates, integers past 64 bits, floats past the exponent range. A line that may
# hold one is read the strict (slower) way first; the others go straight to pydantic.
_SUSPECT = re.compile(rb"NaN|Infinity|\\u[dD][89a-fA-F]|[0-9]{19}|[eE][+-]?[0-9]{3}")


def _load_trajectory(line: bytes) -> Trajectory:
    text = decode_text(line, "")
    if _SUSPECT.search(line):
        loads_json(text)
    return Trajectory.model_validate_json(text)


def import_jsonl(store: Store, path: str | Path, *, skip_bad: bool = False, run_id: str | None = None) -> ImportReport:
    """Import trajectories from JSONL (one Trajectory JSON per line); `run_id` reassigns them to that run."""
    path = Path(path)
    records = ((n, lambda line=line: _load_trajectory(line)) for n, line in _lines(path))
    return _run_import(store, path, records, skip_bad=skip_bad, run_id=run_id)


def _load_chat(line: bytes, run_id: str) -> Trajectory:
    record = loads_json(decode_text(line, ""))
    return chat_record_to_trajectory(record, run_id=run_id)


def import_chat_logs(store: Store, path: str | Path, *, run_id: str, skip_bad: bool = False) -> ImportReport:
    """Import a JSONL file of OpenAI-style chat logs (`{"messages": [...], ...}` per line) into run `run_id`."""
    if not run_id:
        raise ValueError("import_chat_logs needs a run_id")
    path = Path(path)
    records = ((n, lambda line=line: _load_chat(line, run_id)) for n, line in _lines(path))
    return _run_import(store, path, records, skip_bad=skip_bad, run_id=run_id)


def import_parquet(
    store: Store, path: str | Path, *, skip_bad: bool = False, run_id: str | None = None
) -> ImportReport:
    """Import a Parquet file written by `export_parquet` (reads its `trajectory` column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path}: no such file")
    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise BadRecordError(f"{path.name}: not a readable Parquet file ({exc})") from None
    names = pfile.schema_arrow.names
    if "trajectory" not in names:
        raise BadRecordError(
            f"{path.name}: no 'trajectory' column (has {', '.join(names)}); "
            "agentrft imports Parquet files written by its own export"
        )

    def rows() -> _Records:
        number = 0
        for batch in pfile.iter_batches(batch_size=1000, columns=["trajectory"]):
            for value in batch.column(0).to_pylist():
                number += 1
                yield number, partial(_load_parquet_value, value)

    # A Parquet file with no rows is what exporting an empty selection writes: it imports as nothing.
    return _run_import(store, path, rows(), skip_bad=skip_bad, run_id=run_id, unit="row", empty_ok=True)


def _load_parquet_value(value: str | None) -> Trajectory:
    if value is None:
        raise ValueError("field 'trajectory': null")
    return _load_trajectory(value.encode("utf-8"))


__all__ = [
    "ChatLogError",
    "ImportReport",
    "SkippedRecord",
    "describe_error",
    "export_jsonl",
    "export_parquet",
    "import_chat_logs",
    "import_jsonl",
    "import_parquet",
]

"""Reading a run's ``metrics.jsonl`` (one JSON object per step), tolerant of a torn last line.

A process killed mid-write (``kill -9``, power loss) can leave the last line cut short.
That line is the only one that may be damaged, so it is dropped (and the caller told),
while a bad line anywhere else is an error naming the file and line. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrft.inputs import InputError, parse_object


def read_step_metrics(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(rows, torn): every step's metrics, and whether a torn last line was dropped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    lines = text.splitlines()
    torn = False
    rows: list[dict[str, Any]] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = parse_object(line, f"{path}:{no}", check=False)  # our own file: a NaN loss is a value
        except InputError:
            if no == len(lines) and not text.endswith("\n"):  # cut short by a crash: the last write only
                torn = True
                break
            raise
        if not isinstance(row.get("step"), int | float):
            raise InputError(f"{path}:{no}: a metrics line needs a numeric 'step'")
        rows.append(row)
    return rows, torn

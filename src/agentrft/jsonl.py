"""Reading JSONL files of objects with errors that name the file and line (no torch, no agentrft imports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonlError(ValueError):
    """A line that is not a JSON object, or an unreadable file; the message starts with `file:line`."""


def parse_object(line: str, where: str) -> dict[str, Any]:
    """One JSONL line as a dict; `where` (e.g. ``data.jsonl:7``) prefixes the error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise JsonlError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise JsonlError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_objects(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of `path`."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise JsonlError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise JsonlError(f"{path}: not UTF-8 text") from None
    return [(no, parse_object(line, f"{path}:{no}")) for no, line in enumerate(lines, 1) if line.strip()]

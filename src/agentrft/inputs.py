"""Reading the files people hand to agentrft: JSON, JSONL, YAML and TOML, strictly and boundedly.

Every reader raises `InputError` with one line that starts with where the fault is: ``FILE``,
``FILE:LINE`` (JSONL, YAML and TOML syntax errors), then the field as a path when the fault is in
a value (``field 'messages[0].content'``). What is refused, and why:

* text that is not UTF-8 (binary files, UTF-16, Latin-1); a UTF-8 byte-order mark is skipped;
* nesting deeper than `MAX_DEPTH` levels: json, yaml and tomllib recurse per level, and so does
  much of what reads the value afterwards (pydantic, deepcopy, templates);
* NaN and ±Infinity, which JSON forbids (Python's json reads them anyway, and a NaN reward or
  metadata value later becomes ``null`` or poisons a mean), also as YAML ``.nan`` / TOML ``nan``,
  and numbers that overflow a float (``1e999`` reads as Infinity);
* integers outside 64 bits, which SQLite, numpy and torch cannot hold;
* strings or keys with a lone surrogate (a ``\\ud800`` escape with no pair): they cannot be
  written as UTF-8, so tokenizers, SQLite and JSON writers fail on them later;
* YAML whose aliases expand to more than `MAX_VALUES` values.

No agentrft imports and no torch: any layer may use it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_DEPTH = 64
MAX_VALUES = 1_000_000  # after YAML alias expansion; JSON cannot exceed its own length
_INT64 = 2**63


class InputError(ValueError):
    """A file or value a person gave that agentrft refuses; the message is one line naming where."""


@dataclass(frozen=True)
class Problem:
    """The first problem pydantic found in a value (`first_problem`), the parts of a one-line error."""

    field: str  # its dotted location, "" for the value as a whole
    message: str  # pydantic's message without its "Value error, " prefix
    others: int  # how many more problems pydantic found

    @property
    def more(self) -> str:
        """The suffix that counts the others ("(and 2 more)", after a space), or the empty string."""
        return f" (and {self.others} more)" if self.others else ""


def first_problem(exc: ValidationError) -> Problem:
    """The first of a pydantic ValidationError's problems: every one-line validation error starts from it."""
    first = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in first["loc"])
    return Problem(field, str(first["msg"]).removeprefix("Value error, "), exc.error_count() - 1)


def _at(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


# ---------------------------------------------------------------- bytes to text


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 text of `data` (a UTF-8 byte-order mark is skipped); InputError for anything else."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(_at(where, "not UTF-8 text (it looks like UTF-16; save it as UTF-8)"))
    if b"\x00" in data:
        at = _position(data, data.index(b"\x00"))
        raise InputError(_at(where, f"not UTF-8 text (a NUL byte {at}: a binary or UTF-16 file?)"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = _position(data, exc.start)
        raise InputError(_at(where, f"not UTF-8 text (byte 0x{data[exc.start]:02x} {at})")) from None


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    return f"on line {line}" if line > 1 else f"at byte {offset + 1}"


def read_text(path: str | Path) -> str:
    """The UTF-8 text of a file; InputError names the file when it is missing, unreadable or not UTF-8."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode_text(data, str(path))


# ---------------------------------------------------------------- checking parsed values


def _field(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_value(value: Any, where: str = "", *, max_values: int | None = None) -> None:
    """Refuse what no agentrft input may hold (see the module docstring), naming the field.

    Walks iteratively, so depth is measured rather than hit as a RecursionError. `max_values`
    bounds the values visited (YAML aliases can make a small file expand without limit).
    """
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    seen = 0
    while stack:
        node, path = stack.pop()
        seen += 1
        if max_values is not None and seen > max_values:
            raise InputError(_at(where, f"more than {max_values:,} values (YAML aliases expanding?)"))
        problem = None
        if isinstance(node, str):
            if _has_surrogate(node):
                problem = "text holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not valid Unicode"
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, float):
            if not math.isfinite(node):
                name = "NaN" if math.isnan(node) else "Infinity" if node > 0 else "-Infinity"
                problem = f"{name} is not allowed (numbers must be finite; JSON has no NaN or Infinity)"
        elif isinstance(node, int):
            if not -_INT64 <= node < _INT64:
                problem = "integer out of range (more than 64 bits)"
        elif isinstance(node, dict | list):
            if len(path) >= MAX_DEPTH:
                raise InputError(_at(where, f"field '{_field(path)}': nested deeper than {MAX_DEPTH} levels"))
            if isinstance(node, dict):
                for key, child in node.items():
                    if isinstance(key, str) and _has_surrogate(key):
                        inside = f"field '{_field(path)}': " if path else ""
                        raise InputError(_at(where, f"{inside}a key holds a lone surrogate"))
                    stack.append((child, [*path, key if isinstance(key, str) else str(key)]))
            else:
                stack.extend((child, [*path, i]) for i, child in enumerate(node))
        if problem:
            name = _field(path)
            raise InputError(_at(where, f"field '{name}': {problem}" if name else problem))


# ---------------------------------------------------------------- JSON


def loads_json(text: str, where: str = "", *, whole_file: bool = False, check: bool = True) -> Any:
    """Parse JSON text and `check_value` it. A syntax error reads ``where: invalid JSON (... at
    column C)``, or ``where:LINE: ...`` when `whole_file` (`where` is then the file, not a line of it).
    `check=False` skips the value checks, for files agentrft wrote itself (a NaN loss in
    ``metrics.jsonl`` is a measurement, not a bad input); depth is still bounded by the parser."""
    if whole_file and not text.strip():
        raise InputError(_at(where, "empty file (expected a JSON value)"))
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"{where}:{exc.lineno}" if whole_file and where else where
        raise InputError(_at(at, f"invalid JSON ({exc.msg} at column {exc.colno})")) from None
    except RecursionError:
        raise InputError(_at(where, f"nested deeper than {MAX_DEPTH} levels")) from None
    except ValueError:  # an integer literal past Python's 4300-digit conversion limit
        raise InputError(_at(where, "invalid JSON (a number with thousands of digits)")) from None
    if check:
        check_value(value, where)
    return value


def read_json(path: str | Path) -> Any:
    """A JSON file's value, checked (see `loads_json`)."""
    return loads_json(read_text(path), str(path), whole_file=True)


def parse_object(line: str, where: str, *, check: bool = True) -> dict[str, Any]:
    """One JSONL line as a dict; `where` (e.g. ``data.jsonl:7``) prefixes the error (`check`: see `loads_json`)."""
    obj = loads_json(line, where, check=check)
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path: str | Path, *, allow_empty: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSONL file; a file without any is refused
    unless `allow_empty`."""
    rows = [
        (no, parse_object(line, f"{path}:{no}"))
        for no, line in enumerate(read_text(path).splitlines(), 1)
        if line.strip()
    ]
    if not rows and not allow_empty:
        raise InputError(f"{path}: empty file (expected one JSON object per line)")
    return rows


# ---------------------------------------------------------------- YAML and TOML


def loads_yaml(text: str, where: str = "") -> Any:
    """Parse YAML text (safe loader) and `check_value` it; syntax errors name the line."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}:{mark.line + 1}" if where and mark is not None else where
        raise InputError(_at(at, f"invalid YAML ({exc.problem or exc.context})")) from None
    except yaml.YAMLError as exc:
        raise InputError(_at(where, f"invalid YAML ({str(exc).splitlines()[0]})")) from None
    except RecursionError:
        raise InputError(_at(where, f"nested deeper than {MAX_DEPTH} levels")) from None
    check_value(value, where, max_values=MAX_VALUES)
    return value


def loads_toml(text: str, where: str = "") -> dict[str, Any]:
    """Parse TOML text and `check_value` it; syntax errors name the line."""
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        line = msg.rsplit("(at line ", 1)[-1].split(",")[0] if "(at line " in msg else ""
        at = f"{where}:{line}" if where and line.isdigit() else where
        raise InputError(_at(at, f"invalid TOML ({msg.split(' (at ')[0]})")) from None
    except RecursionError:
        raise InputError(_at(where, f"nested deeper than {MAX_DEPTH} levels")) from None
    check_value(value, where)
    return value


def _loads_json_file(text: str, where: str) -> Any:
    return loads_json(text, where, whole_file=True)


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    ".json": _loads_json_file,
    ".yaml": loads_yaml,
    ".yml": loads_yaml,
    ".toml": loads_toml,
}


def read_structured(path: str | Path, *, default: str = ".yaml") -> Any:
    """A JSON, YAML or TOML file's value by its suffix (`default` for other suffixes), checked."""
    path = Path(path)
    parse = _PARSERS.get(path.suffix.lower(), _PARSERS[default])
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{path}: empty file")
    return parse(text, str(path))

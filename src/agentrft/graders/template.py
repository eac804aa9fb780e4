"""`{{ item.x }}` / `{{ sample.output_tools[0].function.arguments }}` templates, compiled at load.

Only the namespaces `item` and `sample` exist (SPECS §1). A path that resolves to
nothing (missing key, index out of range, or null) raises
`GraderFailure("invalid_variable_error")` — never an empty string. Non-string
values render as compact JSON (documented choice), e.g. `{"a": 1}` or `2.5`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrft.graders.base import GraderFailure, GraderSpecError, Sample

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_SEGMENT = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_\-]*)|\[(-?\d+)\]")
_MISSING = object()

Path = tuple[str | int, ...]


def parse_path(expr: str, where: str) -> tuple[str, Path]:
    """`sample.output_tools[0].function` → ("sample", ("output_tools", 0, "function"))."""
    text = expr.strip()
    segs: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if (
            m is None
            or (pos == 0 and m.group(0).startswith("."))
            or (pos > 0 and m.group(1) and not m.group(0).startswith("."))
        ):
            raise GraderSpecError(
                where,
                f"bad template variable {{{{ {text} }}}}: expected dotted names and [index]",
                flag="invalid_variable_error",
            )
        segs.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if not segs or segs[0] not in ("item", "sample"):
        raise GraderSpecError(
            where, f"template variable {{{{ {text} }}}} must start with item. or sample.", flag="invalid_variable_error"
        )
    return str(segs[0]), tuple(segs[1:])


def resolve(sample: Sample, item: dict[str, Any], ns: str, path: Path, label: str) -> Any:
    cur: Any = sample if ns == "sample" else item
    for seg in path:
        if isinstance(seg, int):
            cur = cur[seg] if isinstance(cur, (list, tuple)) and -len(cur) <= seg < len(cur) else _MISSING
        elif isinstance(cur, dict):
            cur = cur.get(seg, _MISSING)
        elif isinstance(cur, Sample):
            v = cur.field(seg)
            cur = _MISSING if v is None else v
        else:
            cur = _MISSING
        if cur is _MISSING or cur is None:
            raise GraderFailure("invalid_variable_error", f"{{{{ {label} }}}} resolves to nothing")
    return cur


def to_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Template:
    """A compiled template: literal text interleaved with variable paths."""

    __slots__ = ("parts", "single", "source")

    def __init__(self, source: str, where: str) -> None:
        self.source = source
        parts: list[str | tuple[str, Path, str]] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(source):
            if m.start() > pos:
                parts.append(source[pos : m.start()])
            ns, path = parse_path(m.group(1), where)
            parts.append((ns, path, m.group(1).strip()))
            pos = m.end()
        if pos < len(source):
            parts.append(source[pos:])
        if "{{" in "".join(p for p in parts if isinstance(p, str)):
            raise GraderSpecError(where, "unclosed '{{' in template", flag="invalid_variable_error")
        self.parts = parts
        # A template that is exactly one variable yields the raw value (numbers stay numbers).
        self.single = parts[0] if len(parts) == 1 and not isinstance(parts[0], str) else None

    def value(self, sample: Sample, item: dict[str, Any]) -> Any:
        """Raw value for a single-variable template, else the rendered text."""
        if self.single is not None:
            ns, path, label = self.single
            if ns == "sample" and len(path) == 1 and path[0] == "output_text":
                return sample.output_text  # hot path; "" is a legitimate (empty) answer
            return resolve(sample, item, ns, path, label)
        return self.render(sample, item)

    def render(self, sample: Sample, item: dict[str, Any]) -> str:
        if self.single is not None:
            return to_text(self.value(sample, item))
        out = []
        for p in self.parts:
            out.append(p if isinstance(p, str) else to_text(resolve(sample, item, p[0], p[1], p[2])))
        return "".join(out)


def compile_template(source: Any, where: str) -> Template:
    if not isinstance(source, str):
        raise GraderSpecError(where, f"must be a string template, got {type(source).__name__}")
    return Template(source, where)

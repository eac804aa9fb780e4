"""finqa-lite's ``shots`` option (worked examples per level in the prompt): its grammar, and a spec's value
read or set (the agentic recipe trains on a zero-shot prompt and evaluates on both)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode

from agentrft.inputs import InputError


def with_shots(spec: str, shots: str | int | None) -> str:
    """An environment spec with its ``shots`` option set to ``shots`` (None: removed, the environment's own)."""
    base, _, query = spec.partition("?")
    options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items() if k != "shots"}
    if shots is not None:
        options["shots"] = str(shots)
    return base + (f"?{urlencode(options, safe=',:')}" if options else "")


def parse_shots(text: str) -> int | dict[int, int]:
    """A finqa-lite ``shots`` option: ``N`` (worked examples at every level) or ``[N,]LEVEL:N,...`` (per level;
    a bare N sets the levels not named, else they keep all of their own), e.g. ``0,4:1``. Bad text: InputError."""
    items = text.split(",")
    if len(items) == 1 and re.fullmatch(r"[0-9]+", text):
        return int(text)
    default = int(items.pop(0)) if re.fullmatch(r"[0-9]+", items[0]) else None
    if not items or not all(re.fullmatch(r"[1-4]:[0-9]+", item) for item in items):
        raise InputError(f"shots must be an integer >= 0 or LEVEL:N pairs (worked examples per level), got {text!r}")
    per_level = {int(level): int(n) for level, _, n in (item.partition(":") for item in items)}
    if len(per_level) != len(items):
        raise InputError(f"shots names a level twice: {text!r}")
    return per_level if default is None else {lv: per_level.get(lv, default) for lv in range(1, 5)}


def shots_of(spec: str) -> str | None:
    """The ``shots`` option of an environment spec (None where it has none)."""
    return parse_qs(spec.partition("?")[2]).get("shots", [None])[-1]

"""`make_env(spec)`: environments by name, as the CLI and configs write them.

Specs: `finqa-lite` (all levels), `finqa-lite:1` or `finqa-lite:1,2` (levels),
`finqa:PATH.json` (an official FinQA file), `jsonl:PATH[?grader=G.json]` (an
OpenAI RFT dataset; more options: `tools=MODULE` (Python tools), `endpoints=E.json`
(HTTP tools), `valid=VALID.jsonl` (the `valid` split); option values may be
URL-quoted). Keyword arguments go to the environment's constructor.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from agentrft.envs.base import Environment
from agentrft.inputs import InputError

VALID_SPECS = ("finqa-lite", "finqa-lite:LEVELS (e.g. finqa-lite:1,2)", "finqa:PATH.json", "jsonl:PATH[?grader=G.json]")


def _unknown(spec: str, why: str = "") -> InputError:
    return InputError(f"unknown environment {spec!r}{': ' + why if why else ''}; valid: {', '.join(VALID_SPECS)}")


def make_env(spec: str, **kwargs: Any) -> Environment:
    name, _, rest = spec.strip().partition(":")
    if name == "finqa-lite":
        from agentrft.envs.finqa.env import FinqaLiteEnv

        if rest:
            try:
                levels = tuple(int(x) for x in rest.split(","))
            except ValueError:
                raise _unknown(spec, "levels must be integers 1-4 separated by commas") from None
            kwargs["levels"] = levels
        return FinqaLiteEnv(**kwargs)
    if name == "finqa":
        if not rest:
            raise _unknown(spec, "finqa needs a path, e.g. finqa:data/test.json")
        from agentrft.envs.finqa.json_env import FinqaJsonEnv

        return FinqaJsonEnv(rest, **kwargs)
    if name == "jsonl":
        path, _, query = rest.partition("?")
        if not path:
            raise _unknown(spec, "jsonl needs a path, e.g. jsonl:data/train.jsonl")
        params = parse_qs(query, keep_blank_values=True) if query else {}
        known = {"grader": "grader_spec_path", "tools": "tools_module", "endpoints": "endpoints", "valid": "valid_path"}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise _unknown(spec, f"unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})")
        from agentrft.envs.jsonl import JsonlEnv

        for option, values in params.items():
            kwargs.setdefault(known[option], values[-1])
        return JsonlEnv(path, **kwargs)
    raise _unknown(spec)

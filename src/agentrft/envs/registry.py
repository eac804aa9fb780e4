"""`make_env(spec)`: environments by name, as the CLI and configs write them.

Specs: `finqa-lite` (all levels), `finqa-lite:1` or `finqa-lite:1,2` (levels),
`finqa-lite:3?shots=0` (worked examples per level in the prompt: 0 for a zero-shot prompt; default all;
per level as `shots=0,4:1`: none, but one at level 4),
`finqa:PATH.json` (an official FinQA file), `jsonl:PATH[?grader=G.json]` (an
OpenAI RFT dataset; more options: `tools=MODULE` (Python tools), `endpoints=E.json`
(HTTP tools), `valid=VALID.jsonl` (the `valid` split); option values may be
URL-quoted), `bfcl:CATEGORIES` (BFCL v4 from the package bfcl-eval), `reasoning-gym:NAMES`
(procedural tasks from the package reasoning-gym), any entry point of group `agentrft.envs`, or
`MODULE:CLASS`. Each name is resolved the same way (`envs/plugins.py`); each environment class parses its
own part of the spec (`from_spec`). Keyword arguments go to the environment's constructor.
"""

from __future__ import annotations

from typing import Any

from agentrft.envs.base import Environment
from agentrft.inputs import InputError

VALID_SPECS = (
    "finqa-lite",
    "finqa-lite:LEVELS[?shots=N[,LEVEL:N...]] (e.g. finqa-lite:1,2)",
    "finqa:PATH.json",
    "jsonl:PATH[?grader=G.json]",
    "bfcl:CATEGORY[,CATEGORY...] (e.g. bfcl:multi_turn_base)",
    "reasoning-gym:NAME[,NAME...][?tools=calc]",
    "an entry point of group agentrft.envs",
    "MODULE:CLASS (a module on PYTHONPATH)",
)


def unknown_env(spec: str, why: str = "") -> InputError:
    return InputError(f"unknown environment {spec!r}{': ' + why if why else ''}; valid: {', '.join(VALID_SPECS)}")


def make_env(spec: str, **kwargs: Any) -> Environment:
    """The environment a spec names (`envs/plugins.py`: entry points, then ``module:Class``); keyword arguments go
    to its constructor. An unknown or malformed spec is one InputError naming it."""
    from agentrft.envs.faults import with_faults
    from agentrft.envs.plugins import EnvSpec, build, resolve

    parsed = EnvSpec.parse(spec)
    faults = parsed.options.pop("faults", None)  # any environment's option (envs/faults.py), not the class's
    target, parsed = resolve(parsed)
    return with_faults(build(target, parsed, **kwargs), faults)

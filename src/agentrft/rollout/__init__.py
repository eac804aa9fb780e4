"""Rollout: the token-in-token-out agent loop, tool-call formats, the concurrent runner.

Imports no torch: the policy is reached only through `agentrft.samplers.base`.
The OpenAI-compatible server lives in `agentrft.rollout.serve` (needs the `serve` extra).
"""

from agentrft.rollout.agent import run_episode
from agentrft.rollout.formats import FORMAT_NAMES, ParsedTurn, ParseError, ToolFormat, make_format
from agentrft.rollout.runner import Runner, RunStats

__all__ = [
    "FORMAT_NAMES",
    "ParseError",
    "ParsedTurn",
    "RunStats",
    "Runner",
    "ToolFormat",
    "make_format",
    "run_episode",
]

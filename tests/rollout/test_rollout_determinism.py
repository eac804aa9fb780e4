"""The same seed gives the same rollout token for token, on an idle machine and beside a CPU hog.

Multi-turn episodes of the tiny policy (a Gymnasium-style env answers every reply; a stop string ends each
turn after a few tokens, so replies differ in length and episodes in turns): without lockstep their requests
reach the continuous-batching engine by timing, and a loaded machine changes which batches they decode in.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrft.envs import make_env
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams
from agentrft.samplers.policies import load_policy

PLUGINS = Path(__file__).parents[1] / "envs" / "plugins"
PARAMS = SamplingParams(temperature=1.0, max_tokens=12, stop=["e"])


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    """One busy process per CPU beside the test, for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, os.cpu_count() or 2))]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _rollout(seed: int, lockstep: bool = True) -> tuple[list[Any], dict[str, Any]]:
    env = make_env("guess_env:GuessEnv?size=50")
    sampler = load_policy("tiny")
    try:
        runner = Runner(env, sampler, params=PARAMS, progress=False, seed=seed, max_concurrency=6, lockstep=lockstep)
        trajs = runner.run_sync(env.tasks("train")[:4], 3)
        return trajs, dict(sampler.stats)
    finally:
        sampler.close()


def _tokens(trajs: list[Any]) -> list[tuple[str, list[int], list[int]]]:
    return [(t.task_id, t.tokens.ids, t.tokens.turn) for t in trajs]


def test_same_seed_same_tokens_idle_and_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    idle, idle_stats = _rollout(seed=11)
    with cpu_hog():
        busy, busy_stats = _rollout(seed=11)
    assert _tokens(busy) == _tokens(idle)
    for a, b in zip(idle, busy, strict=True):
        assert b.tokens.logprobs == pytest.approx(a.tokens.logprobs, abs=1e-6)
        assert (b.status, b.messages) == (a.status, a.messages)
    # the engine ran the very same batches: admissions, decode steps and prefilled positions
    for key in ("admissions", "requests", "steps", "prefill_tokens", "reused_tokens", "tokens"):
        assert busy_stats[key] == idle_stats[key], key
    # a test that would pass with every episode ending at its first reply proves little: these are multi-turn,
    # and their replies end after different numbers of tokens, so rows leave the engine's batches at different steps
    assert all(max(t.tokens.turn) >= 2 for t in idle)
    lengths = {e.completion_tokens for t in idle for e in t.events if e.type == "model_call"}
    assert len(lengths) > 3
    assert idle_stats["admissions"] > 1


def test_another_seed_samples_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    a, _ = _rollout(seed=11)
    b, _ = _rollout(seed=12)
    assert _tokens(a) != _tokens(b)

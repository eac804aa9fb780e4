"""`agentrft eval --precision`: the in-process engine's compute, checked before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner


def _invoke(args: list[str]):
    from agentrft.cli.main import app

    return CliRunner().invoke(app, ["eval", *args])


def test_bad_precision_and_precision_of_an_endpoint_exit_2(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    bad = _invoke(["--env", "finqa-lite:1", "--policy", "tiny", "--precision", "fp16", "--db", db])
    assert bad.exit_code == 2 and "--precision: expected auto, fp32 or bf16, got 'fp16'" in bad.output
    remote = _invoke(["--env", "finqa-lite:1", "--policy", "openai:gpt-x", "--precision", "bf16", "--db", db])
    assert remote.exit_code == 2 and "in-process policies only" in remote.output
    assert not Path(db).exists()


def test_a_bf16_eval_runs_on_bf16_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An eval trains nothing: its engine is built frozen, so its linear weights are stored in bf16."""
    from agentrft.samplers import frozen

    cast: list[int] = []
    real = frozen.store_in_compute_dtype
    monkeypatch.setattr(frozen, "store_in_compute_dtype", lambda m, d: cast.append(real(m, d)) or cast[-1])
    db = str(tmp_path / "e.db")
    args = ["--env", "finqa-lite:1", "--policy", "tiny", "--tasks", "2", "--samples", "2", "--db", db]
    res = _invoke([*args, "--precision", "bf16", "--temperature", "0.7", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{") :])
    assert out["n_trajectories"] == 4
    assert cast == [2 * 7 + 1]  # the tiny model's linear layers: 7 per layer and its untied head

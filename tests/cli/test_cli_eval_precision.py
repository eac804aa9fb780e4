"""`agentrft eval --precision`: the in-process engine's compute, checked before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_bf16_eval_runs(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    args = ["--env", "finqa-lite:1", "--policy", "tiny", "--tasks", "2", "--samples", "2", "--db", db]
    res = _invoke([*args, "--precision", "bf16", "--temperature", "0.7", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{") :])
    assert out["n_trajectories"] == 4

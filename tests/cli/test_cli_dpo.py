"""`agentrft dpo` and `agentrft train` with method dpo, on the tiny policy (SmolLM2's real chat template)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.train.core.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import fakes_dpo as D

runner = CliRunner()
CALL = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+2"}'}}


def _pairs(path: Path) -> Path:
    rows = [
        {
            "prompt": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": f"What is {k}+2?"}],
            "chosen": [
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": str(k + 2)},
                {"role": "assistant", "content": f"The answer is {k + 2}."},
            ],
            "rejected": [{"role": "assistant", "content": "The answer is 7."}],
        }
        for k in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dpo_on_a_pairs_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["dpo", "--pairs", str(_pairs(tmp_path / "p.jsonl")), "--policy", "tiny", "--run-dir", str(run)]
    r = runner.invoke(app, [*args, "--set", "steps=2", "--set", "dpo.pairs_per_step=2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["metrics"]["data/pairs_rendered"] == 3
    rows = read_metrics(run)
    assert [m["step"] for m in rows] == [1, 2] and rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert {"rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin"} <= set(rows[0])
    assert (run / "policy").is_dir() and (run / "dpo_reference.pt").is_file() and (run / "pairs.jsonl").is_file()
    # the same run again without --resume: refused, nothing trained
    r = runner.invoke(app, [*args, "--set", "steps=2"])
    assert r.exit_code == 2 and "already holds checkpoints" in r.stderr


def test_train_with_method_dpo_from_a_store(tmp_path: Path) -> None:
    db = D.make_store(tmp_path / "data.db")
    cfg = tmp_path / "dpo.yaml"
    cfg.write_text(
        f"method: dpo\nsteps: 1\npolicy: {{name: tiny, finetune: full}}\ndata: {{source: {db}, runs: [train]}}\n"
        "dpo: {pairs_per_step: 4, margin: 0.2}\nlogging: {tensorboard: false}\n"
    )
    r = runner.invoke(app, ["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "rewards/accuracy" in r.stdout and "loss" in r.stdout
    (row,) = read_metrics(tmp_path / "run")
    assert row["data/pairs_rendered"] == 0 and row["train_pairs"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--db", "{db}", "--set", "data.runs=[nope]"], "data.runs: no run 'nope'"),
        (
            ["--db", "{db}", "--set", "dpo.margin=2"],
            "no pair of trajectories of one task has a reward gap >= margin 2.0",
        ),
        (["--db", "{db}", "--set", "dpo.loss=hinge"], "dpo.loss: Input should be 'sigmoid', 'ipo' or 'sigmoid_norm'"),
        ([], "name exactly one source of pairs"),
        (["--pairs", "{tmp}/none.jsonl"], "none.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_run_dir(tmp_path: Path, args: list[str], message: str) -> None:
    db = D.make_store(tmp_path / "data.db")
    argv = [a.format(db=db, tmp=tmp_path) for a in args]
    r = runner.invoke(app, ["dpo", *argv, "--policy", "tiny", "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()

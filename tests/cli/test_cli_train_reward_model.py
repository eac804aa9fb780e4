"""`agentrft train` with method reward_model, then `agentrft grade` with the model it saved; bad input is
exit 2 with one line, before a run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.pairs import Pair, write_pairs
from agentrft.types import Message

runner = CliRunner()


def _pairs(path: Path) -> Path:
    pairs = [
        Pair(
            id=f"p{k}",
            task_id=f"t{k}",
            prompt=[Message(role="user", content=f"{k} + 1?")],
            chosen=[Message(role="assistant", content=f"{k + 1}")],
            rejected=[Message(role="assistant", content="I cannot say.")],
            where="test",
        )
        for k in range(4)
    ]
    write_pairs(pairs, path)
    return path


def _config(tmp_path: Path, pairs: Path, **extra: object) -> str:
    cfg = {
        "method": "reward_model",
        "steps": 2,
        "policy": {"name": "tiny", "finetune": "full", "precision": "fp32"},
        "reward_model": {"pairs": str(pairs), "pairs_per_step": 2, "heldout_fraction": 0.25},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "logging": {"tensorboard": False},
        **extra,
    }
    path = tmp_path / "rm.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _one_line_error(result: object) -> str:
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    lines = result.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output  # type: ignore[attr-defined]
    return lines[0]


def test_train_a_reward_model_then_grade_with_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = _config(tmp_path, _pairs(tmp_path / "pairs.jsonl"))
    result = runner.invoke(app, ["train", cfg, "--run-dir", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["metrics"]["rm/heldout_pairs"] == 1.0
    assert 0.0 <= out["metrics"]["rm/heldout_accuracy"] <= 1.0 and out["metrics"]["data/pairs_rendered"] == 4.0
    (tmp_path / "g.json").write_text(json.dumps({"type": "reward_model", "path": "run/reward_model"}))
    (tmp_path / "i.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "1 + 1?"}]}) + "\n")
    (tmp_path / "s.jsonl").write_text(json.dumps({"output_text": "2"}) + "\n")
    files = ["--grader", str(tmp_path / "g.json"), "--items", str(tmp_path / "i.jsonl")]
    graded = runner.invoke(app, ["grade", *files, "--samples", str(tmp_path / "s.jsonl"), "--json"])
    assert graded.exit_code == 0, graded.output
    row = json.loads(graded.stdout.strip().splitlines()[0])
    assert 0.0 < row["reward"] < 1.0 and row["errors"] == []


def test_bad_input_exits_2_before_the_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    pairs = _pairs(tmp_path / "pairs.jsonl")
    with pairs.open("a") as f:
        f.write('{"prompt": [{"role": "assistant", "content": "hi"}], "chosen": [], "rejected": []}\n')
    line = _one_line_error(runner.invoke(app, ["train", _config(tmp_path, pairs), "--run-dir", str(run_dir)]))
    assert f"{pairs}:5: field 'prompt[0].role'" in line
    cfg = _config(tmp_path, _pairs(tmp_path / "ok.jsonl"), rollout={"grader": {"type": "reward_model", "path": "nope"}})
    line = _one_line_error(runner.invoke(app, ["train", cfg, "--run-dir", str(run_dir)]))
    assert "rollout.grader: path: nope: no such directory" in line
    assert not run_dir.exists()

"""`agentrft rollout --policy oracle:…` stores graded demonstrations like any trajectory."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.store import Store


def test_oracle_rollout_stores_graded_demonstrations(tmp_path: Path) -> None:
    db = tmp_path / "demos.db"
    args = ["rollout", "--env", "finqa-lite:3", "--policy", "oracle:tiny", "--tasks", "3", "--db", str(db), "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["episodes"] == 3 and summary["mean_reward"] == 1.0 and summary["statuses"] == {"completed": 3}
    store = Store(db)
    try:
        trajs = store.query_trajectories(run_id=summary["run_id"])
    finally:
        store.close()
    assert len(trajs) == 3
    for t in trajs:
        assert t.policy == "oracle:tiny" and t.grade is not None and t.grade.success
        assert t.tokens is not None and sum(t.tokens.loss_mask) > 0


def test_oracle_on_an_env_without_an_expert_is_one_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}) + "\n")
    res = CliRunner().invoke(app, ["rollout", "--env", f"jsonl:{data}", "--policy", "oracle", "--tasks", "1"])
    assert res.exit_code == 2
    assert "has no expert" in res.output

"""Every command that samples takes --seed: the same seed, the same episodes; another seed, others."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.store import Store


def _tokens(db: Path, run_id: str | None = None) -> list[tuple[str, list[int]]]:
    store = Store(db)
    try:
        trajs = store.query_trajectories(run_id=run_id) if run_id else store.query_trajectories()
        return sorted((t.task_id, t.tokens.ids) for t in trajs)
    finally:
        store.close()


def _rollout(tmp_path: Path, name: str, *extra: str) -> tuple[Path, dict]:
    db = tmp_path / f"{name}.db"
    args = ["rollout", "--env", "finqa-lite:1", "--policy", "tiny", "--tasks", "2", "--samples", "2"]
    res = CliRunner().invoke(app, [*args, "--max-tokens", "8", "--db", str(db), "--json", *extra])
    assert res.exit_code == 0, res.output
    return db, json.loads(res.output.strip().splitlines()[-1])


def test_rollout_seed_repeats_and_varies(tmp_path: Path) -> None:
    a, _ = _rollout(tmp_path, "a", "--seed", "5")
    b, _ = _rollout(tmp_path, "b", "--seed", "5")
    c, _ = _rollout(tmp_path, "c", "--seed", "6")
    d, _ = _rollout(tmp_path, "d")  # the default seed is fixed too (0)
    e, _ = _rollout(tmp_path, "e", "--seed", "0")
    assert _tokens(a) == _tokens(b) != _tokens(c)
    assert _tokens(d) == _tokens(e)


def test_eval_and_check_take_a_seed(tmp_path: Path) -> None:
    runs = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        db = tmp_path / f"{name}.db"
        args = ["eval", "--env", "finqa-lite:1", "--policy", "tiny", "--tasks", "2", "--samples", "2"]
        res = CliRunner().invoke(app, [*args, "--db", str(db), "--json", "--seed", seed])
        assert res.exit_code == 0, res.output
        runs.append(_tokens(db))
    assert runs[0] == runs[1] != runs[2]
    checks = []
    for name, seed in (("a", "3"), ("b", "3")):
        db = tmp_path / f"check-{name}.db"
        args = ["check", "--env", "finqa-lite:1", "--policy", "tiny", "--tasks", "2", "--samples", "2"]
        res = CliRunner().invoke(app, [*args, "--db", str(db), "--json", "--seed", seed])
        assert res.exit_code == 0, res.output
        checks.append(_tokens(db))
    assert checks[0] == checks[1]

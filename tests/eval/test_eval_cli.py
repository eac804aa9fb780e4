"""`agentrft eval / check / report / export` through the typer app (fakes for env, policy and runner)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from eval_fakes import FakeEnv, FakeSampler, install_fake_graders, install_fake_runner, make_task
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.inputs import InputError

TASKS = [make_task(t, 2, level=i % 2 + 1) for i, t in enumerate("abcd")]
cli = CliRunner()


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """make_env → FakeEnv, load_policy → scripted samplers ("weak" / "strong"), fake runner and graders."""
    install_fake_graders(monkeypatch)
    install_fake_runner(monkeypatch)
    answers = {
        "weak": {"a": ["2", "0", "0"], "b": ["0", "0", "0"], "c": ["2", "2", "0"], "d": ["1", "1", "1"]},
        "strong": {"a": ["2", "2", "2"], "b": ["2", "0", "2"], "c": ["2", "2", "2"], "d": ["1", "2", "1"]},
    }
    env = FakeEnv(TASKS)
    env.limits = types.SimpleNamespace(max_tokens_per_turn=64)  # type: ignore[attr-defined]
    import agentrft.envs.registry as reg
    import agentrft.samplers.policies as pol

    def make_env(spec: str) -> FakeEnv:
        if spec != "fake:1":
            raise InputError(f"unknown environment {spec!r}")  # as the real registry: bad input, exit 2
        return env

    monkeypatch.setattr(reg, "make_env", make_env)
    monkeypatch.setattr(pol, "load_policy", lambda name, **kw: FakeSampler(answers[name]))
    return {"env": env}


def _run(args: list[str]) -> Any:
    return cli.invoke(app, args, catch_exceptions=False)


def test_eval_json_and_compare(tmp_path: Path, fakes: dict[str, Any]) -> None:
    db = tmp_path / "run" / "agentrft.db"
    r = _run(
        [
            "eval",
            "--env",
            "fake:1",
            "--policy",
            "weak",
            "--samples",
            "3",
            "--db",
            str(db),
            "--name",
            "baseline",
            "--json",
        ]
    )
    assert r.exit_code == 0, r.output
    base = json.loads(r.stdout)
    assert base["n_tasks"] == 4 and base["pass_at_k"]["1"] == pytest.approx(3 / 12)
    assert base["pass_at_k"]["3"] == pytest.approx(0.5)
    _assert_matches_stored(db, base)
    r = _run(["eval", "--env", "fake:1", "--policy", "strong", "--samples", "3", "--db", str(db), "--name", "final"])
    assert r.exit_code == 0 and "pass@3" in r.stdout and "run id:" in r.stdout
    r = _run(["eval", "--compare", "baseline", "final", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    cmp = json.loads(r.stdout)["comparison"]
    # per-task rates weak (1/3, 0, 2/3, 0) vs strong (1, 2/3, 1, 1/3): every task improves
    assert cmp["diff"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 3 + 1 / 3) / 4)
    assert cmp["wins_b"] == 4 and cmp["p_value"] == pytest.approx(2 / 16)
    r = _run(["eval", "--compare", "baseline", "final", "--db", str(db)])
    assert "B - A on 4 shared tasks" in r.stdout

    # report and exports from the same run directory
    r = _run(["report", str(db.parent)])
    assert r.exit_code == 0 and (db.parent / "report.html").exists()
    html = (db.parent / "report.html").read_text()
    assert "baseline" in html and "Paired comparison on 4 shared tasks" in html
    # strong: tasks b and d have mixed rewards (2 + 2 DPO pairs, 1 + 1 best vs worst); every task has a success
    # (4 SFT rows)
    for fmt, n, extra in (
        ("rft", 4, []),
        ("sft", 4, []),
        ("dpo", 4, []),
        ("dpo", 2, ["--pairs-per-task", "1"]),
        ("parquet", 12, []),
    ):
        out = tmp_path / f"out.{fmt}"
        r = _run(["export", "--db", str(db), "--run", "final", "--format", fmt, str(out), *extra])
        assert r.exit_code == 0, r.output
        assert r.stdout.strip() == f"wrote {n} {fmt} rows to {out}"
    r = _run(["export", "--db", str(db), "--run", "final", "--format", "dpo", str(out), "--margin", "2"])
    assert r.exit_code == 2 and "no pair of trajectories of one task has a reward gap >= margin 2.0" in r.stderr


def test_check_json(fakes: dict[str, Any]) -> None:
    r = _run(["check", "--env", "fake:1", "--policy", "weak", "--samples", "3", "--tasks", "4", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["success_rate"] == pytest.approx(3 / 12) and res["verdict"] == "worth_it"
    r = _run(["check", "--env", "fake:1", "--policy", "weak", "--samples", "3"])
    assert "verdict: worth_it" in r.stdout


def test_errors_are_one_line(tmp_path: Path, fakes: dict[str, Any]) -> None:
    r = _run(["eval", "--env", "nope:1", "--policy", "weak", "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and r.stderr.strip() == "error: unknown environment 'nope:1'"
    r = _run(["eval", "--compare", "a", "b", "--db", str(tmp_path / "missing.db")])
    assert r.exit_code == 2 and "no store at" in r.stderr
    r = _run(["eval", "--policy", "weak"])
    assert r.exit_code == 2 and "pass --env" in r.stderr
    r = _run(["report", str(tmp_path / "nodir")])
    assert r.exit_code == 2 and "is not a directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = _run(["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "agentrft.db not found" in r.stderr
    r = _run(["export", "--db", str(tmp_path / "x.db"), "--run", "r", "--format", "csv", str(tmp_path / "o")])
    assert r.exit_code == 2 and "unknown --format 'csv'" in r.stderr
    db = tmp_path / "s.db"
    _run(["eval", "--env", "fake:1", "--policy", "weak", "--samples", "2", "--db", str(db), "--json"])
    r = _run(["export", "--db", str(db), "--run", "nosuch", "--format", "sft", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no run with id or name 'nosuch'" in r.stderr
    assert "Traceback" not in r.output


def _assert_matches_stored(db: Path, result: dict[str, Any]) -> None:
    """pass@k / pass^k of `--json` equal the unbiased formulas recomputed from the stored trajectories."""
    from collections import defaultdict
    from math import comb

    from agentrft.store import Store

    with Store(db) as store:
        trajs = store.query_trajectories(run_id=result["run_id"])
    per_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        per_task[t.task_id].append(bool(t.grade and t.grade.success))
    assert len(trajs) == result["n_trajectories"] and len(per_task) == result["n_tasks"]
    n = min(len(v) for v in per_task.values())
    for k in range(1, n + 1):
        at = sum(1 - comb(len(v) - sum(v), k) / comb(len(v), k) for v in per_task.values()) / len(per_task)
        hat = sum(comb(sum(v), k) / comb(len(v), k) for v in per_task.values()) / len(per_task)
        assert result["pass_at_k"][str(k)] == pytest.approx(at, abs=1e-12)
        assert result["pass_hat_k"][str(k)] == pytest.approx(hat, abs=1e-12)

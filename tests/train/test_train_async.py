"""Asynchronous GRPO on the fake env + tiny model: the staleness bound holds for every trained trajectory
(read back from the store), k = 0 is the synchronous loop, and an interrupted run (stopped, or killed with
kill -9) resumes without losing a finished trajectory or training one twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fakes_train as F
import pytest

from agentrft.store import Store
from agentrft.train import train
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.types import Trajectory

HERE = Path(__file__).parent
QUICK = {"eval.every_steps": 0, "checkpoint.every_steps": 1}


def _run(run_dir: Path, resume: bool = False, stop_after: int | None = None, **over: Any) -> Any:
    return train(F.config(**over), run_dir, resume=resume, components=F.components(run_dir), stop_after=stop_after)


def _trajectories(run_dir: Path) -> list[Trajectory]:
    with Store(run_dir / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        return s.query_trajectories(run_id=run.id)


def _strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _check_ledger(run_dir: Path, k: int, steps: int) -> list[int]:
    """Every stored trajectory is trained once or dropped with a reason; each trained one within the bound;
    each step trained exactly the trajectories its metrics count. Returns the trained staleness values."""
    trajs = _trajectories(run_dir)
    metrics = {int(r["step"]): r for r in read_metrics(run_dir)}
    assert sorted(metrics) == list(range(1, steps + 1))
    per_step: dict[int, int] = {}
    staleness = []
    for t in trajs:
        trained, dropped = t.metadata.get("trained_step"), t.metadata.get("dropped")
        assert (trained is None) != (dropped is None), (t.id, t.metadata)
        assert t.tokens is not None and t.tokens.turn_versions is not None
        assert t.policy_version == min(t.tokens.turn_versions)
        if trained is None:
            assert isinstance(dropped, str) and dropped
            continue
        per_step[trained] = per_step.get(trained, 0) + 1
        s = (trained - 1) - t.policy_version  # update `trained` starts from version trained - 1
        assert 0 <= s <= k, (t.id, trained, t.policy_version)
        staleness.append(s)
    assert per_step == {s: int(m["train_sequences"]) for s, m in metrics.items()}
    return staleness


def test_k0_is_the_synchronous_loop(tmp_path: Path) -> None:
    _run(tmp_path / "sync", steps=3, **QUICK)
    _run(tmp_path / "k0", steps=3, **{**QUICK, "async.max_staleness": 0})
    assert _strip(read_metrics(tmp_path / "k0")) == _strip(read_metrics(tmp_path / "sync"))


def test_a_synchronous_run_marks_every_trajectory_too(tmp_path: Path) -> None:
    _run(tmp_path, steps=3, **QUICK)
    assert set(_check_ledger(tmp_path, 0, 3)) == {0}


@pytest.mark.parametrize("k", [1, 2])
def test_the_staleness_bound_holds_for_every_trained_trajectory(tmp_path: Path, k: int) -> None:
    # as many groups in flight as the bound allows, so the producer can run ahead as far as k
    res = _run(tmp_path, steps=5, **{**QUICK, "async.max_staleness": k, "async.max_inflight_groups": 2 * (k + 1)})
    staleness = _check_ledger(tmp_path, k, 5)
    assert max(staleness) == k  # the producer ran ahead as far as the bound lets it
    last = res.history[-1]
    for key in ("is/weight_mean", "is/weight_max", "async/trainer_utilisation", "async/producer_utilisation"):
        assert key in last, key
    assert sum(last[f"async/staleness/{s}"] for s in range(k + 1)) == last["train_sequences"]
    assert last["async/dropped_stale"] == 0.0
    # the trajectories queued when the run ended are kept, marked unused
    assert any("unused" in (t.metadata.get("dropped") or "") for t in _trajectories(tmp_path))


def test_groups_in_flight_are_capped_at_one_step_by_default(tmp_path: Path) -> None:
    res = _run(tmp_path, steps=4, **{**QUICK, "async.max_staleness": 2})
    _check_ledger(tmp_path, 2, 4)
    assert all(h["async/inflight_groups"] <= 2 for h in res.history)  # tasks_per_step


def test_a_stopped_run_resumes_losing_nothing_and_training_nothing_twice(tmp_path: Path) -> None:
    over = {**QUICK, "async.max_staleness": 2, "async.max_inflight_groups": 6, "steps": 5}
    _run(tmp_path, stop_after=2, **over)
    before = {t.id for t in _trajectories(tmp_path)}
    _run(tmp_path, resume=True, **over)
    after = {t.id: t for t in _trajectories(tmp_path)}
    assert before <= set(after)  # no finished trajectory is lost
    _check_ledger(tmp_path, 2, 5)
    # what was queued at the stop was put back and trained (not played again)
    assert any(after[i].metadata.get("trained_step", 0) > 2 for i in before)


def test_kill_9_then_resume_loses_nothing_and_trains_nothing_twice(tmp_path: Path) -> None:
    over = {**QUICK, "async.max_staleness": 1, "steps": 5}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "resume_worker_async.py"), str(tmp_path), json.dumps(over)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (tmp_path / "checkpoints" / "step-00000002").exists():
        assert proc.poll() is None, "worker ended before its second checkpoint"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    before = {t.id for t in _trajectories(tmp_path)}
    _run(tmp_path, resume=True, **over)
    assert before <= {t.id for t in _trajectories(tmp_path)}
    _check_ledger(tmp_path, 1, 5)


class _ConstantGrader(F.FakeGrader):
    """Every episode the same reward: no group carries signal, so dynamic sampling drops every one."""

    def score(self, sample: Any, item: dict[str, Any]) -> Any:
        from agentrft.graders import Score

        return Score(0.0, sub={"low": 0.0}, turn_rewards=[0.0])


def test_async_run_whose_every_group_is_dropped_fails_with_the_cause(tmp_path: Path) -> None:
    # before: the trainer waited forever for a group to train on, and said nothing
    comps = F.components(tmp_path)
    comps.grader = _ConstantGrader()
    cfg = F.config(**{**QUICK, "async.max_staleness": 1, "algorithm.dynamic_sampling.enabled": True})
    with pytest.raises(RuntimeError, match=r"last 6 groups played were all dropped \(their episodes: zero_signal\)"):
        train(cfg, tmp_path, components=comps)


def test_grpo_refuses_a_group_of_one_at_load_time() -> None:
    from agentrft.train.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.group_size: GRPO compares"):
        F.config(**{"rollout.group_size": 1})
    F.config(**{"rollout.group_size": 1, "method": "rejection_sampling", "data.success_only": True})

"""Seeded tool faults (envs/faults.py): the spec, a schedule that is a function of the seed and the episode,
faults recorded in the trajectory, what trains, and `agentrft eval --faults`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.envs import make_env
from agentrft.envs.faults import FaultSpec, FaultyEnvironment
from agentrft.inputs import InputError
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams
from agentrft.samplers.policies import load_policy
from agentrft.types import Grade, Trajectory


def test_spec_parses_and_refuses_with_one_clear_error() -> None:
    spec = FaultSpec.parse("error=0.1,timeout=0.05,latency=0.2,down=2-4,tools=calculate|search,seed=3")
    assert spec.error == pytest.approx(0.1) and spec.down == (2, 4) and spec.tools == ("calculate", "search")
    assert FaultSpec.parse(spec.text()) == spec
    for bad, why in [
        ("error", "expected KEY=VALUE"),
        ("error=2", "error: Input should be less than or equal to 1"),
        ("error=0.6,timeout=0.6", "at most 1"),
        ("down=4-2", "down takes A-B"),
        ("flaky=0.1", "flaky: Extra inputs are not permitted"),
    ]:
        with pytest.raises(InputError, match=why):
            FaultSpec.parse(bad)


def test_the_schedule_is_a_function_of_the_seed_and_the_call() -> None:
    spec = FaultSpec.parse("error=0.3")
    draws = [spec.draw("t1", episode, call, "calculate")[0] for episode in range(40) for call in range(50)]
    assert draws == [spec.draw("t1", e, c, "calculate")[0] for e in range(40) for c in range(50)]
    assert sum(d == "error" for d in draws) / len(draws) == pytest.approx(0.3, abs=0.03)
    other = FaultSpec.parse("error=0.3,seed=1")
    assert draws != [other.draw("t1", e, c, "calculate")[0] for e in range(40) for c in range(50)]
    only = FaultSpec.parse("error=1,tools=search")
    assert only.draw("t1", 0, 0, "calculate") == (None, 0.0) and only.draw("t1", 0, 0, "search")[0] == "error"
    down = FaultSpec.parse("down=1-2")
    assert [down.draw("t", 0, c, "x")[0] for c in range(4)] == [None, "down", "down", None]


def _oracle_rollout(spec: str) -> list[Trajectory]:
    env = make_env(f"finqa-lite:1?faults={spec}")
    assert isinstance(env, FaultyEnvironment)
    sampler = load_policy("oracle:tiny", env=env)
    runner = Runner(env, sampler, params=SamplingParams(temperature=0.0, max_tokens=64), progress=False, seed=0)
    return runner.run_sync(env.tasks("train")[:3], 2)


def test_faults_reach_the_policy_and_are_recorded_the_same_way_twice() -> None:
    trajs = _oracle_rollout("error=1")
    calls = [c for t in trajs for c in t.tool_calls]
    assert calls and all(c.error == "the tool failed: internal error" for c in calls)
    assert all(
        t.metadata["env"]["faults"]
        == [{"call": i, "tool": c.name, "kind": "error"} for i, c in enumerate(t.tool_calls)]
        for t in trajs
    )
    again = _oracle_rollout("error=1")
    assert [t.metadata["env"] for t in again] == [t.metadata["env"] for t in trajs]
    clean = _oracle_rollout("error=0")
    assert all(t.metadata["env"]["faults"] == [] for t in clean) and all(
        c.error is None for t in clean for c in t.tool_calls
    )


def test_an_episode_left_no_turn_to_recover_is_not_trained() -> None:
    t = Trajectory(run_id="r", task_id="t", group_id="g", status="max_turns")
    t.grade = Grade(reward=0.0, success=False)
    t.metadata["env"] = {"faults": [{"call": 3, "tool": "calculate", "kind": "error"}], "last_call_faulted": True}
    assert t.untrainable_reason() == "injected_fault"
    t.status = "completed"  # it answered after the fault: its answer is the policy's, and trains
    assert t.untrainable_reason() != "injected_fault"
    t.status, t.metadata["env"]["last_call_faulted"] = "max_turns", False  # it had turns after the fault
    assert t.untrainable_reason() != "injected_fault"


def test_eval_reports_robustness_beside_the_clean_eval(tmp_path: Path) -> None:
    args = ["eval", "--env", "finqa-lite:1", "--policy", "oracle:tiny", "--tasks", "3", "--samples", "1"]
    res = CliRunner().invoke(app, [*args, "--db", str(tmp_path / "e.db"), "--json", "--faults", "error=1"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output[res.output.index("{") :])["robustness"]
    assert [r["faults"] for r in rows] == ["none", "error=1"]
    assert rows[0]["hit"] == 0 and rows[0]["pass_at_1"] == pytest.approx(1.0)  # the oracle, clean
    assert rows[1]["hit"] == 3 and rows[1]["faults_injected"] >= 3
    assert rows[1]["recovery_rate"] == pytest.approx(rows[1]["recovered"] / 3)


def test_a_bad_fault_spec_is_refused_before_anything_runs(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    res = CliRunner().invoke(
        app, ["eval", "--env", "finqa-lite:1", "--policy", "tiny", "--db", str(db), "--faults", "error=7"]
    )
    assert res.exit_code == 2 and "faults 'error=7'" in res.output and not db.exists()
    with pytest.raises(InputError, match="faults"):
        make_env("finqa-lite:1?faults=nonsense")

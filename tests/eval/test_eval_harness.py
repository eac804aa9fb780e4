"""summarize / evaluate on hand-built trajectories with hand-computed figures."""

from __future__ import annotations

import json

import pytest
from eval_fakes import FakeEnv, FakeSampler, FakeStore, install_fake_graders, install_fake_runner, make_task, make_traj

from agentrft.eval.harness import EvalResult, Prices, evaluate, result_from_run, summarize


def _two_tasks() -> tuple[list, list]:
    tasks = [make_task("a", 2, level=1, template="change"), make_task("b", 2, level=2, template="ratio")]
    trajs = [
        make_traj("a", 1.0, seconds=1.0),
        make_traj("a", 0.0, tools=2, tool_error=True, seconds=3.0),
        make_traj("a", 1.0, seconds=2.0),
        make_traj("b", 0.0, answer="7", tools=0, seconds=4.0),
        make_traj("b", 0.5, answer="2.5", seconds=5.0),
        make_traj("b", 0.0, graded=False, seconds=6.0),
    ]
    return tasks, trajs


def test_summarize_hand_computed() -> None:
    tasks, trajs = _two_tasks()
    res = summarize(trajs, tasks, prices=Prices(prompt_per_mtok=1.0, completion_per_mtok=2.0))
    assert (res.n_tasks, res.n_trajectories, res.samples_per_task, res.n_ungraded) == (2, 6, 3, 1)
    assert res.success_rate == pytest.approx(2 / 6)
    # task a: n=3, c=2; task b: n=3, c=0
    assert res.pass_at_k == {1: pytest.approx(1 / 3), 2: pytest.approx(0.5), 3: pytest.approx(0.5)}
    assert res.pass_hat_k == {1: pytest.approx(1 / 3), 2: pytest.approx(1 / 6), 3: pytest.approx(0.0)}
    assert res.mean_reward == pytest.approx((2 / 3 + 0.5 / 3) / 2)
    assert res.reward_ci[0] <= res.mean_reward <= res.reward_ci[1]
    assert res.per_level["1"].success_rate == pytest.approx(2 / 3)
    assert res.per_level["2"].success_rate == 0.0 and res.per_template["ratio"].n_tasks == 1
    # tool calls: 1 + 2 + 1 + 0 + 1 + 1 = 6 over 6 episodes, one error
    assert res.tools.calls_per_episode == pytest.approx(1.0)
    assert res.tools.calls_per_episode_by_tool == {"open": pytest.approx(1.0)}
    assert res.tools.error_rate == pytest.approx(1 / 6) and res.tools.errors_by_kind == {"exception": 1}
    assert res.usage.tokens_per_episode == pytest.approx(120.0)
    assert res.usage.latency_s_mean == pytest.approx(3.5) and res.usage.latency_s_p50 == pytest.approx(3.5)
    assert res.usage.latency_s_p90 == pytest.approx(5.5)
    assert res.cost.successes == 2 and res.cost.tokens_per_success == pytest.approx(360.0)
    assert res.cost.seconds_per_success == pytest.approx(21.0 / 2)
    assert res.cost.usd_per_success == pytest.approx(6 * (100 * 1 + 20 * 2) / 1e6 / 2)
    # compute priced per hour of the run's wall time (all fakes start at t=1000, the longest ends at +6 s)
    res = summarize(trajs, tasks, prices=Prices(compute_per_hour=36.0))
    assert res.cost.wall_seconds == pytest.approx(6.0) and res.cost.compute_per_hour == 36.0
    assert res.cost.usd_per_success == pytest.approx(6.0 / 3600 * 36.0 / 2)
    # failures: a#2 tool_error; b#1 no_tool_call; b#2 wrong_answer; b#3 (ungraded) wrong_answer
    assert res.failures["tool_error"] == 1 and res.failures["no_tool_call"] == 1
    assert res.failures["wrong_answer"] == 2 and sum(res.failures.values()) == 4
    assert res.task_rates() == {"a": pytest.approx(2 / 3), "b": 0.0}


def test_eval_result_json_round_trip() -> None:
    tasks, trajs = _two_tasks()
    res = summarize(trajs, tasks)
    again = EvalResult.model_validate_json(res.model_dump_json())
    assert again == res
    assert res.cost.usd_per_success is None and res.cost.total_usd is None
    json.loads(res.model_dump_json())


def test_zero_successes_give_none_per_success() -> None:
    res = summarize([make_traj("a", 0.0)], [make_task("a", 2)])
    assert res.cost.tokens_per_success is None and res.pass_at_k == {1: 0.0}
    with pytest.raises(ValueError, match="no trajectories"):
        summarize([], [])


def test_evaluate_runs_stores_and_summarises(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_graders(monkeypatch)
    install_fake_runner(monkeypatch)
    tasks = [make_task("a", 2), make_task("b", 5), make_task("c", 1)]
    sampler = FakeSampler({"a": ["2", "2"], "b": ["1", "5"], "c": ["0", "0"]})
    store = FakeStore()
    res = evaluate(FakeEnv(tasks), sampler, samples=2, tasks=2, store=store, run_name="baseline", env_spec="fake:1")
    assert res.n_tasks == 2 and res.pass_at_k[1] == pytest.approx(0.75) and res.pass_at_k[2] == 1.0
    assert res.pass_hat_k[2] == pytest.approx(0.5)
    run = store.get_run(res.run_id)
    assert run.kind == "eval" and run.name == "baseline" and run.config["env"] == "fake:1"
    assert result_from_run(run) == res
    assert set(run.metadata["task_data"]) == {"a", "b"}
    assert len(store.query_trajectories(run_id=res.run_id)) == 4

"""`agentrft demo --env SPEC [--expert-iteration]`: any environment learned from rewards alone (tiny policy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.recipes.demo import DemoSettings, run_demo
from agentrft.train.config import ConfigError

TINY = ["policy.name=tiny", "policy.gradient_checkpointing=false", "policy.precision=fp32"]


@pytest.fixture
def guess_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "envs" / "plugins"))
    return "guess_env:GuessEnv?size=4&train=8&test=3"


def test_expert_iteration_then_grpo_on_a_users_env(tmp_path: Path, guess_env: str) -> None:
    settings = DemoSettings(quick=True, eval_tasks=3, eval_samples=2)
    result = run_demo(
        tmp_path / "run",
        settings,
        [*TINY, "ei.rollout.max_tokens=8", "rollout.max_tokens=8"],
        progress=False,
        env=guess_env,
        expert_iteration=True,
    )
    assert result.train_steps == 4  # 2 of expert iteration, 2 of GRPO (quick)
    summary = json.loads((tmp_path / "run" / "demo.json").read_text())
    (level,) = summary["per_level"]  # a text env's tasks have no level: one row for all
    row = summary["per_level"][level]
    assert row["n_tasks"] == 3 and 0.0 <= row["p_value"] <= 1.0
    assert summary["before"]["n_trajectories"] == summary["after"]["n_trajectories"] == 6
    assert {"expert_iteration", "train", "eval_baseline", "eval_final"} <= set(summary["seconds"])
    assert (tmp_path / "run" / "expert-iteration" / "metrics.jsonl").is_file()
    ei_config = (tmp_path / "run" / "expert-iteration" / "config.yaml").read_text()
    assert "rejection_sampling" in ei_config and "guess_env:GuessEnv" in ei_config


def test_stage_options_without_the_stage_are_refused(tmp_path: Path, guess_env: str) -> None:
    with pytest.raises(ConfigError, match="add --expert-iteration"):
        run_demo(tmp_path / "run", DemoSettings.preset(True), ["ei.steps=1"], progress=False, env=guess_env)


def test_a_jsonl_env_without_a_validation_file_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n')
    with pytest.raises(ConfigError, match=r"add \?valid=FILE"):
        run_demo(tmp_path / "run", DemoSettings.preset(True), TINY, progress=False, env=f"jsonl:{data}")


def test_the_expert_iteration_stage_plays_the_grpo_stages_episodes(tmp_path: Path, guess_env: str) -> None:
    import yaml

    settings = DemoSettings(quick=True, eval_tasks=2, eval_samples=1)
    over = [*TINY, "rollout.max_tokens=8", "rollout.tool_format=hermes", "ei.steps=1"]
    run_demo(tmp_path / "run", settings, over, progress=False, env=guess_env, expert_iteration=True)
    ei = yaml.safe_load((tmp_path / "run" / "expert-iteration" / "config.yaml").read_text())
    assert ei["rollout"]["tool_format"] == "hermes" and ei["rollout"]["max_tokens"] == 8
    assert ei["policy"]["name"] == "tiny" and ei["steps"] == 1


def test_the_evals_grade_with_the_envs_grader_not_the_training_reward(tmp_path: Path, guess_env: str) -> None:
    from agentrft.store import Store

    shaped = '{"type": "multi", "graders": {"shaped": {"type": "env_reward", "name": "shaped"}}, '
    shaped += '"calculate_output": "0.5 * shaped + 0.25"}'
    settings = DemoSettings(quick=True, eval_tasks=2, eval_samples=1)
    over = [*TINY, "rollout.max_tokens=8", f"rollout.grader={shaped}"]
    run_demo(tmp_path / "run", settings, over, progress=False, env=guess_env)
    summary = json.loads((tmp_path / "run" / "demo.json").read_text())
    for stage in ("before", "after"):
        assert set(summary[stage]["sub_reward_mean"]) == {"reward"}  # the env's env_reward grader, by its name
    with Store.open_existing(tmp_path / "run" / "agentrft.db") as store:
        trained = store.query_trajectories(run_id=store.find_run("run").id)  # the GRPO run, named for its dir
    assert trained and all(t.grade is not None and set(t.grade.sub_rewards) == {"shaped"} for t in trained)
    assert all(t.reward is not None and t.reward >= 0.25 - 1e-9 for t in trained)  # 0.5 * [0, 1] + 0.25

"""The hyperparameter mapping (the documented table) and metrics events in the hosted service's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.rft.events import EventLog, metrics_event_data
from agentrft.rft.mapping import BASE_LR, job_env_spec, map_hyperparameters
from agentrft.rft.spec import parse_job_spec

FIXTURES = Path(__file__).parent / "fixtures"


def _spec(**hp: object):
    body = json.loads((FIXTURES / "job.json").read_text())
    body["method"]["reinforcement"]["hyperparameters"] = hp
    return parse_job_spec(body, "job.json", FIXTURES)


def test_auto_resolves_to_the_documented_defaults() -> None:
    spec = _spec()
    cfg, table = map_hyperparameters(spec, train_rows=10, valid_rows=5, env_spec=job_env_spec(spec, None))
    by_name = {r["hyperparameter"]: r for r in table}
    assert cfg.rollout.tasks_per_step == 4 and by_name["batch_size"]["resolved"] == 4
    assert cfg.steps == 3  # ceil(1 epoch x 10 rows / 4)
    assert cfg.optimizer.lr == pytest.approx(BASE_LR) and BASE_LR == 3e-5
    assert cfg.rollout.group_size == 8
    assert cfg.eval.every_steps == 1 and cfg.checkpoint.every_steps == 1  # ceil(3 / 4)
    assert (cfg.eval.split, cfg.eval.num_tasks, cfg.eval.samples_per_task) == ("valid", 5, 1)
    assert by_name["reasoning_effort"]["resolved"] == "not applicable"
    assert cfg.policy.finetune == "full" and cfg.seed == 3 and cfg.rollout.grader == spec.grader
    assert cfg.rollout.env == (
        f"jsonl:{FIXTURES / 'train.jsonl'}?valid={FIXTURES / 'valid.jsonl'}&tools={FIXTURES / 'tools.py'}"
    )


def test_explicit_values_map_as_documented() -> None:
    spec = _spec(
        n_epochs=3, batch_size=3, learning_rate_multiplier=2, compute_multiplier=0.5, eval_interval=4, eval_samples=2
    )
    cfg, _ = map_hyperparameters(spec, train_rows=10, valid_rows=5, env_spec="jsonl:x")
    assert cfg.steps == 10  # ceil(3 x 10 / 3)
    assert cfg.optimizer.lr == pytest.approx(2 * BASE_LR)
    assert cfg.rollout.group_size == 4  # round(8 x 0.5)
    assert (cfg.eval.every_steps, cfg.eval.samples_per_task) == (4, 2)
    tiny, _ = map_hyperparameters(_spec(compute_multiplier=0.01), 10, 5, "jsonl:x")
    assert tiny.rollout.group_size == 2  # a group needs two samples


STEP = {
    "train_episodes": 8.0,
    "train_reward_mean": 0.25,
    "train_reward/exact": 0.125,
    "train_reward/close": 0.5,
    "train_grader_errors/sample_parse_error": 2.0,
    "train_grader_errors/unresponsive_reward_error": 1.0,
    "train_grader_errors/by_grader/close": 3.0,
    "train_sampled_tokens_per_episode": 6.5,
    "train_sampled_tokens": 52.0,
    "valid_episodes": 4.0,
    "valid_reward_mean": 0.75,
    "valid_reward/exact": 1.0,
    "valid_reward/close": 0.375,
    "valid_grader_errors/sample_parse_error": 1.0,
    "valid_tokens_per_episode": 30.0,
    "time/sampling_s": 1.5,
    "time/training_s": 2.0,
    "time/eval_s": 0.5,
    "time/step_s": 4.25,
}


def test_a_step_event_carries_the_hosted_metric_names() -> None:
    message, data = metrics_event_data(3, 6, STEP, {"exact": "string_check", "close": "text_similarity"})
    assert message == (
        "Step 3/6, train mean reward=0.25, full validation mean reward=0.75, full validation mean parse error=0.25"
    )
    assert (data["step"], data["total_steps"], data["train_mean_reward"], data["full_valid_mean_reward"]) == (
        3,
        6,
        0.25,
        0.75,
    )
    assert data["full_valid_mean_parse_error"] == 0.25 and data["mean_unresponsive_rewards"] == 0.125
    assert data["completion_tokens_mean"] == 6.5
    scores = data["scores"]
    assert (scores["train_reward_mean"], scores["valid_reward_mean"]) == (0.25, 0.75)
    assert scores["graders"] == [
        {"name": "close", "type": "text_similarity", "train_reward_mean": 0.5, "valid_reward_mean": 0.375},
        {"name": "exact", "type": "string_check", "train_reward_mean": 0.125, "valid_reward_mean": 1.0},
    ]
    errors = data["errors"]
    assert errors["train_sample_parse_error_count"] == 2.0 and errors["train_sample_parse_error_mean"] == 0.25
    assert errors["valid_sample_parse_error_mean"] == 0.25
    assert errors["graders"][0] == {"name": "close", "type": "text_similarity", "train_error_count": 3.0}
    assert data["timing"]["step"] == {"sampling": 1.5, "training": 2.0, "eval": 0.5, "full_iteration": 4.25}


def test_a_step_without_eval_and_the_baseline() -> None:
    train_only = {k: v for k, v in STEP.items() if not k.startswith("valid")}
    message, data = metrics_event_data(1, 6, train_only, {})
    assert message == "Step 1/6, train mean reward=0.25" and "full_valid_mean_reward" not in data
    baseline = {k: v for k, v in STEP.items() if k.startswith("valid")}
    message, data = metrics_event_data(0, 6, baseline, {})
    assert message.startswith("Baseline (before training), full validation mean reward=0.75")
    assert "train_mean_reward" not in data and data["step"] == 0


def test_event_log_rewinds_the_metrics_of_redone_steps(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.emit("Fine-tuning job started")
    for step in (0, 1, 2, 3):
        log.emit(f"Step {step}", kind="metrics", data={"step": step})
    with open(log.path, "a") as fh:
        fh.write('{"object": "fine_tuning.job.event", "da')  # torn by a kill
    assert len(log.read()) == 5
    assert log.rewind(1) == 2
    events = log.read()
    assert [e["data"].get("step") for e in events] == [None, 0, 1]
    assert all(e["object"] == "fine_tuning.job.event" and e["id"].startswith("ftevent-") for e in events)

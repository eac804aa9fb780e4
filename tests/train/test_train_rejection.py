"""Rejection-sampling fine-tuning on one session: rounds of sample -> grade -> keep the best success -> SFT steps;
a resumed run (mid-round too) equals an uninterrupted one; the config says what it needs."""

from __future__ import annotations

import fakes_train as F
import pytest

from agentrft.store import Store
from agentrft.train import ConfigError, train
from agentrft.train.config import PRESETS, build_config
from agentrft.train.core.metrics import is_timing_key, read_metrics

RS = {
    "method": "rejection_sampling",
    "data.success_only": "true",
    "data.best_of_n": 1,
    "rejection_sampling.steps_per_round": 2,
    "rejection_sampling.tasks_per_round": 3,
    "rollout.group_size": 4,
    "sft.batch_size": 2,
    "steps": 6,
    "eval.every_steps": 0,
}


def _run(run_dir, resume=False, stop_after=None, **over):
    return train(
        F.config(**{**RS, **over}),
        run_dir,
        resume=resume,
        components=F.components(run_dir),
        stop_after=stop_after,
    )


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _trajectories(run_dir):
    with Store(run_dir / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        return s.query_trajectories(run_id=run.id)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    return d, _run(d)


def test_rounds_sample_keep_the_best_success_per_task_and_train_on_it(reference):
    d, res = reference
    rows = read_metrics(d)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and res.steps == 6
    collected = [r["step"] for r in rows if "train_reward_mean" in r]
    assert collected == [1, 3, 5]  # the first step of each round samples with the current policy
    assert [r["rejection/round"] for r in rows] == [1, 1, 2, 2, 3, 3]
    trajs = _trajectories(d)
    assert len(trajs) == 3 * 3 * 4  # rounds x tasks x group_size, all stored and graded
    by_version: dict[int, list] = {}
    for t in trajs:
        by_version.setdefault(t.policy_version, []).append(t)
    assert sorted(by_version) == [0, 2, 4]  # each round samples the weights its previous steps left
    for r in (r for r in rows if "train_reward_mean" in r):
        sampled = by_version[int(r["step"]) - 1]
        tasks_with_success = {t.task_id for t in sampled if t.grade.success}
        # best of n = 1 among the successes: one kept trajectory per task that had a success
        assert r["rejection/kept"] == r["rejection/tasks_kept"] == len(tasks_with_success)
        assert r["rejection/kept_after/success_only"] == sum(t.grade.success for t in sampled)
    kept = {int(r["rejection/round"]): r["rejection/kept"] for r in rows if "rejection/kept" in r}
    assert any(kept.values())
    for r in rows:  # sft.batch_size draws from the round's pool; a round that kept nothing trains nothing
        if kept[int(r["rejection/round"])]:
            assert r["train_sequences"] == 2 and "update_skipped" not in r
        else:
            assert r["update_skipped"] == 1.0
    assert all(r["policy_version"] == r["step"] for r in rows)


@pytest.mark.parametrize("stop_after", [2, 3])  # at a round's end; inside a round (its pool comes from the store)
def test_stop_and_resume_equals_uninterrupted(reference, tmp_path, stop_after):
    ref_dir, _ = reference
    _run(tmp_path, stop_after=stop_after)
    _run(tmp_path, resume=True)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))
    key = [(t.task_id, t.policy_version, t.reward) for t in _trajectories(tmp_path)]
    assert sorted(key) == sorted((t.task_id, t.policy_version, t.reward) for t in _trajectories(ref_dir))


def test_the_config_says_what_rejection_sampling_needs():
    build_config(PRESETS["rejection-sampling"])
    with pytest.raises(ConfigError, match=r"^config: data: rejection_sampling keeps the graded best"):
        build_config({"method": "rejection_sampling"})
    with pytest.raises(ConfigError, match=r"^config: data.source: rejection_sampling samples its own trajectories"):
        build_config({"method": "rejection_sampling", "data": {"success_only": True, "source": "x.db"}})


def test_learns_on_the_fake_task(tmp_path):
    _run(tmp_path, steps=16, **{"checkpoint.every_steps": 0, "rejection_sampling.tasks_per_round": 6})
    success = [r["train_success_rate"] for r in read_metrics(tmp_path) if "train_success_rate" in r]
    assert len(success) == 8
    assert sum(success[-3:]) / 3 > sum(success[:3]) / 3 + 0.1, success

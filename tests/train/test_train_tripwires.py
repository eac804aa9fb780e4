"""Reward-hacking tripwires (train/rl/tripwires.py): each detector on metric histories, and a run on a hackable
grader whose held-out check falls, where the tripwire fires and (action: stop) ends the run at a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import fakes_train as F
import pytest

from agentrft.graders import Grader, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, grader_types, register_grader
from agentrft.train import train
from agentrft.train.rl.tripwires import Tripwires, TripwiresConfig


def _run(wires: Tripwires, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    fired = []
    for step, row in enumerate(rows, start=1):
        fired += [(step, k.removeprefix("tripwire/")) for k in wires.check(step, dict(row))]
    return fired


def test_check_falls_fires_when_the_train_reward_rises_and_the_check_falls_beyond_noise() -> None:
    rows = [{"train_reward_mean": r} for r in (0.1, 0.1, 0.1, 0.4, 0.6, 0.8)]
    rows[2].update(valid_check_reward=0.50, valid_check_se=0.02)
    rows[5].update(valid_check_reward=0.30, valid_check_se=0.02)
    assert _run(Tripwires(TripwiresConfig(enabled=True)), rows) == [(6, "check_falls")]
    noisy = [dict(r) for r in rows]
    noisy[2]["valid_check_se"] = noisy[5]["valid_check_se"] = 0.2  # the same fall, within noise
    assert _run(Tripwires(TripwiresConfig(enabled=True)), noisy) == []
    flat = [dict(r, train_reward_mean=0.1) for r in rows]  # the check fell, but nothing was rewarded for it
    assert _run(Tripwires(TripwiresConfig(enabled=True)), flat) == []


def test_diversity_and_drift_fire_once_until_they_clear() -> None:
    cfg = TripwiresConfig(enabled=True, window=2, drift_steps=3)
    rows = [
        {"train_distinct_answer_frac": 0.9, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 40.0},
        {"train_distinct_answer_frac": 0.1, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 50.0},
        {"train_distinct_answer_frac": 0.1, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 70.0},
        {"train_distinct_answer_frac": 0.1, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 90.0},
        {"train_distinct_answer_frac": 0.8, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 85.0},
        {"train_distinct_answer_frac": 0.1, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 80.0},
        {"train_distinct_answer_frac": 0.1, "train_success_rate": 0.1, "train_sampled_tokens_per_episode": 80.0},
    ]
    fired = _run(Tripwires(cfg), rows)
    assert fired == [(3, "diversity_collapse"), (3, "length_drift"), (7, "diversity_collapse")]
    solved = [dict(r, train_success_rate=1.0, train_sampled_tokens_per_episode=40.0) for r in rows]
    assert _run(Tripwires(cfg), solved) == []  # every episode agreeing on the right answer is not a collapse


@pytest.fixture(scope="module", autouse=True)
def _check_grader_type() -> None:
    if "test_high_tokens" in grader_types():
        return

    class HighTokensSpec(SpecBase):
        type: Literal["test_high_tokens"]

    @register_grader("test_high_tokens")
    class HighTokens(Grader):
        """The check: the share of sampled tokens in the vocabulary's upper half, which the fake grader's
        reward (the lower half's share) pushes down: a training reward that can be hacked against it."""

        Spec = HighTokensSpec

        @classmethod
        def build(cls, spec: Any, where: str, options: LoadOptions) -> HighTokens:
            return cls("high_tokens", 0.5)

        def score(self, sample: Sample, item: dict[str, Any]) -> Score:
            traj = sample.trajectory
            assert traj is not None and traj.tokens is not None
            sampled = [i for i, m in zip(traj.tokens.ids, traj.tokens.loss_mask, strict=True) if m]
            return Score(sum(i >= F.VOCAB // 2 for i in sampled) / max(len(sampled), 1))


def _hackable_run(tmp_path: Path, **over: Any) -> Any:
    cfg = F.config(
        **{
            "steps": 10,
            "eval.every_steps": 1,
            "eval.temperature": 1.0,
            "eval.num_tasks": 4,
            "eval.samples_per_task": 4,
            "tripwires.enabled": True,
            "tripwires.check_grader": json.dumps({"type": "test_high_tokens"}),
            **over,
        }
    )
    return train(cfg, tmp_path, components=F.components(tmp_path))


def test_a_hackable_grader_trips_the_check_and_stop_ends_the_run_at_a_checkpoint(tmp_path: Path) -> None:
    result = _hackable_run(tmp_path, **{"tripwires.action": "stop"})
    curve = [
        (int(m["step"]), round(m["train_reward_mean"], 2), round(m["valid_check_reward"], 2)) for m in result.history
    ]
    print(f"\n[tripwire] (step, train reward, check) {curve}")
    fired = [int(m["step"]) for m in result.history if m.get("tripwire/check_falls")]
    assert fired and fired[0] <= 8, [
        (m["step"], m.get("train_reward_mean"), m.get("valid_check_reward")) for m in result.history
    ]
    assert result.steps == fired[0] < 10  # stopped there, with that step's checkpoint
    assert (tmp_path / "checkpoints" / f"step-{fired[0]:08d}").exists()
    events = [json.loads(line) for line in (tmp_path / "tripwires.jsonl").read_text().splitlines()]
    assert events[0]["kind"] == "check_falls" and events[0]["step"] == fired[0]


def test_the_demo_recipes_recorded_runs_trip_nothing() -> None:
    """The demo's three seeds (benchmarks/results/determinism_2026-12-06: real SmolLM2-135M runs of the demo
    recipe, every step's metrics as logged) replayed through the default tripwires: none fires. The demo has
    no periodic eval, so the check grader's tripwire has nothing to compare; the others see every step."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "determinism_2026-12-06"
    runs = sorted(results.glob("demo_seed*.metrics.jsonl"))
    assert len(runs) == 3
    for path in runs:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert len(rows) == 10 and all("train_distinct_answer_frac" in r for r in rows)
        assert _run(Tripwires(TripwiresConfig(enabled=True)), rows) == [], path.name
        # the same detectors do fire on a collapse injected into the same run: the replay is not vacuous
        collapsed = [dict(r, train_distinct_answer_frac=0.05, train_success_rate=0.1) for r in rows]
        assert (3, "diversity_collapse") in _run(Tripwires(TripwiresConfig(enabled=True)), collapsed)

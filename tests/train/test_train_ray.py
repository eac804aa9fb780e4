"""Rollout workers on Ray: a local cluster with two worker actors and the tiny model trains three
asynchronous steps; both workers play groups, with the weights the trainer published to them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrft.store import Store
from agentrft.train import train
from agentrft.train.config import build_config

if os.environ.get("AGENTRFT_REQUIRE_RAY"):
    import ray  # noqa: F401  (CI installs agentrft[ray]: the test must run there)
else:
    pytest.importorskip("ray", reason="pip install 'agentrft[ray]'")

BASE = {
    "steps": 3,
    "seed": 1,
    "policy": {"name": "tiny", "finetune": "full", "precision": "fp32", "gradient_checkpointing": False},
    "rollout": {"env": "finqa-lite:1", "tasks_per_step": 2, "group_size": 2, "max_tokens": 8, "temperature": 1.0},
    "optimizer": {"lr": 1e-2},
    "eval": {"every_steps": 0},
    "checkpoint": {"every_steps": 0},
    "logging": {"tensorboard": False},
    "async": {"max_staleness": 1},
    "ray": {"enabled": True, "workers": 2, "worker_cpus": 0.5},
}


def test_worker_loads_the_published_weights(tmp_path: Path) -> None:
    """A worker (here a plain object) ends up with exactly the trainer's tensors and version."""
    import torch

    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.train.rl.ray_rollout import RolloutWorker, trainable_tensors

    cfg = build_config({**BASE, "seed": 7}, [])
    worker = RolloutWorker(cfg.model_dump(mode="json"), 0)
    trainer = load_trainable_policy("tiny", seed=8).model  # other weights
    with torch.no_grad():
        next(trainer.parameters()).add_(1.0)
    assert worker.set_weights(4, trainable_tensors(trainer)) == 4 and worker.version() == 4
    for (n, a), (m, b) in zip(worker.model.named_parameters(), trainer.named_parameters(), strict=True):
        assert n == m and torch.equal(a, b)
    with pytest.raises(KeyError, match="weights this model lacks"):
        worker.set_weights(5, {"nope.weight": torch.zeros(1)})


def test_two_ray_workers_train_three_steps_with_synced_weights(tmp_path: Path) -> None:
    res = train(build_config(BASE, []), tmp_path)
    assert res.steps == 3
    with Store(tmp_path / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        trajs = s.query_trajectories(run_id=run.id)
    by_worker: dict[int, list[int]] = {}
    for t in trajs:
        by_worker.setdefault(t.metadata["worker"], []).append(t.policy_version)
        assert t.tokens is not None and t.tokens.turn_versions is not None
        assert t.policy_version == min(t.tokens.turn_versions)
        if "trained_step" in t.metadata:
            assert 0 <= t.metadata["trained_step"] - 1 - t.policy_version <= 1
    assert sorted(by_worker) == [0, 1]  # both workers played
    # the workers sampled with weights the trainer published after its updates (versions 1 and 2)
    assert max(v for vs in by_worker.values() for v in vs) >= 1
    assert sum("trained_step" in t.metadata for t in trajs) == sum(h["train_sequences"] for h in res.history)


def test_a_dead_worker_is_replaced_and_its_group_played_again() -> None:
    import asyncio

    import ray

    from agentrft.envs.registry import make_env
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.train.rl.ray_rollout import RayPlayer

    cfg = build_config(BASE, [])
    player = RayPlayer(cfg, load_trainable_policy("tiny", seed=cfg.seed).model, version=3)
    try:
        task = make_env(cfg.rollout.env).tasks("train")[0]
        for worker in player.workers:  # kill -9 of the actors' processes, as far as Ray is concerned
            ray.kill(worker)
        group = asyncio.run(player.play(task, 2, "run"))
        assert len(group) == 2 and player.restarts == 1
        assert all(t.policy_version == 3 for t in group)  # the replacement got the published weights
        assert all(t.grade is not None and t.metadata["worker"] == 0 for t in group)
    finally:
        player.close()

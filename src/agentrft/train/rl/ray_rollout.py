"""Rollout workers as Ray actors behind the pipeline's `Player` seam (``pip install agentrft[ray]``).

Each `RolloutWorker` actor builds its own environment, grader and in-process sampler
from the run's config (so tools and grading run in the worker), plays one group at a
time and returns it graded; the trainer's process stores it. After every update the
trainer puts its trainable tensors in the object store once (the LoRA adapter only
when training LoRA: `session.prepare_model` wraps each worker's model the same way, so
the names match) and sends every worker ``set_weights``; a Ray actor runs its calls in
submission order, so a worker picks the new weights up between two groups, never inside
one. Every trajectory records ``metadata.worker`` and, per assistant turn, the version
that sampled it (`TokenRecord.turn_versions`).

``ray.init()`` starts a local cluster unless ``ray.address`` names one. Nothing outside
this module imports ray. A GPU worker (vLLM) fits behind the same actor interface:
``play`` and ``set_weights``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrft.train.config import TrainConfig
from agentrft.types import Task, Trajectory


def trainable_tensors(model: Any) -> dict[str, Any]:
    """The parameters an update changes, by name, detached on the CPU (full fine-tuning: all of them;
    LoRA: the adapter's)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


class RolloutWorker:
    """One rollout worker (a Ray actor in `RayPlayer`; a plain object in tests of its own)."""

    def __init__(self, config: dict[str, Any], index: int) -> None:
        import torch

        from agentrft.envs.registry import make_env
        from agentrft.graders.registry import load_grader
        from agentrft.samplers.policies import load_trainable_policy
        from agentrft.train.core.session import prepare_model
        from agentrft.train.rl.stages import train_runner

        cfg = TrainConfig.model_validate(config)
        torch.set_num_threads(max(1, int(cfg.ray.worker_cpus)))
        self.index = index
        self.env = make_env(cfg.rollout.env)
        self.grader = load_grader(cfg.rollout.grader or self.env.grader_spec())
        self.policy = load_trainable_policy(cfg.policy.name, seed=cfg.seed, **cfg.policy.sampler_options())
        self.model = prepare_model(self.policy.model, cfg.policy)  # the trainer's parameter names
        self.model.requires_grad_(False)
        self.policy.reseed(cfg.seed * 1_000_003 + 7_919 * (index + 1))
        self.runner = train_runner(cfg, self.env, self.policy, store=None)

    def set_weights(self, version: int, weights: dict[str, Any]) -> int:
        """Load the trainer's tensors and sample as ``version`` from the next request on."""
        import torch

        params = dict(self.model.named_parameters())
        missing = sorted(set(weights) - set(params))
        if missing:
            raise KeyError(f"worker {self.index}: the trainer sent weights this model lacks: {missing[:3]}")
        with self.policy.paused(), torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
            self.policy.weights_updated(version)
        return version

    def play(self, task: dict[str, Any], group_size: int, run_id: str) -> list[str]:
        """One group of ``task``, graded, as trajectory JSON."""
        from agentrft.graders import agrade_trajectories

        t = Task.model_validate(task)

        async def run() -> list[Trajectory]:
            trajs = await self.runner.run([t], group_size, run_id=run_id, policy_version=None)
            grades = await agrade_trajectories(self.grader, trajs, [t.data] * len(trajs))
            for traj, grade in zip(trajs, grades, strict=True):
                traj.grade = grade
                traj.metadata["worker"] = self.index
            return trajs

        return [traj.to_json() for traj in asyncio.run(run())]

    def version(self) -> int:
        return int(self.policy.policy_version)


class RayPlayer:
    """Plays groups on ``ray.workers`` `RolloutWorker` actors, the least busy first; `publish` sends them the
    trainer's weights through the object store."""

    stores_episodes = False

    def __init__(self, cfg: TrainConfig, model: Any, *, version: int) -> None:
        try:
            import ray
        except ImportError as exc:  # an extra, never a core dependency
            raise RuntimeError("ray is not installed: pip install 'agentrft[ray]'") from exc
        self._ray, self.model = ray, model
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=cfg.ray.address, include_dashboard=False, log_to_driver=False)
        self._actor = ray.remote(num_cpus=cfg.ray.worker_cpus, max_restarts=0)(RolloutWorker)
        self._config = cfg.model_dump(mode="json")
        self.workers: list[Any] = [self._actor.remote(self._config, i) for i in range(cfg.ray.workers)]
        self._busy = [0] * len(self.workers)
        self.restarts = 0
        self._weights: tuple[int, Any] | None = None
        self.publish(version)  # every worker starts from the trainer's weights, whatever its own init

    async def play(self, task: Task, group_size: int, run_id: str) -> list[Trajectory]:
        """The group played on the least busy worker; a worker that dies is replaced (a new actor with the
        last published weights) and the group played again from the start (its episodes never reached the
        store: a worker returns a group whole)."""
        from ray.exceptions import RayActorError

        for attempt in range(3):
            i = min(range(len(self.workers)), key=lambda j: self._busy[j])
            worker = self.workers[i]
            self._busy[i] += 1
            try:
                out = await worker.play.remote(task.model_dump(mode="json"), group_size, run_id)
                return [Trajectory.model_validate_json(s) for s in out]
            except RayActorError:
                if attempt == 2:
                    raise
                self._replace(i, worker)
            finally:
                self._busy[i] -= 1
        raise AssertionError("unreachable")

    def _replace(self, i: int, dead: Any) -> None:
        if self.workers[i] is not dead:  # another group on the same worker replaced it already
            return
        self.restarts += 1
        self.workers[i] = self._actor.remote(self._config, i)
        if self._weights is not None:
            self.workers[i].set_weights.remote(*self._weights)

    def publish(self, version: int) -> None:
        ref = self._ray.put(trainable_tensors(self.model))
        self._weights = (version, ref)
        for w in self.workers:
            w.set_weights.remote(version, ref)

    def versions(self) -> list[int]:
        """Each worker's weights version (after the calls already sent to it)."""
        return [int(v) for v in self._ray.get([w.version.remote() for w in self.workers])]

    def close(self) -> None:
        for w in self.workers:
            self._ray.kill(w)
        if self._started:
            self._ray.shutdown()

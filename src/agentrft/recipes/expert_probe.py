"""Teacher-forced probe: how likely a policy finds the environment's expert episodes, turn by turn.

An eval samples, so it measures a policy's decisions with noise and at the cost of whole episodes. The probe
plays the environment's expert (`Environment.expert()`, through the policy's chat template: its token record is
what the policy would have to write) on ``tasks`` tasks of a split and scores every expert turn under the policy
at the sampling distribution: one forward per episode, no sampling. Per turn index k it reports the mean over
episodes of log P(turn k) and of P(turn k). A turn whose probability training moved says which decision moved:
in finqa-lite levels 3 and 4, turn 3 is the one after the first report's calculation, where level 3 answers and
level 4 goes on to its second report (docs/agentic.md).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrft.envs.base import Environment
from agentrft.inputs import InputError
from agentrft.samplers.distribution import Distribution
from agentrft.types import Trajectory


@dataclass
class ProbeResult:
    episodes: int
    turn_logp: dict[int, float]  # mean over episodes of log P(the expert's turn k)
    turn_p: dict[int, float]  # mean over episodes of P(the expert's turn k)
    episode_logp: float  # mean over episodes of log P(the expert's episode)


def expert_episodes(env: Environment, tokenizer: Any, split: str, tasks: int) -> list[Trajectory]:
    """The expert's episodes of the first ``tasks`` tasks of ``split`` (greedy, as the demonstrations)."""
    from agentrft.eval.harness import evaluate
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.oracle import OracleSampler
    from agentrft.store import Store

    expert = env.expert()
    if expert is None:
        raise InputError(f"probe: environment {env.name!r} has no expert that solves its tasks (Environment.expert())")
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "probe.db") as store:
        params = SamplingParams(temperature=0.0, max_tokens=env.limits.max_tokens_per_turn)
        evaluate(
            env, OracleSampler(expert, tokenizer), split=split, samples=1, tasks=tasks, store=store,
            run_name="probe", params=params, progress=False,
        )  # fmt: skip
        run = next(r for r in store.list_runs() if r.name == "probe")
        return store.query_trajectories(run_id=run.id)


def turn_logprobs(model: Any, traj: Trajectory, dist: Distribution) -> dict[int, float]:
    """log P(turn k) of the trajectory's sampled tokens under ``model`` at ``dist``, per assistant turn."""
    from agentrft.train.core.logprobs import sampled_logprobs

    tokens = traj.tokens
    if tokens is None:
        raise InputError(f"probe: trajectory {traj.id} has no token record")
    ids = torch.tensor([tokens.ids])
    mask = torch.tensor([tokens.loss_mask])
    with torch.no_grad():
        logp, _ = sampled_logprobs(
            model, ids, torch.ones_like(ids), mask, with_entropy=False, use_checkpoint=False, dist=dist
        )
    out: dict[int, float] = {}
    for lp, m, k in zip(logp[0].tolist(), tokens.loss_mask, tokens.turn, strict=True):
        if m:
            out[k] = out.get(k, 0.0) + lp
    return out


def probe(model: Any, episodes: list[Trajectory], dist: Distribution) -> ProbeResult:
    """Score the expert's ``episodes`` under ``model`` (module docstring)."""
    if not episodes:
        raise InputError("probe: no expert episodes to score")
    model.eval()
    per_turn: dict[int, list[float]] = {}
    totals: list[float] = []
    for traj in episodes:
        turns = turn_logprobs(model, traj, dist)
        totals.append(sum(turns.values()))
        for k, lp in turns.items():
            per_turn.setdefault(k, []).append(lp)
    return ProbeResult(
        episodes=len(episodes),
        turn_logp={k: sum(v) / len(v) for k, v in sorted(per_turn.items())},
        turn_p={k: sum(math.exp(x) for x in v) / len(v) for k, v in sorted(per_turn.items())},
        episode_logp=sum(totals) / len(totals),
    )

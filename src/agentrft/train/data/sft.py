"""Filtered SFT (``method: sft``) as a step function on the training core.

The data: `train.data.select_trajectories` (source, runs, tasks, versions, statuses,
reward, success, best-of-n, dedupe), then `train.records.learnable_records`: a
trajectory's own token record, checked against its messages, or (none recorded) one
rendered through the policy's chat template, counted as ``sft/rendered_trajectories``.
Both run before anything is written (`agentrft train` runs them in `check_references`).

Each step reads as its stages: draw ``sft.batch_size`` trajectories (an endless seeded
shuffle whose cursor is the checkpoint's ``state.cursor``, as GRPO draws tasks, so a
resumed run draws what an uninterrupted one would; epochs are implied by steps) ->
pack (prefix trees: the shared system prompt and worked examples run once per row; ``sft.group_by_prompt``
draws a batch from trajectories whose prompts open alike, so there is more to share) ->
update (mean NLL over the step's assistant tokens, `algos.sft`, with the step's global
loss-token count) -> sync -> (eval) -> log. Log-probs are those of the model itself
(``Distribution()``, temperature 1): SFT fits the policy, not a warped sampler.

`train_stage` (pack -> update -> sync) is shared with rejection sampling (`rejection.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentrft.algos import aggregate, masked_mean, nll_loss
from agentrft.memory import trim
from agentrft.samplers.base import TrainablePolicy
from agentrft.samplers.distribution import Distribution
from agentrft.store import Store
from agentrft.train.config import OptimizerConfig, TrainConfig
from agentrft.train.core.packing import MicroBatch
from agentrft.train.core.session import Session, StepFn
from agentrft.train.core.update import autocast, batch_logprobs, batch_stats, optimizer_steps, step_counts
from agentrft.train.data.records import learnable_records
from agentrft.train.rl.stages import next_tasks, pack_stage
from agentrft.types import Trajectory

Evaluate = Callable[[int], dict[str, float]]  # step -> valid_ metrics when a periodic eval is due, else {}


@dataclass
class SFTData:
    """The trajectories SFT draws from, each with the token record it learns from."""

    trajectories: list[Trajectory]
    selection: dict[str, int]  # how many each data filter kept (`select_trajectories`)
    rendered: int  # of them without a recorded token record, rendered through the chat template

    def metrics(self) -> dict[str, float]:
        return {"sft/examples": float(len(self.trajectories)), "sft/rendered_trajectories": float(self.rendered)}


def sft_data(
    cfg: TrainConfig,
    selected: list[Trajectory],
    selection: dict[str, int],
    policy: TrainablePolicy,
    tool_schemas: list[dict[str, Any]],
) -> SFTData:
    """Token records for the selected trajectories: recorded ones checked (ids within the model's vocabulary
    too), the others rendered with the policy's chat template. Raises RecordError naming the trajectory."""
    vocab = int(policy.model.get_input_embeddings().num_embeddings)
    trajs, rendered = learnable_records(
        selected, renderer=policy, tool_format=cfg.rollout.tool_format, tool_schemas=tool_schemas, vocab_size=vocab
    )
    return SFTData(trajs, selection, rendered)


def note_data(store: Store | None, run_id: str, data: SFTData, source: str | None) -> None:
    """What the run learned from, in its record: source, selection counts, rendered trajectories."""
    if store is None:
        return
    run = store.get_run(run_id)
    note = {"source": source, "selection": data.selection, "examples": len(data.trajectories)}
    note["rendered_trajectories"] = data.rendered
    store.update_run(run.model_copy(update={"metadata": {**run.metadata, "sft": note}}))


def sft_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batches: list[MicroBatch],
    opt: OptimizerConfig,
    *,
    precision: torch.dtype | None = None,
) -> dict[str, float]:
    """One optimizer step of token-mean NLL over every loss token of ``batches`` (the global count is taken
    before the first micro-batch, so the step does not depend on the split). Metrics: ``loss`` (= the NLL),
    ``nll``, ``entropy`` (loss-token-weighted means), ``grad_norm``, ``lr``, token counts."""
    counts = step_counts(batches)
    if counts is None:
        return {"update_skipped": 1.0}
    global_tokens, global_seqs = counts
    model.train()
    dist = Distribution()  # temperature 1: the model's own distribution

    def loss_fn(mb: MicroBatch, epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
        with autocast(precision):
            logp, ent = batch_logprobs(model, mb, chunk=opt.logprob_chunk, dist=dist)
        per_token, m = nll_loss(logp, mb.loss_mask)
        loss = aggregate(
            "token_mean",
            per_token,
            mb.loss_mask,
            global_num_tokens=global_tokens,
            global_num_sequences=global_seqs,
            max_tokens=1,
        )
        w = mb.num_loss_tokens / global_tokens
        return loss, {"nll": w * m["nll"], "entropy": w * float(masked_mean(ent, mb.loss_mask))}

    out = optimizer_steps(model, optimizer, scheduler, batches, loss_fn, opt)
    out.update(batch_stats(batches))
    return out


def train_stage(
    cfg: TrainConfig, policy: TrainablePolicy, session: Session, trajs: list[Trajectory]
) -> dict[str, float]:
    """pack -> update -> sync on ``trajs`` (each with a token record); with nothing to learn from
    (``update_skipped``) the weights and their version stay as they were."""
    state, model = session.state, session.model
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0
    loss_masks = [[float(m) for m in t.tokens.loss_mask] if t.tokens is not None else [] for t in trajs]
    batches = pack_stage(trajs, loss_masks, cfg, pad_id)  # the loss mask stands in for GRPO's advantages
    t0 = time.perf_counter()
    with policy.paused():
        metrics = sft_update(
            model, session.optimizer, session.scheduler, batches, cfg.optimizer, precision=session.precision
        )
        if not metrics.get("update_skipped"):
            state.policy_version += 1
            policy.weights_updated(state.policy_version)  # sync: a sampler samples from these weights from now on
    model.eval()
    trim()
    metrics["time/training_s"] = time.perf_counter() - t0
    metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0.0) / max(metrics["time/training_s"], 1e-9)
    return metrics


def prompt_groups(trajectories: list[Trajectory]) -> list[int]:
    """A key per trajectory, equal where the prompts open alike: every prompt message but the last (the system
    prompt and worked examples before the task's own question). Trajectories without recorded prompt messages
    form one group."""
    keys: dict[str, int] = {}
    out = []
    for traj in trajectories:
        opening = traj.messages[: max(traj.n_prompt_messages - 1, 0)]
        text = json.dumps([m.model_dump(mode="json", exclude_none=True) for m in opening], sort_keys=True)
        out.append(keys.setdefault(text, len(keys)))
    return out


def sft_step(cfg: TrainConfig, policy: TrainablePolicy, session: Session, data: SFTData, evaluate: Evaluate) -> StepFn:
    """One filtered-SFT step: draw -> pack -> update -> sync -> (eval)."""
    state = session.state
    examples = data.trajectories
    groups = prompt_groups(examples) if cfg.sft.group_by_prompt else None

    def step_fn(step: int) -> dict[str, float]:
        batch = next_tasks(examples, state.cursor, cfg.sft.batch_size, cfg.seed, groups, chunk=cfg.sft.batch_size)
        state.cursor += len(batch)
        metrics = train_stage(cfg, policy, session, batch)
        metrics.update(data.metrics())
        metrics["sft/epoch"] = state.cursor / len(examples)
        metrics.update(evaluate(step))
        return metrics

    return step_fn

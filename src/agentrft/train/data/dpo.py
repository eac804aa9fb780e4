"""DPO (and IPO, length-normalised DPO) from preference pairs, as a step function on the training core.

A run reads as its stages: pairs (a TRL pairs file, or recorded trajectories paired by the one
rule of `agentrft.pairs`; every refusal before the model loads) -> encode (token records as
recorded, or the chat template: `preference_data`) -> reference (once) -> per step: next pairs
-> pack -> update -> log -> checkpoint. Run directory, checkpoints, exact resume, metrics and
export are the core's (`session.Session`).

Reference log-probs are computed once, in a no-grad pass with the initial weights before step 1
(before any checkpoint is restored, so never with trained weights; for LoRA, before the adapter
exists), and cached in ``RUN_DIR/dpo_reference.pt`` with a fingerprint of the pairs' tokens. A
resumed run reuses the cache (and refuses one computed for other pairs); no frozen copy of the
model is kept. The reference pass packs each step batch of the first epoch exactly as that step
will, so at step 1 the policy's log-probs equal the reference's and every pair's loss is log 2.

Packing: each pair is one unit of a prefix tree (`shared_prefix`): chosen and rejected share
their prompt, which runs through the model once per pair (and once per row for pairs that
share more, such as a system prompt), and both sequences of a pair are in the same
micro-batch. Exact: the same log-probs and gradients as running every sequence alone.

Step ``s`` trains on ``dpo.pairs_per_step`` pairs of an endless stream: the pair list in one
seeded shuffle per epoch (``state.cursor`` counts pairs consumed). The log-probs are those of
the policy itself (temperature 1): DPO's objective is defined on the model's distribution.
The pairs trained on are written to ``RUN_DIR/pairs.jsonl`` (TRL format).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentrft.algos import preference_loss
from agentrft.memory import trim
from agentrft.pairs import write_pairs
from agentrft.samplers.base import TrainablePolicy
from agentrft.samplers.distribution import Distribution
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import ConfigError, TrainConfig
from agentrft.train.core.packing import MicroBatch
from agentrft.train.core.session import Session, StepFn, StepHook, check_run_dir, seed_everything
from agentrft.train.core.update import autocast, autocast_dtype, batch_logprobs, batch_stats, optimizer_steps
from agentrft.train.data.preference_data import (
    PairTokens,
    check_vocab,
    encode_pair,
    fingerprint,
    load_pairs,
    pack_pairs,
    pair_sides,
)
from agentrft.train.loop import TrainResult
from agentrft.train.rl.stages import next_tasks

REFERENCE_NAME = "dpo_reference.pt"
PAIRS_NAME = "pairs.jsonl"
_POLICY_DIST = Distribution()  # the model's own distribution (temperature 1)


def sequence_logprobs(
    model: Any, mb: MicroBatch, *, chunk: int, precision: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) summed log-probs of each row's loss tokens (float64) and (B,) their counts."""
    with autocast(precision):
        logp, _ = batch_logprobs(model, mb, chunk=chunk, dist=_POLICY_DIST, with_entropy=False)
    return logp.double().sum(-1), mb.loss_mask.sum(-1).double()


def epoch_batches(n_pairs: int, per_step: int, seed: int) -> list[list[int]]:
    """Pair indices of the first epoch's steps, as `next_tasks` draws them (the last one may be short)."""
    order = next_tasks(list(range(n_pairs)), 0, n_pairs, seed)
    return [order[i : i + per_step] for i in range(0, n_pairs, per_step)]


def reference_pass(
    model: Any, encoded: Sequence[PairTokens], cfg: TrainConfig, pad_id: int, precision: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(P,) summed reference log-probs of every pair's chosen and rejected sequence, float64, no grad; each
    first-epoch step batch packed as its step will pack it."""
    chosen = torch.zeros(len(encoded), dtype=torch.float64)
    rejected = torch.zeros(len(encoded), dtype=torch.float64)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for idx in epoch_batches(len(encoded), cfg.dpo.pairs_per_step, cfg.seed):
            for mb in pack_pairs([encoded[i] for i in idx], cfg, pad_id):
                seq, _ = sequence_logprobs(model, mb, chunk=cfg.optimizer.logprob_chunk, precision=precision)
                ks, c_rows, r_rows = pair_sides(mb)
                g = torch.tensor([idx[k] for k in ks])
                chosen[g], rejected[g] = seq[c_rows], seq[r_rows]
            trim()
    model.train(was_training)
    return chosen, rejected


def cached_reference(
    run_dir: Path,
    model: Any,
    encoded: Sequence[PairTokens],
    cfg: TrainConfig,
    pad_id: int,
    precision: torch.dtype | None,
    *,
    resume: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference log-probs from ``run_dir/dpo_reference.pt`` when it holds these pairs, else computed now
    (the model still has its initial weights) and saved atomically. Resuming with a cache of other pairs is
    refused: the run would not be the one that was started."""
    path = run_dir / REFERENCE_NAME
    fp = fingerprint(encoded)
    if path.exists():
        blob = torch.load(path, weights_only=True)
        if blob.get("fingerprint") == fp:
            return blob["chosen"], blob["rejected"]
        if resume:
            raise ConfigError(
                f"{path}: reference log-probs of other pairs than these (the data changed since the run started?); "
                "resume with the same pairs, or start a new run dir"
            )
    chosen, rejected = reference_pass(model, encoded, cfg, pad_id, precision)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(
        {"fingerprint": fp, "pair_ids": [e.pair_id for e in encoded], "chosen": chosen, "rejected": rejected}, tmp
    )
    os.replace(tmp, path)
    return chosen, rejected


def train_dpo(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    policy: TrainablePolicy | None = None,
    stop_after: int | None = None,
    progress: bool = False,
    allow_config_change: bool = False,
    on_step: StepHook | None = None,
) -> TrainResult:
    """Train ``cfg.steps`` DPO steps (``method: dpo``); arguments as `loop.train`. ``policy``: a loaded
    policy (tests, embedding), else ``cfg.policy.name`` is loaded after the pairs passed their checks."""
    run_dir = Path(run_dir)
    if not cfg.optimizer.shared_prefix:
        raise ConfigError("optimizer.shared_prefix: DPO always packs each pair as a prefix tree (exact); leave it true")
    d = cfg.dpo
    pairs, data_metrics = load_pairs(d.pairs, cfg.data, margin=d.margin, per_task=d.pairs_per_task)
    last = check_run_dir(run_dir, cfg, resume=resume, allow_config_change=allow_config_change)
    seed_everything(cfg.seed)
    if policy is None:
        from agentrft.samplers.policies import load_trainable_policy

        policy = load_trainable_policy(cfg.policy.name, sampler="reference", seed=cfg.seed)
    from agentrft.envs.registry import make_env

    schemas = make_env(cfg.rollout.env).tool_schemas()  # how a rendered pair's tool calls are written
    encoded = [encode_pair(p, policy, cfg.rollout.tool_format, schemas) for p in pairs]
    check_vocab(encoded, pairs, int(policy.model.get_input_embeddings().weight.shape[0]))
    data_metrics["data/pairs_rendered"] = float(sum(e.rendered for e in encoded))
    run_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(pairs, run_dir / PAIRS_NAME)
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0
    precision = autocast_dtype(cfg.policy.precision)
    ref = cached_reference(run_dir, policy.model, encoded, cfg, pad_id, precision, resume=last is not None)
    store = Store(run_dir / RUN_STORE_NAME)
    try:
        session = Session.open(
            cfg,
            run_dir,
            policy.model,
            store=store,
            resume_from=last,
            resume=resume,
            policy_version=policy.policy_version,
        )
        try:
            step_fn = _dpo_step(cfg, session, encoded, ref, data_metrics, pad_id)
            session.run(step_fn, progress=progress, stop_after=stop_after, on_step=on_step)
            session.finish(policy.tokenizer)
        finally:
            session.close()
    finally:
        store.close()
    return TrainResult(run_dir, session.run_id, session.state.step, session.history, session.saved)


def _dpo_step(
    cfg: TrainConfig,
    session: Session,
    encoded: list[PairTokens],
    ref: tuple[torch.Tensor, torch.Tensor],
    data_metrics: dict[str, float],
    pad_id: int,
) -> StepFn:
    """One step: next pairs -> pack -> preference-loss update; metrics are means over the step's pairs."""
    d, state, model = cfg.dpo, session.state, session.model
    ref_chosen, ref_rejected = ref
    everything = list(range(len(encoded)))

    def step_fn(step: int) -> dict[str, float]:
        idx = next_tasks(everything, state.cursor, d.pairs_per_step, cfg.seed)
        state.cursor += len(idx)
        batches = pack_pairs([encoded[i] for i in idx], cfg, pad_id)
        n = len(idx)
        model.train()

        def loss_fn(mb: MicroBatch, epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
            seq, counts = sequence_logprobs(model, mb, chunk=cfg.optimizer.logprob_chunk, precision=session.precision)
            ks, c_rows, r_rows = pair_sides(mb)
            g = torch.tensor([idx[k] for k in ks])
            losses, m = preference_loss(
                d.loss,
                seq[c_rows],
                seq[r_rows],
                ref_chosen[g],
                ref_rejected[g],
                beta=d.beta,
                chosen_tokens=counts[c_rows],
                rejected_tokens=counts[r_rows],
            )
            m["logps/chosen"], m["logps/rejected"] = seq[c_rows].detach(), seq[r_rows].detach()
            return losses.sum() / n, {k: float(v.sum()) / n for k, v in m.items()}

        t0 = time.perf_counter()
        metrics = optimizer_steps(model, session.optimizer, session.scheduler, batches, loss_fn, cfg.optimizer)
        state.policy_version += 1
        model.eval()
        trim()
        metrics["time/training_s"] = time.perf_counter() - t0
        metrics.update(batch_stats(batches))
        metrics.update(data_metrics)
        metrics["train_pairs"] = float(n)
        metrics["epoch"] = state.cursor / len(encoded)
        return metrics

    return step_fn

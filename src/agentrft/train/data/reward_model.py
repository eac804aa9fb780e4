"""A Bradley–Terry reward model from preference pairs, as a step function on the training core.

A run reads as its stages: pairs (a TRL pairs file, or recorded trajectories paired by the one
rule of `agentrft.pairs`; every refusal before the model loads) -> held-out split by task ->
encode (token records as recorded, or the chat template: `preference_data`) -> per step: next
pairs -> pack -> scores -> Bradley–Terry loss -> update -> (held-out accuracy) -> log ->
checkpoint -> at the end the model in ``RUN_DIR/reward_model`` (`rm_model.save_reward_model`),
loadable by path, with its held-out accuracy in the manifest. Run directory, checkpoints, exact
resume and metrics are the core's (`session.Session`).

Model (`rm_model`): the policy's body, full or LoRA (``policy``), and a zero-initialised
scalar head read at each sequence's last loss token, so step 1 starts with every pair at log 2.

Held-out split: the pairs of a fixed share of the tasks (``reward_model.heldout_fraction``),
never trained on. Tasks are ranked by a hash of their id (a pairs file without ``task_id``: of
the prompt) and the first ``round(fraction x tasks)`` are held out (at least one, never all), so
the split depends on nothing but the task ids. ``rm/heldout_accuracy`` (pairwise, a tie counting
half), ``rm/heldout_loss`` (the plain BT loss) and ``rm/heldout_pairs`` are logged every
``heldout_every_steps`` and after the last step.

Packing: each pair is one prefix-tree unit (`shared_prefix`), so its prompt runs once and both
sides are in one micro-batch; pairs of one task (and tasks sharing a system prompt or few-shot
examples) share more. Step ``s`` trains on ``reward_model.pairs_per_step`` training pairs of an
endless stream, one seeded shuffle per epoch (``state.cursor`` counts pairs consumed).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentrft.algos.reward_model import bradley_terry_loss
from agentrft.inputs import InputError
from agentrft.memory import trim
from agentrft.pairs import Pair, write_pairs
from agentrft.samplers.chat_template import TokenizerRenderer
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import TrainConfig
from agentrft.train.core.packing import MicroBatch
from agentrft.train.core.session import Session, StepFn, StepHook, check_run_dir, seed_everything
from agentrft.train.core.update import autocast, batch_stats, optimizer_steps
from agentrft.train.data.preference_data import (
    PairTokens,
    check_vocab,
    encode_pair,
    load_pairs,
    pack_pairs,
    pair_sides,
)
from agentrft.train.data.rm_model import RewardModel, save_reward_model, sequence_scores
from agentrft.train.loop import TrainResult
from agentrft.train.rl.stages import next_tasks

PAIRS_NAME = "pairs.jsonl"
EXPORT_NAME = "reward_model"
_HELDOUT_KEYS = ("rm/heldout_accuracy", "rm/heldout_loss", "rm/heldout_margin")  # saved in the manifest


# ---------------------------------------------------------------- pairs and the held-out split


def task_key(pair: Pair) -> str:
    """What the held-out split is by: the task id, or (a pairs file without ``task_id``) the prompt."""
    return pair.task_id or json.dumps([m.to_openai() for m in pair.prompt], sort_keys=True)


def heldout_tasks(keys: Sequence[str], fraction: float) -> set[str]:
    """The held-out task keys: the first ``round(fraction x tasks)`` by hash (at least one, never all)."""
    if fraction <= 0:
        return set()
    tasks = sorted(set(keys), key=lambda k: (hashlib.sha256(k.encode()).hexdigest(), k))
    if len(tasks) < 2:
        raise InputError(
            f"reward_model.heldout_fraction: {fraction} holds out whole tasks, but every pair is of one task; "
            "pair more tasks, or set reward_model.heldout_fraction=0 to train on all (no held-out accuracy)"
        )
    n = min(max(1, round(fraction * len(tasks))), len(tasks) - 1)
    return set(tasks[:n])


# ---------------------------------------------------------------- packing and scoring


def pair_scores(
    rm: RewardModel, mb: MicroBatch, precision: torch.dtype | None
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The micro-batch's pairs (local indices k into the packed list) and their (P,) chosen and rejected scores."""
    with autocast(precision):
        scores = sequence_scores(rm, mb)
    ks, chosen_rows, rejected_rows = pair_sides(mb)
    return ks, scores[chosen_rows], scores[rejected_rows]


def heldout_metrics(
    rm: RewardModel, pairs: Sequence[PairTokens], cfg: TrainConfig, pad_id: int, precision: torch.dtype | None
) -> dict[str, float]:
    """Pairwise accuracy, plain BT loss and mean margin over ``pairs`` (no grad, eval mode)."""
    was_training = rm.training
    rm.eval()
    acc = loss = margin = 0.0
    with torch.no_grad():
        for start in range(0, len(pairs), cfg.reward_model.pairs_per_step):
            for mb in pack_pairs(pairs[start : start + cfg.reward_model.pairs_per_step], cfg, pad_id):
                _, chosen, rejected = pair_scores(rm, mb, precision)
                losses, m = bradley_terry_loss(chosen.double(), rejected.double())
                acc += float(m["rm/accuracy"].sum())
                loss += float(losses.sum())
                margin += float(m["rm/margin"].sum())
            trim()
    rm.train(was_training)
    n = len(pairs)
    return {
        "rm/heldout_accuracy": acc / n,
        "rm/heldout_loss": loss / n,
        "rm/heldout_margin": margin / n,
        "rm/heldout_pairs": float(n),
    }


# ---------------------------------------------------------------- the method


class _NoTemplate:
    """The renderer of a policy without a tokenizer: pairs that need rendering are refused."""

    def __init__(self, policy: str) -> None:
        self.policy = policy

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        raise InputError(
            f"{self.policy}: pairs without token records are rendered through the policy's chat template, and "
            "this policy has no tokenizer"
        )


def _encode(
    pairs: list[Pair], cfg: TrainConfig, model: Any, tokenizer: Any, tool_schemas: list[dict[str, Any]]
) -> list[PairTokens]:
    """Each pair's two sequences (`preference_data.encode_pair`: token records as recorded, else the chat
    template), after the vocabulary check."""
    renderer = TokenizerRenderer(tokenizer) if tokenizer is not None else _NoTemplate(cfg.policy.name)
    encoded = [encode_pair(p, renderer, cfg.rollout.tool_format, tool_schemas) for p in pairs]
    check_vocab(encoded, pairs, int(model.get_input_embeddings().weight.shape[0]))
    return encoded


def _base_policy(name: str) -> str:
    """The policy name as the grader will load it from anywhere: an ``hf:`` directory made absolute."""
    if name.startswith("hf:") and Path(name[3:]).exists():
        return f"hf:{Path(name[3:]).resolve()}"
    return name


def train_reward_model(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    stop_after: int | None = None,
    progress: bool = False,
    allow_config_change: bool = False,
    on_step: StepHook | None = None,
) -> TrainResult:
    """Train ``cfg.steps`` reward-model steps (``method: reward_model``); arguments as `loop.train`.
    ``model_and_tokenizer``: a loaded causal LM and its tokenizer (tests, embedding), else ``cfg.policy.name``
    is loaded after the pairs passed their checks."""
    run_dir = Path(run_dir)
    rc = cfg.reward_model
    pairs, data_metrics = load_pairs(
        rc.pairs,
        cfg.data,
        margin=rc.margin,
        per_task=rc.pairs_per_task,
        pairs_key="reward_model.pairs",
        cli_flags=None,
    )
    held = heldout_tasks([task_key(p) for p in pairs], rc.heldout_fraction)
    train_idx = [i for i, p in enumerate(pairs) if task_key(p) not in held]
    held_idx = [i for i, p in enumerate(pairs) if task_key(p) in held]
    last = check_run_dir(run_dir, cfg, resume=resume, allow_config_change=allow_config_change)
    seed_everything(cfg.seed)
    if model_and_tokenizer is None:
        from agentrft.samplers.policies import load_model_and_tokenizer

        model_and_tokenizer = load_model_and_tokenizer(cfg.policy.name, seed=cfg.seed)
    model, tokenizer = model_and_tokenizer
    from agentrft.envs.registry import make_env

    schemas = make_env(cfg.rollout.env).tool_schemas()  # how a rendered pair's tool calls are written
    encoded = _encode(pairs, cfg, model, tokenizer, schemas)
    n_rendered = sum(e.rendered for e in encoded)
    data_metrics.update(
        {
            "data/pairs_rendered": float(n_rendered),  # through the chat template: no token record
            "data/pairs_token_records": float(len(encoded) - n_rendered),
            "rm/train_pairs": float(len(train_idx)),
            "rm/heldout_tasks": float(len(held)),
        }
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(pairs, run_dir / PAIRS_NAME)
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    held_pairs = [encoded[i] for i in held_idx]
    manifest: dict[str, Any] = {
        "base_policy": _base_policy(cfg.policy.name),
        "base_seed": cfg.seed,
        "finetune": cfg.policy.finetune,
        "tool_format": cfg.rollout.tool_format,
        "tool_schemas": schemas,
        "trained_on": {
            "source": rc.pairs or cfg.data.source,
            "pairs": len(train_idx),
            "pairs_rendered": sum(encoded[i].rendered for i in train_idx),
            "run_dir": str(run_dir.resolve()),
        },
        "heldout": {"fraction": rc.heldout_fraction, "tasks": sorted(held), "pairs": len(held_idx)},
    }
    store = Store(run_dir / RUN_STORE_NAME)
    try:
        session = Session.open(
            cfg, run_dir, model, store=store, resume_from=last, resume=resume, wrap=lambda lm: RewardModel(lm)
        )
        final: dict[str, float] = {}
        try:
            step_fn = _rm_step(cfg, session, [encoded[i] for i in train_idx], held_pairs, data_metrics, pad_id, final)

            def export(rm: Any, tok: Any) -> Path:
                if held_pairs and not final:  # resumed after the last step: measure it now
                    final.update(heldout_metrics(rm, held_pairs, cfg, pad_id, session.precision))
                manifest["steps"] = session.state.step
                manifest["heldout"].update(
                    {k.removeprefix("rm/heldout_"): final[k] for k in _HELDOUT_KEYS if k in final}
                )
                return save_reward_model(rm, tok, run_dir / EXPORT_NAME, manifest)

            session.run(step_fn, progress=progress, stop_after=stop_after, on_step=on_step)
            session.finish(tokenizer, export=export)
        finally:
            session.close()
    finally:
        store.close()
    return TrainResult(run_dir, session.run_id, session.state.step, session.history, session.saved)


def _rm_step(
    cfg: TrainConfig,
    session: Session,
    train_pairs: list[PairTokens],
    held_pairs: list[PairTokens],
    data_metrics: dict[str, float],
    pad_id: int,
    final: dict[str, float],
) -> StepFn:
    """One step: next pairs -> pack -> scores -> BT loss -> update -> (held-out accuracy); metrics are means over
    the step's pairs. ``final`` receives the held-out metrics of the last step (for the manifest)."""
    rc, state, rm = cfg.reward_model, session.state, session.model
    everything = list(range(len(train_pairs)))

    def step_fn(step: int) -> dict[str, float]:
        idx = next_tasks(everything, state.cursor, rc.pairs_per_step, cfg.seed)
        state.cursor += len(idx)
        batches = pack_pairs([train_pairs[i] for i in idx], cfg, pad_id)
        n = len(idx)
        rm.train()

        def loss_fn(mb: MicroBatch, epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
            _, chosen, rejected = pair_scores(rm, mb, session.precision)
            losses, m = bradley_terry_loss(chosen, rejected, center_coef=rc.center_coef)
            return losses.sum() / n, {k: float(v.sum()) / n for k, v in m.items()}

        t0 = time.perf_counter()
        metrics = optimizer_steps(rm, session.optimizer, session.scheduler, batches, loss_fn, cfg.optimizer)
        state.policy_version += 1
        rm.eval()
        trim()
        metrics["time/training_s"] = time.perf_counter() - t0
        metrics.update(batch_stats(batches))
        metrics.update(data_metrics)
        metrics["epoch"] = state.cursor / len(train_pairs)
        every = rc.heldout_every_steps
        if held_pairs and ((every and step % every == 0) or step == cfg.steps):
            t0 = time.perf_counter()
            metrics.update(heldout_metrics(rm, held_pairs, cfg, pad_id, session.precision))
            metrics["time/eval_s"] = time.perf_counter() - t0
            if step == cfg.steps:
                final.update({k: metrics[k] for k in _HELDOUT_KEYS})
        return metrics

    return step_fn

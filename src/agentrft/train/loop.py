"""The GRPO/DAPO training loop: sample tasks -> rollouts -> grade -> advantages -> pack -> update -> sync -> eval -> checkpoint -> log.

Public API: `train(config, run_dir, resume=False) -> TrainResult`. The policy is an
in-process sampler whose ``.model`` is trained in place: the sampler samples from the
same object, so "sync" is bumping ``policy_version`` while holding the sampler's
model lock. Everything a resumed run needs is in the checkpoint (see checkpoint.py),
so a run stopped after step k and resumed logs the same metrics as one that never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrft.train.checkpoint import (
    TrainerState,
    export_policy,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agentrft.train.config import PolicyConfig, TrainConfig
from agentrft.train.memory import peak_rss_mib, trim
from agentrft.train.metrics import MetricsLogger, rollout_metrics
from agentrft.train.stages import advantage_stage, grade_stage, pack_stage, rollout_stage
from agentrft.train.update import autocast_dtype, lr_lambda, make_optimizer, policy_update
from agentrft.types import Run


@dataclass
class Components:
    """What the loop trains with; built from the config unless passed in (tests, embedding)."""

    env: Any
    sampler: Any  # exposes .model (trained in place), .tokenizer, .policy_version, optional .model_lock
    grader: Any
    store: Any = None


@dataclass
class TrainResult:
    run_dir: Path
    run_id: str
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    checkpoint: Path | None = None  # latest complete checkpoint; the final policy is in run_dir / "policy"


def build_components(cfg: TrainConfig, run_dir: Path) -> Components:
    from agentrft.envs.registry import make_env
    from agentrft.graders.registry import load_grader
    from agentrft.samplers.policies import load_policy
    from agentrft.store import Store

    env = make_env(cfg.rollout.env)
    sampler = load_policy(cfg.policy.name, seed=cfg.seed)
    grader = load_grader(cfg.rollout.grader or env.grader_spec())
    return Components(env, sampler, grader, Store(run_dir / "store.sqlite"))


def prepare_model(model: torch.nn.Module, pc: PolicyConfig) -> torch.nn.Module:
    """Full fine-tuning: the model itself. LoRA: peft injects adapters into the same module tree
    (so the sampler, holding the base model, samples through them) and only they train."""
    if pc.gradient_checkpointing:
        # non-reentrant: gradients reach LoRA weights without requiring grads on the inputs
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if pc.finetune == "full":
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=pc.lora_r, lora_alpha=pc.lora_alpha, lora_dropout=pc.lora_dropout,
                      target_modules=pc.lora_target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def _reseed_sampler(sampler: Any, seed: int) -> None:
    """Per-step sampler seed, so sampling does not depend on how many steps this process has run."""
    if hasattr(sampler, "reseed"):
        sampler.reseed(seed)


def eval_stage(cfg: TrainConfig, comps: Components, run_id: str, version: int) -> dict[str, float]:
    """Held-out tasks at the eval temperature; metrics prefixed ``valid_``."""
    from agentrft.rollout.runner import Runner
    from agentrft.samplers.base import SamplingParams

    tasks = comps.env.tasks(cfg.eval.split)[: cfg.eval.num_tasks]
    params = SamplingParams(temperature=cfg.eval.temperature, max_tokens=cfg.rollout.max_tokens, seed=None)
    runner = Runner(comps.env, comps.sampler, store=comps.store, tool_format=cfg.rollout.tool_format,
                    params=params, progress=False)
    trajs = asyncio.run(runner.run(tasks, cfg.eval.samples_per_task, run_id=f"{run_id}-eval", policy_version=version))
    grade_stage(trajs, {t.id: t for t in tasks}, comps.grader, comps.store)
    return rollout_metrics(trajs, "valid")


def train(cfg: TrainConfig, run_dir: Path, *, resume: bool = False, components: Components | None = None,
          stop_after: int | None = None) -> TrainResult:
    """Train for ``cfg.steps`` optimizer steps (``stop_after``: return after that step, as an interruption would)."""
    from agentrft.rollout.runner import Runner
    from agentrft.samplers.base import SamplingParams

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = run_dir / "checkpoints"
    last = latest_checkpoint(ckpt_root) if resume else None
    if not resume and latest_checkpoint(ckpt_root) is not None:
        raise FileExistsError(f"{run_dir} already holds checkpoints; pass resume=True (--resume) or a new run dir")
    cfg.save(run_dir / "config.yaml")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    comps = components or build_components(cfg, run_dir)
    sampler = comps.sampler
    model = prepare_model(sampler.model, cfg.policy)
    ref_model = None
    if cfg.algorithm.kl_coef > 0 and cfg.policy.finetune == "full":
        ref_model = copy.deepcopy(sampler.model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optimizer
    optimizer = make_optimizer(params, o)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, cfg.steps))
    state = TrainerState(policy_version=getattr(sampler, "policy_version", 0))
    if last is not None:
        state = load_checkpoint(last, model, optimizer, scheduler)
        sampler.policy_version = state.policy_version
    run_id = state.extra.get("run_id") or f"train-{run_dir.name}"
    state.extra["run_id"] = run_id
    if comps.store is not None and not comps.store.has_run(run_id):
        comps.store.add_run(Run(id=run_id, name=run_dir.name, kind="train", config=cfg.model_dump(mode="json")))
    logger = MetricsLogger(run_dir, cfg.logging, store=comps.store, run_id=run_id,
                           resume_from_step=state.step if last is not None else None)
    precision = autocast_dtype(cfg.policy.precision)
    tasks = comps.env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        comps.env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    r = cfg.rollout
    runner = Runner(comps.env, sampler, store=comps.store, tool_format=r.tool_format, progress=False,
                    params=SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens))
    pad_id = getattr(getattr(sampler, "tokenizer", None), "pad_token_id", None) or 0
    lock = getattr(sampler, "model_lock", None) or contextlib.nullcontext()
    history: list[dict[str, float]] = []
    saved: Path | None = last
    try:
        while state.step < cfg.steps:
            step = state.step + 1
            t_step = time.perf_counter()
            _reseed_sampler(sampler, cfg.seed * 1_000_003 + step)
            model.eval()  # sampling: no dropout
            groups, state.cursor, metrics = rollout_stage(cfg, runner, tasks, state.cursor, run_id,
                                                          state.policy_version, comps.grader, comps.store)
            trim()  # the rollout's KV caches were freed in the engine thread's arena
            trajs, per_token, adv_metrics = advantage_stage(groups, cfg.algorithm)
            metrics.update(adv_metrics)
            batches = pack_stage(trajs, per_token, cfg, pad_id)
            t0 = time.perf_counter()
            with lock:
                metrics.update(policy_update(model, optimizer, scheduler, batches, cfg.algorithm, o,
                                             precision=precision, temperature=cfg.algorithm.logprob_temperature,
                                             ref_model=ref_model))
                state.policy_version += 1  # sync: the sampler samples from these weights from now on
                sampler.policy_version = state.policy_version
            model.eval()
            trim()
            metrics["time/training_s"] = time.perf_counter() - t0
            metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0.0) / max(metrics["time/training_s"], 1e-9)
            metrics["sampling_tokens_per_s"] = metrics["train_sampled_tokens"] / max(metrics["time/sampling_s"], 1e-9)
            state.step = step
            if cfg.eval.every_steps and (step % cfg.eval.every_steps == 0 or step == cfg.steps):
                t0 = time.perf_counter()
                metrics.update(eval_stage(cfg, comps, run_id, state.policy_version))
                metrics["time/eval_s"] = time.perf_counter() - t0
            metrics["policy_version"] = float(state.policy_version)
            metrics["time/step_s"] = time.perf_counter() - t_step
            metrics["mem/peak_rss_mib"] = peak_rss_mib()
            logger.log(step, metrics)
            history.append({"step": float(step), **metrics})
            every = cfg.checkpoint.every_steps
            if (every and step % every == 0) or step == cfg.steps or step == stop_after:
                saved = save_checkpoint(ckpt_root, model, optimizer, scheduler, state, keep_last=cfg.checkpoint.keep_last)
            if stop_after is not None and step >= stop_after:
                break
        if state.step >= cfg.steps:
            export_policy(model, getattr(sampler, "tokenizer", None), run_dir / "policy")
    finally:
        logger.close()
    return TrainResult(run_dir=run_dir, run_id=run_id, steps=state.step, history=history, checkpoint=saved)

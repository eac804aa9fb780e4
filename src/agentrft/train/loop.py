"""The GRPO/DAPO training loop.

Each step reads as its stages: rollout -> grade -> filter (`collect_stage`) -> advantages ->
pack -> update -> sync -> (eval) -> log -> checkpoint.

Public API: `train(config, run_dir, resume=False) -> TrainResult`. The policy is a
`TrainablePolicy` (`samplers.base`): the trainer optimises its ``model`` in place,
inside ``policy.paused()``, and ends each update with ``policy.weights_updated(version)``
(the sync). Everything a resumed run needs is in the checkpoint (see checkpoint.py), so
a run stopped after step k and resumed logs the same metrics as one that never stopped.
The periodic eval goes through `eval.harness` (the one eval path).
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from agentrft.envs.base import Environment
from agentrft.eval.harness import evaluate_async
from agentrft.graders import Grader
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams, TrainablePolicy
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.checkpoint import (
    TrainerState,
    export_policy,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agentrft.train.config import PolicyConfig, TrainConfig
from agentrft.train.memory import peak_rss_mib, trim
from agentrft.train.metrics import MetricsLogger, eval_metrics
from agentrft.train.progress import StepProgress
from agentrft.train.resume import check_resumed_config, close_run, open_run
from agentrft.train.stages import advantage_stage, collect_stage, pack_stage
from agentrft.train.update import autocast_dtype, lr_lambda, make_optimizer, policy_update

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Components:
    """What the loop trains with; built from the config unless passed in (tests, embedding)."""

    env: Environment
    sampler: TrainablePolicy
    grader: Grader
    store: Store | None = None


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
    from agentrft.samplers.policies import load_trainable_policy

    env = make_env(cfg.rollout.env)
    grader = load_grader(cfg.rollout.grader or env.grader_spec())  # a bad spec fails before the model loads
    policy = load_trainable_policy(cfg.policy.name, sampler=cfg.policy.sampler, seed=cfg.seed)
    return Components(env, policy, grader, Store(run_dir / RUN_STORE_NAME))


def prepare_model(model: PreTrainedModel, pc: PolicyConfig) -> torch.nn.Module:
    """Full fine-tuning: the model itself. LoRA: peft injects adapters into the same module tree
    (so the sampler, holding the base model, samples through them) and only they train."""
    if pc.gradient_checkpointing:
        # non-reentrant: gradients reach LoRA weights without requiring grads on the inputs
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if pc.finetune == "full":
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=pc.lora_r,
        lora_alpha=pc.lora_alpha,
        lora_dropout=pc.lora_dropout,
        target_modules=pc.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def eval_stage(cfg: TrainConfig, comps: Components, run_id: str, version: int) -> dict[str, float]:
    """Held-out tasks at the eval temperature through `eval.harness` (stored as an eval run);
    metrics prefixed ``valid_``."""
    e = cfg.eval
    params = SamplingParams(temperature=e.temperature, max_tokens=cfg.rollout.max_tokens)
    if comps.store is None:
        raise ValueError("a periodic eval (eval.every_steps > 0) needs a store")
    result = asyncio.run(
        evaluate_async(
            comps.env,
            comps.sampler,
            split=e.split,
            samples=e.samples_per_task,
            tasks=e.num_tasks,
            store=comps.store,
            run_name=f"{run_id}-eval-v{version}",
            params=params,
            env_spec=cfg.rollout.env,
            grader=comps.grader,
            tool_format=cfg.rollout.tool_format,
            seed=cfg.seed,
            progress=False,
        )
    )
    return eval_metrics(result, "valid")


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    components: Components | None = None,
    stop_after: int | None = None,
    progress: bool = False,
    allow_config_change: bool = False,
) -> TrainResult:
    """Train for ``cfg.steps`` optimizer steps (``stop_after``: return after that step, as an interruption
    would). ``progress``: a live bar on a terminal, else one line per step on stderr. ``resume`` continues
    ``run_dir`` from its latest checkpoint with the config it was started with (see `resume.py`)."""
    run_dir = Path(run_dir)
    ckpt_root = run_dir / "checkpoints"
    last = latest_checkpoint(ckpt_root) if resume else None
    if not resume and latest_checkpoint(ckpt_root) is not None:
        raise FileExistsError(f"{run_dir} already holds checkpoints; pass resume=True (--resume) or a new run dir")
    if resume:
        check_resumed_config(cfg, run_dir, allow_changed=allow_config_change)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    comps = components or build_components(cfg, run_dir)
    policy = comps.sampler
    if not isinstance(policy, TrainablePolicy):
        raise TypeError(
            f"policy {getattr(policy, 'policy', policy)!r} cannot be trained in process "
            "(not a TrainablePolicy: eval-only endpoints and remote engines are sampled, not trained)"
        )
    cfg.save(run_dir / "config.yaml")
    model = prepare_model(policy.model, cfg.policy)
    ref_model = None
    if cfg.algorithm.kl_coef > 0 and cfg.policy.finetune == "full":
        ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False)
    o = cfg.optimizer
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], o)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, cfg.steps))
    state = TrainerState(policy_version=policy.policy_version)
    if last is not None:
        state = load_checkpoint(last, model, optimizer, scheduler)
        policy.weights_updated(state.policy_version)
    run_id = state.extra.get("run_id") or f"train-{run_dir.name}"
    state.extra["run_id"] = run_id
    if comps.store is not None:
        open_run(
            comps.store, run_id, run_dir, cfg, resumed=resume, step=state.step, policy_version=state.policy_version
        )
    logger = MetricsLogger(
        run_dir, cfg.logging, store=comps.store, run_id=run_id, resume_from_step=state.step if resume else None
    )
    precision = autocast_dtype(cfg.policy.precision)
    dist = cfg.sampling_distribution()
    tasks = comps.env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        comps.env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    r = cfg.rollout
    runner = Runner(
        comps.env,
        policy,
        store=comps.store,
        tool_format=r.tool_format,
        progress=False,
        params=SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens),
    )
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0
    history: list[dict[str, float]] = []
    saved: Path | None = last
    try:
        with StepProgress(cfg.steps, start=state.step, enabled=progress) as bar:
            while state.step < cfg.steps:
                step = state.step + 1
                t_step = time.perf_counter()
                policy.reseed(cfg.seed * 1_000_003 + step)  # sampling does not depend on this process's history
                model.eval()  # sampling: no dropout
                groups, state.cursor, metrics = collect_stage(
                    cfg, runner, tasks, state.cursor, run_id, state.policy_version, comps.grader, comps.store
                )
                trim()  # the rollout's KV caches were freed in the engine thread's arena
                trajs, per_token, adv_metrics = advantage_stage(groups, cfg.algorithm)
                metrics.update(adv_metrics)
                batches = pack_stage(trajs, per_token, cfg, pad_id)
                t0 = time.perf_counter()
                with policy.paused():
                    metrics.update(
                        policy_update(
                            model,
                            optimizer,
                            scheduler,
                            batches,
                            cfg.algorithm,
                            o,
                            dist=dist,
                            precision=precision,
                            ref_model=ref_model,
                        )
                    )
                    state.policy_version += 1
                    policy.weights_updated(state.policy_version)  # sync: sample from these weights from now on
                model.eval()
                trim()
                metrics["time/training_s"] = time.perf_counter() - t0
                metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0.0) / max(metrics["time/training_s"], 1e-9)
                metrics["sampling_tokens_per_s"] = metrics["train_sampled_tokens"] / max(
                    metrics["time/sampling_s"], 1e-9
                )
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
                bar.step(step, metrics)
                every = cfg.checkpoint.every_steps
                if (every and step % every == 0) or step == cfg.steps or step == stop_after:
                    saved = save_checkpoint(
                        ckpt_root, model, optimizer, scheduler, state, keep_last=cfg.checkpoint.keep_last
                    )
                if stop_after is not None and step >= stop_after:
                    break
        if state.step >= cfg.steps:
            export_policy(model, policy.tokenizer, run_dir / "policy")
            if comps.store is not None:
                close_run(comps.store, run_id)
    finally:
        logger.close()
    return TrainResult(run_dir=run_dir, run_id=run_id, steps=state.step, history=history, checkpoint=saved)

"""The one training core every method runs on (GRPO, filtered SFT, DPO, reward model).

A `Session` owns what does not depend on the method: the run directory and its config,
seeds, the model made trainable (full or LoRA, gradient checkpointing), the optimizer
and LR schedule, bf16 autocast, atomic checkpoints with exact resume, the run's record
in the store (`resume.py`), step metrics (`metrics.MetricsLogger`: JSONL, store,
TensorBoard), progress lines, and the final export. A method supplies one function,
``step_fn(step) -> metrics``, that does its work for one optimizer step (build its
batch, call `update.optimizer_steps`), and reads or advances ``session.state``.

Order of a run: `Session.open` (checks, seeds, model, optimizer, checkpoint, run
record, logger) -> `run(step_fn)` (per step: step_fn, timing/memory metrics, log,
checkpoint) -> `finish` (export, run complete). A resumed session reloads weights,
optimizer, scheduler, RNG states and ``state`` (step, weights version, data cursor),
so a resumed run logs the same metrics as one that never stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrft.memory import peak_rss_mib
from agentrft.precision import bf16_native, resolve
from agentrft.store import Store
from agentrft.train.config import ConfigError, PolicyConfig, TrainConfig
from agentrft.train.core.checkpoint import (
    TrainerState,
    export_policy,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agentrft.train.core.metrics import MetricsLogger
from agentrft.train.core.progress import StepProgress
from agentrft.train.core.resume import CONFIG_NAME, check_resumed_config, close_run, open_run
from agentrft.train.core.update import autocast_dtype, lr_lambda, make_optimizer

StepFn = Callable[[int], dict[str, float]]
# Called after each logged step with (step, metrics); True stops the run there, after a checkpoint
# (a job cancelled between steps resumes exactly from it).
StepHook = Callable[[int, dict[str, float]], bool]


def prepare_model(model: Any, pc: PolicyConfig) -> Any:
    """Full fine-tuning: the model itself. LoRA: peft injects adapters into the same module tree
    (so a sampler holding the base model samples through them) and only they train."""
    if pc.gradient_checkpointing:
        # non-reentrant: gradients reach LoRA weights without requiring grads on the inputs
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if pc.finetune == "full":
        model.requires_grad_(True)
        if pc.freeze_layers:
            freeze_bottom(model, pc.freeze_layers)
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


def freeze_bottom(model: Any, n: int) -> None:
    """Keep the token embeddings (with an lm_head tied to them) and the first ``n`` decoder layers fixed
    (``policy.freeze_layers``): nothing below layer ``n`` needs a gradient, so autograd's backward stops there."""
    layers = model.get_decoder().layers
    if n > len(layers):
        raise ValueError(f"policy.freeze_layers: {n} is more than the model's {len(layers)} decoder layers")
    model.get_input_embeddings().requires_grad_(False)
    for layer in layers[:n]:
        layer.requires_grad_(False)


def note_compute(store: Store, run_id: str, *, step: int, precision: str) -> None:
    """Append to the run record what the trainer computes in from ``step`` on (``policy.precision: auto`` is
    bf16 or fp32 by the CPU, so a run started on one machine and resumed on another says so)."""
    run = store.get_run(run_id)
    entry = {"from_step": step, "precision": resolve(precision), "bf16_native": bf16_native()}
    compute = [*run.metadata.get("compute", []), entry]
    store.update_run(run.model_copy(update={"metadata": {**run.metadata, "compute": compute}}))


def check_run_dir(run_dir: Path, cfg: TrainConfig, *, resume: bool, allow_config_change: bool) -> Path | None:
    """Refuse what a run directory cannot take, before anything is written; returns the checkpoint to resume."""
    ckpt_root = run_dir / "checkpoints"
    if not resume and latest_checkpoint(ckpt_root) is not None:
        raise FileExistsError(f"{run_dir} already holds checkpoints; pass resume=True (--resume) or a new run dir")
    if resume:
        check_resumed_config(cfg, run_dir, allow_changed=allow_config_change)
        return latest_checkpoint(ckpt_root)
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Session:
    """A training run in progress; build it with `Session.open`."""

    cfg: TrainConfig
    run_dir: Path
    model: Any  # the trainable module (a peft wrapper for LoRA)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainerState
    run_id: str
    logger: MetricsLogger
    store: Store | None
    precision: torch.dtype | None
    resumed_from: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    saved: Path | None = None

    @classmethod
    def open(
        cls,
        cfg: TrainConfig,
        run_dir: Path,
        base_model: Any,
        *,
        store: Store | None,
        resume_from: Path | None,
        resume: bool,
        policy_version: int = 0,
        wrap: Callable[[Any], Any] | None = None,
    ) -> Session:
        """Model made trainable, optimizer and schedule, checkpoint restored (``resume_from``), run registered.
        Call `check_run_dir` and `seed_everything` first (before the policy loads). ``wrap``: the method's
        module around the prepared model (the reward model's scalar head); its trainable parameters train,
        and are checkpointed, with the model's."""
        cfg.save(run_dir / CONFIG_NAME)
        model = prepare_model(base_model, cfg.policy)
        if cfg.optimizer.weights == "bf16":  # no fp32 master: the weights the sampler shares become bf16 too
            if autocast_dtype(cfg.policy.precision) != torch.bfloat16:
                raise ConfigError(
                    "optimizer.weights: bf16 weights need bf16 compute (policy.precision resolves to fp32)"
                )
            model.to(torch.bfloat16)
        if cfg.optimizer.shared_prefix and cfg.optimizer.shared_prefix_layout == "segments":
            from agentrft.train.core.segment_attention import use_segment_attention

            use_segment_attention(base_model)  # once, before any update: a model that cannot take it fails here
        if wrap is not None:
            model = wrap(model)
        o = cfg.optimizer
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], o)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, cfg.steps))
        state = TrainerState(policy_version=policy_version)
        if resume_from is not None:
            state = load_checkpoint(resume_from, model, optimizer, scheduler)
        run_id = state.extra.get("run_id") or f"train-{run_dir.name}"
        state.extra["run_id"] = run_id
        precision = autocast_dtype(cfg.policy.precision)
        if store is not None:
            open_run(store, run_id, run_dir, cfg, resumed=resume, step=state.step, policy_version=state.policy_version)
            note_compute(store, run_id, step=state.step, precision=cfg.policy.precision)
        logger = MetricsLogger(
            run_dir, cfg.logging, store=store, run_id=run_id, resume_from_step=state.step if resume else None
        )
        return cls(
            cfg,
            run_dir,
            model,
            optimizer,
            scheduler,
            state,
            run_id,
            logger,
            store,
            precision,
            resume_from,
            saved=resume_from,
        )

    def run(
        self,
        step_fn: StepFn,
        *,
        progress: bool = False,
        stop_after: int | None = None,
        on_step: StepHook | None = None,
    ) -> None:
        """Steps until ``cfg.steps`` (or ``stop_after``, as an interruption would): step_fn, then timing and
        memory metrics, log, ``on_step`` (True: stop after this step), checkpoint. step_fn advances ``state``
        (cursor, weights version) itself."""
        cfg, state = self.cfg, self.state
        with StepProgress(cfg.steps, start=state.step, enabled=progress) as bar:
            while state.step < cfg.steps:
                step = state.step + 1
                t_step = time.perf_counter()
                metrics = step_fn(step)
                state.step = step
                metrics["policy_version"] = float(state.policy_version)
                metrics["time/step_s"] = time.perf_counter() - t_step
                metrics["mem/peak_rss_mib"] = peak_rss_mib()
                self.logger.log(step, metrics)
                self.history.append({"step": float(step), **metrics})
                bar.step(step, metrics)
                stop = on_step(step, metrics) if on_step is not None else False
                every = cfg.checkpoint.every_steps
                if (every and step % every == 0) or step == cfg.steps or step == stop_after or stop:
                    self.saved = save_checkpoint(
                        self.run_dir / "checkpoints",
                        self.model,
                        self.optimizer,
                        self.scheduler,
                        state,
                        keep_last=cfg.checkpoint.keep_last,
                    )
                if stop or (stop_after is not None and step >= stop_after):
                    break

    @property
    def done(self) -> bool:
        return self.state.step >= self.cfg.steps

    def finish(self, tokenizer: Any, *, export: Callable[[Any, Any], Path] | None = None) -> None:
        """After the last step: the trained model exported (default: the policy in Hugging Face form in
        ``run_dir/policy``; ``export(model, tokenizer)`` for a method's own form); the run complete."""
        if self.done:
            if export is None:
                export_policy(self.model, tokenizer, self.run_dir / "policy")
            else:
                export(self.model, tokenizer)
            if self.store is not None:
                close_run(self.store, self.run_id)

    def close(self) -> None:
        self.logger.close()

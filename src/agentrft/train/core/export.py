"""A run's checkpoint as a policy (`agentrft export-policy`): the weights of a stopped or unfinished run, or of an
earlier step of a finished one, in the form the run's own final export has (a full model directory that loads
back as ``hf:<dir>``, or a LoRA adapter directory).

The run directory's ``config.yaml`` says which policy the run started from and how it was made trainable (full,
LoRA, bf16 weights); the checkpoint's ``trainable.pt`` holds every trained tensor by name. Everything that can be
refused (no such run, no checkpoint, no such step, a reward model's run) is refused before a model loads.
"""

from __future__ import annotations

from pathlib import Path

from agentrft.inputs import InputError
from agentrft.train.core.checkpoint import checkpoint_step, list_checkpoints
from agentrft.train.core.resume import CONFIG_NAME


def checkpoint_to_export(run_dir: Path, step: int | None) -> Path:
    """The checkpoint of ``step`` in ``run_dir`` (the latest when None); a missing one is an InputError naming the
    steps there are."""
    if not (run_dir / CONFIG_NAME).is_file():
        raise InputError(f"{run_dir}: not a training run directory (no {CONFIG_NAME})")
    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        raise InputError(f"{run_dir}: no checkpoint (checkpoint.every_steps: 0, or the run stopped before its first)")
    if step is None:
        return found[-1]
    by_step = {checkpoint_step(p): p for p in found}
    if step not in by_step:
        raise InputError(f"{run_dir}: no checkpoint of step {step}; there are steps {sorted(by_step)}")
    return by_step[step]


def export_checkpoint(run_dir: Path, out: Path, *, step: int | None = None) -> Path:
    """Write ``run_dir``'s checkpoint of ``step`` (the latest when None) to ``out`` as a policy; returns the
    checkpoint exported."""
    from agentrft.train.config import load_config

    checkpoint = checkpoint_to_export(run_dir, step)
    cfg = load_config(run_dir / CONFIG_NAME)
    if cfg.method == "reward_model":
        raise InputError(f"{run_dir}: a reward model's run; its checkpoint is a scorer, not a policy")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {out}: exists and is not an empty directory")

    import torch

    from agentrft.samplers.policies import load_model_and_tokenizer
    from agentrft.train.core.checkpoint import export_policy, load_trainable
    from agentrft.train.core.session import prepare_model

    base, tokenizer = load_model_and_tokenizer(cfg.policy.name, seed=cfg.seed)
    model = prepare_model(base, cfg.policy.model_copy(update={"gradient_checkpointing": False}))
    if cfg.optimizer.weights == "bf16":
        model.to(torch.bfloat16)  # as the run trained and exported it
    try:
        load_trainable(checkpoint, model)
    except ValueError as err:  # the run's config.yaml was edited, or its policy directory changed since
        raise InputError(f"{err} (policy {cfg.policy.name!r}, finetune {cfg.policy.finetune})") from None
    export_policy(model, tokenizer, out)
    return checkpoint

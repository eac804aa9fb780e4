"""Atomic training checkpoints: weights (or LoRA adapter), optimizer, scheduler, RNG states, cursor, step.

A checkpoint is written into a temporary directory beside its final place, every
file flushed to disk, and then renamed to ``checkpoints/step-NNNNNNNN`` in one
``os.rename``. A ``kill -9`` at any moment therefore leaves either the previous
complete checkpoint or the new one, never a half-written one; leftover temporary
directories are ignored and swept on the next save.

Layout of one checkpoint:
    trainable.pt   the trainable parameters by name (all weights, or the LoRA adapter only)
    trainer.pt     optimizer and scheduler state dicts, RNG states (python, numpy, torch)
    state.json     step, policy_version, data cursor (human-readable)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

_PREFIX = "step-"


@dataclass
class TrainerState:
    """What besides tensors a resumed run needs to continue exactly."""

    step: int = 0  # optimizer steps completed
    policy_version: int = 0
    cursor: int = 0  # training tasks consumed so far (the task order is a function of seed and cursor)
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory (``step-NNNNNNNN``) was saved at."""
    return int(path.name[len(_PREFIX) :])


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [
        p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and p.name[len(_PREFIX) :].isdigit()
    ]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def save_checkpoint(
    ckpt_root: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainerState,
    *,
    keep_last: int = 2,
) -> Path:
    """Write a checkpoint atomically and prune all but the newest ``keep_last``; returns its path."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_root.glob(".tmp-*"):  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = ckpt_root / f"{_PREFIX}{state.step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=ckpt_root))
    # no copy: torch.save writes the tensors as they are (tied weights stay one storage)
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    torch.save(trainable, tmp / "trainable.pt")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
        tmp / "trainer.pt",
    )
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fd = os.open(ckpt_root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in list_checkpoints(ckpt_root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainable(path: Path, model: torch.nn.Module) -> None:
    """Copy a checkpoint's trained tensors into ``model``'s parameters, which must be exactly its trainable ones
    (ValueError otherwise)."""
    trainable = torch.load(path / "trainable.pt", weights_only=True)
    params = dict(model.named_parameters())
    missing = [n for n in trainable if n not in params]
    expected = {n for n, p in params.items() if p.requires_grad}
    if missing or expected - set(trainable):
        raise ValueError(
            f"checkpoint {path} does not match the model: unknown {missing[:3]}, "
            f"absent {sorted(expected - set(trainable))[:3]} (was it made with another policy or finetune mode?)"
        )
    with torch.no_grad():
        for n, t in trainable.items():
            params[n].copy_(t)


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Restore a checkpoint into live objects (in place) and return its TrainerState."""
    load_trainable(path, model)
    # weights_only=False: the numpy RNG state is not a tensor. Load only checkpoints you wrote.
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    raw = json.loads((path / "state.json").read_text())
    return TrainerState(**raw)


def export_policy(model: Any, tokenizer: Any, path: Path) -> Path:
    """The trained policy in Hugging Face form: a peft adapter directory (LoRA) or a full model directory.

    A full model (with its tokenizer) loads back as policy ``hf:<path>``; a LoRA
    adapter loads with ``peft.PeftModel.from_pretrained(base_model, path)``.
    """
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    return path

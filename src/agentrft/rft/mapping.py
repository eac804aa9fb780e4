"""A job's hyperparameters as a GRPO `TrainConfig`: the one place the mapping is decided.

| hyperparameter | ``auto`` | GRPO config |
| --- | --- | --- |
| ``batch_size`` | min(4, training rows) | ``rollout.tasks_per_step`` (prompts per step) |
| ``n_epochs`` | 1 | ``steps`` = ceil(n_epochs × training rows / batch_size) |
| ``learning_rate_multiplier`` | 1.0 | ``optimizer.lr`` = multiplier × `BASE_LR` (3e-5: the demo's full fine-tune of SmolLM2-135M) |
| ``compute_multiplier`` | 1.0 | ``rollout.group_size`` = max(2, round(8 × multiplier)) samples per prompt (the GRPO group) |
| ``eval_interval`` | ceil(steps / 4) | ``eval.every_steps`` and ``checkpoint.every_steps`` (the last step always evals and saves) |
| ``eval_samples`` | 1 | ``eval.samples_per_task`` over every validation row (``eval.num_tasks``) |
| ``reasoning_effort`` | – | not applicable (no reasoning mode); recorded as such |

Fixed choices: full fine-tune (so the result is a plain Hugging Face model directory), the GRPO
advantage with token-mean aggregation and DAPO's asymmetric clip (the config's defaults), a
constant learning rate, no KL term, three checkpoints kept; training and validation sample at
``agentrft.temperature`` (0.7 by default). The resolved table and the config are saved with the job
(``mapping.json``, ``config.yaml``). No torch here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentrft.envs.jsonl import VALID_SPLIT
from agentrft.rft.spec import JobSpec
from agentrft.train.config import TrainConfig, build_config

BASE_LR = 3e-5
BASE_SAMPLES_PER_PROMPT = 8
AUTO_BATCH_SIZE = 4
AUTO_EVALS = 4
KEEP_CHECKPOINTS = 3


def job_env_spec(spec: JobSpec, endpoints_file: Path | None) -> str:
    """The `make_env` name of the job's environment: its training file, the ``valid`` split, its tools."""
    options = [("valid", spec.validation_file)]
    if spec.agentrft.tools_module:
        options.append(("tools", spec.agentrft.tools_module))
    if endpoints_file is not None:
        options.append(("endpoints", str(endpoints_file)))
    query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in options)
    return f"jsonl:{spec.training_file}?{query}"


def _row(name: str, given: Any, resolved: Any, key: str, value: Any, rule: str) -> dict[str, Any]:
    return {"hyperparameter": name, "given": given, "resolved": resolved, "config": key, "value": value, "rule": rule}


def map_hyperparameters(
    spec: JobSpec, train_rows: int, valid_rows: int, env_spec: str
) -> tuple[TrainConfig, list[dict[str, Any]]]:
    """(the GRPO config, the resolved mapping table) of a validated job (see the module docstring). Long
    because it is the mapping table itself, one row per hyperparameter, kept in one place to read against
    docs/rft.md."""
    hp = spec.hyperparameters
    batch = min(AUTO_BATCH_SIZE, train_rows) if hp.batch_size == "auto" else int(hp.batch_size)
    epochs = 1 if hp.n_epochs == "auto" else int(hp.n_epochs)
    steps = max(1, math.ceil(epochs * train_rows / batch))
    lr_mult = 1.0 if hp.learning_rate_multiplier == "auto" else float(hp.learning_rate_multiplier)
    compute = 1.0 if hp.compute_multiplier == "auto" else float(hp.compute_multiplier)
    group = max(2, round(BASE_SAMPLES_PER_PROMPT * compute))
    interval = max(1, math.ceil(steps / AUTO_EVALS)) if hp.eval_interval == "auto" else int(hp.eval_interval)
    samples = 1 if hp.eval_samples == "auto" else int(hp.eval_samples)
    local = spec.agentrft
    rows = [
        _row("batch_size", hp.batch_size, batch, "rollout.tasks_per_step", batch, "auto: min(4, training rows)"),
        _row(
            "n_epochs",
            hp.n_epochs,
            epochs,
            "steps",
            steps,
            f"ceil(n_epochs x {train_rows} training rows / batch_size)",
        ),
        _row(
            "learning_rate_multiplier",
            hp.learning_rate_multiplier,
            lr_mult,
            "optimizer.lr",
            lr_mult * BASE_LR,
            f"multiplier x base lr {BASE_LR:g}",
        ),
        _row(
            "compute_multiplier",
            hp.compute_multiplier,
            compute,
            "rollout.group_size",
            group,
            f"max(2, round({BASE_SAMPLES_PER_PROMPT} x multiplier)) samples per prompt",
        ),
        _row(
            "eval_interval",
            hp.eval_interval,
            interval,
            "eval.every_steps, checkpoint.every_steps",
            interval,
            f"auto: ceil(steps / {AUTO_EVALS}); the last step always evals and saves",
        ),
        _row(
            "eval_samples",
            hp.eval_samples,
            samples,
            "eval.samples_per_task",
            samples,
            f"samples of each of the {valid_rows} validation rows per eval",
        ),
        _row(
            "reasoning_effort",
            hp.reasoning_effort,
            "not applicable",
            "-",
            None,
            "the local models have no reasoning mode",
        ),
    ]
    body = {
        "method": "grpo",
        "seed": spec.seed,
        "steps": steps,
        "policy": {"name": spec.model, "finetune": "full", "gradient_checkpointing": local.gradient_checkpointing},
        "rollout": {
            "env": env_spec,
            "split": "train",
            "tasks_per_step": batch,
            "group_size": group,
            "temperature": local.temperature,
            "max_tokens": local.max_tokens,
            "tool_format": local.tool_format,
            "grader": spec.grader,
        },
        "optimizer": {"lr": lr_mult * BASE_LR, "schedule": "constant", "warmup_steps": 0},
        "eval": {
            "every_steps": interval,
            "split": VALID_SPLIT,
            "num_tasks": valid_rows,
            "samples_per_task": samples,
            "temperature": local.temperature,
        },
        "checkpoint": {"every_steps": interval, "keep_last": KEEP_CHECKPOINTS},
        "logging": {"tensorboard": False},
    }
    return build_config(body, source="job"), rows

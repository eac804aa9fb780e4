"""A job's events: ``RUN_DIR/events.jsonl``, one ``fine_tuning.job.event`` object per line.

``type: "message"`` events say what happened (created, validated, started, baseline, checkpoint,
cancelled, resumed, succeeded, failed); ``type: "metrics"`` events carry a step's figures under the
names of the hosted service's metric events (OpenAI's reinforcement fine-tuning guide, "Training
metrics"), built from the step metrics the trainer logs (`train.metrics`, agentrft names in
``metrics.jsonl``):

* ``step``, ``total_steps``; ``train_mean_reward``; on eval steps ``full_valid_mean_reward`` and
  ``full_valid_mean_parse_error`` (every validation row is evaluated, so the validation figures are
  always the full ones; the baseline before training is step 0);
* ``scores``: ``train_reward_mean``, ``valid_reward_mean`` and per grader (each sub-grader of a
  ``multi``, by its key) ``{name, type, train_reward_mean, valid_reward_mean}``;
* ``errors``: per grader-error flag ``{train,valid}_<flag>_count`` and ``_mean`` (per episode), and per
  grader its error count;
* ``usage.samples``: completion tokens per episode (``completion_tokens_mean`` at the top level too);
  no reasoning tokens: the local models have no reasoning mode;
* ``timing.step``: ``sampling``, ``grading``, ``training``, ``eval``, ``full_iteration`` seconds;
* ``mean_unresponsive_rewards``: share of training episodes whose grader did not answer.

A resumed job drops the metrics events of the steps it redoes (`EventLog.rewind`), as the
trainer drops their metrics. No torch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrft.inputs import InputError, parse_object
from agentrft.types import new_id

EVENTS_NAME = "events.jsonl"


class EventLog:
    """Append-only events of one job (a line torn by a kill is skipped when read, and dropped on rewind)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / EVENTS_NAME

    def emit(
        self, message: str, *, level: str = "info", kind: str = "message", data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        event = {
            "object": "fine_tuning.job.event",
            "id": "ftevent-" + new_id().lower(),
            "created_at": int(time.time()),
            "level": level,
            "message": message,
            "type": kind,
            "data": data or {},
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(parse_object(line, f"{self.path}:{n}", check=False))
            except InputError:
                continue  # a line torn by an interruption
        return out

    def rewind(self, step: int) -> int:
        """Drop the metrics events of steps after ``step`` (redone by a resumed job); returns how many."""
        events = self.read()
        kept = [e for e in events if e.get("type") != "metrics" or int(e.get("data", {}).get("step", 0)) <= step]
        self.path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in kept), encoding="utf-8")
        return len(events) - len(kept)


def _per_episode(metrics: dict[str, float], count_key: str, split: str) -> float | None:
    n = metrics.get(f"{split}_episodes")
    if not n:
        return None
    return metrics.get(count_key, 0.0) / n


def _split_errors(metrics: dict[str, float], split: str) -> dict[str, float]:
    out: dict[str, float] = {}
    prefix = f"{split}_grader_errors/"
    for key, value in metrics.items():
        if key.startswith(prefix) and not key.startswith(prefix + "by_grader/"):
            flag = key[len(prefix) :]
            out[f"{split}_{flag}_count"] = value
            share = _per_episode(metrics, key, split)
            if share is not None:
                out[f"{split}_{flag}_mean"] = share
    return out


def metrics_event_data(
    step: int, total_steps: int, metrics: dict[str, float], grader_types: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    """(message, data) of a step's metrics event in the hosted shape (see the module docstring)."""
    trained = "train_reward_mean" in metrics
    evaluated = "valid_reward_mean" in metrics
    names = sorted(
        {k.split("/", 1)[1] for k in metrics if k.startswith(("train_reward/", "valid_reward/"))} | set(grader_types)
    )
    graders = []
    for name in names:
        entry: dict[str, Any] = {"name": name, "type": grader_types.get(name)}
        for split in ("train", "valid"):
            if f"{split}_reward/{name}" in metrics:
                entry[f"{split}_reward_mean"] = metrics[f"{split}_reward/{name}"]
        graders.append(entry)
    scores: dict[str, Any] = {"graders": graders}
    data: dict[str, Any] = {"step": step, "total_steps": total_steps}
    errors: dict[str, Any] = {
        "graders": [
            {
                "name": name,
                "type": grader_types.get(name),
                **{
                    f"{split}_error_count": metrics[f"{split}_grader_errors/by_grader/{name}"]
                    for split in ("train", "valid")
                    if f"{split}_grader_errors/by_grader/{name}" in metrics
                },
            }
            for name in names
        ]
    }
    parts = [f"Step {step}/{total_steps}"] if step else ["Baseline (before training)"]
    if trained:
        scores["train_reward_mean"] = data["train_mean_reward"] = metrics["train_reward_mean"]
        errors.update(_split_errors(metrics, "train"))
        tokens = metrics.get("train_sampled_tokens_per_episode")
        data["completion_tokens_mean"] = tokens
        data["usage"] = {
            "samples": {
                "train_completion_tokens_mean": tokens,
                "train_completion_tokens_count": metrics.get("train_sampled_tokens"),
                "train_tool_calls_mean": metrics.get("train_tool_calls_per_episode"),
                "train_tool_errors_mean": metrics.get("train_tool_errors_per_episode"),
            }
        }
        data["mean_unresponsive_rewards"] = (
            _per_episode(metrics, "train_grader_errors/unresponsive_reward_error", "train") or 0.0
        )
        parts.append(f"train mean reward={metrics['train_reward_mean']:.2f}")
    if evaluated:
        scores["valid_reward_mean"] = data["full_valid_mean_reward"] = metrics["valid_reward_mean"]
        errors.update(_split_errors(metrics, "valid"))
        parse = _per_episode(metrics, "valid_grader_errors/sample_parse_error", "valid") or 0.0
        data["full_valid_mean_parse_error"] = parse
        data.setdefault("usage", {}).setdefault("samples", {})["valid_tokens_mean"] = metrics.get(
            "valid_tokens_per_episode"
        )
        parts.append(f"full validation mean reward={metrics['valid_reward_mean']:.2f}")
        parts.append(f"full validation mean parse error={parse:.2f}")
    data["scores"] = scores
    data["errors"] = errors
    timing = {
        name: metrics[key]
        for name, key in (
            ("sampling", "time/sampling_s"),
            ("grading", "time/grading_s"),
            ("training", "time/training_s"),
            ("eval", "time/eval_s"),
            ("full_iteration", "time/step_s"),
        )
        if key in metrics
    }
    if timing:
        data["timing"] = {"step": timing}
    return ", ".join(parts), data

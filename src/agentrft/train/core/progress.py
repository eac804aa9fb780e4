"""What a person watching `agentrft train` / `demo` sees while training runs.

On a terminal: a live progress bar over steps with the last step's reward and success
(or SFT's NLL) and timings. Elsewhere (a log file, CI, a pipe): one plain line per step, so a
ten-minute training phase is never silent. Off when ``enabled`` is False
(library use, tests).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def step_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/10  reward 0.412  success 0.344  excluded 0  sample 9.1s  update 7.9s`` (GRPO), or
    ``step 3/10  loss 0.641  accuracy 0.750  margin 0.120  update 7.9s`` (DPO), or
    ``step 3/30  nll 0.191  update 22.8s`` (SFT), or
    ``step 3/10  loss 0.641  accuracy 0.750  held-out accuracy 0.700  update 7.9s`` (reward model): what the
    step measured, nothing it did not."""
    parts = [f"step {step}/{total}"]
    if "rm/accuracy" in metrics:  # a reward model: no rollout
        parts.append(f"loss {metrics.get('loss', 0.0):.3f}")
        parts.append(f"accuracy {metrics['rm/accuracy']:.3f}")
        if "rm/heldout_accuracy" in metrics:
            parts.append(f"held-out accuracy {metrics['rm/heldout_accuracy']:.3f}")
        parts.append(f"update {metrics.get('time/training_s', 0.0):.1f}s")
        return "  ".join(parts)
    if "rewards/accuracy" in metrics:  # a preference method: no rollout
        parts.append(f"loss {metrics.get('loss', 0.0):.3f}")
        parts.append(f"accuracy {metrics['rewards/accuracy']:.3f}")
        parts.append(f"margin {metrics.get('rewards/margin', 0.0):.3f}")
        parts.append(f"update {metrics.get('time/training_s', 0.0):.1f}s")
        return "  ".join(parts)
    if "train_reward_mean" in metrics:
        parts.append(f"reward {metrics['train_reward_mean']:.3f}")
        parts.append(f"success {metrics.get('train_success_rate', 0.0):.3f}")
    if "excluded_trajectories" in metrics:
        parts.append(f"excluded {int(metrics['excluded_trajectories'])}")
    if "nll" in metrics:
        parts.append(f"nll {metrics['nll']:.3f}")
    if "valid_reward_mean" in metrics:
        parts.append(f"valid reward {metrics['valid_reward_mean']:.3f}")
    if "time/sampling_s" in metrics:
        parts.append(f"sample {metrics['time/sampling_s']:.1f}s")
    parts.append(f"update {metrics.get('time/training_s', 0.0):.1f}s")
    return "  ".join(parts)


class StepProgress:
    """Context manager; call `step(step, metrics)` after each logged step."""

    def __init__(self, total: int, *, start: int = 0, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.stream = stream or sys.stderr
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> StepProgress:
        if self.enabled and self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("training"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream),
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        line = step_line(step, self.total, metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=line.split("  ", 1)[1])
        else:
            print(line, file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

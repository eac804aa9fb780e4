"""A training run's record in the store, consistent across interruptions and `--resume`.

* A run is ``incomplete`` from its first step until its last, so a run killed midway
  is never mistaken for a finished one.
* `--resume` continues from the latest checkpoint (step k, weights version v). The
  steps after k were logged and sampled but are redone, identically (fixed seeds):
  their trajectories (sampled by weights >= v in a step after k: each records its
  ``metadata.step``, since a step whose update was skipped leaves the version as
  it was), step metrics (> k) and periodic
  eval runs (of versions > v) are removed first, so exports, evals and reports
  never count them twice. What was removed is noted in the run's metadata.
* `--resume` with a config that differs from the saved ``config.yaml`` is refused,
  naming the differences, unless the caller allows it explicitly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentrft.store import Store
from agentrft.train.config import ConfigError, TrainConfig, load_config
from agentrft.types import Run

CONFIG_NAME = "config.yaml"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def config_changes(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """``["optimizer.lr: 1e-05 -> 3e-05", ...]``: the dotted keys whose values differ."""
    a, b = _flat(saved.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_resumed_config(cfg: TrainConfig, run_dir: Path, *, allow_changed: bool) -> None:
    """Refuse to resume ``run_dir`` with a config other than the one it was started with."""
    path = run_dir / CONFIG_NAME
    if not path.exists():
        return
    changes = config_changes(load_config(path), cfg)
    if changes and not allow_changed:
        shown = "; ".join(changes[:5]) + (f" (and {len(changes) - 5} more)" if len(changes) > 5 else "")
        raise ConfigError(
            f"{path}: --resume with a changed config ({shown}); resume with the saved config, "
            "or pass --allow-config-change to continue with the new one"
        )


def _eval_version(run: Run, run_id: str) -> int | None:
    """The weights version of one of this training run's periodic eval runs (named ``{run_id}-eval-v{N}``)."""
    prefix = f"{run_id}-eval-v"
    if run.kind != "eval" or not run.name.startswith(prefix) or not run.name[len(prefix) :].isdigit():
        return None
    return int(run.name[len(prefix) :])


def open_run(
    store: Store, run_id: str, run_dir: Path, cfg: TrainConfig, *, resumed: bool, step: int, policy_version: int
) -> None:
    """Register a new run, or (``resumed``) rewind an existing one to its checkpoint (see the module docstring)."""
    if not resumed:
        if store.has_run(run_id):
            raise FileExistsError(
                f"{run_dir} already holds training run {run_id} from an earlier start; "
                "pass --resume to continue it, or use a new run dir"
            )
        store.add_run(
            Run(id=run_id, name=run_dir.name, kind="train", config=cfg.model_dump(mode="json"), status="incomplete")
        )
        return
    # an asynchronous run keeps its trajectories: the pipeline puts back or marks each (train/rl/pipeline.py)
    removed = store.rewind_run(
        run_id, policy_version=policy_version, step=step, trajectories=not cfg.async_.max_staleness
    )
    for run in store.list_runs():
        version = _eval_version(run, run_id)
        if version is not None and version > policy_version:
            removed += store.delete_run(run.id)
    if not store.has_run(run_id):
        store.add_run(
            Run(id=run_id, name=run_dir.name, kind="train", config=cfg.model_dump(mode="json"), status="incomplete")
        )
    run = store.get_run(run_id)
    note = {"at": time.time(), "from_step": step, "removed_trajectories": removed}
    run = run.model_copy(
        update={
            "status": "incomplete",
            "config": cfg.model_dump(mode="json"),
            "metadata": {**run.metadata, "resumes": [*run.metadata.get("resumes", []), note]},
        }
    )
    store.update_run(run)


def close_run(store: Store, run_id: str) -> None:
    """Mark the run complete (its last step is done)."""
    store.update_run(store.get_run(run_id).model_copy(update={"status": "complete"}))

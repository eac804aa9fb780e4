"""`agentrft train CONFIG [--set k=v ...] [--resume] [--run-dir DIR]`: every training method (GRPO/DAPO, filtered
SFT, rejection sampling, DPO), and `agentrft sft --data SOURCE ...`, the same config system's ``sft`` preset with
``data.source`` and ``policy.name`` filled in.

Everything the config says is checked before the run directory is touched: the file itself
(`train.config.load_config`), then what it names (`check_references`: environment, splits,
grader, policy), then the run directory (no checkpoints unless --resume). A bad config exits 2
and leaves no trace; torch is imported only after that.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from agentrft.cli.support import fail
from agentrft.train.config.presets import PRESETS

if TYPE_CHECKING:
    from agentrft.train.config import TrainConfig


_RESUME_HELP = "Continue from the run dir's latest checkpoint."
_ALLOW_HELP = "With --resume: continue even though the config differs from the saved one."
_SET_HELP = "Override one option, e.g. --set optimizer.lr=1e-5 (repeatable)."


def train_cmd(
    config: str = typer.Argument(..., help=f"YAML/TOML config file, or a preset name ({', '.join(PRESETS)})."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
    resume: bool = typer.Option(False, "--resume", help=_RESUME_HELP),
    allow_config_change: bool = typer.Option(False, "--allow-config-change", help=_ALLOW_HELP),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where config, checkpoints, metrics and the store go."),
    as_json: bool = typer.Option(False, "--json", help="Print the final metrics as one JSON object."),
    ray: bool = typer.Option(
        False, "--ray", help="GRPO: play groups on Ray rollout-worker actors (ray.workers; pip install agentrft[ray])."
    ),
    ray_address: str = typer.Option(
        None, "--ray-address", help="With --ray: join this Ray cluster (else a local one)."
    ),
    seed: int | None = typer.Option(None, "--seed", help="The run's seed (the config's `seed`, default 0)."),
) -> None:
    """Train a policy (method: grpo, sft, rejection_sampling or dpo) or a reward model (method: reward_model);
    metrics go to RUN_DIR/metrics.jsonl. GRPO runs asynchronously with --set async.max_staleness=K."""
    from agentrft.train.config import load_config

    if ray_address and not ray:
        raise fail("--ray-address needs --ray")
    extra = ["ray.enabled=true"] if ray else []
    extra += [f"ray.address={ray_address}"] if ray_address else []
    extra += [f"seed={seed}"] if seed is not None else []
    run_training(load_config(config, [*set_, *extra]), config, run_dir, resume, allow_config_change, as_json)


def sft_cmd(
    data: str = typer.Option(
        ..., "--data", help="Recorded trajectories: a store (.db) or an export (.jsonl, .parquet)."
    ),
    policy: str = typer.Option("smollm2-135m", "--policy", help="Policy to fine-tune: smollm2-135m | tiny | hf:PATH."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one option of the sft preset, e.g. --set data.runs=[demo2] (repeatable)."
    ),
    resume: bool = typer.Option(False, "--resume", help=_RESUME_HELP),
    allow_config_change: bool = typer.Option(False, "--allow-config-change", help=_ALLOW_HELP),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where config, checkpoints, metrics and the store go."),
    as_json: bool = typer.Option(False, "--json", help="Print the final metrics as one JSON object."),
) -> None:
    """Filtered SFT on recorded trajectories: `agentrft train sft --set data.source=DATA --set policy.name=POLICY`.

    The sft preset keeps successful trajectories (data.success_only) and learns their assistant tokens only;
    select with --set data.runs=[...], data.tasks, data.min_reward, data.best_of_n, data.dedupe."""
    from agentrft.train.config import PRESETS, build_config

    preset = PRESETS["sft"]
    base = {**preset, "data": {**preset["data"], "source": data}, "policy": {**preset["policy"], "name": policy}}
    cfg = build_config(base, set_, source="preset sft")  # the values as given: a path is not read as YAML
    run_training(cfg, "preset sft", run_dir, resume, allow_config_change, as_json)


_SHOWN = (
    "train_reward_mean",
    "valid_reward_mean",
    "loss",
    "rewards/accuracy",
    "rewards/margin",
    "rm/heldout_accuracy",
    "clip_frac",
    "entropy",
)


def run_training(
    cfg: TrainConfig, source: str, run_dir: Path | None, resume: bool, allow_config_change: bool, as_json: bool
) -> None:
    """Check what ``cfg`` names and the run dir (bad input exits 2 and leaves no trace), train, print the result."""
    from agentrft.train.config.check import check_references

    check_references(cfg, source=source)
    if run_dir is None:
        if resume:
            raise fail("--resume needs --run-dir (the run to continue)")
        run_dir = Path("runs") / f"{'train' if cfg.method == 'grpo' else cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and not run_dir.is_dir():
        raise fail(f"--run-dir {run_dir} is a file, not a directory")
    if resume and not run_dir.exists():
        raise fail(f"--resume: {run_dir} does not exist (nothing to continue; leave --resume out to start it)")
    blocker = next((p for p in run_dir.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise fail(f"--run-dir {run_dir}: {blocker} is a file, not a directory")

    from agentrft.train import train
    from agentrft.train.core.checkpoint import latest_checkpoint

    if not resume and latest_checkpoint(run_dir / "checkpoints") is not None:
        raise fail(f"{run_dir} already holds checkpoints; pass --resume to continue it, or a new --run-dir")
    result = train(cfg, run_dir, resume=resume, progress=not as_json, allow_config_change=allow_config_change)
    final = result.history[-1] if result.history else {}
    if as_json:
        typer.echo(
            json.dumps(
                {"run_dir": str(result.run_dir), "run_id": result.run_id, "steps": result.steps, "metrics": final}
            )
        )
        return
    typer.echo(f"run dir      {result.run_dir}")
    typer.echo(f"steps        {result.steps}")
    for key in _SHOWN:
        if key in final:
            typer.echo(f"{key:<20} {final[key]:.4f}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("sft")(sft_cmd)

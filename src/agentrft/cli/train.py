"""`agentrft train CONFIG [--set k=v ...] [--resume] [--run-dir DIR]`: GRPO/DAPO fine-tuning."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer


def train_cmd(
    config: str = typer.Argument(..., help="YAML/TOML config file, or a preset name (demo, demo-quick)."),
    set_: list[str] = typer.Option([], "--set", help="Override one option, e.g. --set optimizer.lr=1e-5 (repeatable)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run dir's latest checkpoint."),
    allow_config_change: bool = typer.Option(
        False,
        "--allow-config-change",
        help="With --resume: continue even though the config differs from the saved one.",
    ),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where config, checkpoints, metrics and the store go."),
    as_json: bool = typer.Option(False, "--json", help="Print the final metrics as one JSON object."),
) -> None:
    """Train a policy with GRPO/DAPO on an environment's tasks; metrics go to RUN_DIR/metrics.jsonl."""
    from agentrft.train import ConfigError, load_config, train

    try:
        cfg = load_config(config, set_)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if run_dir is None:
        if resume:
            typer.echo("error: --resume needs --run-dir (the run to continue)", err=True)
            raise typer.Exit(2)
        run_dir = Path("runs") / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        result = train(cfg, run_dir, resume=resume, progress=not as_json, allow_config_change=allow_config_change)
    except ConfigError as err:  # e.g. --resume with a changed config: bad input, nothing was run
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except (FileExistsError, ValueError, KeyError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
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
    for key in ("train_reward_mean", "valid_reward_mean", "loss", "clip_frac", "entropy"):
        if key in final:
            typer.echo(f"{key:<20} {final[key]:.4f}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)

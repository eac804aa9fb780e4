"""`agentrft export`: a run's trajectories as OpenAI RFT rows, SFT, DPO pairs or Parquet; `agentrft export-policy`:
a training run's checkpoint as a policy."""

from __future__ import annotations

from pathlib import Path

import typer

from agentrft.cli.support import DEFAULT_DB, fail, open_store, user_errors
from agentrft.eval.exports import EXPORT_FORMATS
from agentrft.pairs import DEFAULT_MARGIN, DEFAULT_PAIRS_PER_TASK


def export_command(
    out: Path = typer.Argument(..., help="Output file (.jsonl, or .parquet for --format parquet)."),
    run: str = typer.Option(..., "--run", help="Run id or name."),
    fmt: str = typer.Option(..., "--format", help="rft | sft | dpo | parquet"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="SQLite store file."),
    margin: float = typer.Option(
        DEFAULT_MARGIN, "--margin", help="dpo: least reward gap between chosen and rejected (> 0)."
    ),
    pairs_per_task: int = typer.Option(
        DEFAULT_PAIRS_PER_TASK, "--pairs-per-task", help="dpo: most pairs per task (1 = best vs worst)."
    ),
) -> None:
    """rft: prompt + grading keys per task; sft: best success per task; dpo: preference pairs per task
    (TRL prompt/chosen/rejected, the pairing rule `agentrft dpo` trains on); parquet: all."""
    if fmt not in EXPORT_FORMATS:
        raise fail(f"unknown --format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}", 2)
    if not margin > 0 or pairs_per_task < 1:
        raise fail("--margin must be > 0 and --pairs-per-task >= 1", 2)
    with user_errors():
        from agentrft.eval.exports import export_run

        store = open_store(db)
        try:
            n = export_run(
                store,
                store.find_run(run).id,
                fmt,  # type: ignore[arg-type]
                out,
                margin=margin,
                pairs_per_task=pairs_per_task,
            )
        finally:
            store.close()
    typer.echo(f"wrote {n} {fmt} rows to {out}")


def export_policy_command(
    run_dir: Path = typer.Argument(..., help="A training run directory (config.yaml, checkpoints/)."),
    out: Path = typer.Option(..., "--out", help="Directory to write the policy to (new or empty)."),
    step: int = typer.Option(None, "--step", help="The checkpoint's step (default: the latest)."),
) -> None:
    """A run's checkpoint as a policy, in the form of the run's own final export: a full model directory that
    loads back as hf:OUT, or a LoRA adapter. For a run stopped before its end, or an earlier step of one."""
    with user_errors():
        from agentrft.train.core.export import export_checkpoint

        checkpoint = export_checkpoint(run_dir, out, step=step)
    form = (
        f"a LoRA adapter ({out}/adapter_config.json)" if (out / "adapter_config.json").exists() else f"policy hf:{out}"
    )
    typer.echo(f"wrote {checkpoint.name} of {run_dir} to {out}: {form}")


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("export-policy")(export_policy_command)

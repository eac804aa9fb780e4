"""`agentrft export`: a run's trajectories as OpenAI RFT rows, SFT, DPO pairs or Parquet."""

from __future__ import annotations

from pathlib import Path

import typer

from agentrft.cli.support import DEFAULT_DB, fail, find_run, open_store, user_errors
from agentrft.eval.exports import EXPORT_FORMATS


def export_command(
    out: Path = typer.Argument(..., help="Output file (.jsonl, or .parquet for --format parquet)."),
    run: str = typer.Option(..., "--run", help="Run id or name."),
    fmt: str = typer.Option(..., "--format", help="rft | sft | dpo | parquet"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="SQLite store file."),
) -> None:
    """rft: prompt + grading keys per task; sft: best success per task; dpo: best vs worst per group; parquet: all."""
    if fmt not in EXPORT_FORMATS:
        raise fail(f"unknown --format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}", 2)
    with user_errors():
        from agentrft.eval.exports import export_run

        store = open_store(db)
        try:
            n = export_run(store, find_run(store, run).id, fmt, out)  # type: ignore[arg-type]
        finally:
            store.close()
    typer.echo(f"wrote {n} {fmt} rows to {out}")


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)

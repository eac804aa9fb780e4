"""`agentrft report RUN_DIR`: one self-contained HTML report (see `agentrft.eval.report` for the layout)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentrft.cli.support import fail, user_errors


def report_command(
    run_dir: Path = typer.Argument(..., help="Run directory holding agentrft.db (and optionally metrics.jsonl)."),
    out: Path | None = typer.Option(None, "--out", help="Output file (default RUN_DIR/report.html)."),
) -> None:
    """Write an offline HTML report: training curves, before/after, levels, tools, failures, trajectories."""
    if not run_dir.is_dir():
        raise fail(f"{run_dir} is not a directory (expected a run directory holding agentrft.db)")
    with user_errors():
        from agentrft.eval.report import DB_NAME, write_report

        if not (run_dir / DB_NAME).is_file():
            raise fail(f"{run_dir / DB_NAME} not found: a run directory holds its store as {DB_NAME}")

        path = write_report(run_dir, out)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)

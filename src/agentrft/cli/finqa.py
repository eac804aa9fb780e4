"""`agentrft finqa …`: FinQA evaluation with the official metrics."""

from __future__ import annotations

import json
from pathlib import Path

import typer

finqa_app = typer.Typer(help="FinQA tools: official-style evaluation of predicted programs.", no_args_is_help=True)


@finqa_app.command("evaluate")
def evaluate(
    predictions: Path = typer.Argument(..., help='Predictions JSON: a list of {"id", "predicted": [tokens…, "EOF"]}.'),
    gold: Path = typer.Argument(..., help="Gold FinQA JSON (e.g. test.json of the FinQA release)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Execution accuracy and program accuracy, as the official FinQA evaluate.py computes them."""
    from agentrft.envs.finqa.evaluate import evaluate_predictions

    result = evaluate_predictions(predictions, gold)  # a bad file: FinqaDataError, exit 2 (cli.support)
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"predictions         {result['n']}")
    typer.echo(f"execution accuracy  {result['execution_accuracy']:.4f}")
    typer.echo(f"program accuracy    {result['program_accuracy']:.4f}")


def register(app: typer.Typer) -> None:
    app.add_typer(finqa_app, name="finqa")

"""`agentrft grade`: run an OpenAI-style grader spec over JSONL items and samples.

Pairs line i of ITEMS with line i of SAMPLES (one ITEMS line is reused for every
sample). A SAMPLES line is `{"output_text": …}`, a full sample
(`output_json`, `output_tools`, `choices`) or a serialised trajectory.
`--json` prints one object per pair: `{"index", "reward", "sub_rewards",
"errors" (flag names), "success"}`; otherwise one readable line per pair and a
summary. The spec is validated (one line naming its JSON path) before any
sample is read; a bad JSONL line is reported as `FILE:LINE: why`, and a sample
that carries chat `messages` must be a valid conversation (`openai_rows`).
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agentrft.cli.support import fail, user_errors
from agentrft.inputs import read_jsonl


def _sample(obj: dict[str, Any], where: str) -> Any:
    from agentrft.graders import Sample
    from agentrft.openai_rows import parse_messages

    if "messages" in obj:
        parse_messages(obj["messages"], where)
    try:
        return Sample.from_dict(obj)
    except ValueError as e:
        first = str(e).splitlines()[0]
        raise fail(f"{where}: not a sample or trajectory ({first})", code=2) from None


def grade_command(
    grader: Path = typer.Option(..., "--grader", help="Grader spec (JSON or YAML file)."),
    items: Path = typer.Option(..., "--items", help="JSONL of dataset items (grading data)."),
    samples: Path = typer.Option(..., "--samples", help="JSONL of samples or trajectories."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line for machines."),
    base_url: str | None = typer.Option(None, "--base-url", help="Judge endpoint for model graders."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Grades in flight (async graders)."),
) -> None:
    """Grade SAMPLES against ITEMS with the grader spec G and print the rewards."""
    from agentrft.graders import LoadOptions, agrade_many, load_grader, summarize_grades

    with user_errors():
        g = load_grader(grader, LoadOptions(base_url=base_url, concurrency=concurrency))
        item_rows = read_jsonl(items)
        sample_rows = read_jsonl(samples)
        if len(item_rows) != 1 and len(item_rows) != len(sample_rows):
            raise fail(
                f"{items} has {len(item_rows)} items but {samples} has {len(sample_rows)} samples "
                "(give one item per sample, or a single item)",
                code=2,
            )
        pairs = [
            (_sample(obj, f"{samples}:{no}"), item_rows[0 if len(item_rows) == 1 else k][1])
            for k, (no, obj) in enumerate(sample_rows)
        ]
    grades = asyncio.run(agrade_many(g, pairs, concurrency=concurrency))
    for k, gr in enumerate(grades):
        flags = [e.flag for e in gr.errors]
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "index": k,
                        "reward": gr.reward,
                        "sub_rewards": gr.sub_rewards,
                        "errors": flags,
                        "success": gr.success,
                    }
                )
            )
        else:
            extra = f"  errors: {', '.join(flags)}" if flags else ""
            typer.echo(f"{k:>5}  reward {gr.reward:.4f}  {'pass' if gr.success else 'fail'}{extra}")
    if not as_json:
        summary = summarize_grades(grades)
        if summary["n"]:
            typer.echo(
                f"n={summary['n']}  reward_mean={summary['reward_mean']:.4f}  "
                f"success_rate={summary['success_rate']:.3f}  errors={summary['error_count']}"
            )


def register(app: typer.Typer) -> None:
    app.command("grade")(grade_command)

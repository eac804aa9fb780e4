"""`agentrft demo [--quick]`: baseline eval, GRPO on CPU, eval again, report (see agentrft.recipes.demo)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from agentrft.recipes.demo import DemoSettings

_FULL, _QUICK = DemoSettings.preset(False), DemoSettings.preset(True)  # the --help text reads the real defaults


def demo_cmd(
    quick: bool = typer.Option(False, "--quick", help="A few minutes: tiny evals and 2 training steps (CI smoke run)."),
    seed: int | None = typer.Option(
        None, "--seed", help="The run's seed (default 0): sampling, task order and the evals' episodes follow it."
    ),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where the store, metrics, checkpoints and report go."),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Override a training option, e.g. --set steps=20 (repeatable); with --agentic also a stage's "
        "(imitation.K=V, late.K=V, rl.K=V) or the recipe's own settings (recipe.K=V, e.g. recipe.late_replay=8).",
    ),
    eval_tasks: int = typer.Option(
        None,
        "--eval-tasks",
        min=1,
        help=(f"Held-out tasks per eval (default {_FULL.eval_tasks}; quick {_QUICK.eval_tasks})."),
    ),
    eval_samples: int = typer.Option(
        None,
        "--eval-samples",
        min=1,
        help=(f"Samples per task (default {_FULL.eval_samples}; quick {_QUICK.eval_samples})."),
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the before/after summary as JSON."),
    resume: bool = typer.Option(
        False, "--resume", help="With --agentic: continue a stopped recipe in --run-dir (finished stages are kept)."
    ),
    env: str = typer.Option(
        None,
        "--env",
        help="Learn this environment from rewards alone (preset self-improve: GRPO with the curriculum over its "
        "levels, from the base policy, no demonstrations), e.g. 'reasoning-gym:chain_sum?tools=calc' or "
        "'bfcl:simple'; the table adds pass@1 per level with a paired test.",
    ),
    expert_iteration: bool = typer.Option(
        False,
        "--expert-iteration",
        help="With --env: first fine-tune on the policy's own successes (rejection sampling, preset "
        "self-improve-ei; --set ei.KEY=V), then GRPO.",
    ),
    agentic: bool = typer.Option(
        False,
        "--agentic",
        help="The agentic recipe on finqa-lite levels 2-4: baseline evals (few-shot prompt, and the base policy on "
        "the trained zero-shot prompt), oracle demonstrations, imitation (one pass over levels 1-4; a second with "
        "recipe.late_levels), GRPO with the curriculum and per-turn credit, final evals (held-out and ood), all "
        "after the baseline on the zero-shot prompt. --set imitation.KEY=V / late.KEY=V / rl.KEY=V.",
    ),
) -> None:
    """Run the whole loop on embedded defaults: SmolLM2-135M on finqa-lite level 1, on the CPU."""
    from rich.console import Console
    from rich.table import Table

    from agentrft.inputs import InputError
    from agentrft.recipes.demo import run_demo
    from agentrft.train.config import ConfigError

    if seed is not None:
        if agentic:
            typer.echo("error: --agentic takes a stage's seed as --set rl.seed=N (and imitation./late.)", err=True)
            raise typer.Exit(2)
        set_ = [f"seed={seed}", *set_, *([f"ei.seed={seed}"] if expert_iteration else [])]
    if agentic:
        if env or expert_iteration:
            typer.echo("error: --agentic is finqa-lite's recipe; --env/--expert-iteration are not for it", err=True)
            raise typer.Exit(2)
        _agentic(quick, run_dir, list(set_), eval_tasks, eval_samples, as_json, resume)
        return
    if expert_iteration and not env:
        typer.echo("error: --expert-iteration needs --env (the environment to learn)", err=True)
        raise typer.Exit(2)
    if resume:
        typer.echo("error: --resume continues an --agentic recipe (a plain demo is re-run from the start)", err=True)
        raise typer.Exit(2)
    settings = DemoSettings.preset(quick)
    if eval_tasks is not None:
        settings.eval_tasks = eval_tasks
    if eval_samples is not None:
        settings.eval_samples = eval_samples
    run_dir = run_dir or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        result = run_demo(
            run_dir, settings, list(set_), progress=not as_json, env=env, expert_iteration=expert_iteration
        )
    except (ConfigError, InputError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result.summary()))
        return
    title = env or "finqa-lite"
    table = Table(title=f"{title} held-out, before vs after {result.train_steps} training steps")
    for col in ("metric", "before", "after"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for row in result.table_rows():
        table.add_row(*row)
    console = Console()
    console.print(table)
    if env:
        levels = Table(title="pass@1 per level, paired sign-flip test over its tasks")
        for col in ("level", "tasks", "before", "after", "p", "better / worse"):
            levels.add_column(col, justify="right")
        for level, row in result.summary()["per_level"].items():
            levels.add_row(
                level,
                str(row["n_tasks"]),
                f"{row['before']:.3f}",
                f"{row['after']:.3f}",
                f"{row['p_value']:.2g}",
                f"{row['better']} / {row['worse']}",
            )
        console.print(levels)
    ei = (
        f"expert iteration {result.seconds['expert_iteration']:.0f} s, " if "expert_iteration" in result.seconds else ""
    )
    console.print(
        f"wall time {result.seconds['total']:.0f} s "
        f"(baseline eval {result.seconds['eval_baseline']:.0f} s, {ei}training {result.seconds['train']:.0f} s, "
        f"final eval {result.seconds['eval_final']:.0f} s)"
    )
    console.print(f"run dir {run_dir}  ·  report {run_dir / 'report.html'}")


def _agentic(
    quick: bool,
    run_dir: Path | None,
    sets: list[str],
    eval_tasks: int | None,
    eval_samples: int | None,
    as_json: bool,
    resume: bool,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from agentrft.inputs import InputError
    from agentrft.recipes.agentic import run_agentic
    from agentrft.recipes.agentic_settings import AgenticSettings
    from agentrft.train.config import ConfigError

    settings = AgenticSettings.preset(quick)
    if eval_tasks is not None:
        settings.eval_tasks = eval_tasks
    if eval_samples is not None:
        settings.eval_samples = eval_samples
    if resume and run_dir is None:
        typer.echo("error: --resume needs the --run-dir of the recipe to continue", err=True)
        raise typer.Exit(2)
    run_dir = run_dir or Path("runs") / f"agentic-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        settings = settings.with_overrides([item for item in sets if item.startswith("recipe.")])
        sets = [item for item in sets if not item.startswith("recipe.")]
        result = run_agentic(run_dir, settings, sets, progress=not as_json, resume=resume)
    except (ConfigError, InputError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result.summary()))
        return
    table = Table(
        title="finqa-lite pass@1 by level: baseline (its few-shot prompt; baseline-trained-prompt: on the trained "
        "policy's prompt), after imitation, after RL"
    )
    table.add_column("level")
    for s in result.stages():
        table.add_column(s, justify="right")
    for row in result.level_table():
        table.add_row(*row)
    console = Console()
    console.print(table)
    sec = result.seconds
    late = f" + late imitation {sec['imitation_late']:.0f} s" if "imitation_late" in sec else ""
    console.print(
        f"wall time {sec['total']:.0f} s: imitation {sec['imitation']:.0f} s{late} + RL {sec['rl']:.0f} s "
        f"(demonstrations {sec['demos']:.0f} s; evals "
        f"{sum(v for k, v in sec.items() if k.startswith('eval_')):.0f} s)"
    )
    console.print(f"run dir {run_dir}  ·  report {run_dir / 'report.html'}  ·  summary {run_dir / 'agentic.json'}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)

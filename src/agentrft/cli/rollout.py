"""`agentrft rollout`: play tasks of an environment with a policy, grade and record the episodes."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from agentrft.cli.support import fail, open_store


def rollout(
    env_spec: str = typer.Option("finqa-lite:1", "--env", help="Environment spec, e.g. finqa-lite:1,2 or jsonl:PATH."),
    policy: str = typer.Option(
        "smollm2-135m",
        "--policy",
        help="Policy: smollm2-135m, tiny, hf:PATH, openai:MODEL, oracle[:POLICY] (the env's expert).",
    ),
    split: str = typer.Option("train", "--split"),
    num_tasks: int = typer.Option(
        8, "--tasks", min=1, help="How many tasks of the split (the first N, of each level where tasks have levels)."
    ),
    samples: int = typer.Option(1, "--samples", min=1, help="Episodes per task (the GRPO group size)."),
    tool_format: str = typer.Option("xml", "--tool-format", help="xml, hermes, native or pythonic."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Per-turn cap (default: the env's)."),
    concurrency: int = typer.Option(64, "--concurrency", min=1),
    db: Path | None = typer.Option(None, "--db", help="SQLite store to record the episodes in."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary instead of text."),
    seed: int = typer.Option(
        0, "--seed", help="Sampling seed: the same seed gives the same episodes, on an idle or a busy machine."
    ),
) -> None:
    """Run tasks × samples episodes concurrently, grade each with the environment's grader, print a summary."""
    from agentrft.rollout.formats import FORMAT_NAMES

    if tool_format not in FORMAT_NAMES:
        raise fail(f"unknown --tool-format {tool_format!r}; valid: {', '.join(FORMAT_NAMES)}")
    from agentrft.envs.registry import make_env
    from agentrft.samplers.policies import load_policy

    # Errors of the environment spec, its data and the policy name exit 2 (cli.support).
    env = make_env(env_spec)
    from agentrft.eval.harness import select_tasks

    tasks = select_tasks(env.tasks(split), num_tasks)
    if not tasks:
        raise fail(f"environment {env_spec!r} has no tasks in split {split!r}")
    sampler = load_policy(policy, env=env)

    from agentrft.graders import load_grader
    from agentrft.rollout.runner import Runner
    from agentrft.samplers.base import SamplingParams
    from agentrft.types import Run

    store = None
    run = Run(
        name=f"rollout {env_spec} {policy}",
        kind="other",
        status="incomplete",  # until every episode is in: a rollout killed midway says so
        config={
            "env": env_spec,
            "policy": policy,
            "split": split,
            "tasks": len(tasks),
            "samples": samples,
            "tool_format": tool_format,
            "temperature": temperature,
            "seed": seed,
        },
    )
    if db is not None:
        store = open_store(db, create=True)
        store.add_run(run)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens or env.limits.max_tokens_per_turn)
    runner = Runner(
        env,
        sampler,
        store=store,
        grader=load_grader(env.grader_spec()),
        tool_format=tool_format,
        params=params,
        max_concurrency=concurrency,
        progress=not as_json,
        seed=seed,
    )
    try:
        runner.run_sync(tasks, samples, run_id=run.id)
        if store is not None:
            store.update_run(run.model_copy(update={"status": "complete"}))
    finally:
        if store is not None:
            store.close()
    s = runner.stats
    summary = {
        "run_id": run.id,
        "episodes": s.episodes,
        "statuses": s.statuses,
        "mean_reward": s.mean_reward,
        "grader_errors": s.grader_errors,
        "generated_tokens": s.generated_tokens,
        "tokens_per_s": round(s.tokens_per_s, 1),
        "tool_calls": s.tool_calls,
        "seconds": round(s.elapsed_s, 2),
        "store_errors": s.store_errors,
        "db": str(db) if db else None,
    }
    if as_json:
        typer.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        typer.echo(f"{key:17} {value}")


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout)

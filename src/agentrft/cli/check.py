"""`agentrft check`: is reinforcement fine-tuning worth it for this environment and policy?"""

from __future__ import annotations

from pathlib import Path

import typer

from agentrft.cli.support import open_store, user_errors


def check_command(
    env: str = typer.Option(..., "--env", help="Environment spec, e.g. finqa-lite:1."),
    policy: str = typer.Option("smollm2-135m", "--policy", help="smollm2-135m | tiny | hf:PATH | openai:MODEL"),
    samples: int = typer.Option(8, "--samples", min=2, help="Samples per task (k)."),
    tasks: int = typer.Option(
        20, "--tasks", min=1, help="Number of tasks (the first M of the split, of each level where tasks have levels)."
    ),
    split: str = typer.Option("train", "--split", help="train | held-out | ood"),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0),
    db: Path | None = typer.Option(None, "--db", help="Keep the sampled trajectories in this store."),
    as_json: bool = typer.Option(False, "--json", help="Print the CheckResult as JSON."),
    seed: int = typer.Option(
        0, "--seed", help="Sampling seed: the same seed gives the same episodes, on an idle or a busy machine."
    ),
) -> None:
    """Baseline success (Wilson CI), solved-at-least-once, guessability, grader determinism, reward skew → verdict."""
    with user_errors():
        from agentrft.envs.registry import make_env
        from agentrft.eval.check import check
        from agentrft.samplers.base import SamplingParams
        from agentrft.samplers.policies import load_policy

        environment = make_env(env)
        sampler = load_policy(policy, env=environment)
        params = SamplingParams(temperature=temperature, max_tokens=environment.limits.max_tokens_per_turn)
        store = open_store(db, create=True) if db is not None else None
        try:
            res = check(
                environment,
                sampler,
                samples=samples,
                tasks=tasks,
                split=split,
                store=store,
                params=params,
                env_spec=env,
                progress=not as_json,
                seed=seed,
            )
        finally:
            if store is not None:
                store.close()
    if as_json:
        typer.echo(res.model_dump_json(indent=2))
        return
    lo, hi = res.success_ci
    typer.echo(f"{res.env} · {res.policy} · {res.n_tasks} tasks × {res.samples_per_task} samples")
    typer.echo(f"  success rate          {res.success_rate:.1%}  (95% Wilson CI {lo:.1%}–{hi:.1%})")
    typer.echo(f"  solved at least once  {res.solved_at_least_once:.1%} of tasks")
    typer.echo("  guessability          " + ", ".join(f"{k} {v:.0%}" for k, v in res.guessability.items()))
    typer.echo(f"  grader agreement      {res.grader_agreement:.0%} of {res.n_regraded} re-graded twice")
    typer.echo(f"  grader error rate     {res.grader_error_rate:.1%}")
    typer.echo(f"  rewards at min / max  {res.reward_at_min:.0%} / {res.reward_at_max:.0%}")
    typer.echo(f"  zero-variance groups  {res.zero_variance_groups:.0%}")
    typer.echo(f"verdict: {res.verdict}")
    for reason in res.reasons:
        typer.echo(f"  - {reason}")


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)

"""`agentrft replay`: branch a stored episode at a turn and sample a policy's continuations from there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agentrft.cli.support import DEFAULT_DB, fail, open_store, user_errors

_SPLITS = ("train", "held-out", "ood")


def _env_spec(run: Any) -> str | None:
    """The environment spec a stored run played (rollout and eval runs: ``env``; training runs: ``rollout.env``)."""
    config = run.config or {}
    spec = config.get("env") or (config.get("rollout") or {}).get("env")
    return spec if isinstance(spec, str) else None


def replay(
    traj_id: str = typer.Option(..., "--traj", help="The trajectory to branch (id or unique id prefix)."),
    turn: int = typer.Option(..., "--turn", min=0, help="The turn to sample again (0 = the first assistant turn)."),
    policy: str = typer.Option(
        "smollm2-135m", "--policy", help="The policy that continues: smollm2-135m, tiny, hf:PATH."
    ),
    samples: int = typer.Option(4, "--samples", min=1, help="Continuations (one group)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="The store holding the trajectory; the branches go there too."),
    env: str | None = typer.Option(
        None, "--env", help="Environment spec (default: the one the trajectory's run played)."
    ),
    tool_format: str | None = typer.Option(None, "--tool-format", help="Default: the trajectory's run's."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Rebuild a stored episode token-exactly up to --turn (tool results from the record), sample --samples
    continuations of --policy from there, grade them and store them as a group linked to the original."""
    with user_errors():
        from agentrft.envs.registry import make_env
        from agentrft.graders import load_grader
        from agentrft.rollout.replay import branch, prefix_of
        from agentrft.samplers.base import SamplingParams
        from agentrft.samplers.policies import load_policy
        from agentrft.types import Run

        store = open_store(db)
        try:
            parent = store.get_trajectory(traj_id)
            prefix_of(parent, turn)  # a turn it cannot be cut at is refused before any model loads
            run = store.get_run(parent.run_id) if store.has_run(parent.run_id) else None
            spec = env or (_env_spec(run) if run is not None else None)
            if spec is None:
                raise fail(f"trajectory {parent.id}'s run names no environment: pass --env SPEC")
            environment = make_env(spec)
            task = next((t for s in _SPLITS for t in _tasks(environment, s) if t.id == parent.task_id), None)
            if task is None:
                raise fail(f"environment {spec!r} has no task {parent.task_id!r} (the trajectory's)")
            fmt = tool_format or ((run.config or {}).get("tool_format") if run is not None else None) or "xml"
            if policy.startswith("openai:"):
                raise fail(
                    f"--policy {policy!r}: replay continues a token record, so it needs a policy in this process"
                )
            sampler: Any = load_policy(policy, env=environment)
            if hasattr(sampler, "reseed"):
                sampler.reseed(seed)
            new = Run(
                name=f"replay {parent.id[:8]} turn {turn}",
                kind="other",
                config={"env": spec, "policy": policy, "branch_of": parent.id, "turn": turn, "tool_format": fmt},
            )
            store.add_run(new)
            params = SamplingParams(temperature=temperature, max_tokens=environment.limits.max_tokens_per_turn)
            grader = load_grader(environment.grader_spec())
            trajs = asyncio.run(
                branch(
                    environment, sampler, parent, task, turn, samples,
                    params=params, tool_format=fmt, grader=grader, store=store, run_id=new.id,
                )
            )  # fmt: skip
        finally:
            store.close()
    summary: dict[str, Any] = {
        "parent": parent.id,
        "parent_reward": parent.grade.reward if parent.grade else None,
        "turn": turn,
        "run_id": new.id,
        "group_id": trajs[0].group_id,
        "branches": [
            {"id": t.id, "status": t.status, "reward": t.grade.reward if t.grade else None, "answer": t.final_answer}
            for t in trajs
        ],
    }
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(f"parent {parent.id} (reward {summary['parent_reward']}), branched at turn {turn} -> run {new.id}")
    for b in summary["branches"]:
        typer.echo(f"  {b['id']}  {b['status']:10}  reward {b['reward']}  answer {b['answer']!r}")


def _tasks(env: Any, split: str) -> list[Any]:
    from agentrft.inputs import InputError

    try:
        return list(env.tasks(split))
    except InputError:
        return []


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)

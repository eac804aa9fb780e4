"""`agentrft eval`: evaluate a policy on an environment's held-out tasks, or compare two eval runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from agentrft.cli.support import DEFAULT_DB, eval_result_of, fail, open_store, user_errors
from agentrft.eval.harness import LOCAL_COMPUTE_USD_PER_HOUR


def _print_result(res: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"eval {res.run_name or res.run_id} · {res.env} · {res.policy} · split {res.split}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("tasks × samples", f"{res.n_tasks} × {res.samples_per_task}"),
        ("success rate", f"{res.success_rate:.1%}"),
        *((f"pass@{k}", f"{v:.1%}") for k, v in res.pass_at_k.items()),
        *((f"pass^{k}", f"{v:.1%}") for k, v in res.pass_hat_k.items()),
        ("mean reward [95% CI]", f"{res.mean_reward:.3f} [{res.reward_ci[0]:.3f}, {res.reward_ci[1]:.3f}]"),
        ("tool calls / episode", f"{res.tools.calls_per_episode:.2f}"),
        ("tool error rate", f"{res.tools.error_rate:.1%}"),
        ("tokens / episode", f"{res.usage.tokens_per_episode:,.0f}"),
        ("latency s / episode", f"{res.usage.latency_s_mean:.2f}"),
        ("tokens / success", "–" if res.cost.tokens_per_success is None else f"{res.cost.tokens_per_success:,.0f}"),
        ("seconds / success", "–" if res.cost.seconds_per_success is None else f"{res.cost.seconds_per_success:.2f}"),
    ]
    if res.cost.usd_per_success is not None:
        rate = res.cost.compute_per_hour
        basis = f" (compute ${rate:g}/h × {res.cost.wall_seconds:.0f} s)" if rate else ""
        rows.append((f"USD / success{basis}", f"{res.cost.usd_per_success:.6f}"))
    rows += [(f"failures: {k}", str(v)) for k, v in res.failures.items() if v]
    rows += [(f"level {k}", f"{b.success_rate:.1%} of {b.n_samples}") for k, b in res.per_level.items()]
    if res.n_ungraded:
        rows.append(("ungraded trajectories", str(res.n_ungraded)))
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    typer.echo(f"run id: {res.run_id}")


def _print_robustness(rows: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="robustness to tool faults (the same tasks and sampling seed)")
    for col in ("faults", "pass@1", "episodes", "hit by a fault", "recovered", "recovery rate"):
        table.add_column(col, justify="left" if col == "faults" else "right")
    for r in rows:
        rate = "–" if r.recovery_rate is None else f"{r.recovery_rate:.1%}"
        table.add_row(r.faults, f"{r.pass_at_1:.1%}", str(r.episodes), str(r.hit), str(r.recovered), rate)
    Console().print(table)


def _compare(db: Path, run_a: str, run_b: str, as_json: bool) -> None:
    from agentrft.eval.metrics import paired_test

    store = open_store(db)
    try:
        a, b = store.find_run(run_a), store.find_run(run_b)
        ra, rb = eval_result_of(store, a), eval_result_of(store, b)
    finally:
        store.close()
    cmp = paired_test(ra.task_rates(), rb.task_rates())
    out = {
        "run_a": {"id": a.id, "name": a.name, "success_rate": ra.success_rate, "mean_reward": ra.mean_reward},
        "run_b": {"id": b.id, "name": b.name, "success_rate": rb.success_rate, "mean_reward": rb.mean_reward},
        "comparison": cmp.model_dump(mode="json"),
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(f"A = {a.name or a.id} ({a.id}): per-task success {cmp.mean_a:.1%}")
    typer.echo(f"B = {b.name or b.id} ({b.id}): per-task success {cmp.mean_b:.1%}")
    typer.echo(
        f"B - A on {cmp.n_tasks} shared tasks: {cmp.diff:+.1%} (95% CI {cmp.ci[0]:+.1%} to {cmp.ci[1]:+.1%}), "
        f"p = {cmp.p_value:.3g} [{cmp.method}]"
    )
    typer.echo(
        f"B better on {cmp.wins_b} tasks, worse on {cmp.wins_a}, tied on {cmp.ties}"
        + (f"; {cmp.only_in_a} tasks only in A, {cmp.only_in_b} only in B" if cmp.only_in_a or cmp.only_in_b else "")
    )


def _command_agent(agent: Any, env: Any, sampler: Any, params: Any) -> Any:
    """The agent program as the episode player, served `sampler` (an in-process policy) within its context."""
    from agentrft.rollout.agent_command import CommandAgent
    from agentrft.rollout.serve_request import ServeLimits
    from agentrft.samplers.base import is_token_sampler
    from agentrft.samplers.inprocess import InProcessPolicy

    if not is_token_sampler(sampler):
        raise fail(f"--agent-command needs an in-process --policy (one that returns token ids), not {sampler.policy!r}")
    context = sampler.max_positions if isinstance(sampler, InProcessPolicy) else None
    return CommandAgent(agent, env, sampler, params=params, limits=ServeLimits(context_tokens=context))


def eval_command(
    env: str | None = typer.Option(None, "--env", help="Environment spec, e.g. finqa-lite:1 or finqa-lite:1,2."),
    policy: str = typer.Option(
        "smollm2-135m", "--policy", help="smollm2-135m | tiny | hf:PATH | openai:MODEL | oracle[:POLICY]"
    ),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task (pass@k for every k up to this)."),
    tasks: int | None = typer.Option(
        None, "--tasks", min=1, help="Only the first M tasks of the split (of each level, where tasks have levels)."
    ),
    split: str = typer.Option("held-out", "--split", help="train | held-out | ood"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="SQLite store file (created if missing)."),
    name: str = typer.Option("eval", "--name", help="Run name (e.g. baseline, final)."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature (0 = greedy)."),
    prompt_price: float | None = typer.Option(None, "--price-prompt", min=0.0, help="USD per million prompt tokens."),
    completion_price: float | None = typer.Option(
        None, "--price-completion", min=0.0, help="USD per million completion tokens."
    ),
    compute_price: float | None = typer.Option(
        None,
        "--compute-usd-per-hour",
        min=0.0,
        help=(
            "USD per hour of the run's wall time (default for in-process policies: "
            f"{LOCAL_COMPUTE_USD_PER_HOUR:g}, about a 2-vCPU cloud VM; 0 to leave compute unpriced)."
        ),
    ),
    compare: tuple[str, str] | None = typer.Option(
        None, "--compare", help="Compare two eval runs: RUN_A RUN_B (ids or names); prints B - A with a paired test."
    ),
    agent_command: str | None = typer.Option(
        None,
        "--agent-command",
        help="Evaluate an agent program instead of the built-in loop, e.g. 'python my_agent.py': one run per "
        "episode with the task on stdin and OPENAI_BASE_URL/OPENAI_API_KEY set to a session of an in-process "
        "server over --policy; its stdout is the final answer.",
    ),
    agent_timeout: float = typer.Option(600.0, "--agent-timeout", min=1.0, help="Seconds per agent run."),
    agent_concurrency: int = typer.Option(8, "--agent-concurrency", min=1, help="Agent runs at once."),
    precision: str = typer.Option(
        "fp32",
        "--precision",
        help="In-process policies: the engine's compute, fp32, bf16 or auto (bf16 autocast and KV: about half the "
        "memory and prefill time on a CPU that multiplies bf16 natively, ~3x slower elsewhere; auto picks bf16 "
        "on such a CPU only).",
    ),
    tool_format: str = typer.Option(
        "xml",
        "--tool-format",
        help="How tool calls look in the model's text: xml (one call per turn), hermes (<tool_call> JSON, several "
        "per turn), native (the chat template's tools) or pythonic ([f(a=1), g(b=2)]).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the EvalResult (or comparison) as JSON."),
    faults: list[str] = typer.Option(
        [],
        "--faults",
        help="Also evaluate under seeded tool faults (repeatable), e.g. --faults error=0.1 --faults error=0.3: "
        "pass@1 and the recovery rate beside the clean eval's (envs/faults.py lists the kinds).",
    ),
    seed: int = typer.Option(
        0, "--seed", help="Sampling seed: the same seed gives the same episodes, on an idle or a busy machine."
    ),
) -> None:
    """Evaluate a policy: pass@k, pass^k, reward CI, tool use, cost per success, failure categories."""
    if compare is not None and all(compare):
        with user_errors():
            _compare(db, compare[0], compare[1], as_json)
        return
    if env is None:
        raise fail("pass --env ENV (or --compare RUN_A RUN_B)", 2)
    if (prompt_price is None) != (completion_price is None):
        raise fail("pass both --price-prompt and --price-completion, or neither", 2)
    with user_errors():
        from agentrft.envs.registry import make_env
        from agentrft.eval.harness import Prices, evaluate
        from agentrft.samplers.base import SamplingParams

        environment = make_env(env)
        agent = None if agent_command is None else _agent(agent_command, agent_timeout, agent_concurrency)
        sampler = _sampler(policy, environment, tool_format, precision)
        params = SamplingParams(temperature=temperature, max_tokens=environment.limits.max_tokens_per_turn)
        player = None if agent is None else _command_agent(agent, environment, sampler, params)
        prices = None
        if prompt_price is not None or compute_price is not None:
            prices = Prices(
                prompt_per_mtok=prompt_price or 0.0,
                completion_per_mtok=completion_price or 0.0,
                compute_per_hour=compute_price or 0.0,
            )
        specs: list[Any] = []
        if faults:
            from agentrft.envs.faults import FaultSpec

            specs = [FaultSpec.parse(f) for f in faults]  # a bad spec is refused before the store or any episode
        store = open_store(db, create=True)
        rows: list[Any] | None = None
        try:
            how: dict[str, Any] = dict(
                split=split,
                samples=samples,
                tasks=tasks,
                store=store,
                run_name=name,
                params=params,
                prices=prices,
                env_spec=env,
                progress=not as_json,
                player=player,
                agent_command=agent_command,
                tool_format=tool_format,
                seed=seed,
                sampling_seed=seed,
            )
            if specs:
                from agentrft.eval.robustness import evaluate_robustness

                res, rows = evaluate_robustness(environment, sampler, specs=specs, **how)
            else:
                res = evaluate(environment, sampler, **how)
        finally:
            store.close()
    if as_json:
        if rows is None:
            typer.echo(res.model_dump_json(indent=2))
        else:
            robust = [r.model_dump() | {"recovery_rate": r.recovery_rate} for r in rows]
            typer.echo(json.dumps({**res.model_dump(mode="json"), "robustness": robust}, indent=2))
    else:
        _print_result(res)
        if rows is not None:
            _print_robustness(rows)


def _agent(command: str, timeout_s: float, concurrency: int) -> Any:
    """``--agent-command``'s config, its program checked before any model loads."""
    from pydantic import ValidationError

    from agentrft.inputs import first_problem
    from agentrft.rollout.agent_command import AgentCommandConfig

    try:
        agent = AgentCommandConfig(command=command, timeout_s=timeout_s, max_concurrency=concurrency)
    except ValidationError as exc:
        raise fail(f"--agent-command: {first_problem(exc).message}", 2) from None
    if (why := agent.missing_program()) is not None:
        raise fail(f"--agent-command: {why}", 2)
    return agent


def _sampler(policy: str, environment: Any, tool_format: str, precision: str) -> Any:
    """The policy to evaluate, its options checked first. An eval trains nothing: an in-process engine stores
    its weights as it computes them (samplers/frozen.py)."""
    from agentrft.precision import PRECISIONS
    from agentrft.rollout.formats import FORMAT_NAMES
    from agentrft.samplers.policies import is_in_process, load_policy

    if tool_format not in FORMAT_NAMES:
        raise fail(f"--tool-format: expected one of {', '.join(FORMAT_NAMES)}, got {tool_format!r}", 2)
    if precision not in PRECISIONS:
        raise fail(f"--precision: expected auto, fp32 or bf16, got {precision!r}", 2)
    if precision != "fp32" and not is_in_process(policy):
        raise fail(f"--precision: applies to in-process policies only, not {policy!r}", 2)
    kw: dict[str, Any] = {"frozen": True} if is_in_process(policy) else {}
    if precision != "fp32":
        kw["precision"] = precision
    return load_policy(policy, env=environment, **kw)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)

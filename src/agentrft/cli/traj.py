"""`agentrft traj …`: list, show, export and import the trajectories of a store.

Thin over `agentrft.store.Store`. Errors print one line on stderr and exit 2
(bad usage, bad data, unknown id) or 1 (a failure while running, e.g. a full
disk); never a traceback (`cli.support`). A rejected import writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from agentrft.cli.support import DEFAULT_DB, fail, open_store

_SHOW_LIMIT = 2000  # characters of one tool result / message shown unless --full

traj_app = typer.Typer(help="Inspect, export and import recorded trajectories.", no_args_is_help=True)

_db_opt = typer.Option(DEFAULT_DB, "--db", help="SQLite store file.")
_json_opt = typer.Option(False, "--json", help="Print JSON for machines instead of a rendering for people.")


def _filters(
    run: str | None, task: str | None, group: str | None, policy_version: int | None,
    min_reward: float | None, max_reward: float | None, status: str | None,
) -> dict[str, Any]:  # fmt: skip
    return dict(
        run_id=run, task_id=task, group_id=group, policy_version=policy_version,
        min_reward=min_reward, max_reward=max_reward, status=status,
    )  # fmt: skip


# Shared filter options of `list` and `export`.
_run_opt = typer.Option(None, "--run", help="Only this run id.")
_task_opt = typer.Option(None, "--task", help="Only this task id.")
_group_opt = typer.Option(None, "--group", help="Only this group id.")
_pv_opt = typer.Option(None, "--policy-version", min=0, max=2**63 - 1, help="Only this policy version.")
_min_opt = typer.Option(None, "--min-reward", help="Only graded trajectories with reward >= X.")
_max_opt = typer.Option(None, "--max-reward", help="Only graded trajectories with reward <= X.")
_status_opt = typer.Option(None, "--status", help="completed | max_turns | truncated | timeout | error")


def _summary(t: Any) -> dict[str, Any]:
    return {
        "id": t.id, "run_id": t.run_id, "task_id": t.task_id, "group_id": t.group_id,
        "policy_version": t.policy_version, "status": t.status, "reward": t.reward,
        "success": None if t.grade is None else t.grade.success, "turns": t.num_turns,
        "tool_calls": len(t.tool_calls), "tokens": None if t.tokens is None else len(t.tokens.ids),
        "created_at": t.created_at,
    }  # fmt: skip


def _console() -> Any:
    import sys

    from rich.console import Console

    # Piped or captured output is not wrapped at 80 columns: ids and tables stay whole for grep.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@traj_app.command("list")
def list_cmd(
    db: Path = _db_opt,
    run: str | None = _run_opt,
    task: str | None = _task_opt,
    group: str | None = _group_opt,
    policy_version: int | None = _pv_opt,
    min_reward: float | None = _min_opt,
    max_reward: float | None = _max_opt,
    status: str | None = _status_opt,
    limit: int = typer.Option(50, "--limit", min=1, help="Show the N most recent matches (oldest first)."),
    as_json: bool = _json_opt,
) -> None:
    """List trajectories: id, run, task, group, status, reward, turns, tool calls."""
    from rich.table import Table

    filters = _filters(run, task, group, policy_version, min_reward, max_reward, status)
    with open_store(db) as store:
        total = store.count_trajectories(**filters)
        trajs = store.query_trajectories(**filters, limit=limit, offset=max(0, total - limit))
    rows = [_summary(t) for t in trajs]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(caption=f"{len(rows)} of {total} trajectories" if total > len(rows) else None)
    for name in ("id", "run", "task", "group", "v", "status", "reward", "turns", "tools", "tokens", "created"):
        right = name in ("v", "reward", "turns", "tools", "tokens")
        table.add_column(name, justify="right" if right else "left", no_wrap=name in ("id", "created"))
    for r in rows:
        reward = "-" if r["reward"] is None else f"{r['reward']:.3f}"
        status_style = "" if r["status"] == "completed" else "yellow"
        table.add_row(
            r["id"], r["run_id"], r["task_id"], r["group_id"], str(r["policy_version"]),
            f"[{status_style}]{r['status']}[/]" if status_style else r["status"], reward, str(r["turns"]),
            str(r["tool_calls"]), "-" if r["tokens"] is None else str(r["tokens"]), _time(r["created_at"]),
        )  # fmt: skip
    _console().print(table)


@traj_app.command("show")
def show_cmd(
    traj_id: str = typer.Argument(..., metavar="ID", help="Trajectory id or a unique prefix of it."),
    db: Path = _db_opt,
    as_json: bool = _json_opt,
    full: bool = typer.Option(False, "--full", help=f"Do not shorten texts longer than {_SHOW_LIMIT} characters."),
) -> None:
    """Show one trajectory turn by turn: messages, tool calls and results, final answer, grade."""
    with open_store(db) as store:
        traj = store.get_trajectory(traj_id)
    if as_json:
        typer.echo(traj.to_json())
        return
    _console().print(_render(traj, None if full else _SHOW_LIMIT))


def _check_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise fail(f"{path}: the file name must end in .jsonl or .parquet", code=2)
    return suffix[1:]


@traj_app.command("export")
def export_cmd(
    out: Path = typer.Argument(..., metavar="OUT", help="Output file, .jsonl or .parquet."),
    db: Path = _db_opt,
    run: str | None = _run_opt,
    task: str | None = _task_opt,
    group: str | None = _group_opt,
    policy_version: int | None = _pv_opt,
    min_reward: float | None = _min_opt,
    max_reward: float | None = _max_opt,
    status: str | None = _status_opt,
) -> None:
    """Export matching trajectories (full records) to JSONL or Parquet."""
    fmt = _check_suffix(out)
    filters = _filters(run, task, group, policy_version, min_reward, max_reward, status)
    with open_store(db) as store:
        export: Callable[..., int] = store.export_jsonl if fmt == "jsonl" else store.export_parquet
        n = export(out, **filters)
    typer.echo(f"exported {n} trajectories to {out}")


@traj_app.command("import")
def import_cmd(
    src: Path = typer.Argument(..., metavar="IN", help="Input file, .jsonl or .parquet."),
    db: Path = _db_opt,
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip bad records (listed on stderr) instead of stopping."),
    chat_logs: bool = typer.Option(False, "--chat-logs", help='IN is JSONL of OpenAI chat logs {"messages": [...]}.'),
    run: str | None = typer.Option(None, "--run", help="Put the trajectories in this run (created if new)."),
    as_json: bool = _json_opt,
) -> None:
    """Import trajectories (all or nothing unless --skip-bad)."""
    fmt = _check_suffix(src)
    chat_run: str | None = None  # the run that chat logs go to (set exactly when --chat-logs)
    if chat_logs:
        if fmt != "jsonl" or not run:
            raise fail("--chat-logs reads a .jsonl file and needs --run NAME", code=2)
        chat_run = run
    if not src.is_file():
        raise fail(f"{src}: no such file")
    new_store = not db.exists()
    try:
        with open_store(db, create=True) as store:
            if chat_run is not None:
                report = store.import_chat_logs(src, run_id=chat_run, skip_bad=skip_bad)
            elif fmt == "jsonl":
                report = store.import_jsonl(src, skip_bad=skip_bad, run_id=run)
            else:
                report = store.import_parquet(src, skip_bad=skip_bad, run_id=run)
    except Exception:
        if new_store:  # a refused import leaves no empty store behind either
            for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                path.unlink(missing_ok=True)
        raise
    if as_json:
        typer.echo(report.model_dump_json(exclude={"ids"}))
        return
    for problem in report.problems[:20]:
        typer.echo(f"skipped: {problem.message}", err=True)
    if len(report.problems) > 20:
        typer.echo(f"skipped: ... and {len(report.problems) - 20} more", err=True)
    typer.echo(report.summary())


# ---------------------------------------------------------------- rendering of `show`


def _clip(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + f" … [{len(text) - max_chars} more characters, --full shows all]"


def _render(traj: Any, max_chars: int | None) -> Any:
    """A rich renderable of one trajectory. Model text goes in `Text` objects, never markup,
    so brackets in it cannot be taken for rich styles."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    from agentrft.types import ReasoningEvent, ToolCallEvent

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    tokens = "none (no token record)"
    if traj.tokens is not None:
        tokens = f"{len(traj.tokens.ids)} ({traj.tokens.num_sampled} sampled)"
    status = Text(traj.status, style="green" if traj.status == "completed" else "yellow")
    if traj.error:
        status.append(f"  {traj.error}", style="red")
    for key, value in (
        ("id", traj.id), ("run", traj.run_id), ("task", traj.task_id), ("group", traj.group_id),
        ("env", f"{traj.env.name} v{traj.env.version}"), ("policy", f"{traj.policy} (version {traj.policy_version})"),
        ("created", _time(traj.created_at)), ("turns", str(traj.num_turns)), ("tokens", tokens),
    ):  # fmt: skip
        head.add_row(key, Text(value))
    head.add_row("status", status)
    parts: list[Any] = [head]

    events = [e for e in traj.events if isinstance(e, ToolCallEvent)]
    by_call_id = {e.call_id: e for e in events if e.call_id}
    tool_msgs = {m.tool_call_id: m.text() for m in traj.messages if m.role == "tool" and m.tool_call_id}
    shown_calls: set[str] = set()
    turn = -1
    for i, msg in enumerate(traj.messages):
        if msg.role == "assistant" and i < traj.n_prompt_messages:
            # a turn the prompt gave (a worked example, earlier history): its calls' results are its tool
            # messages, no episode event is its; one rule over each run of them
            if i == 0 or traj.messages[i - 1].role not in ("assistant", "tool"):
                parts.append(Rule("given in the prompt", style="dim"))
            if msg.text():
                parts.append(Text.assemble(("assistant: ", "bold"), _clip(msg.text(), max_chars)))
            for call in msg.tool_calls or []:
                shown_calls.add(call.id)
                parts.append(_render_call(call, None, tool_msgs.get(call.id), max_chars))
        elif msg.role == "assistant":
            turn += 1
            parts.append(Rule(f"turn {turn}", style="blue"))
            reasoning = msg.reasoning_content or "\n".join(
                e.text for e in traj.events if isinstance(e, ReasoningEvent) and e.turn == turn
            )
            if reasoning:
                parts.append(Text(_clip(reasoning, max_chars), style="dim italic"))
            if msg.text():
                parts.append(Text.assemble(("assistant: ", "bold"), _clip(msg.text(), max_chars)))
            turn_events = [e for e in events if e.turn == turn]
            for k, call in enumerate(msg.tool_calls or []):
                event = by_call_id.get(call.id) or (turn_events[k] if k < len(turn_events) else None)
                shown_calls.add(call.id)
                parts.append(_render_call(call, event, tool_msgs.get(call.id), max_chars))
        elif msg.role == "tool" and msg.tool_call_id in shown_calls:
            continue  # already shown under its call
        else:
            style = {"user": "bold cyan", "tool": "bold magenta"}.get(msg.role, "bold dim")
            parts.append(Text.assemble((f"{msg.role}: ", style), _clip(msg.text(), max_chars)))

    if traj.final_answer is not None:
        parts.append(Panel(Text(_clip(traj.final_answer, max_chars)), title="final answer", border_style="green"))
    parts.append(_render_grade(traj.grade))
    return Group(*parts)


def _render_call(call: Any, event: Any, tool_msg: str | None, max_chars: int | None) -> Any:
    from rich.text import Text

    args: Any = call.function.arguments
    if event is not None:
        args = event.arguments
    args_text = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else str(args)
    line = Text.assemble(("  → ", "bold"), (call.function.name, "bold yellow"), "(", _clip(args_text, max_chars), ")")
    if event is not None and event.latency_s:
        line.append(f"  {event.latency_s * 1000:.0f} ms", style="dim")
    out = [line]
    if event is not None and event.error is not None:
        kind = f" ({event.error_kind})" if event.error_kind else ""
        out.append(Text(f"    error{kind}: {_clip(event.error, max_chars)}", style="red"))
    else:
        result = event.result if event is not None and event.result is not None else tool_msg
        out.append(Text("    ← ") + Text(_clip(result if result is not None else "(no result)", max_chars)))
    if event is not None and event.truncated:
        out.append(Text("    [result truncated by the tool output cap]", style="yellow"))
    return Text("\n").join(out)


def _render_grade(grade: Any) -> Any:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    if grade is None:
        return Text("not graded", style="dim")
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("reward", Text(f"{grade.reward:.4g}", style="green" if grade.success else "red"))
    table.add_row("success", str(grade.success))
    for name, value in grade.sub_rewards.items():
        table.add_row(f"  {name}", "None" if value is None else f"{value:.4g}")
    if grade.turn_rewards is not None:
        table.add_row("turn rewards", ", ".join(f"{r:.3g}" for r in grade.turn_rewards))
    for err in grade.errors:
        table.add_row(Text("error", style="red"), Text(f"{err.flag} [{err.grader}] {err.message}", style="red"))
    c = grade.cost
    cost = f"{c.prompt_tokens} prompt + {c.completion_tokens} completion tokens, {c.tool_calls} tool calls, {c.seconds:.2f} s"
    if c.usd is not None:
        cost += f", ${c.usd:.4f}"
    table.add_row("cost", cost)
    return Panel(table, title=f"grade ({grade.grader})" if grade.grader else "grade", border_style="blue")


def register(app: typer.Typer) -> None:
    app.add_typer(traj_app, name="traj")

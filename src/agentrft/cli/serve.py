"""`agentrft serve`: an OpenAI-compatible endpoint over a local policy that records what it serves."""

from __future__ import annotations

import ipaddress
import signal
from pathlib import Path
from types import FrameType

import typer


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


# ServeLimits fields --limit may set: the rest have their own flags (--max-tokens, --max-tokens-limit,
# --max-body-bytes) or come from the model (context_tokens)
LIMIT_KEYS = (
    "max_json_depth",
    "max_n",
    "max_session_requests",
    "max_sessions",
    "max_connections",
    "header_timeout_s",
    "body_timeout_s",
    "max_session_bytes",
    "session_idle_s",
)


def parse_limits(pairs: list[str]) -> dict[str, str]:
    """--limit KEY=VALUE pairs as a dict; a malformed pair or unknown key is a ValueError naming it."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise ValueError(f"--limit {pair!r}: expected KEY=VALUE, e.g. max_sessions=100")
        if key not in LIMIT_KEYS:
            raise ValueError(f"--limit {pair!r}: unknown key {key!r}; valid: {', '.join(LIMIT_KEYS)}")
        values[key] = value.strip()
    return values


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def serve(
    policy: str = typer.Option(
        "smollm2-135m", "--policy", help="In-process policy: smollm2-135m, tiny, hf:PATH_OR_ID."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to bind; the default is reachable from this machine only. Any other needs --api-key.",
    ),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    api_key: str | None = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on every request."),
    db: Path = typer.Option(Path("agentrft-serve.db"), "--db", help="SQLite store that records each completion."),
    tool_format: str = typer.Option(
        "xml", "--tool-format", help="How tool calls are written: xml, hermes, native, pythonic."
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="Default max_tokens when a request sets none."),
    max_tokens_limit: int = typer.Option(
        4096, "--max-tokens-limit", min=1, help="Largest max_tokens a request may ask for; more is a 400."
    ),
    max_body_bytes: int = typer.Option(
        2 * 1024 * 1024, "--max-body-bytes", min=1024, help="Largest request body; more is a 413, unread."
    ),
    limit: list[str] = typer.Option(
        [],
        "--limit",
        help="Another server limit as KEY=VALUE (repeatable), e.g. --limit max_sessions=100 --limit "
        "session_idle_s=600: " + ", ".join(LIMIT_KEYS) + ".",
    ),
    shutdown_timeout: int = typer.Option(
        5,
        "--shutdown-timeout",
        min=0,
        help="On SIGTERM/SIGINT, seconds in-flight requests may still finish (and be recorded); the rest get 503.",
    ),
) -> None:
    """Serve POST /v1/chat/completions and GET /v1/models; each completion becomes a trajectory in --db.

    Sessions: a client whose base URL is /v1/sessions/ID (or that sends X-Agentrft-Session: ID) plays one
    episode; POST /v1/sessions/ID/end records it as one trajectory (open sessions are recorded at shutdown)."""
    from agentrft.rollout.formats import FORMAT_NAMES

    if api_key is not None and not api_key.strip():
        typer.echo("error: --api-key is empty", err=True)
        raise typer.Exit(2)
    if not is_loopback(host):
        if api_key is None:
            typer.echo(
                f"error: --host {host} is reachable from other machines; set --api-key KEY (or bind 127.0.0.1)",
                err=True,
            )
            raise typer.Exit(2)
        typer.echo(
            f"warning: serving on {host}, reachable from other machines: requests need the API key, "
            "but traffic is plain HTTP (put a TLS proxy in front)",
            err=True,
        )
    if tool_format not in FORMAT_NAMES:
        typer.echo(f"error: unknown --tool-format {tool_format!r}; valid: {', '.join(FORMAT_NAMES)}", err=True)
        raise typer.Exit(2)
    if max_tokens > max_tokens_limit:
        typer.echo(f"error: --max-tokens {max_tokens} exceeds --max-tokens-limit {max_tokens_limit}", err=True)
        raise typer.Exit(2)
    from pydantic import ValidationError

    from agentrft.inputs import first_problem
    from agentrft.rollout.serve_request import ServeLimits

    try:  # every bad value named before the store opens or the model loads
        extra = parse_limits(limit)
        flags = {
            "default_max_tokens": max_tokens,
            "max_tokens_limit": max_tokens_limit,
            "max_body_bytes": max_body_bytes,
        }
        limits = ServeLimits.model_validate({**extra, **flags})
    except ValidationError as err:  # the flags' own bounds are typer's, so the bad value is a --limit's
        p = first_problem(err)  # ServeLimits is flat: the field is the key
        typer.echo(f"error: --limit {p.field}={extra.get(p.field, '')}: {p.message}", err=True)
        raise typer.Exit(2) from None
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        typer.echo("error: serving needs the 'serve' extra: pip install 'agentrft[serve]'", err=True)
        raise typer.Exit(1) from None
    from agentrft.cli.support import open_store
    from agentrft.samplers.base import is_token_sampler
    from agentrft.samplers.policies import PolicyError, load_policy

    store = open_store(db, create=True)  # a file that is not a store: exit 2 before the model loads
    try:
        sampler = load_policy(policy)
    except (PolicyError, OSError) as err:
        store.close()
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2 if isinstance(err, PolicyError) else 1) from None
    if not is_token_sampler(sampler):
        store.close()
        typer.echo(f"error: policy {policy!r} returns no token ids; serve needs an in-process policy", err=True)
        raise typer.Exit(2)

    from agentrft.rollout.serve import create_app
    from agentrft.samplers.inprocess import InProcessPolicy
    from agentrft.types import Run

    run = Run(name=f"serve {policy}", kind="serve", config={"policy": policy, "tool_format": tool_format})
    store.add_run(run)
    if isinstance(sampler, InProcessPolicy):  # in-process models say their positions; others enforce their own
        limits = limits.model_copy(update={"context_tokens": sampler.max_positions})
    app = create_app(sampler, store=store, tool_format=tool_format, api_key=api_key, run_id=run.id, limits=limits)
    typer.echo(f"serving {policy} on http://{host}:{port}/v1 (run {run.id}, recording to {db})", err=True)
    from agentrft.rollout.serve_http import server_config

    server = uvicorn.Server(
        server_config(
            app, limits, host=host, port=port, log_level="warning", timeout_graceful_shutdown=shutdown_timeout
        )
    )
    # uvicorn stops gracefully on the first SIGTERM/SIGINT, then raises the signal again for the
    # handler it found: with the default one the process died by it (exit 143) before the store
    # was closed. This handler makes that second delivery (or a signal before uvicorn listens) a
    # plain exit 0 through the `finally` below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        server.run()
    finally:
        store.close()
        typer.echo(f"stopped: {app.state.recorded} completion(s) recorded, {app.state.abandoned} abandoned", err=True)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)

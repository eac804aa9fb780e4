"""Shared plumbing of the commands: the default store, opening it, finding a run, one-line errors.

Errors become one line on stderr (``error: ...``) and exit status 1; bad usage
exits 2 (typer's own convention). Never a traceback for bad input. The store
and eval imports are deferred so that `agentrft --help` stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from agentrft.eval.harness import EvalResult
    from agentrft.store import Store
    from agentrft.types import Run

DEFAULT_DB = Path("runs/agentrft.db")


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors bad input produces (values, files, store lookups) into one line + exit 1."""
    from agentrft.store import StoreError

    try:
        yield
    except (StoreError, ValueError, LookupError, OSError) as err:
        text = str(err).strip().splitlines()
        raise fail(text[0] if text else type(err).__name__) from None


def open_store(db: Path, *, create: bool = False) -> Store:
    from agentrft.store import Store

    if not create and not db.is_file():
        raise fail(f"no store at {db} (pass --db PATH)")
    return Store(db)


def find_run(store: Store, ref: str) -> Run:
    """A run by id, else by its unique name (the latest of that name wins, as users re-run evals)."""
    if store.has_run(ref):
        return store.get_run(ref)
    named = [r for r in store.list_runs() if r.name == ref]
    if not named:
        raise ValueError(f"no run with id or name {ref!r} in {store.path}")
    return named[-1]


def eval_result_of(store: Store, run: Run) -> EvalResult:
    """The run's stored EvalResult, or one summarised from its trajectories."""
    from agentrft.eval.harness import result_from_run, summarize
    from agentrft.types import Task

    if "result" in run.metadata:
        return result_from_run(run)
    trajs = store.query_trajectories(run_id=run.id)
    if not trajs:
        raise ValueError(f"run {run.id} ({run.name!r}) has no trajectories to evaluate")
    tasks = {tid: Task(id=tid, messages=[], data=d) for tid, d in (run.metadata.get("task_data") or {}).items()}
    return summarize(trajs, tasks, run_id=run.id, run_name=run.name)

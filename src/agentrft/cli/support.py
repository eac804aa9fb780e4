"""Shared plumbing of the commands: the default store, opening it, finding a run, one-line errors.

Exit codes, the same for every command (the `agentrft --help` epilog and the README say so too):

* 0 — done;
* 2 — bad usage or bad input: an unknown option or name, a missing or unreadable file, a file that
  is not UTF-8, not valid JSON/YAML/TOML, nested too deep, holds NaN or a lone surrogate, or fails
  validation; an unknown run or trajectory id. Nothing was written.
* 1 — a failure while running on valid input (a server that does not answer, a full disk, a bug).

Either way stderr gets one line, ``error: ...``, and never a traceback; ``AGENTRFT_DEBUG=1`` lets an
unexpected error (exit 1) raise with its traceback. `user_errors` does the mapping; `main.py`
wraps every command in it. The store and eval imports are deferred so that `agentrft --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from agentrft.inputs import InputError

if TYPE_CHECKING:
    from agentrft.eval.harness import EvalResult
    from agentrft.store import Store
    from agentrft.types import Run

DEFAULT_DB = Path("runs/agentrft.db")
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
DEBUG_ENV = "AGENTRFT_DEBUG"
_MAX_MESSAGE = 1000
# typer's own exits and usage errors carry their exit code and message already. Usage errors derive
# from ClickException, click's or the copy newer typer vendors: found through typer's public BadParameter.
_CLICK_EXCEPTION = cast(
    "type[Exception]", next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
)
_CLI_EXITS: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, _CLICK_EXCEPTION)


def one_line(text: str) -> str:
    """`text` as one printable line: its first non-blank line, surrogates escaped, clipped."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``error: message`` (one line) on stderr; the Exit to raise. Bad input (2) unless told."""
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(code)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from agentrft.samplers.policies import PolicyError
    from agentrft.store.errors import (
        AmbiguousIdError,
        BadRecordError,
        DuplicateIdError,
        NotAStoreError,
        NotFoundError,
    )

    return (InputError, PolicyError, NotFoundError, AmbiguousIdError, BadRecordError, DuplicateIdError, NotAStoreError)


@contextmanager
def user_errors() -> Iterator[None]:
    """Map what escapes the block to the exit codes of the module docstring, with one line on stderr.

    The project's bad-input errors (`InputError` and its subclasses: config, grader spec, dataset,
    environment spec; unknown policy; unknown or duplicate ids; bad import records) exit 2 with
    their message. Anything else is unexpected: exit 1 with its type and message, or raised as it
    is when ``AGENTRFT_DEBUG=1``. typer/click exits and usage errors pass through untouched.
    """
    try:
        yield
    except _CLI_EXITS:
        raise
    except BrokenPipeError:
        # the reader of stdout went away (`agentrft ... | head`): nobody is left to tell; exit 1 quietly, and
        # point stdout at /dev/null so the interpreter's flush at exit does not raise the same error again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_FAILURE) from None
    except Exception as err:
        if isinstance(err, _bad_input_types()):
            raise fail(str(err) or type(err).__name__, EXIT_BAD_INPUT) from None
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        text = one_line(str(err))
        raise fail(
            f"{type(err).__name__}{': ' + text if text else ''} ({DEBUG_ENV}=1 shows the traceback)", EXIT_FAILURE
        ) from None


def open_store(db: Path, *, create: bool = False) -> Store:
    """The store at `db` (created when `create`); a missing, empty or non-store file is bad input, refused
    before anything is written to it."""
    from agentrft.store import NotAStoreError, Store

    if not create and not db.is_file():
        raise fail(f"no store at {db} (pass --db PATH)")
    if db.is_dir():
        raise fail(f"{db}: is a directory, not a store file (pass --db PATH/agentrft.db)")
    try:
        return Store(db) if create else Store.open_existing(db)
    except NotAStoreError as err:
        raise fail(str(err)) from None


def eval_result_of(store: Store, run: Run) -> EvalResult:
    """The run's stored EvalResult, or one summarised from its trajectories."""
    from agentrft.eval.harness import result_from_run, summarize
    from agentrft.types import Task

    if "result" in run.metadata:
        return result_from_run(run)
    trajs = store.query_trajectories(run_id=run.id)
    if not trajs:
        raise InputError(f"run {run.id} ({run.name!r}) has no trajectories to evaluate")
    tasks = {tid: Task(id=tid, messages=[], data=d) for tid, d in (run.metadata.get("task_data") or {}).items()}
    return summarize(trajs, tasks, run_id=run.id, run_name=run.name)

"""`agentrft` command line: thin over the library. Each command group lives in its own module.

Every command runs inside `support.user_errors`, so the exit codes (0 ok, 2 bad usage or input,
1 failure) and the one-line ``error: ...`` hold for all of them, also for commands added later.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

EPILOG = (
    "Exit status: 0 done; 2 bad usage or bad input (unknown option or name, missing, unreadable or "
    "invalid file; nothing is written); 1 a failure while running. Errors are one line on stderr; "
    "AGENTRFT_DEBUG=1 shows the traceback of an unexpected one."
)


class _Group(TyperGroup):
    """The root group: invoking any command (nested groups included) maps its errors to exit codes."""

    def invoke(self, ctx: Any) -> Any:
        from agentrft.cli.support import user_errors

        with user_errors():
            return super().invoke(ctx)


app = typer.Typer(
    name="agentrft",
    help="Agentic reinforcement fine-tuning: record, grade, train and evaluate tool-using agents.",
    epilog=EPILOG,
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# ---- command registration: one line per module (keep this block sorted by name) ----
# (each module defines `register(app: typer.Typer) -> None`)
_COMMAND_MODULES: list[str] = [
    "check",
    "demo",
    "dpo",
    "eval",
    "export",
    "finqa",
    "grade",
    "replay",
    "report",
    "rft",
    "rollout",
    "serve",
    "train",
    "traj",
]


def _register_all() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"agentrft.cli.{name}").register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()

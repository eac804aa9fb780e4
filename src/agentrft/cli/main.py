"""`agentrft` command line: thin over the library. Each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="agentrft",
    help="Agentic reinforcement fine-tuning: record, grade, train and evaluate tool-using agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# ---- command registration: one line per module (keep this block sorted by name) ----
# (each module defines `register(app: typer.Typer) -> None`)
_COMMAND_MODULES: list[str] = [
    "check",
    "demo",
    "eval",
    "export",
    "finqa",
    "grade",
    "report",
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

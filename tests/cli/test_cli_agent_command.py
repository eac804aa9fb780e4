"""`agentrft eval --agent-command`: a command that cannot run is bad input (exit 2, one line), refused
before any model loads or any run is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrft.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "command,message",
    [
        ("no-such-agent-program run", "error: --agent-command: no-such-agent-program: not found on PATH"),
        ("python 'unclosed", "error: --agent-command: cannot split the command line: No closing quotation"),
        ("./nope/agent.sh", "error: --agent-command: ./nope/agent.sh: no such executable file"),
    ],
)
def test_an_agent_command_that_cannot_run_is_bad_input(tmp_path: Path, command: str, message: str) -> None:
    db = tmp_path / "eval.db"
    r = runner.invoke(
        app, ["eval", "--env", "finqa-lite:1", "--policy", "tiny", "--db", str(db), "--agent-command", command]
    )
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert not db.exists()

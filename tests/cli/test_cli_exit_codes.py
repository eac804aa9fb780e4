"""Bad input exits 2 with one line, before anything is written: files that are not stores, a run dir that
cannot be one, a resume of nothing, an out-of-range id (issue 47, item 13)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrft.cli.main import app


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def _other_program_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    return path


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


@pytest.mark.parametrize("command", [["traj", "list"], ["traj", "show", "abc"], ["traj", "export", "x.jsonl"]])
def test_a_read_command_never_makes_an_empty_file_a_store(tmp_path: Path, command: list[str]) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    code, out = _run(*command, "--db", str(empty))
    assert code == 2 and "empty file, not an agentrft store" in out
    assert empty.stat().st_size == 0


def test_another_programs_database_is_left_alone(tmp_path: Path) -> None:
    other = _other_program_db(tmp_path / "other.db")
    before = other.read_bytes()
    for args in (["traj", "list", "--db", str(other)], ["rollout", "--policy", "tiny", "--db", str(other)]):
        code, out = _run(*args)
        assert code == 2 and "without agentrft's tables" in out
    assert _tables(other) == {"notes"}
    assert other.read_bytes() == before  # not even its journal mode was switched


def test_resume_of_a_run_dir_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    code, out = _run("train", "demo", "--resume", "--run-dir", str(missing), "--set", "policy.name=tiny")
    assert code == 2 and "does not exist" in out and not missing.exists()


def test_run_dir_under_a_file_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    code, out = _run("train", "demo", "--run-dir", str(tmp_path / "afile" / "sub"), "--set", "policy.name=tiny")
    assert code == 2 and "is a file, not a directory" in out


def test_policy_version_out_of_range_is_bad_input(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert _run("rollout", "--policy", "tiny", "--tasks", "1", "--max-tokens", "4", "--db", str(db), "--json")[0] == 0
    code, out = _run("traj", "list", "--db", str(db), "--policy-version", str(10**30))
    assert code == 2 and "--policy-version" in out


def test_sft_and_serve_refuse_a_file_that_is_not_sqlite(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    code, out = _run("sft", "--data", str(junk), "--policy", "tiny", "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "not an agentrft store" in out
    code, out = _run("serve", "--db", str(junk), "--policy", "tiny")
    assert code == 2 and "not an agentrft store" in out
    assert junk.read_text() == "not sqlite"

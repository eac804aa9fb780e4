"""`agentrft traj …` through typer's CliRunner (one end-to-end subprocess call as well)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_factories import make_traj

from agentrft.cli.main import app
from agentrft.store import Store
from agentrft.types import Trajectory

runner = CliRunner(env={"COLUMNS": "200"})  # a wide terminal: rich wraps tables to 80 columns without one


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["traj", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / "agentrft.db"
    with Store(path) as store:
        store.add_trajectories(
            [make_traj(i, run_id="r1" if i < 6 else "r2", reward=None if i == 2 else i / 10) for i in range(10)]
        )
    return path


def _ids(db: Path, **filters: object) -> list[str]:
    with Store(db) as store:
        return [t.id for t in store.query_trajectories(**filters)]


def test_list_json_filters_and_limit(db: Path) -> None:
    code, out, _ = _run("list", "--db", str(db), "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == _ids(db)
    assert rows[0]["tool_calls"] == 2 and rows[0]["tokens"] == 80 and rows[0]["turns"] == 2
    code, out, _ = _run("list", "--db", str(db), "--run", "r1", "--min-reward", "0.3", "--json")
    rows = json.loads(out)
    assert sorted(r["reward"] for r in rows) == [0.3, 0.4, 0.5]
    assert [r["id"] for r in rows] == _ids(db, run_id="r1", min_reward=0.3)
    code, out, _ = _run("list", "--db", str(db), "--task", "task-7", "--json")
    assert [r["task_id"] for r in json.loads(out)] == ["task-7"]
    code, out, _ = _run("list", "--db", str(db), "--limit", "3", "--json")
    assert [r["id"] for r in json.loads(out)] == _ids(db)[-3:]  # the most recent three


def test_list_table_for_people(db: Path) -> None:
    code, out, _ = _run("list", "--db", str(db), "--limit", "4")
    assert code == 0
    for traj_id in _ids(db)[-4:]:
        assert traj_id in out
    assert "4 of 10 trajectories" in out
    assert "0.900" in out


def test_show_renders_turns_tools_errors_grade(db: Path) -> None:
    traj_id = _ids(db, task_id="task-3")[0]
    code, out, _ = _run("show", traj_id[:18], "--db", str(db))
    assert code == 0
    for piece in (
        traj_id, "turn 0", "turn 1", "I should search first.", 'search({"query": "revenue 2003", "k": 3})',
        "← doc-1: revenue rose 12.5%", "[result truncated by the tool output cap]",
        "error (malformed): arguments are not valid JSON", "final answer", "The revenue grew by",
        "reward", "0.3", "answer", "truncated_observation_error [tools] search output cut", "80 (40 sampled)",
    ):  # fmt: skip
        assert piece in out, piece
    code, out, _ = _run("show", traj_id, "--db", str(db), "--json")
    with Store(db) as store:
        assert Trajectory.from_json(out) == store.get_trajectory(traj_id)


def test_show_renders_a_prompts_worked_example_as_the_prompt_not_as_a_turn(tmp_path: Path) -> None:
    from agentrft.types import Message, ToolCall, ToolCallFunction

    t = make_traj(5)
    call = ToolCall(id="example_1", function=ToolCallFunction(name="calculate", arguments='{"expression": "1 + 1"}'))
    example = [
        Message(role="user", content="What is one plus one?"),
        Message(role="assistant", content=None, tool_calls=[call]),
        Message(role="tool", tool_call_id="example_1", name="calculate", content="2"),
        Message(role="assistant", content="The answer is 2."),
    ]
    t.messages = [t.messages[0], *example, *t.messages[1:]]
    t.n_prompt_messages = 6  # system, the worked example, the task's question
    db = tmp_path / "agentrft.db"
    with Store(db) as store:
        store.add_trajectories([t])
    _, out, _ = _run("show", t.id, "--db", str(db))
    # the example's own call and result, not the episode's first tool event; the episode's turns count from 0
    assert out.count("given in the prompt") == 1  # one rule over the example's two assistant turns
    assert 'calculate({"expression": "1 + 1"})' in out and "← 2" in out
    assert out.index("What is one plus one?") < out.index("turn 0") and "turn 2" not in out
    assert out.count('search({"query": "revenue 2005", "k": 3})') == 1


def test_show_shortens_long_text_unless_full(tmp_path: Path) -> None:
    db = tmp_path / "long.db"
    t = make_traj(1)
    t.messages[3].content = "x" * 5000
    t.events[2].result = "[bold]y[/bold]" * 400  # markup-looking model text stays literal
    with Store(db) as store:
        store.add_trajectory(t)
    _, out, _ = _run("show", t.id, "--db", str(db))
    assert "more characters, --full shows all" in out and "[bold]y[/bold]" in out
    _, out, _ = _run("show", t.id, "--db", str(db), "--full")
    assert "more characters" not in out


def test_export_import_round_trip(db: Path, tmp_path: Path) -> None:
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"x.{fmt}"
        code, stdout, _ = _run("export", str(out), "--db", str(db), "--run", "r2")
        assert (code, stdout.strip()) == (0, f"exported 4 trajectories to {out}")
        target = tmp_path / fmt / "new.db"
        code, stdout, _ = _run("import", str(out), "--db", str(target))
        assert (code, stdout.strip()) == (0, f"imported 4 trajectories from {out}")
        with Store(db) as a, Store(target) as b:
            assert b.query_trajectories() == a.query_trajectories(run_id="r2")


def test_import_bad_file_and_skip_bad(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(make_traj(1).to_json() + "\n" + '{"status": 3}\n')
    db = tmp_path / "i.db"
    code, out, err = _run("import", str(bad), "--db", str(db))
    assert code == 2 and out == "" and not db.exists()  # refused: not even an empty store is left
    assert (
        err
        == "error: bad.jsonl line 2: field 'status': Input should be 'completed', 'max_turns', 'truncated', 'timeout' or 'error'\n"
    )
    code, out, err = _run("import", str(bad), "--db", str(db), "--skip-bad")
    assert code == 0
    assert err.startswith("skipped: bad.jsonl line 2: field 'status'")
    assert out.strip() == f"imported 1 trajectories from {bad}, skipped 1 bad records"


def test_import_chat_logs(tmp_path: Path) -> None:
    logs = tmp_path / "chat.jsonl"
    record = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "calculate", "arguments": '{"e": "2+2"}'}}]},
            {"role": "tool", "tool_call_id": "a", "content": "4"},
            {"role": "assistant", "content": "4"},
        ],
        "user": "u1",
    }  # fmt: skip
    logs.write_text(json.dumps(record) + "\n")
    db = tmp_path / "c.db"
    code, out, _ = _run("import", str(logs), "--db", str(db), "--chat-logs", "--run", "prod-logs", "--json")
    assert code == 0 and json.loads(out)["imported"] == 1
    with Store(db) as store:
        (t,) = store.query_trajectories(run_id="prod-logs")
    assert [(c.name, c.arguments, c.result) for c in t.tool_calls] == [("calculate", {"e": "2+2"}, "4")]
    assert t.final_answer == "4" and t.metadata == {"user": "u1"}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["show", "NOPE"], 2, "error: no trajectory with id (or id prefix) 'NOPE'"),
        (["export", "out.csv"], 2, "error: out.csv: the file name must end in .jsonl or .parquet"),
        (["import", "in.jsonl", "--chat-logs"], 2, "error: --chat-logs reads a .jsonl file and needs --run NAME"),
        (["import", "missing.jsonl"], 2, "error: missing.jsonl: no such file"),
    ],
)
def test_errors_are_one_line(
    db: Path, args: list[str], code: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    got, _out, err = _run(*args, "--db", str(db))
    assert got == code
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_missing_db_and_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run("list")
    assert (code, err) == (2, "error: no store at runs/agentrft.db (pass --db PATH)\n")
    (tmp_path / "t.jsonl").write_text(make_traj(1).to_json() + "\n")
    code, _, _ = _run("import", "t.jsonl")  # creates runs/ and the default store
    assert code == 0 and (tmp_path / "runs" / "agentrft.db").is_file()
    code, out, _ = _run("list", "--json")
    assert len(json.loads(out)) == 1


def test_entry_point_subprocess(db: Path) -> None:
    exe = Path(sys.executable).with_name("agentrft")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "agentrft.cli.main"]
    proc = subprocess.run([*cmd, "traj", "show", "ZZZ", "--db", str(db)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no trajectory with id") and "Traceback" not in proc.stderr

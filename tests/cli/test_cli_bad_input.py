"""One targeted test per cause of a traceback or a silent acceptance that the bad-input pass found,
and the exit-code rule (0 done, 2 bad usage or input, 1 failure while running) at the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.cli.support import user_errors
from agentrft.inputs import InputError
from agentrft.store import Store
from agentrft.store.errors import NotFoundError

runner = CliRunner()
USER = {"role": "user", "content": "2+2?"}
SPEC = {
    "type": "string_check",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}


def _write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _one_line_error(result: object, code: int = 2) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception  # type: ignore[attr-defined]
    assert result.exit_code == code, result.output  # type: ignore[attr-defined]
    lines = result.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output  # type: ignore[attr-defined]
    return lines[0]


def _grade(tmp_path: Path, spec: str, items: str, samples: str) -> object:
    g = _write(tmp_path / "g.json", spec)
    i = _write(tmp_path / "i.jsonl", items)
    s = _write(tmp_path / "s.jsonl", samples)
    return runner.invoke(app, ["grade", "--grader", g, "--items", i, "--samples", s, "--json"])


# ---------------------------------------------------------------- deep nesting (RecursionError before)


def test_grade_deeply_nested_spec_items_samples(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000
    ok_spec, ok_item, ok_sample = json.dumps(SPEC), '{"answer": "4"}\n', '{"output_text": "4"}\n'
    line = _one_line_error(_grade(tmp_path, '{"type": ' + deep + "}", ok_item, ok_sample))
    assert line.endswith("g.json: nested deeper than 64 levels")
    line = _one_line_error(_grade(tmp_path, ok_spec, '{"answer": ' + deep + "}\n", ok_sample))
    assert line.endswith("i.jsonl:1: nested deeper than 64 levels")
    line = _one_line_error(_grade(tmp_path, ok_spec, ok_item, '{"output_json": ' + "[" * 100 + "1" + "]" * 100 + "}"))
    assert line.endswith("s.jsonl:1: field 'output_json" + "[0]" * 63 + "': nested deeper than 64 levels")


def test_multi_grader_formula_nesting(tmp_path: Path) -> None:
    multi = {"type": "multi", "graders": {"a": SPEC}, "calculate_output": "(" * 3000 + "a" + ")" * 3000}
    line = _one_line_error(_grade(tmp_path, json.dumps(multi), '{"answer": "4"}', '{"output_text": "4"}'))
    assert "calculate_output: bad formula" in line


def test_yaml_config_nesting_and_no_run_dir(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "c.yaml", "rollout:\n  grader: " + "[" * 5000 + "]" * 5000 + "\n")
    result = runner.invoke(app, ["train", cfg, "--run-dir", str(tmp_path / "run")])
    assert _one_line_error(result).endswith("c.yaml: nested deeper than 64 levels")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- encodings (UnicodeDecodeError before)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ("steps: 1\n".encode("utf-16"), "not UTF-8 text (it looks like UTF-16; save it as UTF-8)"),
        (b"steps: 1\npolicy: {name: caf\xe9}\n", "not UTF-8 text (byte 0xe9 on line 2)"),
        (bytes(range(256)), "not UTF-8 text (a NUL byte at byte 1: a binary or UTF-16 file?)"),
    ],
)
def test_non_utf8_config_and_spec(tmp_path: Path, data: bytes, why: str) -> None:
    cfg = _write(tmp_path / "c.yaml", data)
    assert (
        _one_line_error(runner.invoke(app, ["train", cfg, "--run-dir", str(tmp_path / "run")]))
        == f"error: {cfg}: {why}"
    )
    assert not (tmp_path / "run").exists()
    spec = _write(tmp_path / "g.json", data)
    i = _write(tmp_path / "i.jsonl", '{"a": 1}')
    result = runner.invoke(app, ["grade", "--grader", spec, "--items", i, "--samples", i])
    assert _one_line_error(result) == f"error: {spec}: {why}"


# ---------------------------------------------------------------- jsonl env: tools, surrogates, ids


def _eval(tmp_path: Path, *rows: dict[str, object]) -> object:
    data = _write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "e.db"
    result = runner.invoke(app, ["eval", "--env", f"jsonl:{data}", "--policy", "tiny", "--db", str(db), "--json"])
    assert not db.exists()  # refused before the store (and the model)
    return result


def test_jsonl_env_bad_tool_schema(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": 5}}}]
    line = _one_line_error(_eval(tmp_path, {"messages": [USER], "tools": tools}))
    assert "d.jsonl:1: field 'tools[0].function.parameters.properties': not a valid JSON Schema" in line


def test_jsonl_env_lone_surrogate_in_prompt(tmp_path: Path) -> None:
    line = _one_line_error(_eval(tmp_path, {"messages": [{"role": "user", "content": "2+2 \ud800?"}]}))
    assert line.endswith(
        "d.jsonl:1: field 'messages[0].content': text holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not valid Unicode"
    )


def test_jsonl_env_duplicate_ids_null_content_empty(tmp_path: Path) -> None:
    line = _one_line_error(_eval(tmp_path, {"id": 7, "messages": [USER]}, {"id": "7", "messages": [USER]}))
    assert line.endswith(
        "d.jsonl:2: field 'id': task id '7' is already used on line 1 (ids name tasks in results and stores; make them unique)"
    )
    line = _one_line_error(_eval(tmp_path, {"messages": [{"role": "user", "content": None}]}))
    assert line.endswith(
        "d.jsonl:1: field 'messages[0].content': a user message needs content (a string or content parts)"
    )
    line = _one_line_error(_eval(tmp_path))
    assert line.endswith("d.jsonl: empty file (expected one RFT row per line)")


# ---------------------------------------------------------------- chat logs: refused from now on, store untouched


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ('{"messages": []}', "field 'messages': must be a non-empty list of chat messages"),
        (json.dumps({"messages": [USER, {"role": "tool", "content": "4"}]}), "field 'messages[1].tool_call_id': a tool message needs the id of the call it answers"),
        (json.dumps({"messages": [{"role": "user", "content": None}]}), "field 'messages[0].content': a user message needs content (a string or content parts)"),
        ('{"messages": [{"role": "user", "content": "x"}], "score": NaN}', "field 'score': NaN is not allowed (numbers must be finite; JSON has no NaN or Infinity)"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": 1e999}', "field 'n': Infinity is not allowed (numbers must be finite; JSON has no NaN or Infinity)"),
        ("", "empty file (no records)"),
    ],
)  # fmt: skip
def test_chat_log_import_refusals_leave_the_store_alone(tmp_path: Path, record: str, why: str) -> None:
    db = tmp_path / "s.db"
    with Store(db) as store:
        store.add_run(__import__("agentrft.types", fromlist=["Run"]).Run(id="other"))
    logs = _write(tmp_path / "chat.jsonl", record + "\n" if record else "")
    result = runner.invoke(app, ["traj", "import", logs, "--db", str(db), "--chat-logs", "--run", "logs"])
    line = _one_line_error(result)
    assert line == f"error: chat.jsonl{' line 1' if record else ''}: {why}"
    with Store(db) as store:
        assert store.count_trajectories() == 0 and [r.id for r in store.list_runs()] == ["other"]


def test_rejected_import_does_not_create_a_store(tmp_path: Path) -> None:
    logs = _write(tmp_path / "chat.jsonl", '{"messages": []}\n')
    db = tmp_path / "new" / "s.db"
    _one_line_error(runner.invoke(app, ["traj", "import", logs, "--db", str(db), "--chat-logs", "--run", "logs"]))
    assert not db.exists()


# ---------------------------------------------------------------- seeds and huge values


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--set", f"seed={10**30}"], "--set seed: cannot use value '1000000000000000000000000000000': integer out of range (more than 64 bits)"),
        (["--set", f"seed={2**32}"], "C: seed: Input should be less than 4294967296"),
        (["--set", "seed=-1"], "C: seed: Input should be greater than or equal to 0"),
        (["--set", "optimizer.lr=.inf"], "--set optimizer.lr: cannot use value '.inf': Infinity is not allowed (numbers must be finite; JSON has no NaN or Infinity)"),
    ],
)  # fmt: skip
def test_train_seed_and_huge_values(tmp_path: Path, args: list[str], why: str) -> None:
    cfg = _write(tmp_path / "c.yaml", "steps: 1\npolicy: {name: tiny}\n")
    result = runner.invoke(app, ["train", cfg, *args, "--run-dir", str(tmp_path / "run")])
    assert _one_line_error(result) == f"error: {why.replace('C:', cfg + ':')}"
    assert not (tmp_path / "run").exists()
    cfg = _write(tmp_path / "c.yaml", f"seed: {10**30}\n")
    assert _one_line_error(runner.invoke(app, ["train", cfg])).endswith(
        "field 'seed': integer out of range (more than 64 bits)"
    )


def test_train_config_errors_come_before_the_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for text, why in (
        ("rollout: {env: 'nope:1'}\n", "rollout.env: unknown environment 'nope:1'"),
        ("policy: {name: 'openai:gpt'}\n", "policy.name: 'openai:gpt' cannot be trained in process"),
        ("rollout: {grader: {type: nope}}\n", "rollout.grader: type: unknown grader type 'nope'"),
        ("rollout: {split: nope}\n", "rollout.split: unknown finqa-lite split 'nope'"),
        (
            "rollout: {tool_format: json}\n",
            "rollout.tool_format: Input should be 'xml', 'hermes', 'native' or 'pythonic'",
        ),
        ("# nothing\n", "empty config"),
    ):
        cfg = _write(tmp_path / "c.yaml", text)
        line = _one_line_error(runner.invoke(app, ["train", cfg, "--run-dir", str(run)]))
        assert line.startswith(f"error: {cfg}: {why}"), line
        assert not run.exists()


# ---------------------------------------------------------------- empty inputs (exit 0 before)


def test_empty_inputs(tmp_path: Path) -> None:
    result = _grade(tmp_path, json.dumps(SPEC), "", '{"output_text": "4"}')
    assert _one_line_error(result).endswith("i.jsonl: empty file (expected one JSON object per line)")
    result = _grade(tmp_path, json.dumps(SPEC), '{"answer": "4"}', "\n\n")
    assert _one_line_error(result).endswith("s.jsonl: empty file (expected one JSON object per line)")
    empty = _write(tmp_path / "t.jsonl", "")
    assert _one_line_error(runner.invoke(app, ["traj", "import", empty, "--db", str(tmp_path / "d.db")])).endswith(
        "t.jsonl: empty file (no records)"
    )
    pred = _write(tmp_path / "p.json", "")
    line = _one_line_error(runner.invoke(app, ["finqa", "evaluate", pred, pred]))
    assert line.endswith("p.json: empty file (expected a JSON value)")


# ---------------------------------------------------------------- the exit-code rule


def _invoke_raising(exc: BaseException) -> object:
    app_ = typer.Typer()

    @app_.command()
    def boom() -> None:
        with user_errors():
            raise exc

    return CliRunner().invoke(app_, [])


def _map(exc: BaseException) -> tuple[int, str]:
    result = _invoke_raising(exc)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception  # type: ignore[attr-defined]
    return result.exit_code, result.stderr  # type: ignore[attr-defined]


def test_user_errors_maps_bad_input_to_2_and_the_unexpected_to_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRFT_DEBUG", raising=False)
    assert _map(InputError("f.json: bad\nsecond line")) == (2, "error: f.json: bad\n")
    assert _map(NotFoundError("no run 'x'")) == (2, "error: no run 'x'\n")
    assert _map(KeyError("k")) == (1, "error: KeyError: 'k' (AGENTRFT_DEBUG=1 shows the traceback)\n")
    assert _map(RuntimeError("server said no\n  detail")) == (
        1,
        "error: RuntimeError: server said no (AGENTRFT_DEBUG=1 shows the traceback)\n",
    )
    assert _map(OSError("x\ud800y")) == (1, "error: OSError: x\\ud800y (AGENTRFT_DEBUG=1 shows the traceback)\n")
    assert _map(typer.Exit(3)) == (3, "")  # typer's own exits pass through
    monkeypatch.setenv("AGENTRFT_DEBUG", "1")
    assert isinstance(_invoke_raising(KeyError("k")).exception, KeyError)  # raised as it is: the traceback shows
    assert _map(InputError("f.json: bad")) == (2, "error: f.json: bad\n")  # bad input stays one line


def _entry(*args: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agentrft")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "agentrft.cli.main"]
    env = {k: v for k, v in os.environ.items() if k != "AGENTRFT_DEBUG"}
    if debug:
        env["AGENTRFT_DEBUG"] = "1"
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=env)


def test_entry_point_exit_codes(tmp_path: Path) -> None:
    proc = _entry("grade", "--grader", str(tmp_path / "nope.json"), "--items", "x", "--samples", "y")
    assert (proc.returncode, proc.stderr) == (2, f"error: {tmp_path / 'nope.json'}: no such file\n")
    proc = _entry("grade", "--nope")
    assert proc.returncode == 2 and "No such option" in proc.stderr and "Traceback" not in proc.stderr
    # a failure while running on valid input: the export target's parent is a file
    db = tmp_path / "s.db"
    Store(db).close()
    (tmp_path / "file").write_text("x")
    proc = _entry("traj", "export", str(tmp_path / "file" / "out.jsonl"), "--db", str(db))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: FileExistsError") and proc.stderr.count("\n") == 1
    assert proc.stderr.rstrip().endswith("(AGENTRFT_DEBUG=1 shows the traceback)")
    proc = _entry("traj", "export", str(tmp_path / "file" / "out.jsonl"), "--db", str(db), debug=True)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    proc = _entry("--help")
    assert proc.returncode == 0 and "Exit status: 0 done; 2 bad usage or bad input" in " ".join(proc.stdout.split())

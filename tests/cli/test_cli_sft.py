"""`agentrft sft`: the sft preset of the one config system with the data and policy filled in; bad data exits 2
with one line naming what and where, before the run dir exists."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.store import Store
from agentrft.train.config import PRESETS, build_config
from agentrft.types import Grade, Message, Run, TokenRecord, Trajectory

runner = CliRunner()


def _chat(i: int, success: bool = True) -> Trajectory:
    return Trajectory(
        run_id="logs",
        task_id=f"t{i}",
        messages=[
            Message(role="system", content="You add numbers."),
            Message(role="user", content=f"What is {i} + {i}?"),
            Message(role="assistant", content=f"The answer is {2 * i}."),
        ],
        n_prompt_messages=2,
        grade=Grade(reward=float(success), success=success),
    )


def _store(path: Path, trajs: list[Trajectory]) -> str:
    with Store(path) as s:
        s.add_run(Run(id="logs", name="chat-logs", kind="import"))
        for t in trajs:
            s.add_trajectory(t)
    return str(path)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def test_sft_command_trains_the_sft_preset_on_rendered_chats(tmp_path: Path) -> None:
    data = _store(tmp_path / "chats.db", [_chat(i) for i in range(4)] + [_chat(9, success=False)])
    run = tmp_path / "run"
    sets = ["steps=2", "sft.batch_size=2", "policy.gradient_checkpointing=false", "checkpoint.every_steps=0"]
    args = ["sft", "--data", data, "--policy", "tiny", "--run-dir", str(run), "--json"]
    result = runner.invoke(app, [*args, *[x for s in sets for x in ("--set", s)]])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["metrics"]["sft/rendered_trajectories"] == 4  # the failure is not selected
    saved = yaml.safe_load((run / "config.yaml").read_text())
    want = build_config(PRESETS["sft"], [f"data.source={data}", "policy.name=tiny", *sets])
    assert saved == want.model_dump(mode="json")  # the same config `agentrft train sft --set ...` builds
    assert (run / "policy" / "config.json").exists()


def test_sft_command_bad_data_exits_2_before_the_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"

    def sft(data: str, *sets: str) -> str:
        args = ["sft", "--data", data, "--policy", "tiny", "--run-dir", str(run)]
        line = _one_line_error(runner.invoke(app, [*args, *[x for s in sets for x in ("--set", s)]]))
        assert not run.exists()
        return line

    missing = str(tmp_path / "missing.db")
    assert sft(missing) == f"error: preset sft: data.source: {missing}: no such file"
    data = _store(tmp_path / "chats.db", [_chat(1, success=False)])
    assert sft(data).startswith(f"error: preset sft: data: no trajectory of {data} is left after the 'success_only'")
    bad = _chat(2).model_copy(
        update={"tokens": TokenRecord(ids=[1, 2, 3], loss_mask=[0, 0, 0], logprobs=[0.0] * 3, turn=[0, 0, 0])}
    )
    data = _store(tmp_path / "bad.db", [bad])
    assert sft(data) == (
        f"error: preset sft: data: trajectory {bad.id}: its token record has 0 runs of sampled tokens but its "
        "messages have 1 assistant turns after the 2 prompt messages"
    )
    assert sft(data, "data.runs=[nope]").startswith("error: preset sft: data.runs: no run 'nope'")

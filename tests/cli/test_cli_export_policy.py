"""`agentrft export-policy RUN_DIR --out DIR [--step N]`: a training run's checkpoint as a policy in the run's own
export form (a full model loading back as hf:DIR, or a LoRA adapter); what it cannot export exits 2 with one line,
before a model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.store import Store
from agentrft.types import Grade, Message, Run, Trajectory

runner = CliRunner()


def _chats(path: Path) -> str:
    with Store(path) as s:
        s.add_run(Run(id="logs", name="chat-logs", kind="import"))
        for i in range(4):
            s.add_trajectory(
                Trajectory(
                    run_id="logs",
                    task_id=f"t{i}",
                    messages=[
                        Message(role="user", content=f"What is {i} + {i}?"),
                        Message(role="assistant", content=f"The answer is {2 * i}."),
                    ],
                    n_prompt_messages=1,
                    grade=Grade(reward=1.0, success=True),
                )
            )
    return str(path)


def _train(tmp_path: Path, *sets: str) -> Path:
    """Three SFT steps on the tiny policy with a checkpoint after each (the last two kept)."""
    run = tmp_path / "run"
    base = [
        "steps=3",
        "sft.batch_size=2",
        "policy.gradient_checkpointing=false",
        "checkpoint.every_steps=1",
        "checkpoint.keep_last=2",
    ]
    args = ["sft", "--data", _chats(tmp_path / "chats.db"), "--policy", "tiny", "--run-dir", str(run), "--json"]
    result = runner.invoke(app, [*args, *[x for s in [*base, "optimizer.lr=1e-2", *sets] for x in ("--set", s)]])
    assert result.exit_code == 0, result.output
    return run


def _weights(directory: Path, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(directory / name))


def _export(run: Path, out: Path, *extra: str):
    return runner.invoke(app, ["export-policy", str(run), "--out", str(out), *extra])


def test_the_latest_checkpoint_is_the_runs_own_export_and_an_earlier_step_is_not(tmp_path: Path) -> None:
    run = _train(tmp_path)
    result = _export(run, tmp_path / "latest")
    assert result.exit_code == 0, result.output
    assert "step-00000003" in result.stdout and f"hf:{tmp_path / 'latest'}" in result.stdout
    final, latest = _weights(run / "policy"), _weights(tmp_path / "latest")
    assert final.keys() == latest.keys()
    for name, tensor in final.items():
        torch.testing.assert_close(latest[name], tensor, rtol=0, atol=0)
    assert (tmp_path / "latest" / "tokenizer_config.json").exists()  # loads back as hf:DIR on its own

    assert _export(run, tmp_path / "step2", "--step", "2").exit_code == 0
    earlier = _weights(tmp_path / "step2")
    assert any(not torch.allclose(earlier[n], t) for n, t in final.items())  # a step of lr 1e-2 moved them


def test_a_lora_run_exports_its_adapter(tmp_path: Path) -> None:
    run = _train(tmp_path, "policy.finetune=lora")
    result = _export(run, tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    assert "LoRA adapter" in result.stdout
    final = _weights(run / "policy", "adapter_model.safetensors")
    exported = _weights(tmp_path / "adapter", "adapter_model.safetensors")
    assert final.keys() == exported.keys() and final
    for name, tensor in final.items():
        torch.testing.assert_close(exported[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-config", "not a training run directory (no config.yaml)"),
        ("no-checkpoint", "no checkpoint"),
        ("no-step", "no checkpoint of step 1; there are steps [2, 3]"),
        ("out-not-empty", "exists and is not an empty directory"),
        ("reward-model", "a reward model's run; its checkpoint is a scorer, not a policy"),
    ],
)
def test_what_cannot_be_exported_exits_2_with_one_line(tmp_path: Path, case: str, message: str) -> None:
    run = _train(tmp_path)
    out, extra = tmp_path / "out", []
    if case == "no-config":
        (run / "config.yaml").unlink()
    elif case == "no-checkpoint":
        for step in (run / "checkpoints").iterdir():
            step.rename(tmp_path / step.name)
    elif case == "no-step":
        extra = ["--step", "1"]
    elif case == "reward-model":  # the same checkpoint, as if a reward model's run had written it
        config = run / "config.yaml"
        config.write_text(config.read_text().replace("method: sft", "method: reward_model"))
    else:
        out.mkdir()
        (out / "keep.txt").write_text("a user's file")
    result = _export(run, out, *extra)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert case == "out-not-empty" or not out.exists()
    if case == "out-not-empty":
        assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]

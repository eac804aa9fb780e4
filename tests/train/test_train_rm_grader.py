"""reward_model grader: the spec is checked at load time (without torch), grading scores what training
scored (a LoRA reward model on the `tiny` policy, trained a few steps on a TRL pairs file), and every
failure is a flag."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrft.graders import GraderSpecError, load_grader
from agentrft.pairs import Pair, write_pairs
from agentrft.train.config import build_config
from agentrft.types import Message, TokenRecord, Trajectory

torch.set_num_threads(1)


def _pair(k: int, j: int) -> Pair:
    prompt = [Message(role="system", content="Answer briefly."), Message(role="user", content=f"What is {k} + {j}?")]
    return Pair(
        id=f"p{k}-{j}",
        task_id=f"task-{k}",
        prompt=prompt,
        chosen=[Message(role="assistant", content=f"It is {k + j}. Checked.")],
        rejected=[Message(role="assistant", content="No idea.")],
        where="test",
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """RUN_DIR of a 3-step LoRA reward model on `tiny`, from a pairs file rendered through its chat template."""
    from agentrft.train.data.reward_model import train_reward_model

    root = tmp_path_factory.mktemp("rm")
    write_pairs([_pair(k, j) for k in range(4) for j in range(2)], root / "pairs.jsonl")
    cfg = build_config(
        {
            "method": "reward_model",
            "steps": 3,
            "seed": 1,
            "policy": {"name": "tiny", "finetune": "lora", "lora_r": 4, "precision": "fp32"},
            "reward_model": {"pairs": str(root / "pairs.jsonl"), "pairs_per_step": 4, "heldout_fraction": 0.25},
            "optimizer": {"lr": 1e-2},
            "checkpoint": {"every_steps": 0, "keep_last": 1},
            "logging": {"tensorboard": False},
        }
    )
    res = train_reward_model(cfg, root / "run")
    assert res.history[-1]["data/pairs_rendered"] == 8 and res.history[-1]["rm/heldout_pairs"] == 2
    return root / "run"


def _conversation(k: int, answer: str) -> Trajectory:
    p = _pair(k, 0)
    return Trajectory(task_id=p.task_id, messages=[*p.prompt, Message(role="assistant", content=answer)])


def test_spec_is_checked_at_load_time_naming_the_field(tmp_path, trained):
    with pytest.raises(GraderSpecError, match=r"^path: .*nowhere: no such directory"):
        load_grader({"type": "reward_model", "path": str(tmp_path / "nowhere")})
    with pytest.raises(GraderSpecError, match=r"^path: .*holds no reward model \(manifest.json missing"):
        load_grader({"type": "reward_model", "path": str(tmp_path)})
    (tmp_path / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(GraderSpecError, match=r"^path: .*not a reward model manifest"):
        load_grader({"type": "reward_model", "path": str(tmp_path)})
    with pytest.raises(GraderSpecError, match=r"^path: required field is missing"):
        load_grader({"type": "reward_model"})
    rm = str(trained / "reward_model")
    with pytest.raises(GraderSpecError, match=r"^pass_threshold: must be in \(0, 1\)"):
        load_grader({"type": "reward_model", "path": rm, "pass_threshold": 1.5})
    with pytest.raises(GraderSpecError, match=r"^graders.rm.path: .*no such directory"):
        load_grader(
            {"type": "multi", "graders": {"rm": {"type": "reward_model", "path": "x"}}, "calculate_output": "rm"}
        )
    spec = tmp_path / "specs" / "g.json"  # a relative path is relative to the spec file
    spec.parent.mkdir()
    shutil.copytree(trained / "reward_model", tmp_path / "specs" / "rm")
    spec.write_text(json.dumps({"type": "reward_model", "path": "rm"}))
    assert load_grader(spec).name == "reward_model"


def test_loading_the_spec_imports_no_torch(trained):
    code = (
        "import sys, json\n"
        "from agentrft.graders import load_grader\n"
        f"g = load_grader({{'type': 'reward_model', 'path': {str(trained / 'reward_model')!r}}})\n"
        "print(json.dumps('torch' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "false"


def test_grades_are_sigmoid_of_the_trained_models_score(trained):
    """The grader's score equals the trainer's for the same sequence: the LoRA checkpoint applied to a fresh
    `tiny` base with the trainer's own scoring (`sequence_scores`), against the exported and merged model."""
    from agentrft.samplers.chat_template import TokenizerRenderer
    from agentrft.samplers.policies import load_model_and_tokenizer
    from agentrft.train.config import load_config
    from agentrft.train.core.checkpoint import latest_checkpoint
    from agentrft.train.core.packing import PackedSequence, collate
    from agentrft.train.core.session import prepare_model
    from agentrft.train.data.records import render_token_record
    from agentrft.train.data.rm_model import RewardModel, sequence_scores

    g = load_grader({"type": "reward_model", "path": str(trained / "reward_model")})
    traj = _conversation(1, "It is 1. Checked.")
    grade = g.grade(traj, {})
    r = grade.metadata["score"]
    assert grade.errors == [] and grade.reward == pytest.approx(1 / (1 + math.exp(-r)), rel=1e-12)
    assert grade.success == (grade.reward >= 0.5)

    cfg = load_config(trained / "config.yaml")
    base, tok = load_model_and_tokenizer("tiny", seed=cfg.seed)
    rm = RewardModel(prepare_model(base, cfg.policy))
    saved = torch.load(latest_checkpoint(trained / "checkpoints") / "trainable.pt", weights_only=True)
    params = dict(rm.named_parameters())
    with torch.no_grad():
        for name, value in saved.items():
            params[name].copy_(value)
    assert any(float(v.abs().max()) > 0 for n, v in saved.items() if n.startswith("head"))  # it trained

    record = render_token_record(traj.model_copy(update={"n_prompt_messages": 2}), TokenizerRenderer(tok), "xml", [])
    ids, mask = record.ids, record.loss_mask
    with torch.no_grad():
        want = sequence_scores(rm.eval(), collate([PackedSequence(0, ids, mask, [0.0] * len(ids), [0.0] * len(ids))]))
    assert r == pytest.approx(float(want[0]), abs=1e-5)
    # a recorded token sequence is scored as recorded, the same number
    recorded = traj.model_copy(
        update={"tokens": TokenRecord(ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), turn=[0] * len(ids))}
    )
    assert g.grade(recorded, {}).metadata["score"] == pytest.approx(r, abs=1e-6)
    # a sample's text after the item's messages: the same conversation again
    item = {"messages": [m.to_openai() for m in traj.messages[:2]]}
    assert g.grade("It is 1. Checked.", item).metadata["score"] == pytest.approx(r, abs=1e-6)


def test_failures_are_flagged_never_a_silent_zero(trained, tmp_path):
    rm = trained / "reward_model"
    g = load_grader({"type": "reward_model", "path": str(rm), "name": "rm"})

    def flag(sample, item=None):
        grade = g.grade(sample, item or {})
        assert grade.reward == 0.0 and not grade.success and len(grade.errors) == 1, grade
        assert grade.errors[0].grader == "rm"
        return grade.errors[0].flag, grade.errors[0].message

    no_prompt = flag("It is 3.")
    assert no_prompt[0] == "sample_parse_error" and "item needs `messages`" in no_prompt[1]
    assert flag("", {"messages": [{"role": "user", "content": "q"}]})[0] == "sample_parse_error"
    assert "field 'messages'" in flag("x", {"messages": "not a list"})[1]
    huge = Trajectory(
        task_id="t",
        messages=[Message(role="user", content="q"), Message(role="assistant", content="a")],
        tokens=TokenRecord(ids=[1, 2, 10**6], loss_mask=[0, 0, 1], logprobs=[0.0] * 3, turn=[0] * 3),
    )
    got = flag(huge)
    assert got[0] == "sample_parse_error" and "outside the reward model's vocabulary" in got[1]
    no_answer = Trajectory(task_id="t", messages=[Message(role="user", content="q")])
    assert flag(no_answer)[0] == "sample_parse_error"
    # a model whose head went bad, or whose files went away, after the spec was loaded
    copy = tmp_path / "rm"
    shutil.copytree(rm, copy)
    broken = load_grader({"type": "reward_model", "path": str(copy), "name": "rm"})
    from safetensors.torch import save_file

    save_file({"weight": torch.full((1, 64), float("nan")), "bias": torch.zeros(1)}, str(copy / "head.safetensors"))
    (copy / "manifest.json").touch()  # a new model version at the same path
    nan = broken.grade(_conversation(1, "It is 1."), {})
    assert nan.errors[0].flag == "model_grader_parse_error" and nan.reward == 0.0
    (copy / "head.safetensors").write_bytes(b"not safetensors")
    (copy / "manifest.json").write_text((copy / "manifest.json").read_text() + " ")
    gone = broken.grade(_conversation(1, "It is 1."), {})
    assert (
        gone.errors[0].flag == "model_grader_server_error" and "cannot load the reward model" in gone.errors[0].message
    )

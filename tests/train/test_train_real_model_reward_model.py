"""A reward model on the real model (SmolLM2-135M, LoRA, bf16 autocast where the CPU has it): pairs from a
TRL file go through SmolLM2's chat template, step 1's loss is log 2 (zero head), each pair's prompt runs
once, and the saved model loads by path as a grader (the base policy by name, the adapter merged)."""

from __future__ import annotations

import json
import math

import pytest

from agentrft.train import train
from agentrft.train.config import build_config


@pytest.mark.real_model
def test_reward_model_on_smollm2_from_a_pairs_file(tmp_path) -> None:
    rows = []
    for k in range(4):
        prompt = [{"role": "user", "content": f"Revenue was ${5 + k} million in 2022 and $3 million in 2021. Change?"}]
        rows.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": f"The answer is {2 + k}."}],
                "rejected": [{"role": "assistant", "content": "The answer is 8."}],
                "task_id": f"t{k}",
            }
        )
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(
        {
            "method": "reward_model",
            "steps": 2,
            "policy": {"name": "smollm2-135m", "finetune": "lora", "lora_r": 4},
            "reward_model": {"pairs": str(pairs), "pairs_per_step": 3, "heldout_fraction": 0.25},
            "optimizer": {"lr": 1e-4},
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    res = train(cfg, tmp_path / "run")
    first, last = res.history[0], res.history[-1]
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-6) and first["data/pairs_rendered"] == 4
    assert first["train_forward_tokens"] < first["train_sequence_tokens"]  # each pair's prompt ran once
    assert last["rm/heldout_pairs"] == 1 and "rm/heldout_accuracy" in last
    from agentrft.graders import load_grader

    grader = load_grader({"type": "reward_model", "path": str(tmp_path / "run" / "reward_model")})
    grade = grader.grade("The answer is 2.", {"messages": rows[0]["prompt"]})
    assert grade.errors == [] and 0.0 < grade.reward < 1.0 and math.isfinite(grade.metadata["score"])

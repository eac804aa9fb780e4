"""DPO on the real model (SmolLM2-135M, bf16 autocast where the CPU has it): pairs from a TRL file go
through SmolLM2's chat template, step 1's loss is exactly log 2 (the cached reference was packed as step 1
packs), and the exported policy loads back as ``hf:RUN_DIR/policy``."""

from __future__ import annotations

import json
import math

import pytest

from agentrft.train import train
from agentrft.train.config import build_config

CALL = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "5 - 3"}'}}


@pytest.mark.real_model
def test_dpo_on_smollm2_from_a_pairs_file(tmp_path) -> None:
    rows = []
    for k in range(4):
        prompt = [{"role": "user", "content": f"Revenue was ${5 + k} million in 2022 and $3 million in 2021. Change?"}]
        good = f"The answer is {2 + k}."
        rows.append(
            {
                "prompt": prompt,
                "chosen": [
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": str(2 + k)},
                    {"role": "assistant", "content": good},
                ],
                "rejected": [{"role": "assistant", "content": "The answer is 8."}],
            }
        )
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(
        {
            "method": "dpo",
            "steps": 2,
            "policy": {"name": "smollm2-135m", "finetune": "full"},
            "dpo": {"pairs": str(pairs), "pairs_per_step": 2},
            "optimizer": {"lr": 1e-5},
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    res = train(cfg, tmp_path / "run")
    first = res.history[0]
    assert first["loss"] == math.log(2) and first["data/pairs_rendered"] == 4
    assert first["train_forward_tokens"] < first["train_sequence_tokens"]  # each pair's prompt ran once
    from agentrft.samplers.policies import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(f"hf:{tmp_path / 'run' / 'policy'}")
    assert tok.eos_token_id == 2 and model.config.vocab_size == 49152

"""The default policy, SmolLM2-135M-Instruct, loads (from the cache after the first run) and answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.policies import load_policy


@pytest.mark.real_model
def test_smollm2_greedy_reply() -> None:
    t0 = time.perf_counter()
    s = load_policy("smollm2-135m")
    load_s = time.perf_counter() - t0
    assert isinstance(s, HFSampler)
    assert s.model.config.num_hidden_layers == 30 and len(s.tokenizer) == 49152
    assert "quantization_config" not in s.model.config.to_dict()  # plain float weights, not GGUF
    prompt = s.render([{"role": "user", "content": "What is 2+2?"}])
    res = asyncio.run(s.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=24))))
    print(f"smollm2-135m load {load_s:.1f}s; reply {res.text!r} ({res.finish_reason})")
    assert res.text.strip()
    assert "<|im_end|>" not in res.text
    assert all(lp <= 0.0 for lp in res.logprobs) and len(res.logprobs) == len(res.token_ids)

"""The engine's compute: grouped-query SDPA without copying the KV, and bf16 (autocast, bf16 KV)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.decode_rows import RowState, make_generator
from agentrft.samplers.hf import GQA_SWITCH, HFSampler
from agentrft.samplers.hf_decode import DecodeSpec, RunningBatch
from agentrft.samplers.policies import PolicyError, load_trainable_policy, tiny_model_and_tokenizer

PARAMS = SamplingParams(temperature=0.7, max_tokens=16)


def _prompt(tok) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 times 7? Think."}], tokenize=False, add_generation_prompt=True
    )
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_grouped_query_sdpa_is_the_same_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model has 4 query heads over 2 KV heads: with and without `enable_gqa`, the same logits (a
    padded batch, so the masked path) and the same fp32 gradients (the trainer runs through it too)."""
    model, _ = tiny_model_and_tokenizer(seed=3)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids = torch.randint(5, 200, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0

    def run(switch: str) -> tuple[torch.Tensor, torch.Tensor]:
        monkeypatch.setenv(GQA_SWITCH, switch)
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[0, -3:].logsumexp(-1).sum().backward()
        return logits.detach(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()

    plain, plain_grad = run("0")
    grouped, grouped_grad = run("1")
    assert torch.allclose(plain[0], grouped[0], atol=1e-6, rtol=0)
    assert torch.allclose(plain[1, 9:], grouped[1, 9:], atol=1e-6, rtol=0)
    assert torch.allclose(plain_grad, grouped_grad, atol=1e-6, rtol=1e-5)


def test_the_switch_is_set_once_and_a_users_value_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model_and_tokenizer(seed=3)
    monkeypatch.delenv(GQA_SWITCH, raising=False)
    HFSampler(model, tok, policy="tiny").close()
    assert os.environ[GQA_SWITCH] == "1"
    monkeypatch.setenv(GQA_SWITCH, "0")
    HFSampler(model, tok, policy="tiny").close()
    assert os.environ[GQA_SWITCH] == "0"


def test_bf16_keeps_the_kv_in_bf16_and_samples_what_bf16_autocast_computes() -> None:
    """A bf16 batch stores its KV in bf16 and reports the log-probs of the tokens under the function the
    trainer's bf16 autocast computes (within bf16 rounding); the model's own weights stay fp32."""
    from agentrft.samplers.distribution import Distribution
    from agentrft.train.core.logprobs import sampled_logprobs

    model, tok = tiny_model_and_tokenizer(seed=4)
    model.eval()
    prompt = _prompt(tok)
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    row = RowState(PARAMS, make_generator(PARAMS, torch.device("cpu"), 11))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True):
        batch = RunningBatch(model, spec, torch.device("cpu"), kv_dtype=torch.bfloat16)
        batch.admit([SampleRequest(prompt, PARAMS)], [row])
        assert all(la.keys.dtype == torch.bfloat16 and la.values.dtype == torch.bfloat16 for la in batch.cache.layers)
        while batch.rows:
            batch.step()
    assert next(model.parameters()).dtype == torch.float32
    full = torch.tensor([prompt + row.token_ids])
    mask = torch.tensor([[0] * len(prompt) + [1] * len(row.token_ids)])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        expected, _ = sampled_logprobs(model, full, torch.ones_like(full), mask, dist=Distribution.of(PARAMS))
    expected = expected[0, len(prompt) :]
    got = torch.tensor(row.logprobs)
    assert torch.allclose(got, expected, atol=0.05, rtol=0)  # bf16: ~3 significant digits per matmul


def test_the_bf16_sampler_runs_and_leaves_no_autocast_behind() -> None:
    s = load_trainable_policy("tiny", seed=5, precision="bf16")
    assert isinstance(s, HFSampler) and s.precision == "bf16"
    prompt = s.render([{"role": "user", "content": "Hello"}])

    async def go():
        return await asyncio.gather(
            *(s.sample(SampleRequest(prompt, PARAMS.model_copy(update={"seed": i}))) for i in range(4))
        )

    try:
        results = asyncio.run(go())
        assert all(len(r.token_ids) == len(r.logprobs) > 0 for r in results)
        assert all(lp <= 0.0 for r in results for lp in r.logprobs)
        # the prefix cache keeps bf16 KV in a bf16 sampler
        assert all(t.dtype == torch.bfloat16 for t in s.prefix_cache.tensors())
        # autocast is the engine thread's, and only while a batch runs
        assert not torch.is_autocast_enabled("cpu")
        with torch.no_grad():
            out = s.model(torch.tensor([prompt])).logits
        assert out.dtype == torch.float32
    finally:
        s.close()


def test_bad_precision_is_refused() -> None:
    with pytest.raises(PolicyError, match="precision"):
        load_trainable_policy("tiny", precision="fp16")
    with pytest.raises(PolicyError, match="reference sampler computes in fp32"):
        load_trainable_policy("tiny", sampler="reference", precision="bf16")


def test_a_batch_that_cannot_start_fails_its_requests_and_gives_the_model_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agentrft.samplers.hf_decode as hf_decode

    real = hf_decode.RunningBatch
    calls = []

    def once_broken(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("no room for the cache")
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_decode, "RunningBatch", once_broken)  # the engine thread imports it when it starts
    s = load_trainable_policy("tiny", seed=6, precision="bf16")
    prompt = s.render([{"role": "user", "content": "Hi"}])
    try:
        with pytest.raises(RuntimeError, match="HF sampler failed: MemoryError: no room for the cache"):
            asyncio.run(s.sample(SampleRequest(prompt, PARAMS)))
        with s.paused():  # the lock was given back: this does not block
            pass
        ok = asyncio.run(s.sample(SampleRequest(prompt, PARAMS)))
        assert len(ok.token_ids) > 0 and len(calls) == 2
    finally:
        s.close()

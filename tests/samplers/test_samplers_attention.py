"""`samplers/attention.py`: grouped-query heads folded into the query rows give SDPA's attention, and the engine's
decode steps take that path."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from agentrft.samplers import attention
from agentrft.samplers.attention import NAME, folded_gqa_attention, use_agentrft_attention
from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.policies import tiny_model_and_tokenizer


def _reference(q, k, v, mask, scale):
    """SDPA with each kv head repeated for its query heads (transformers' `repeat_kv`), output (B, Q, H, D)."""
    r = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize(("heads", "kv_heads", "q_len"), [(4, 2, 1), (9, 3, 2), (9, 3, 5), (6, 1, 3)])
def test_folded_heads_give_sdpa_attention(heads: int, kv_heads: int, q_len: int) -> None:
    g = torch.Generator().manual_seed(heads * 10 + q_len)
    b, length, dim = 3, 37, 8
    q = torch.randn(b, heads, q_len, dim, generator=g)
    k, v = (torch.randn(b, kv_heads, length, dim, generator=g) for _ in range(2))
    mask = torch.rand(b, 1, q_len, length, generator=g) > 0.4
    mask[..., -1] = True  # every query sees a key
    got = folded_gqa_attention(q, k, v, mask, 0.3)
    assert got.shape == (b, q_len, heads, dim)
    assert torch.allclose(got, _reference(q, k, v, mask, 0.3), atol=1e-5, rtol=0)


def test_model_on_agentrft_sdpa_gives_sdpa_logits_under_a_4d_mask() -> None:
    """A decode-like forward (two queries per row over a cache, a boolean [B, 1, Q, L] mask): the switched model's
    logits are plain SDPA's, and the folded path ran in every layer."""
    model, _ = tiny_model_and_tokenizer(seed=1)
    plain = copy.deepcopy(model)
    use_agentrft_attention(model)
    assert model.config._attn_implementation == NAME and plain.config._attn_implementation == "sdpa"
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    calls = []
    real = attention.folded_gqa_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()
    mask[1, :, :, :3] = False  # row 1 is left-padded
    mask[1, :, :3, :3] = torch.eye(3, dtype=torch.bool)
    with torch.no_grad():
        attention.folded_gqa_attention = spy
        try:
            got = model(input_ids=ids, attention_mask=mask).logits
        finally:
            attention.folded_gqa_attention = real
        want = plain(input_ids=ids, attention_mask=mask).logits
    assert len(calls) == model.config.num_hidden_layers
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_only_sdpa_models_switch() -> None:
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="needs a model on sdpa"):
        use_agentrft_attention(model)


def test_the_engine_decodes_through_folded_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    plain_model = copy.deepcopy(model)
    calls = []
    real = attention.folded_gqa_attention
    monkeypatch.setattr(attention, "folded_gqa_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    s = HFSampler(model, tok, "tiny", prefix_cache_tokens=0)
    assert model.config._attn_implementation == NAME
    prompt = s.render([{"role": "user", "content": "What is 17% of 230?"}])
    params = SamplingParams(temperature=0.0, max_tokens=6)

    async def go(sampler: HFSampler):
        return await asyncio.gather(*(sampler.sample(SampleRequest(prompt, params)) for _ in range(2)))

    try:
        got = asyncio.run(go(s))
    finally:
        s.close()
    assert calls  # decode steps attended through the folded path
    monkeypatch.setattr(attention, "use_agentrft_attention", lambda m, **kw: False)  # the reference: plain SDPA
    ref_sampler = HFSampler(plain_model, tok, "tiny", prefix_cache_tokens=0)
    try:
        want = asyncio.run(go(ref_sampler))
    finally:
        ref_sampler.close()
    assert plain_model.config._attn_implementation == "sdpa"
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_a_model_that_cannot_switch_samples_on_plain_sdpa() -> None:
    """Some classes (Falcon, remote code) cannot take a registered attention implementation: the sampler keeps them
    on SDPA instead of refusing them."""
    from transformers import LlamaForCausalLM

    class Fixed(LlamaForCausalLM):
        @classmethod
        def _can_set_attn_implementation(cls) -> bool:
            return False

    tiny, tok = tiny_model_and_tokenizer(seed=0)
    model = Fixed(tiny.config).eval()
    assert model.config._attn_implementation == "sdpa"
    s = HFSampler(model, tok, "fixed", prefix_cache_tokens=0)
    try:
        prompt = s.render([{"role": "user", "content": "Hello"}])
        out = asyncio.run(s.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=3))))
    finally:
        s.close()
    assert model.config._attn_implementation == "sdpa" and len(out.token_ids) >= 1
    with pytest.raises(ValueError, match="a model class that can switch"):  # the trainer's segment layout needs it
        use_agentrft_attention(model)

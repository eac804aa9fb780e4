"""`samplers/attention.py`: grouped-query heads folded into the query rows, and a shared head of keys every row sees,
give SDPA's attention, and the engine's decode steps take those paths."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from agentrft.samplers import attention
from agentrft.samplers.attention import (
    HEAD_KWARG,
    NAME,
    folded_gqa_attention,
    shared_head_attention,
    use_agentrft_attention,
)
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


@pytest.mark.parametrize(
    ("heads", "kv_heads", "q_len", "dtype"),
    [
        (4, 2, 1, torch.float64),
        (9, 3, 2, torch.float64),
        (6, 1, 3, torch.float64),
        (4, 4, 2, torch.float64),
        (9, 3, 2, torch.bfloat16),
    ],
)
def test_a_shared_head_gives_the_attention_of_rows_that_hold_it(
    heads: int, kv_heads: int, q_len: int, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(heads * 10 + q_len)
    b, p_len, length, dim = 3, 23, 14, 8
    q = torch.randn(b, heads, q_len, dim, generator=g).to(dtype)
    hk, hv = (torch.randn(1, kv_heads, p_len, dim, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, kv_heads, length, dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(b, 1, q_len, length, generator=g) > 0.4
    mask[0, ..., :] = False  # a row that sees only the head
    got = shared_head_attention(q, k, v, mask, hk, hv, 0.3)
    assert got.shape == (b, q_len, heads, dim) and got.dtype == dtype
    full_k, full_v = (torch.cat([h.expand(b, -1, -1, -1), x], dim=2) for h, x in ((hk, k), (hv, v)))
    full_mask = torch.cat([torch.ones(b, 1, q_len, p_len, dtype=torch.bool), mask], dim=-1)
    want = _reference(q.double(), full_k.double(), full_v.double(), full_mask, 0.3)
    tol = 1e-12 if dtype == torch.float64 else 2e-2  # bf16: the inputs' rounding, one step of the output's
    assert torch.allclose(got.double(), want, atol=tol, rtol=0)


def test_a_shared_head_under_features_it_does_not_compute_goes_to_sdpa_over_the_whole_keys() -> None:
    """A sliding window (Mistral, Phi-3, Qwen2 pass one to every layer) or soft-capping: the head is written in
    front of the row's keys and SDPA attends over them, as it would for a row holding the prefix."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(5)
    b, heads, kv_heads, q_len, p_len, length, dim = 2, 6, 2, 2, 9, 7, 8
    q = torch.randn(b, heads, q_len, dim, generator=g, dtype=torch.float64)
    hk, hv = (torch.randn(1, kv_heads, p_len, dim, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, kv_heads, length, dim, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(b, 1, q_len, length, generator=g) > 0.3
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    head = SimpleNamespace(layers=[(hk, hv)])
    got, _ = attention._attention(module, q, k, v, mask, scaling=0.3, sliding_window=4096, **{HEAD_KWARG: head})
    full_k, full_v = (torch.cat([h.expand(b, -1, -1, -1), x], dim=2) for h, x in ((hk, k), (hv, v)))
    full_mask = torch.cat([torch.ones(b, 1, q_len, p_len, dtype=torch.bool), mask], dim=-1)
    assert torch.allclose(got, _reference(q, full_k, full_v, full_mask, 0.3), atol=1e-12, rtol=0)


def test_a_shared_head_refuses_a_mask_it_cannot_extend() -> None:
    model, _ = tiny_model_and_tokenizer(seed=1)
    use_agentrft_attention(model)
    cfg = model.config
    dim = cfg.hidden_size // cfg.num_attention_heads

    class Head:
        layers = [(torch.zeros(1, cfg.num_key_value_heads, 4, dim),) * 2] * cfg.num_hidden_layers

    ids = torch.randint(0, cfg.vocab_size, (1, 3))
    with torch.no_grad(), pytest.raises(ValueError, match="boolean mask"):
        model(input_ids=ids, **{HEAD_KWARG: Head()})  # no 4D mask: the causal mask is built without the head


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
    s = HFSampler(model, tok, "tiny", prefix_cache_tokens=0, share_head=False)  # one prompt: all of it a head
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


def test_the_engine_decodes_through_a_shared_head_as_plain_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two prompts with a common prefix sampled together (and a later turn through the prefix cache): the batch
    keeps the prefix once, decode steps attend through it, and ids and log-probs are plain SDPA's."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    plain_model = copy.deepcopy(model)
    calls = []
    real = attention.shared_head_attention
    monkeypatch.setattr(attention, "shared_head_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    s = HFSampler(model, tok, "tiny")
    system = {"role": "system", "content": "You are a careful analyst. Use the calculator for every figure. " * 3}
    prompts = [s.render([system, {"role": "user", "content": q}]) for q in ("What is 17% of 230?", "Add 4 and 5.")]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3)

    async def go(sampler: HFSampler):
        first = await asyncio.gather(*(sampler.sample(SampleRequest(p, params)) for p in prompts for _ in range(2)))
        follow = prompts[0] + first[0].token_ids + prompts[1][-5:]  # a next turn: its past from the prefix cache
        return [*first, await sampler.sample(SampleRequest(follow, params))]

    try:
        got = asyncio.run(go(s))
    finally:
        s.close()
    assert calls and s.stats["reused_tokens"] > 0
    monkeypatch.setattr(attention, "use_agentrft_attention", lambda m, **kw: False)  # the reference: plain SDPA
    ref_sampler = HFSampler(plain_model, tok, "tiny")
    try:
        want = asyncio.run(go(ref_sampler))
    finally:
        ref_sampler.close()
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

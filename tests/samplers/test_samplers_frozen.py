"""`samplers/frozen.py`: an eval-only sampler stores its linear weights in bf16 and computes what bf16 autocast over
the fp32 weights computes; the fp32 tensors it keeps own their memory; a frozen engine refuses weight updates."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.frozen import store_in_compute_dtype
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.policies import tiny_model_and_tokenizer


def _tied_tiny() -> torch.nn.Module:
    """The tiny model with its output head tied to the token embedding (as SmolLM2's is)."""
    from transformers import LlamaForCausalLM

    tiny, _ = tiny_model_and_tokenizer(seed=3)
    cfg = copy.deepcopy(tiny.config)
    cfg.tie_word_embeddings = True
    torch.manual_seed(3)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_bf16_linear_weights_compute_what_autocast_computes(tied: bool) -> None:
    model = _tied_tiny() if tied else tiny_model_and_tokenizer(seed=2)[0]
    before = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    cast = store_in_compute_dtype(model, torch.bfloat16)
    layers = model.config.num_hidden_layers
    assert cast == layers * 7 + (0 if tied else 1)  # q, k, v, o, gate, up, down per layer (+ an untied head)
    embedding = model.get_input_embeddings().weight
    assert embedding.dtype == torch.float32
    assert (model.lm_head.weight is embedding) == tied
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = model(ids).logits.float(), before(ids).logits.float()
    assert torch.allclose(got, want, atol=1e-6, rtol=0)  # the same casts, the same kernels


def test_kept_fp32_tensors_are_copies_of_their_own() -> None:
    """Every fp32 tensor left is a fresh copy of exactly its size, so nothing holds the loaded checkpoint's memory
    (a safetensors map) alive."""
    model, _ = tiny_model_and_tokenizer(seed=0)
    old = {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters() if p.dtype == torch.float32}
    store_in_compute_dtype(model, torch.bfloat16)
    kept = {n: p for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert kept and set(kept) < set(old)
    for name, p in kept.items():
        assert p.untyped_storage().data_ptr() != old[name]
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size()


def _greedy(sampler: HFSampler) -> list:
    prompt = sampler.render([{"role": "user", "content": "What is 17% of 230?"}])
    params = SamplingParams(temperature=0.0, max_tokens=8)

    async def go() -> list:
        return await asyncio.gather(*(sampler.sample(SampleRequest(prompt, params)) for _ in range(2)))

    try:
        return asyncio.run(go())
    finally:
        sampler.close()


def test_a_frozen_bf16_engine_samples_as_the_trainable_one_and_refuses_updates() -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    trainable = HFSampler(copy.deepcopy(model), tok, "tiny", prefix_cache_tokens=0, precision="bf16")
    frozen = HFSampler(model, tok, "tiny", prefix_cache_tokens=0, precision="bf16", frozen=True)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert trainable.model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    for a, b in zip(_greedy(frozen), _greedy(trainable), strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.weights_updated(1)
    with pytest.raises(RuntimeError, match="frozen"), frozen.paused():  # a trainer's entry: refused before any write
        pass


def test_a_frozen_fp32_engine_keeps_its_weights() -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    HFSampler(model, tok, "tiny", frozen=True).close()
    assert {p.dtype for p in model.parameters()} == {torch.float32}

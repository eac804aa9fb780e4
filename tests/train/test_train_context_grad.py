"""The stop-gradient context (`context_grad`, ``optimizer.context_grad: stop``): the exact update's log-probs, and
the gradient of an independent construction: each sequence alone through the plain model, with the key and value
projections of every token that is neither trained nor predicting a trained token detached."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_train_shared_prefix import _assert_grads_close, _batch

from agentrft.train.config import OptimizerConfig, TrainConfig
from agentrft.train.core import segment_attention
from agentrft.train.core.context_grad import gradient_columns, visibility
from agentrft.train.core.logprobs import sampled_logprobs
from agentrft.train.core.packing import collate
from agentrft.train.core.segment_attention import use_segment_attention
from agentrft.train.core.shared_prefix import pack_segment_rows, shared_prefix_logprobs, shared_prefix_micro_batches


def _context(loss_mask: list[int]) -> torch.Tensor:
    """(T,) True where token t is context: neither trained nor the predictor of a trained token."""
    m = torch.tensor(loss_mask, dtype=torch.bool)
    need = m.clone()
    need[:-1] |= m[1:]
    return ~need


def _reference(model, seqs, weights):
    """Per sequence, plain forward; the context tokens' k_proj / v_proj outputs detached at every layer."""
    ctx: list[torch.Tensor] = []

    def hook(_module, _inputs, out):
        c = ctx[0][None, :, None]
        return torch.where(c, out.detach(), out)

    handles = [
        proj.register_forward_hook(hook)
        for layer in model.model.layers
        for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj)
    ]
    out = []
    try:
        for s, w in zip(seqs, weights, strict=True):
            ctx[:] = [_context(s.loss_mask)]
            mb = collate([s])
            lp, _ = sampled_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, chunk_size=5)
            (lp[0] * w).sum().backward()
            out.append(lp[0].detach())
    finally:
        for h in handles:
            h.remove()
    return out


def _weights(seqs, dtype):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(len(s.input_ids), generator=g, dtype=dtype) for s in seqs]


@pytest.mark.parametrize("path", ["auto", "causal"])  # auto takes the masked suffix path at these sizes
@pytest.mark.parametrize("row_tokens", [10_000, 40])
def test_logprobs_exact_and_gradient_that_of_a_detached_context(row_tokens, path, monkeypatch):
    if path == "causal":  # the context pass's attention by the causal suffix path (the recipe's zero-shot rows)
        monkeypatch.setattr(segment_attention, "suffix_path", lambda p, n, s: "causal")
    seqs = _batch()
    weights = _weights(seqs, torch.float64)
    ref_model, model, exact_model = tiny_llama(), tiny_llama(), tiny_llama()
    want_lp = _reference(ref_model, seqs, weights)
    mbs = shared_prefix_micro_batches(seqs, 10_000, row_tokens, layout="segments", context_grad="stop")
    assert all(mb.shared is not None and mb.shared.stop_context for mb in mbs)
    use_segment_attention(model)
    use_segment_attention(exact_model)
    position = {s.index: k for k, s in enumerate(seqs)}  # a sequence's place in ``seqs``
    for mb in mbs:
        for m in (model, exact_model):
            if m is exact_model:
                mb.shared.stop_context = False
            lp, _ = shared_prefix_logprobs(m, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=5)
            mb.shared.stop_context = True
            w = torch.zeros_like(lp)
            for b, i in enumerate(mb.seq_index):
                want, wi = want_lp[position[i]], weights[position[i]]
                # the log-probs are the exact update's (and the reference's): only the gradient differs
                torch.testing.assert_close(lp[b, : len(want)], want, rtol=1e-10, atol=1e-12)
                w[b, : len(wi)] = wi
            (lp * w).sum().backward()
    got = [p.grad for p in model.parameters()]
    _assert_grads_close(got, [p.grad for p in ref_model.parameters()])
    exact = [p.grad for p in exact_model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(got, exact, strict=True)) > 1e-3  # not the exact gradient


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_recomputes_the_same_gradient(lora):
    seqs = _batch(seed=3)
    [mb] = shared_prefix_micro_batches(seqs, 10_000, 10_000, layout="segments", context_grad="stop")
    grads = []
    for gc in (False, True):
        model = tiny_llama()
        use_segment_attention(model)
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
            )
        model.train()
        lp, _ = shared_prefix_logprobs(model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=5)
        (lp * mb.loss_mask).sum().backward()
        grads.append([p.grad for p in model.parameters() if p.requires_grad])
    assert any(float(g.abs().max()) > 1e-6 for g in grads[0])
    _assert_grads_close(grads[1], grads[0])


def test_without_autograd_the_rows_run_once():
    """Old and reference log-probs (no grad) take the one-pass layout: the same numbers."""
    seqs = _batch(seed=4)
    [mb] = shared_prefix_micro_batches(seqs, 10_000, 10_000, layout="segments", context_grad="stop")
    model = tiny_llama()
    use_segment_attention(model)
    lp_grad, _ = shared_prefix_logprobs(model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=5)
    with torch.no_grad():
        lp, _ = shared_prefix_logprobs(model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=5)
    torch.testing.assert_close(lp, lp_grad.detach(), rtol=1e-10, atol=1e-12)


def test_gradient_columns_and_their_visibility():
    a = [5, 6, 7, 8, 9, 1]  # trained: 8 9 (predicted from 7) and 1 (from 9)
    b = [5, 6, 2, 3]  # trained: 3 (from 2)
    rows = pack_segment_rows([a, b], [[0, 1]], pad_id=0)  # [5 6 | 7 8 9 1 | 2 3]
    assert rows.segments == [(2, [(2, 6), (6, 8)])]
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 0]])
    mask[0, 5] = 1
    [cols] = gradient_columns(rows.seq_row, rows.seq_cols, mask, 1)
    assert cols.tolist() == [2, 3, 4, 5, 6, 7]
    vis = visibility([cols], rows.segments, 8)[0, 0].int()
    assert vis[1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]  # column 3 (a's 8): the prefix, a up to itself
    assert vis[4].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0]  # column 6 (b's 2): the prefix, itself, never a's
    prefix_only = visibility([torch.tensor([1])], [(4, [])], 4)[0, 0].int()
    assert prefix_only.tolist() == [[1, 1, 0, 0, 0]]
    padded = visibility([torch.tensor([0, 1]), torch.tensor([0])], [(2, []), (2, [])], 2)
    assert padded[1, 0, 1].int().tolist() == [0, 0, 1]  # a padding query sees the dummy column only


def test_stop_needs_the_segment_layout_and_a_token_level_method():
    with pytest.raises(ValueError, match="segments"):
        OptimizerConfig(context_grad="stop")
    assert OptimizerConfig(context_grad="stop", shared_prefix_layout="segments").context_grad == "stop"
    with pytest.raises(ValueError, match="context_grad"):
        TrainConfig.model_validate(
            {"method": "dpo", "optimizer": {"context_grad": "stop", "shared_prefix_layout": "segments"}}
        )
    seqs = _batch()
    with pytest.raises(ValueError, match="segments"):
        shared_prefix_micro_batches(seqs, 64, 64, context_grad="stop")
    with pytest.raises(ValueError, match="context_grad"):
        shared_prefix_micro_batches(seqs, 64, 64, layout="segments", context_grad="some")


def test_the_trainer_packs_stop_micro_batches_from_the_config():
    import random

    from conftest import fake_trajectory

    from agentrft.train.rl.stages import pack_stage

    rng = random.Random(0)
    trajs = [fake_trajectory(rng, turns=2) for _ in range(3)]
    per_token = [[float(m) for m in t.tokens.loss_mask] for t in trajs]
    cfg = TrainConfig.model_validate(
        {"method": "sft", "optimizer": {"context_grad": "stop", "shared_prefix_layout": "segments"}}
    )
    mbs = pack_stage(trajs, per_token, cfg, pad_id=0)
    assert mbs and all(mb.shared is not None and mb.shared.stop_context for mb in mbs)
    exact = pack_stage(trajs, per_token, TrainConfig.model_validate({"method": "sft"}), pad_id=0)
    assert all(mb.shared is None or not mb.shared.stop_context for mb in exact)

"""The segment layout of shared-prefix updates (`segment_attention`): the same log-probs, losses and gradients as
per-sample runs, with and without gradient checkpointing and LoRA, and no change to the model's other callers."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import VOCAB, tiny_llama
from test_train_shared_prefix import _assert_grads_close, _batch, _seq, _update

from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.core import segment_attention
from agentrft.train.core.logprobs import sampled_logprobs
from agentrft.train.core.packing import collate, micro_batches
from agentrft.train.core.segment_attention import NAME, segmented_attention, suffix_path, use_segment_attention
from agentrft.train.core.shared_prefix import (
    pack_segment_rows,
    plan_segment_rows,
    segment_row_len,
    shared_prefix_logprobs,
    shared_prefix_micro_batches,
)


def test_segment_packing_lays_out_prefix_then_suffixes():
    a, b, c = [5, 6, 7, 8], [5, 6, 9], [1, 2]
    rows = pack_segment_rows([a, b, c], [[2], [0, 1]], pad_id=0)
    assert rows.input_ids.tolist() == [[1, 2, 0, 0, 0], [5, 6, 7, 8, 9]]
    assert rows.position_ids.tolist() == [[0, 1, 0, 0, 0], [0, 1, 2, 3, 2]]
    assert rows.segments == [(2, [(2, 2)]), (2, [(2, 4), (4, 5)])]  # c alone: all prefix, an empty suffix
    assert rows.seq_cols[1, :3].tolist() == [0, 1, 4]
    assert rows.tree_mask is None and rows.num_tokens == 2 + 5
    assert segment_row_len([a, b, c], [0, 1]) == 5
    # only the prefix common to the whole row is shared: b and d agree on 3 tokens, a on 2 with them
    d = [5, 6, 9, 4]
    assert segment_row_len([a, b, c, d], [0, 1, 3]) == 2 + 2 + 1 + 2


def test_segment_rows_are_cut_at_the_token_budget():
    toks = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 9], [7, 7]]
    # [7 7] shares nothing with the others: joining would cost more than its own row
    assert plan_segment_rows(toks, 100) == [[0, 1, 2], [3]]
    rows = plan_segment_rows(toks, 6)  # [1 2 3] + 4 + 5 = 5 fits; + [9 9] would share only [1 2]: 2 + 2 + 2 + 2
    assert rows == [[0, 1], [2], [3]]
    assert all(segment_row_len(toks, r) <= 6 for r in rows)
    assert plan_segment_rows([[1] * 9], 3) == [[0]]


@pytest.mark.parametrize("path", ["masked", "causal", "auto"])
def test_segmented_attention_equals_masked_attention(path):
    """Against SDPA with the explicit mask of the same layout, queries of padding columns aside, by either path,
    in the output and in the gradients of q, k and v."""
    torch.manual_seed(0)
    heads, kv, length, dim = 4, 2, 14, 8
    segments = [(5, [(5, 8), (8, 9), (9, 12)]), (0, [(0, 6), (6, 13)]), (7, [])]
    if path == "auto":  # a fourth row long enough that auto takes the causal path for it: 2 x 600 after 4
        segments.append((4, [(4, 604), (604, 1204)]))
        picked = [segment_attention.suffix_path(p, len(sp), max(e - s for s, e in sp)) for p, sp in segments if sp]
        assert picked == ["masked", "masked", "causal"]
    rows, length = len(segments), max(length, 1204)
    q = torch.randn(rows, heads, length, dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(rows, kv, length, dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(rows, kv, length, dim, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(rows, 1, length, length, dtype=torch.bool)
    real = torch.zeros(rows, length, dtype=torch.bool)
    for r, (p, spans) in enumerate(segments):
        mask[r, 0, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        real[r, :p] = True
        for s, e in spans:
            mask[r, 0, s:e, :p] = True
            mask[r, 0, s:e, s:e] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
            real[r, s:e] = True
    pad = ~real
    mask[pad[:, None, :, None].expand_as(mask) & torch.eye(length, dtype=torch.bool)] = True  # padding sees itself
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    got = segmented_attention(q, k, v, segments, None, path=path)
    torch.testing.assert_close(got[real], want[real], rtol=1e-12, atol=1e-12)
    assert float(got[pad].abs().max()) == 0.0
    weights = torch.randn_like(want) * real[:, :, None, None]  # a loss on the real columns only
    want_grads = torch.autograd.grad((want * weights).sum(), (q, k, v))
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_the_suffix_path_for_the_recipes_rows_is_pinned():
    # the recipe's level-3 rows: ~1,100-token suffixes after a 290-token zero-shot prompt or a 1,365-token
    # few-shot one (its worked example); a row of one short suffix after a long prefix
    assert suffix_path(290, 8, 1100) == "causal"
    assert suffix_path(1365, 6, 1100) == "masked"
    assert suffix_path(2000, 1, 50) == "masked" and suffix_path(0, 4, 2000) == "causal"


@pytest.fixture(params=["auto", "causal"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The model-level tests by the path ``auto`` picks at their sizes (masked) and by the causal one."""
    if request.param == "causal":
        monkeypatch.setattr(segment_attention, "suffix_path", lambda p, n, s: "causal")
    return str(request.param)


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-10, 1e-12), (torch.float32, 1e-5, 1e-6)])
def test_logprobs_and_gradients_equal_per_sample(dtype, rtol, atol, path):
    seqs = _batch()
    ref_model, model = tiny_llama(dtype=dtype), tiny_llama(dtype=dtype)
    mb = collate(seqs)
    lp_ref, ent_ref = sampled_logprobs(ref_model, mb.input_ids, mb.attention_mask, mb.loss_mask, chunk_size=7)
    smbs = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000, layout="segments")
    assert len(smbs) == 1
    [smb] = smbs
    assert smb.shared is not None and smb.shared.segments is not None
    assert smb.shared.num_tokens < int(mb.attention_mask.sum())  # the groups' prompts run once
    order = [seqs.index(next(s for s in seqs if s.index == i)) for i in smb.seq_index]
    with pytest.raises(ValueError, match="use_segment_attention"):  # plain SDPA would ignore the layout
        shared_prefix_logprobs(model, smb.shared, smb.input_ids, smb.loss_mask, chunk_size=7)
    use_segment_attention(model)
    lp, ent = shared_prefix_logprobs(model, smb.shared, smb.input_ids, smb.loss_mask, chunk_size=7)
    torch.testing.assert_close(lp, lp_ref[order], rtol=rtol, atol=atol)
    torch.testing.assert_close(ent, ent_ref[order], rtol=rtol, atol=atol)
    w = torch.linspace(-1, 1, lp.numel(), dtype=dtype).reshape(lp.shape)
    (lp_ref[order] * w).sum().backward()
    (lp * w).sum().backward()
    _assert_grads_close([p.grad for p in model.parameters()], [p.grad for p in ref_model.parameters()])


@pytest.mark.parametrize("row_tokens,max_tokens", [(10_000, 10_000), (40, 10_000), (30, 60)])
def test_update_equals_per_sample_under_any_split(row_tokens, max_tokens, path):
    algo = AlgorithmConfig(updates_per_batch=2)
    seqs = _batch()
    d_ref, m_ref = _update(micro_batches(seqs, max_tokens=1), algo)
    shared = shared_prefix_micro_batches(seqs, max_tokens=max_tokens, row_tokens=row_tokens, layout="segments")
    assert sorted(i for mb in shared for i in mb.seq_index) == list(range(len(seqs)))
    d, m = _update(shared, algo, prepare=use_segment_attention)
    assert any(float(x.abs().max()) > 1e-6 for x in d)
    _assert_grads_close(d, d_ref)
    assert m["loss"] == pytest.approx(m_ref["loss"], rel=1e-7)


@pytest.mark.parametrize("lora,gc", [(True, False), (True, True), (False, True)])
def test_update_equals_per_sample_with_lora_and_checkpointing(lora, gc, path):
    """Checkpointing recomputes each layer in the backward: the layout is a forward argument, so it is there too."""
    algo = AlgorithmConfig()
    seqs = _batch(seed=3)
    d_ref, _ = _update(micro_batches(seqs, max_tokens=10_000), algo, lora=lora, gc=gc)
    mbs = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000, layout="segments")
    d, _ = _update(mbs, algo, lora=lora, gc=gc, prepare=use_segment_attention)
    assert any(float(x.abs().max()) > 1e-6 for x in d)
    _assert_grads_close(d, d_ref)


def test_the_switched_model_computes_as_before_for_everyone_else():
    model = tiny_llama()
    ids = torch.tensor([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    before = model(input_ids=ids, attention_mask=attn).logits
    use_segment_attention(model)
    assert model.config._attn_implementation == NAME
    after = model(input_ids=ids, attention_mask=attn).logits
    torch.testing.assert_close(after[attn.bool()], before[attn.bool()], rtol=1e-12, atol=1e-12)
    use_segment_attention(model)  # idempotent


def test_layout_choices_are_checked():
    seqs = [_seq(i, [random.Random(i).randrange(VOCAB) for _ in range(6)], [0, 0, 0, 1, 1, 1], 1.0) for i in range(2)]
    with pytest.raises(ValueError, match="layout"):
        shared_prefix_micro_batches(seqs, max_tokens=64, row_tokens=64, layout="radix")
    with pytest.raises(ValueError, match="tree layout"):
        shared_prefix_micro_batches(seqs, max_tokens=64, row_tokens=64, units=[[0, 1]], layout="segments")
    eager = tiny_llama()
    eager.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="sdpa"):
        use_segment_attention(eager)


def test_bf16_autocast_matches_the_tree_layout(path):
    """Under bf16 autocast (the trainer's CPU default) the segment layout computes what the tree layout does."""
    from agentrft.train.core.update import autocast

    seqs = _batch(seed=5)
    tree_model, seg_model = tiny_llama(dtype=torch.float32), tiny_llama(dtype=torch.float32)
    use_segment_attention(seg_model)
    [tree] = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000)
    [seg] = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000, layout="segments")
    out = []
    for model, mb in ((tree_model, tree), (seg_model, seg)):
        with autocast(torch.bfloat16):
            lp, _ = shared_prefix_logprobs(model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=7)
        (lp * mb.loss_mask).sum().backward()
        out.append((lp.detach(), [p.grad for p in model.parameters()]))
    order = [seg.seq_index.index(i) for i in tree.seq_index]  # the layouts plan their rows differently
    torch.testing.assert_close(out[1][0][order], out[0][0], rtol=0, atol=0.05)
    for g_seg, g_tree in zip(out[1][1], out[0][1], strict=True):
        torch.testing.assert_close(g_seg, g_tree, rtol=0.05, atol=0.05 * float(g_tree.abs().max()) + 1e-6)


def test_a_model_that_ignores_the_layout_gets_nan_not_a_wrong_answer(monkeypatch):
    """Were the switch undone behind our back, plain SDPA would see the NaN placeholder mask: NaN, not a wrong number."""
    import agentrft.train.core.segment_attention as sa

    seqs = _batch(seed=6)
    [mb] = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000, layout="segments")
    model = tiny_llama()
    monkeypatch.setattr(sa, "check_segment_attention", lambda body: None)
    lp, _ = shared_prefix_logprobs(model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=7)
    assert bool(torch.isnan(lp[mb.loss_mask.bool()]).all())

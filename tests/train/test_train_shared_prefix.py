"""Invariance of shared-prefix (prefix-tree) updates: the same log-probs, loss and gradients as per-sample runs."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import VOCAB, tiny_llama

from agentrft.samplers.distribution import Distribution
from agentrft.train.config import OptimizerConfig
from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.core import update as U
from agentrft.train.core.logprobs import sampled_logprobs
from agentrft.train.core.packing import PackedSequence, collate, micro_batches
from agentrft.train.core.shared_prefix import (
    pack_prefix_tree,
    packed_row_len,
    plan_rows,
    shared_prefix_logprobs,
    shared_prefix_micro_batches,
)

# Tolerances. Log-probs in the forward agree to fp64 rounding. Gradients of shared tokens are summed in a
# different order than in per-sample runs, and Llama's RMSNorm computes in fp32 even in an fp64 model, so
# gradients agree to fp32 rounding: 1e-5 relative plus an absolute floor of 1e-6 x the largest gradient entry.
GRAD_RTOL = 1e-5


def _assert_grads_close(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=GRAD_RTOL, atol=1e-6 * float(b.abs().max()) + 1e-12)


def _seq(index: int, ids: list[int], mask: list[int], adv: float) -> PackedSequence:
    return PackedSequence(index, ids, mask, [-0.5 * m for m in mask], [adv * m for m in mask])


def _group(rng: random.Random, start: int, g: int, prompt_len: int, multi_turn: bool) -> list[PackedSequence]:
    """A group sharing a prompt; multi-turn members share the first turn with some siblings, then diverge."""
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    first_turns = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 4))] for _ in range(2)]
    out = []
    for k in range(g):
        ids, mask = list(prompt), [0] * prompt_len
        if multi_turn:
            turn = first_turns[k % 2]  # members 0,2,4.. agree on turn 1; they diverge at different points later
            ids += turn
            mask += [1] * len(turn)
            tool = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))]
            ids += tool
            mask += [0] * len(tool)
        n = rng.randint(1, 6)
        ids += [rng.randrange(VOCAB) for _ in range(n)]
        mask += [1] * n
        out.append(_seq(start + k, ids, mask, rng.uniform(-1, 1)))
    return out


def _batch(seed: int = 0) -> list[PackedSequence]:
    rng = random.Random(seed)
    seqs = _group(rng, 0, 6, 12, multi_turn=False) + _group(rng, 6, 5, 9, multi_turn=True)
    seqs += _group(rng, 11, 1, 7, multi_turn=True)  # a group of 1
    # an exact duplicate and a sequence that is a strict prefix of a sibling
    dup = seqs[2]
    seqs.append(_seq(12, list(dup.input_ids), list(dup.loss_mask), 0.3))
    cut = len(seqs[7].input_ids) - 1
    seqs.append(_seq(13, seqs[7].input_ids[:cut], seqs[7].loss_mask[:cut], -0.7))
    random.Random(seed + 1).shuffle(seqs)
    return seqs


def test_tree_packing_shares_prefixes_and_masks_exactly():
    a, b, c = [5, 6, 7, 8], [5, 6, 9], [1, 2]
    rows = pack_prefix_tree([a, b, c], [[2], [0, 1]], pad_id=0)  # row 0: c, row 1: a then b
    assert rows.input_ids.tolist() == [[1, 2, 0, 0, 0], [5, 6, 7, 8, 9]]
    assert rows.position_ids.tolist() == [[0, 1, 0, 0, 0], [0, 1, 2, 3, 2]]
    assert rows.seq_cols[1, :3].tolist() == [0, 1, 4]  # b reuses a's columns 0,1 and adds column 4
    m = rows.tree_mask[1, 0].int()
    assert m[4].tolist() == [1, 1, 0, 0, 1]  # b's third token sees only b's tokens
    assert m[3].tolist() == [1, 1, 1, 1, 0]
    assert rows.tree_mask[0, 0, 3].int().tolist() == [0, 0, 0, 1, 0]  # padding sees itself only (no NaN)
    assert rows.num_tokens == 2 + 5
    assert packed_row_len([a, b, c], [0, 1]) == 5


def test_rows_are_cut_at_the_token_budget():
    toks = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 9], [7, 7]]
    assert plan_rows(toks, 100) == [[0, 1, 2, 3]]
    rows = plan_rows(toks, 6)  # 4 + 1 = 5 fits, + 2 more would be 7
    assert rows == [[0, 1], [2, 3]]
    assert all(packed_row_len(toks, r) <= 6 for r in rows)
    assert plan_rows([[1] * 9], 3) == [[0]]  # a sequence longer than the budget gets its own row


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-10, 1e-12), (torch.float32, 1e-5, 1e-6)])
def test_logprobs_and_gradients_equal_per_sample(dtype, rtol, atol):
    seqs = _batch()
    ref_model, model = tiny_llama(dtype=dtype), tiny_llama(dtype=dtype)
    mb = collate(seqs)
    lp_ref, ent_ref = sampled_logprobs(ref_model, mb.input_ids, mb.attention_mask, mb.loss_mask, chunk_size=7)
    [smb] = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000)
    assert smb.shared is not None and smb.shared.num_tokens < int(mb.attention_mask.sum())  # something is shared
    order = [seqs.index(next(s for s in seqs if s.index == i)) for i in smb.seq_index]
    lp, ent = shared_prefix_logprobs(model, smb.shared, smb.input_ids, smb.loss_mask, chunk_size=7)
    torch.testing.assert_close(lp, lp_ref[order], rtol=rtol, atol=atol)
    torch.testing.assert_close(ent, ent_ref[order], rtol=rtol, atol=atol)
    w = torch.linspace(-1, 1, lp.numel(), dtype=dtype).reshape(lp.shape)
    (lp_ref[order] * w).sum().backward()
    (lp * w).sum().backward()
    _assert_grads_close([p.grad for p in model.parameters()], [p.grad for p in ref_model.parameters()])


def _update(batches, algo, lora: bool = False, gc: bool = False, prepare=None):
    model = tiny_llama()
    if prepare is not None:
        prepare(model)
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False),
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1.0)  # lr 1: the change is exactly minus the gradient
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in params]
    m = U.policy_update(
        model, opt, sched, batches, algo, OptimizerConfig(grad_clip=1e9, logprob_chunk=5), dist=Distribution()
    )
    return [p.detach() - b for p, b in zip(params, before, strict=True)], m


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("row_tokens,max_tokens", [(10_000, 10_000), (40, 10_000), (30, 60), (1, 1)])
def test_update_equals_per_sample_under_any_split(mode, row_tokens, max_tokens):
    """One row, groups split across rows, rows split across micro-batches, and one sequence per micro-batch."""
    algo = AlgorithmConfig(aggregation=mode, updates_per_batch=2)  # 2: the old-logprob pass goes the same way
    seqs = _batch()
    d_ref, m_ref = _update(micro_batches(seqs, max_tokens=1), algo)
    shared = shared_prefix_micro_batches(seqs, max_tokens=max_tokens, row_tokens=row_tokens)
    assert sorted(i for mb in shared for i in mb.seq_index) == list(range(len(seqs)))
    d, m = _update(shared, algo)
    assert any(float(x.abs().max()) > 1e-6 for x in d)
    _assert_grads_close(d, d_ref)
    assert m["loss"] == pytest.approx(m_ref["loss"], rel=1e-7)  # includes the 2nd pass, after fp32-rounded steps
    if row_tokens == 10_000:
        assert m["train_forward_tokens"] < m_ref["train_forward_tokens"]
        assert m["train_sequence_tokens"] == m_ref["train_forward_tokens"]


@pytest.mark.parametrize("lora,gc", [(True, False), (True, True), (False, True)])
def test_update_equals_per_sample_with_lora_and_checkpointing(lora, gc):
    algo = AlgorithmConfig()
    seqs = _batch(seed=3)
    d_ref, _ = _update(micro_batches(seqs, max_tokens=10_000), algo, lora=lora, gc=gc)
    d, _ = _update(shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000), algo, lora=lora, gc=gc)
    assert any(float(x.abs().max()) > 1e-6 for x in d)
    _assert_grads_close(d, d_ref)


def test_rows_that_share_nothing_take_the_plain_causal_layout() -> None:
    """A micro-batch whose rows each hold one sequence gets no tree (the plain layout computes the same without
    a dense mask); one where a row shares a prefix keeps it."""
    rng = random.Random(3)
    alone = [_seq(i, [rng.randrange(VOCAB) for _ in range(12)], [0] * 6 + [1] * 6, 1.0) for i in range(2)]
    mbs = shared_prefix_micro_batches(alone, max_tokens=64, row_tokens=12)  # each sequence fills its own row
    assert len(mbs) == 1 and mbs[0].shared is None
    assert mbs[0].input_ids.shape == (2, 12)
    group = _group(rng, 0, 3, prompt_len=8, multi_turn=False)
    mbs = shared_prefix_micro_batches(group, max_tokens=64, row_tokens=64)
    assert len(mbs) == 1 and mbs[0].shared is not None

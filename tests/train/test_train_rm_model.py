"""The reward model's scores: read at the last loss token; prefix-tree packing equals one sequence at a time."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import VOCAB, tiny_llama

from agentrft.algos.reward_model import bradley_terry_loss
from agentrft.train.core.packing import PackedSequence, collate
from agentrft.train.core.shared_prefix import pack_prefix_tree
from agentrft.train.data.rm_model import RewardModel, last_loss_index, sequence_scores


def _pairs(rng: random.Random, n_pairs: int = 3) -> list[PackedSequence]:
    """Pairs (2k chosen, 2k+1 rejected) sharing a prompt; pairs 0 and 1 share a task's prompt too."""
    seqs: list[PackedSequence] = []
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(5, 9))] for _ in range(max(n_pairs - 1, 1))]
    if n_pairs > 1:
        prompts.insert(1, prompts[0])
    for prompt in prompts:
        for _ in range(2):
            answer = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 6))]
            tail = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 2))]  # after the last loss token
            ids = prompt + answer + tail
            mask = [0] * len(prompt) + [1] * len(answer) + [0] * len(tail)
            zeros = [0.0] * len(ids)
            seqs.append(PackedSequence(len(seqs), ids, mask, zeros, zeros))
    return seqs


def _model(seed: int = 0) -> RewardModel:
    rm = RewardModel(tiny_llama(seed))
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        rm.head.weight.normal_(0, 1.0)
        rm.head.bias.fill_(0.3)
    return rm


def test_last_loss_index():
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [0, 1, 0, 1, 0]])
    assert last_loss_index(mask).tolist() == [2, 4, 3]
    with pytest.raises(ValueError, match="needs a loss token"):
        last_loss_index(torch.tensor([[0, 1], [0, 0]]))


def test_head_starts_at_zero_so_every_pair_starts_at_log_2():
    rm = RewardModel(tiny_llama(0))
    mb = collate(_pairs(random.Random(0)))
    scores = sequence_scores(rm, mb)
    assert scores.abs().max() == 0.0
    losses, _ = bradley_terry_loss(scores[0::2], scores[1::2])
    torch.testing.assert_close(losses, torch.full((3,), 0.6931471805599453, dtype=losses.dtype), rtol=1e-15, atol=0)


def test_score_reads_the_last_loss_token_not_what_follows():
    rm = _model()
    seq = _pairs(random.Random(1), 1)[0]
    last = max(i for i, m in enumerate(seq.loss_mask) if m)
    alone = sequence_scores(rm, collate([seq]))
    cut = PackedSequence(
        0, seq.input_ids[: last + 1], seq.loss_mask[: last + 1], [0.0] * (last + 1), [0.0] * (last + 1)
    )
    torch.testing.assert_close(alone, sequence_scores(rm, collate([cut])), rtol=1e-12, atol=1e-12)
    hidden = rm.body(input_ids=torch.tensor([seq.input_ids])).last_hidden_state[0, last]
    torch.testing.assert_close(alone[0], rm.head(hidden)[0], rtol=1e-12, atol=1e-12)


def test_packed_equals_per_sequence_scores_and_gradients():
    """Chosen and rejected of each pair (and two pairs of one prompt) in one prefix-tree row: the prompt runs
    once; scores and BT loss equal the padded per-sequence batch's to fp64 rounding, every parameter's
    gradient to fp32 rounding (as in test_train_shared_prefix)."""
    seqs = _pairs(random.Random(7))
    rows = [[0, 1, 2, 3], [4, 5]]  # pairs 0 and 1 share their prompt; each row sorted as plan_rows would
    rows = [sorted(r, key=lambda i: seqs[i].input_ids) for r in rows]

    def run(packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        rm = _model(3)
        mb = collate(seqs)
        if packed:
            mb.shared = pack_prefix_tree([s.input_ids for s in seqs], rows)
        scores = sequence_scores(rm, mb)
        losses, _ = bradley_terry_loss(scores[0::2], scores[1::2], center_coef=0.01)
        losses.mean().backward()
        grads = {n: p.grad.clone() for n, p in rm.named_parameters() if p.grad is not None}
        return scores.detach(), grads, mb.num_forward_tokens

    s_seq, g_seq, n_seq = run(False)
    s_pack, g_pack, n_pack = run(True)
    torch.testing.assert_close(s_pack, s_seq, rtol=1e-10, atol=1e-12)
    assert g_seq.keys() == g_pack.keys() and "head.weight" in g_seq
    for name in g_seq:  # Llama's RMSNorm runs in fp32 even in an fp64 model: gradients agree to fp32 rounding
        want = g_seq[name]
        torch.testing.assert_close(g_pack[name], want, rtol=1e-5, atol=1e-6 * float(want.abs().max()) + 1e-12)
    shared = len(seqs[0].input_ids) - sum(seqs[0].loss_mask)  # at least the prompt runs once, not 4 times
    assert n_pack <= n_seq - 3 * min(shared, 5)

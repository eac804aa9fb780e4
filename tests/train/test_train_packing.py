import pytest
import torch
from conftest import fake_trajectory

from agentrft.train.packing import collate, micro_batches, plan_micro_batches, to_sequence


def test_plan_sorted_budgeted_deterministic():
    lengths = [5, 9, 3, 9, 4, 20]
    plan = plan_micro_batches(lengths, max_tokens=18)
    assert plan == [[5], [1, 3], [0, 4, 2]]
    for group in plan:
        if len(group) > 1:
            assert len(group) * max(lengths[i] for i in group) <= 18
    assert plan_micro_batches(lengths, 18) == plan
    assert sorted(i for g in plan for i in g) == list(range(6))
    with pytest.raises(ValueError):
        plan_micro_batches(lengths, 0)


def test_collate_right_pads(rng):
    t1, t2 = fake_trajectory(rng), fake_trajectory(rng)
    s1 = to_sequence(0, t1, [1.0] * len(t1.tokens.ids))
    s2 = to_sequence(1, t2, [2.0] * len(t2.tokens.ids))
    mb = collate([s1, s2])
    n1 = len(s1)
    assert mb.input_ids.shape == (2, max(len(s1), len(s2)))
    assert mb.input_ids[0, :n1].tolist() == t1.tokens.ids
    assert mb.attention_mask[0].sum() == n1 and mb.loss_mask[0].tolist()[:n1] == t1.tokens.loss_mask
    assert torch.all(mb.loss_mask[0, n1:] == 0)
    assert mb.seq_index == [0, 1]


def test_to_sequence_checks(rng):
    t = fake_trajectory(rng)
    with pytest.raises(ValueError, match="advantages"):
        to_sequence(0, t, [0.0])
    t.tokens = None
    with pytest.raises(ValueError, match="no token record"):
        to_sequence(0, t, [])


def test_micro_batches_cover_all(rng):
    trajs = [fake_trajectory(rng) for _ in range(7)]
    seqs = [to_sequence(i, t, [0.0] * len(t.tokens.ids)) for i, t in enumerate(trajs)]
    mbs = micro_batches(seqs, max_tokens=40)
    assert sorted(i for mb in mbs for i in mb.seq_index) == list(range(7))
    assert sum(mb.num_loss_tokens for mb in mbs) == sum(s.num_loss_tokens for s in seqs)

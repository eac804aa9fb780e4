import pytest
import torch
from conftest import fake_trajectory

from agentrft.train.core.packing import collate, micro_batches, plan_micro_batches, to_sequence


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


def test_a_stitched_session_packs_one_sequence_per_segment_with_the_episodes_advantage():
    from agentrft.train.core.packing import to_sequences
    from agentrft.types import SegmentBreak, TokenRecord, Trajectory

    # segment 0: prompt 3, sampled 2; segment 1: prompt 4, sampled 1, template close 1 (mask 0)
    tok = TokenRecord(
        ids=[1, 2, 3, 10, 11, 1, 2, 4, 5, 12, 6],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0],
        logprobs=[0, 0, 0, -0.5, -0.25, 0, 0, 0, 0, -1.0, 0],
        turn=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
        segment=[0] * 5 + [1] * 6,
        breaks=[SegmentBreak(segment=1, request=1, reason="template_rewrote_history")],
    )
    traj = Trajectory(tokens=tok)
    adv = [0.5 * m for m in tok.loss_mask]
    first, second = to_sequences(7, traj, adv)
    assert (first.index, first.input_ids, first.loss_mask) == (7, [1, 2, 3, 10, 11], [0, 0, 0, 1, 1])
    assert (second.index, second.input_ids, second.sampler_logprobs) == (8, [1, 2, 4, 5, 12, 6], [0, 0, 0, 0, -1.0, 0])
    assert first.advantages[-1] == second.advantages[4] == 0.5
    assert sum(s.num_loss_tokens for s in (first, second)) == tok.num_sampled
    one = Trajectory(tokens=tok.model_copy(update={"segment": None, "breaks": []}))
    assert [s.input_ids for s in to_sequences(0, one, adv)] == [tok.ids]


def test_a_token_record_refuses_inconsistent_segments():
    from agentrft.types import TokenRecord

    base = {"ids": [1, 2, 3], "loss_mask": [0, 1, 0], "logprobs": [0, -1, 0], "turn": [0, 0, 1]}
    with pytest.raises(ValueError, match="count up by one"):
        TokenRecord(**base, segment=[0, 2, 2])
    with pytest.raises(ValueError, match="breaks must name segments 1..1"):
        TokenRecord(**base, segment=[0, 0, 1])

import math

import torch
from conftest import tiny_llama

from agentrft.samplers.distribution import Distribution
from agentrft.train.core.logprobs import sampled_logprobs


def _naive(model, ids, attn, mask, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=attn).logits / temperature
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    p = torch.log_softmax(logits[:, :-1], -1)
    ent = -(p.exp() * p).sum(-1)
    pad = torch.zeros(ids.shape[0], 1, dtype=logits.dtype)
    return torch.cat([pad, lp], 1) * mask, torch.cat([pad, ent], 1) * mask


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (3, 11), generator=g)
    attn = torch.ones(3, 11, dtype=torch.long)
    attn[1, 8:] = 0
    attn[2, 5:] = 0
    mask = torch.zeros(3, 11, dtype=torch.long)
    mask[0, 3:] = 1
    mask[1, 4:8] = 1
    mask[2, 1:3] = 1
    return ids, attn, mask


def test_chunked_equals_full_logits_and_gradients():
    model = tiny_llama()
    ids, attn, mask = _batch()
    for chunk in (1, 4, 1024):
        for temp in (1.0, 0.7):
            lp, ent = sampled_logprobs(model, ids, attn, mask, chunk_size=chunk, dist=Distribution(temperature=temp))
            ref_lp, ref_ent = _naive(model, ids, attn, mask, temp)
            torch.testing.assert_close(lp, ref_lp, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-12)
    # gradients through the chunked + checkpointed path equal the naive ones
    model.zero_grad()
    lp, _ = sampled_logprobs(model, ids, attn, mask, chunk_size=3)
    lp.sum().backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref_lp, _ = _naive(model, ids, attn, mask)
    ref_lp.sum().backward()
    for a, b in zip(g1, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_unmasked_positions_are_zero_and_first_token_rejected():
    model = tiny_llama()
    ids, attn, mask = _batch()
    lp, _ = sampled_logprobs(model, ids, attn, mask)
    assert torch.all(lp[mask == 0] == 0)
    assert torch.all(lp[mask == 1] < 0)
    bad = mask.clone()
    bad[0, 0] = 1
    try:
        sampled_logprobs(model, ids, attn, bad)
    except ValueError as exc:
        assert "loss_mask[:, 0]" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_top_k_top_p_logprobs_renormalise_over_the_kept_tokens():
    """With truncation, the log-prob is that of the truncated distribution: hand-computed on a 4-token head."""
    head = torch.nn.Linear(1, 4, bias=True).double()
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)))
    h = torch.zeros(3, 1, dtype=torch.float64)
    from agentrft.train.core.logprobs import _chunk_logprobs

    targets = torch.tensor([3, 2, 0])
    # top_p 0.6: nucleus {0.4, 0.3} (mass before 0.3 is 0.4 < 0.6; before 0.2 is 0.7); renormalised over 0.7
    with torch.no_grad():
        lp, ent = _chunk_logprobs(head, h, targets, True, Distribution(top_p=0.6))
    assert abs(float(lp[0]) - math.log(0.4 / 0.7)) < 1e-12 and abs(float(lp[1]) - math.log(0.3 / 0.7)) < 1e-12
    # a sampled token outside the recomputed nucleus (rounding moved the boundary) stays in its support
    assert abs(float(lp[2]) - math.log(0.1 / 0.8)) < 1e-12
    p = torch.tensor([0.4, 0.3]) / 0.7
    assert abs(float(ent[0]) - float(-(p * p.log()).sum())) < 1e-6
    # top_k 2 at temperature 0.5: probabilities squared, renormalised over the two largest
    with torch.no_grad():
        lp, _ = _chunk_logprobs(head, h[:1], targets[:1], False, Distribution(temperature=0.5, top_k=2))
    assert abs(float(lp[0]) - math.log(0.16 / (0.16 + 0.09))) < 1e-12

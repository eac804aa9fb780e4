"""Cross-request prefix KV cache: exactness vs the uncached path, reuse, invalidation, memory bound."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.policies import tiny_model_and_tokenizer
from agentrft.samplers.prefix_cache import PrefixCache, SharedPrefix, as_tokens, common_prefix_len, shared_prefixes

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
SYSTEM = (
    "You are a careful financial analyst. Use the calculator tool for every arithmetic step, "
    "then give the final answer on its own line. Example: revenue grew from 120 to 150, so the "
    "growth is (150 - 120) / 120 = 25%. Example: costs fell from 80 to 60, a 25% decrease."
)


@pytest.fixture(scope="module")
def model_tok():
    return tiny_model_and_tokenizer(seed=0)


def make(model_tok, **kw) -> HFSampler:
    """A sampler whose cache keeps shared prefixes only, unless remember_turns=True (finished turns too)."""
    model, tok = model_tok
    kw.setdefault("remember_turns", False)
    return HFSampler(model, tok, "tiny", prefix_min_tokens=kw.pop("prefix_min_tokens", 16), **kw)


def run(coro):
    return asyncio.run(coro)


async def _gather(s: HFSampler, reqs: list[SampleRequest]):
    return await asyncio.gather(*(s.sample(r) for r in reqs))


def prompts(s: HFSampler, questions: list[str]) -> list[list[int]]:
    return [s.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in questions]


QUESTIONS = [
    "What was the growth of net income?",
    "Compute the margin for 2019.",
    "By how much did debt fall?",
    "Ratio of assets to liabilities?",
    "What is 17% of 230?",
]


def assert_same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_helpers_hand_computed() -> None:
    a, b = np.array([1, 2, 3, 4]), np.array([1, 2, 9])
    assert common_prefix_len(a, b) == 2 and common_prefix_len(a, a) == 4 and common_prefix_len(a, a[:0]) == 0
    ps = [np.array(x) for x in ([5, 1, 2, 3, 7], [9, 9], [1, 2, 3, 4], [1, 2, 3, 5, 6], [5, 1, 2, 8])]
    # [1,2,3,4] & [1,2,3,5,6] share 3; [5,1,2,3,7] & [5,1,2,8] share 3; [9,9] alone
    assert shared_prefixes(ps, 3) == [SharedPrefix(3, [2, 3], None), SharedPrefix(3, [0, 4], None)]
    assert shared_prefixes(ps, 4) == []
    # a prefix stops one token short of its shortest member
    assert shared_prefixes([np.array([1, 2, 3]), np.array([1, 2, 3, 4])], 2) == [SharedPrefix(2, [0, 1], None)]
    # a tree: all four share 4 tokens; A, B share 8 (a child); C, D share 5 (extends the root by 1)
    a, b, c, d = (np.array([1] * 4 + t) for t in ([2, 2, 2, 2, 7], [2, 2, 2, 2, 8], [3, 3], [3, 4]))
    assert shared_prefixes([d, b, c, a], 4) == [
        SharedPrefix(4, [0, 1, 2, 3], None),
        SharedPrefix(8, [1, 3], 0),
        SharedPrefix(5, [0, 2], 0),
    ]
    assert shared_prefixes([d, b, c, a], 8) == [SharedPrefix(8, [1, 3], None)]  # C, D share only 5


def test_shared_prefix_equals_one_at_a_time(model_tok) -> None:
    cached = make(model_tok)
    plain = make(model_tok, prefix_cache_tokens=0)
    ps = prompts(cached, QUESTIONS)
    assert min(common_prefix_len(np.array(ps[0]), np.array(p)) for p in ps[1:]) >= 40
    params = [GREEDY, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=3)]
    reqs = [SampleRequest(p, params[i % 2]) for i, p in enumerate(ps)]
    alone = [run(plain.sample(r)) for r in reqs]
    got = run(_gather(cached, reqs))
    assert cached.stats["admissions"] == 1  # admitted together: the shared prefix came from this round
    assert cached.stats["reused_tokens"] > 0 and len(cached.prefix_cache) == 1
    g = cached.prefix_cache.tokens  # the shared prefix, prefilled once, used by all five
    assert g == min(common_prefix_len(np.array(ps[0]), np.array(p)) for p in ps[1:])
    assert cached.stats["reused_tokens"] == 5 * g
    assert cached.stats["prefill_tokens"] == sum(map(len, ps)) - 4 * g
    for a, b in zip(alone, got, strict=True):
        assert_same(a, b)
    # and both equal a full-sequence forward pass of the uncached model
    res = got[0]
    with torch.no_grad():
        logp = torch.log_softmax(cached.model(torch.tensor([ps[0] + res.token_ids])).logits[0], -1)
    n = len(ps[0])
    ref = logp[n - 1 : n - 1 + len(res.token_ids)].gather(1, torch.tensor(res.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4, rtol=0)


def test_cache_reused_across_rounds_and_turns(model_tok) -> None:
    cached = make(model_tok)
    plain = make(model_tok, prefix_cache_tokens=0)
    ps = prompts(cached, QUESTIONS)
    run(_gather(cached, [SampleRequest(p, GREEDY) for p in ps[:2]]))  # round 1 stores the shared prefix
    stored = cached.prefix_cache.tokens
    assert stored >= 40
    # round 2: one new prompt alone, a later "turn" extending a round-1 prompt, and two of mixed lengths
    turn2 = ps[0] + cached.render([{"role": "user", "content": "and in 2020?"}], add_generation_prompt=True)
    for p in [ps[2], turn2, ps[3]]:
        before = cached.stats["reused_tokens"]
        got = run(cached.sample(SampleRequest(p, GREEDY)))
        assert cached.stats["reused_tokens"] - before >= stored  # prefilled only after the cached prefix
        assert_same(run(plain.sample(SampleRequest(p, GREEDY))), got)
    mixed = [SampleRequest(ps[4], GREEDY), SampleRequest(turn2[:-3], GREEDY), SampleRequest(ps[1][:30], GREEDY)]
    got = run(_gather(cached, mixed))
    for r, g in zip(mixed, got, strict=True):
        assert_same(run(plain.sample(r)), g)
    assert cached.prefix_cache.stats["hits"] >= 4


def test_weight_change_invalidates(model_tok) -> None:
    model, tok = tiny_model_and_tokenizer(seed=1)
    s = HFSampler(model, tok, "tiny", prefix_min_tokens=16, remember_turns=False)
    ps = prompts(s, QUESTIONS[:3])

    def fill() -> None:  # two prompts admitted together store their shared prefix
        run(_gather(s, [SampleRequest(p, GREEDY) for p in ps[:2]]))
        assert len(s.prefix_cache) == 1

    fill()
    w = model.model.layers[0].self_attn.k_proj.weight

    def fresh_reference(p: list[int]):
        return run(HFSampler(model, tok, "tiny", prefix_cache_tokens=0).sample(SampleRequest(p, GREEDY)))

    old = fresh_reference(ps[2])
    # 1) the trainer's way: paused() frees the cache, the update, then weights_updated()
    with s.paused():
        assert len(s.prefix_cache) == 0
        with torch.no_grad():
            w.mul_(3.0)
        s.weights_updated(1)
    new = fresh_reference(ps[2])
    assert new.logprobs != pytest.approx(old.logprobs, abs=1e-3)  # the change matters
    assert_same(new, run(s.sample(SampleRequest(ps[2], GREEDY))))
    # 2) weights changed outside paused(): weights_updated() alone is the signal, same version too
    fill()
    cleared = s.prefix_cache.stats["cleared"]
    w.data.mul_(0.5)
    s.weights_updated(1)
    got = run(s.sample(SampleRequest(ps[2], GREEDY)))
    assert s.prefix_cache.stats["cleared"] == cleared + 1
    assert_same(fresh_reference(ps[2]), got)


def test_memory_bound_and_lru(model_tok) -> None:
    model, tok = model_tok
    s = HFSampler(model, tok, "tiny", prefix_min_tokens=16, prefix_cache_tokens=120, remember_turns=False)
    systems = [f"System prompt number {i}. " + SYSTEM for i in range(3)]
    for sysmsg in systems:
        ps = [s.render([{"role": "system", "content": sysmsg}, {"role": "user", "content": q}]) for q in QUESTIONS[:2]]
        run(_gather(s, [SampleRequest(p, GREEDY) for p in ps]))
        assert s.prefix_cache.tokens <= 120
    assert s.prefix_cache.stats["evicted"] >= 1 and len(s.prefix_cache) < 3  # three system prompts do not fit
    layers, kv_heads, head_dim = 2, 2, 16
    assert s.prefix_cache.nbytes == s.prefix_cache.tokens * layers * 2 * kv_heads * head_dim * 4
    # hand-checked: a longer sequence extends its prefix, the least recently used leaf goes first, then its
    # parent once it is a leaf; a sequence longer than the whole budget is never stored
    pc = PrefixCache(max_tokens=10, min_tokens=2)
    kv = [(torch.arange(11.0).view(1, 1, 11, 1).expand(1, 1, 11, 2).contiguous(), torch.zeros(1, 1, 11, 2))]
    assert not pc.add(np.arange(11), kv) and pc.tokens == 0
    assert pc.add(np.arange(4), [(k[:, :, :4], v[:, :, :4]) for k, v in kv])
    assert pc.add(np.arange(6), [(k[:, :, :6], v[:, :, :6]) for k, v in kv]) and pc.tokens == 6  # 2 more stored
    assert len(pc) == 1 and not pc.add(np.arange(5), kv)  # covered by the 6-token sequence
    assert pc.add(np.arange(100, 105), [(k[:, :, :5], v[:, :, :5]) for k, v in kv])
    assert pc.tokens == 9 and pc.stats["evicted"] == 1  # positions 4-5 went; 0-3 stay
    got, m = pc.lookup(np.arange(6), 6)
    assert m == 4 and got is not None and got.materialize()[0][0][0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    got, m = pc.lookup(np.array([100, 101, 102, 7]), 3)
    assert m == 3 and got is not None and got.materialize()[0][0].shape == (1, 1, 3, 2)
    assert pc.add(np.arange(200, 203), [(k[:, :, :3], v[:, :, :3]) for k, v in kv])  # 12 > 10: 0-3 (LRU) go
    assert pc.tokens == 8 and pc.lookup(np.arange(6), 6)[1] == 0 and pc.stats["evicted"] == 2


def test_the_tree_stores_a_shared_prefix_once() -> None:
    """Three sequences that share a 6-token prefix, two of them 9 tokens: each position is stored once, every
    lookup returns exactly the KV it was given, node by node."""
    g = torch.Generator().manual_seed(0)
    pc = PrefixCache(max_tokens=100, min_tokens=3)
    seqs = [
        np.array([1, 2, 3, 4, 5, 6, 7, 8]),
        np.array([1, 2, 3, 4, 5, 6, 9, 9, 9]),
        np.array([1, 2, 3, 4, 5, 6, 7, 8, 5]),
    ]
    kvs = {}
    full = [(torch.randn(1, 2, 9, 4, generator=g), torch.randn(1, 2, 9, 4, generator=g)) for _ in range(3)]
    for seq in seqs:
        kv = [(k[:, :, : len(seq)], v[:, :, : len(seq)]) for k, v in full]
        kvs[tuple(seq)] = kv
        assert pc.add(seq, kv)
    # 8, then 3 past the shared 6 (a split), then 1 past the first sequence's 8
    assert pc.tokens == 8 + 3 + 1 and pc.stats["split"] == 1 and pc.stats["stored"] == 3
    assert len(pc) == 2 and sorted(len(t) for t in pc.sequences()) == [9, 9]
    assert pc.nbytes == pc.tokens * 3 * 2 * (2 * 4) * 4
    for seq in seqs:
        got, m = pc.lookup(np.concatenate([seq, [42]]), len(seq))
        assert m == len(seq) and got is not None
        for (k, v), (wk, wv) in zip(got.materialize(), kvs[tuple(seq)], strict=True):
            assert torch.equal(k, wk) and torch.equal(v, wv)  # copies of the stored values, not computed
    got, m = pc.lookup(np.array([1, 2, 3, 4, 5, 6, 7, 0]), 8)  # leaves the 7-8 node part way
    assert m == 7 and got is not None and [p[0][0].shape[2] for p in got.parts] == [6, 1]
    assert all(_owns(t) for t in pc.tensors())  # a split copies both halves into their own storage
    assert pc.lookup(np.array([1, 2, 9]), 3) == (None, 0)  # 2 < min_tokens


def test_the_next_rounds_lookups_span_nodes_and_sample_as_uncached(model_tok) -> None:
    """Turns cached on top of a shared system prompt: a later prompt's base runs across tree nodes, and the
    samples match the uncached path's."""
    s = make(model_tok, remember_turns=True)
    plain = make(model_tok, prefix_cache_tokens=0)
    firsts = prompts(s, QUESTIONS[:2])
    replies = run(_gather(s, [SampleRequest(p, GREEDY) for p in firsts]))
    turns = [np.array(p + r.token_ids[:-1]) for p, r in zip(firsts, replies, strict=True)]
    shared = common_prefix_len(*turns)
    assert len(s.prefix_cache) == 2  # the shared prefix node, each finished turn a child of it
    assert s.prefix_cache.tokens == shared + sum(len(t) - shared for t in turns)
    tool = s.tokenizer.encode(" The calculator says 42.", add_special_tokens=False)
    seconds = [p + r.token_ids + tool for p, r in zip(firsts, replies, strict=True)]
    before = s.stats["reused_tokens"]
    got = run(_gather(s, [SampleRequest(p, GREEDY) for p in seconds]))
    assert s.stats["reused_tokens"] - before == sum(
        len(p) + len(r.token_ids) - 1 for p, r in zip(firsts, replies, strict=True)
    )
    for p, g in zip(seconds, got, strict=True):
        assert_same(run(plain.sample(SampleRequest(p, GREEDY))), g)


def test_disabled_cache_takes_the_plain_path(model_tok) -> None:
    s = make(model_tok, prefix_cache_tokens=0)
    ps = prompts(s, QUESTIONS[:3])
    run(_gather(s, [SampleRequest(p, GREEDY) for p in ps]))
    assert s.stats["reused_tokens"] == 0 and s.stats["prefill_tokens"] == sum(map(len, ps))
    assert len(s.prefix_cache) == 0


def test_prefill_on_mixed_bases_equals_plain_prefill(model_tok) -> None:
    from agentrft.samplers.hf_prefill import _prefill

    model, _ = model_tok
    s = make(model_tok)
    ps = prompts(s, QUESTIONS[:4])
    ps[3] = s.render([{"role": "user", "content": "An unrelated prompt without a cached base."}])
    dev = torch.device("cpu")
    with torch.inference_mode():
        full, last = _prefill(model, ps, dev)
        # bases of different lengths (one from another prompt's cache, sliced), one row without a base
        bases: list = [(None, 0)] * 4
        bases[0] = ([(k[:, :, :20], v[:, :, :20]) for k, v in full[1]], 20)  # ps[1] shares >= 20 with ps[0]
        bases[1] = ([(k[:, :, :35], v[:, :, :35]) for k, v in full[1]], 35)
        n2 = len(ps[2]) - 1  # all but the last token
        bases[2] = ([(k[:, :, :n2], v[:, :, :n2]) for k, v in full[2]], n2)
        got, got_last = _prefill(model, ps, dev, bases)
        # from a start inside the base (a copy), past it (a view of the chunk's columns), at 0 without a base
        starts = [7, 36, n2 - 3, 0]
        cut, _ = _prefill(model, ps, dev, bases, starts=starts)
    assert torch.allclose(got_last, last, atol=1e-4, rtol=0)
    for a, b, c, p, start in zip(full, got, cut, ps, starts, strict=True):
        assert len(a) == len(b) == len(c) == 2
        for (ka, va), (kb, vb), (kc, vc) in zip(a, b, c, strict=True):
            assert ka.shape == kb.shape == (1, 2, len(p), 16)
            assert torch.allclose(ka, kb, atol=1e-4) and torch.allclose(va, vb, atol=1e-4)
            assert kc.shape == (1, 2, len(p) - start, 16)
            assert torch.allclose(kc, ka[:, :, start:], atol=1e-4) and torch.allclose(vc, va[:, :, start:], atol=1e-4)


def _three_prompts(model_tok) -> tuple:
    """The tiny model, three rendered prompts that share the system prompt, and the CPU device."""
    return model_tok[0], prompts(make(model_tok), QUESTIONS[:3]), torch.device("cpu")


def test_prefill_from_a_start_inside_any_part_of_a_cached_prefix(model_tok) -> None:
    """A base of several parts (the radix tree's nodes on a prompt's path): the KV from a start in its first or a
    later part, or past it, is the plain prefill's from there, as is one from a start > 0 without a base."""
    from agentrft.samplers.hf_prefill import _prefill
    from agentrft.samplers.prefix_cache import PrefixKV

    model, ps, dev = _three_prompts(model_tok)
    with torch.inference_mode():
        full, _ = _prefill(model, ps, dev)
        parts = [[(k[:, :, a:b], v[:, :, a:b]) for k, v in full[0]] for a, b in ((0, 10), (10, 25))]
        base = PrefixKV(parts)
        for starts in ([5, 0, 0], [12, 3, 0], [25, 0, 4], [30, 0, 0]):
            got, _ = _prefill(model, ps, dev, [(base, 25), (None, 0), (None, 0)], starts=starts)
            for a, b, start in zip(full, got, starts, strict=True):
                for (ka, va), (kb, vb) in zip(a, b, strict=True):
                    assert kb.shape == (1, 2, ka.shape[2] - start, 16)
                    assert torch.allclose(kb, ka[:, :, start:], atol=1e-4)
                    assert torch.allclose(vb, va[:, :, start:], atol=1e-4)


def test_a_prefill_chunk_holds_one_layer_of_its_past_at_a_time(model_tok, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk on one shared base builds each layer's past when the forward reaches that layer, and its cache keeps
    only the new columns: no layer holds the base expanded to every row once its attention ran."""
    from agentrft.samplers import hf_prefill

    model, _ = model_tok
    s = make(model_tok)
    ps = prompts(s, QUESTIONS[:3])
    dev = torch.device("cpu")
    built: list[int] = []
    caches: list = []
    chunk_past, out_cache = hf_prefill._chunk_past, hf_prefill.out_cache
    shared = min(common_prefix_len(as_tokens(ps[0]), as_tokens(p)) for p in ps)
    with torch.inference_mode():
        full, _ = hf_prefill._prefill(model, ps, dev)
        base = [(k[:, :, :shared], v[:, :, :shared]) for k, v in full[0]]
        monkeypatch.setattr(hf_prefill, "_chunk_past", lambda *a: built.append(a[3]) or chunk_past(*a))
        monkeypatch.setattr(hf_prefill, "out_cache", lambda out: caches.append(out_cache(out)) or caches[-1])
        got, _ = hf_prefill._prefill(model, ps, dev, [(base, shared)] * 3, starts=[shared] * 3)
    assert built == list(range(len(full[0])))  # each layer's past once, in the forward's order
    longest = max(map(len, ps)) - shared
    assert len(caches) == 1 and all(la.keys.shape == (3, 2, longest, 16) for la in caches[0].layers)
    for a, b in zip(full, got, strict=True):
        for (ka, va), (kb, vb) in zip(a, b, strict=True):
            assert torch.allclose(kb, ka[:, :, shared:], atol=1e-4) and torch.allclose(vb, va[:, :, shared:], atol=1e-4)


def test_nested_shared_prefixes_in_one_round(model_tok) -> None:
    cached = make(model_tok)
    plain = make(model_tok, prefix_cache_tokens=0)
    base = prompts(cached, QUESTIONS[:2])  # share the system prompt
    follow = [
        cached.render([{"role": "user", "content": t}])
        for t in ("And in 2020? Show the steps please.", "Why is that? Explain it briefly.")
    ]
    ps = [b + f for b in base for f in follow]  # two later turns per first turn: a two-level tree
    reqs = [SampleRequest(p, GREEDY) for p in ps]
    got = run(_gather(cached, reqs))
    for r, g in zip(reqs, got, strict=True):
        assert_same(run(plain.sample(r)), g)
    root = min(common_prefix_len(np.array(ps[0]), np.array(p)) for p in ps)
    kids = [common_prefix_len(np.array(ps[0]), np.array(ps[1])), common_prefix_len(np.array(ps[2]), np.array(ps[3]))]
    assert cached.prefix_cache.stats["stored"] == 3  # root, then both children (which extend it)
    assert sorted(len(t) for t in cached.prefix_cache.sequences()) == sorted(kids)
    assert cached.prefix_cache.tokens == root + sum(k - root for k in kids)  # the root's positions once
    # the root once, each child on top of it once, then every prompt's own suffix
    assert cached.stats["prefill_tokens"] == root + sum(k - root for k in kids) + sum(
        len(p) - kids[i // 2] for i, p in enumerate(ps)
    )


def test_the_next_turn_prefills_only_what_was_appended(model_tok) -> None:
    """Turn 2's prompt is turn 1's prompt + reply + a tool result: with the finished turn's KV cached it
    prefills only past the reply, and samples what the uncached path samples."""
    s = make(model_tok, remember_turns=True)
    p1 = prompts(s, QUESTIONS[:1])[0]
    first = run(s.sample(SampleRequest(p1, GREEDY)))
    assert len(first.token_ids) >= 2
    tool = s.tokenizer.encode(" The calculator says 42. Now answer.", add_special_tokens=False)
    p2 = p1 + first.token_ids + tool
    before = dict(s.stats)
    second = run(s.sample(SampleRequest(p2, GREEDY)))
    reused = s.stats["reused_tokens"] - before["reused_tokens"]
    prefilled = s.stats["prefill_tokens"] - before["prefill_tokens"]
    assert reused == len(p1) + len(first.token_ids) - 1  # all but the reply's last token, never fed
    assert prefilled == len(p2) - reused
    plain = make(model_tok, prefix_cache_tokens=0)
    assert_same(run(plain.sample(SampleRequest(p2, GREEDY))), second)
    # off: the finished turn is not kept (only shared prefixes are)
    off = make(model_tok)
    run(off.sample(SampleRequest(p1, GREEDY)))
    assert len(off.prefix_cache) == 0


def test_padding_between_rows_of_different_lengths_is_measured(model_tok) -> None:
    s = make(model_tok, prefix_cache_tokens=0, share_head=False)
    short = s.render([{"role": "user", "content": "Hi"}])
    long = s.render([{"role": "user", "content": SYSTEM + " " + SYSTEM}])
    run(_gather(s, [SampleRequest(short, GREEDY), SampleRequest(long, GREEDY)]))
    st = s.stats
    assert st["kv_positions"] == 2 * len(long)  # one admission: two cache rows padded to the longer prompt
    assert st["kv_used_positions"] == len(short) + len(long)
    # with the rows' common prefix (the template's default system prompt) held once as the batch's shared head
    h = next(i for i, (a, b) in enumerate(zip(short, long, strict=False)) if a != b)
    assert h >= 16
    shared = make(model_tok, prefix_cache_tokens=0)
    run(_gather(shared, [SampleRequest(short, GREEDY), SampleRequest(long, GREEDY)]))
    assert shared.stats["kv_positions"] == 2 * (len(long) - h) + h
    assert shared.stats["kv_used_positions"] == len(short) + len(long) - h


def _owns(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_owned_copies_views_and_casts() -> None:
    from agentrft.samplers.prefix_cache import owned

    batch = torch.randn(4, 2, 10, 8)
    row = batch[1:2]  # contiguous, yet a view of the whole batch: contiguous() would keep all four rows alive
    assert row.is_contiguous() and not _owns(row)
    got = owned(row)
    assert _owns(got) and torch.equal(got, row)
    assert owned(got) is got  # already its own: no copy
    half = owned(batch[:, :, 3:], torch.bfloat16)
    assert _owns(half) and half.dtype == torch.bfloat16 and half.shape == (4, 2, 7, 8)
    assert torch.equal(half, batch[:, :, 3:].to(torch.bfloat16))


def test_prefix_cache_entries_own_their_memory() -> None:
    batch = [(torch.randn(3, 2, 70, 4), torch.randn(3, 2, 70, 4)) for _ in range(2)]
    pc = PrefixCache(max_tokens=1000, min_tokens=8)
    tokens = np.arange(70)
    assert pc.add(tokens, [(k[2:3], v[2:3]) for k, v in batch])  # the last row of a batch's cache
    assert len(list(pc.tensors())) == 4 and all(_owns(t) for t in pc.tensors())
    assert pc.nbytes == 2 * 2 * (2 * 70 * 4) * 4


def test_prefill_kv_is_in_the_cache_dtype(model_tok) -> None:
    """Each prompt's KV from a chunked prefill is in the requested dtype (a tensor of its own when cast); the values
    are those of the plain prefill."""
    from agentrft.samplers.hf_prefill import _prefill

    model, ps, dev = _three_prompts(model_tok)
    with torch.inference_mode():
        plain, _ = _prefill(model, ps, dev)
        half, _ = _prefill(model, ps, dev, kv_dtype=torch.bfloat16)
    for a, b, p in zip(plain, half, ps, strict=True):
        for (ka, va), (kb, vb) in zip(a, b, strict=True):
            assert _owns(kb) and _owns(vb)
            assert kb.dtype == vb.dtype == torch.bfloat16 and kb.shape == ka.shape == (1, 2, len(p), 16)
            # two runs of the same forward: equal up to one bf16 rounding step should a kernel reorder a sum
            for got, want in ((kb, ka), (vb, va)):
                assert torch.allclose(got.float(), want.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-6)

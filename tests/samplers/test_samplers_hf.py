"""HFSampler on the tiny policy: exactness of ids and log-probs, batching and sharing invariance."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from agentrft.samplers.base import SampleRequest, SamplingParams, TokenSampler, TrainablePolicy
from agentrft.samplers.decode_rows import RowState, make_generator
from agentrft.samplers.distribution import top_p_drop
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.hf_decode import DecodeSpec, RunningBatch, _slot_width, generate_batch
from agentrft.samplers.hf_prefill import _prefill_chunks
from agentrft.samplers.policies import PolicyError, load_policy, tiny_model_and_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def sampler() -> HFSampler:
    s = load_policy("tiny")
    assert isinstance(s, HFSampler)
    return s


@pytest.fixture(scope="module")
def prompt(sampler: HFSampler) -> list[int]:
    return sampler.render([{"role": "user", "content": "What is 2+2?"}])


def run(coro):
    return asyncio.run(coro)


async def _gather(s: HFSampler, reqs: list[SampleRequest]):
    return await asyncio.gather(*(s.sample(r) for r in reqs))


def test_is_a_trainable_policy(sampler: HFSampler) -> None:
    assert isinstance(sampler, TokenSampler) and isinstance(sampler, TrainablePolicy)
    assert sampler.policy == "tiny" and sampler.policy_version == 0
    sampler.weights_updated(3)
    assert sampler.policy_version == 3
    sampler.weights_updated(0)


def test_render_and_decode(sampler: HFSampler) -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    ids = sampler.render(msgs, add_generation_prompt=False)
    assert msgs[2]["content"] is None  # input left untouched
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    )
    assert sampler.decode(ids) == expected
    with_prompt = sampler.render(msgs[:2])
    assert sampler.decode(with_prompt).endswith("<|im_start|>assistant\n")
    # SmolLM2's template has no tool support: schemas are ignored, not an error.
    assert not sampler.template_supports_tools
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert sampler.render(msgs[:2], tools=tools) == with_prompt


def test_greedy_matches_model_generate(sampler: HFSampler, prompt: list[int]) -> None:
    res = run(sampler.sample(SampleRequest(prompt, GREEDY)))
    with torch.no_grad():
        ref = sampler.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
        )
    assert res.token_ids == ref[0, len(prompt) :].tolist()
    assert res.finish_reason == "length" and res.completion_tokens == 12 and res.prompt_tokens == len(prompt)
    assert res.text == sampler.decode(res.token_ids)
    assert res.latency_s > 0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, max_tokens=10, seed=1),
        SamplingParams(temperature=1.3, max_tokens=10, seed=2),
        SamplingParams(temperature=1.0, top_p=0.3, max_tokens=10, seed=3),
        GREEDY,
    ],
)
def test_logprobs_are_those_of_the_sampled_distribution(
    sampler: HFSampler, prompt: list[int], params: SamplingParams
) -> None:
    """What the sampler reports is what the trainer recomputes (`train.logprobs`, same `Distribution`);
    greedy reports the raw model's log-probs."""
    from agentrft.samplers.distribution import Distribution
    from agentrft.train.core.logprobs import sampled_logprobs

    res = run(sampler.sample(SampleRequest(prompt, params)))
    n = len(res.token_ids)
    full = torch.tensor([prompt + res.token_ids])
    mask = torch.tensor([[0] * len(prompt) + [1] * n])
    dist = Distribution() if params.greedy else Distribution.of(params)
    with torch.no_grad():
        expected, _ = sampled_logprobs(sampler.model, full, torch.ones_like(full), mask, dist=dist)
        raw = torch.log_softmax(sampler.model(full).logits[0].float(), dim=-1)
    expected = expected[0, len(prompt) :]
    assert torch.allclose(torch.tensor(res.logprobs), expected, atol=1e-4, rtol=0)
    assert len(res.logprobs) == n
    raw = raw[len(prompt) - 1 : len(prompt) - 1 + n].gather(1, torch.tensor(res.token_ids)[:, None])[:, 0]
    if params.temperature != 1.0 and not params.greedy:  # the tempered distribution is not the raw one
        assert not torch.allclose(torch.tensor(res.logprobs), raw, atol=1e-2)


def test_concurrent_batch_equals_one_at_a_time(sampler: HFSampler, prompt: list[int]) -> None:
    reqs = [SampleRequest(prompt[: 8 + 4 * i], SamplingParams(temperature=0.0, max_tokens=4 + i)) for i in range(8)]
    alone = [run(sampler.sample(r)) for r in reqs]
    before = dict(sampler.stats)
    together = run(_gather(sampler, reqs))
    assert sampler.stats["admissions"] - before["admissions"] == 1  # admitted together
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason == "length"
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert [len(b.token_ids) for b in together] == [4 + i for i in range(8)]


def test_group_prefix_sharing_equals_unshared(sampler: HFSampler, prompt: list[int]) -> None:
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=s) for s in range(4)] + [GREEDY]
    shared = [SampleRequest(prompt, p, group_key="g") for p in params]
    before = dict(sampler.stats)
    got = run(_gather(sampler, shared))
    assert sampler.stats["prefills"] - before["prefills"] == 1  # one prefill for the group of 5
    alone = [run(sampler.sample(SampleRequest(prompt, p))) for p in params]
    for a, b in zip(alone, got, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert len({tuple(r.token_ids) for r in got[:4]}) > 1  # different seeds, different samples


def test_stop_string_ends_and_is_kept(sampler: HFSampler, prompt: list[int]) -> None:
    full = run(sampler.sample(SampleRequest(prompt, GREEDY)))
    stop = sampler.decode(full.token_ids[4:5]).strip()
    assert stop
    k = next(k for k in range(1, 13) if stop in sampler.decode(full.token_ids[:k]))
    res = run(
        sampler.sample(
            SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop=["never-there", stop]))
        )
    )
    assert res.finish_reason == "stop_string"
    assert res.token_ids == full.token_ids[:k]
    assert stop in res.text and res.text == sampler.decode(res.token_ids)


def test_max_tokens_and_eos(prompt: list[int]) -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    s = HFSampler(model, tok, "tiny")
    full = run(s.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=3))))
    assert full.finish_reason == "length" and len(full.token_ids) == 3
    # Treat the greedy 3rd token as an extra EOS (generation_config may list several).
    model.generation_config.eos_token_id = [tok.eos_token_id, full.token_ids[2]]
    s2 = HFSampler(model, tok, "tiny")
    res = run(s2.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=10))))
    assert res.finish_reason == "stop"
    assert res.token_ids == full.token_ids  # EOS kept in ids
    assert res.text == s2.decode(full.token_ids[:2])  # and left out of the text


def test_seed_determinism_regardless_of_batch(sampler: HFSampler, prompt: list[int]) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10, seed=1234)
    a = run(sampler.sample(SampleRequest(prompt, p)))
    b = run(sampler.sample(SampleRequest(prompt, p)))
    others = [SampleRequest(prompt[: 20 + i], SamplingParams(temperature=1.0, max_tokens=6)) for i in range(5)]
    c = run(_gather(sampler, [*others, SampleRequest(prompt, p)]))[-1]
    d = run(sampler.sample(SampleRequest(prompt, p.model_copy(update={"seed": 99}))))
    assert a.token_ids == b.token_ids == c.token_ids
    assert a.token_ids != d.token_ids


def test_top_k_one_is_greedy(sampler: HFSampler, prompt: list[int]) -> None:
    g = run(sampler.sample(SampleRequest(prompt, GREEDY)))
    k1 = run(sampler.sample(SampleRequest(prompt, SamplingParams(temperature=2.0, top_k=1, max_tokens=12))))
    assert g.token_ids == k1.token_ids


def test_top_p_filter_hand_computed() -> None:
    x = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3], [0.2, 0.5, 0.3]]))
    drop = top_p_drop(x.clone(), torch.tensor([0.6, 0.5, 1.0]))
    out = x.masked_fill(drop, float("-inf"))
    keep = torch.isfinite(out).tolist()
    # row 0: 0.5 then 0.3 (mass before 0.5 < 0.6) kept, 0.2 (mass before 0.8) dropped
    assert keep == [[False, True, True], [False, True, False], [True, True, True]]
    assert math.isclose(float(out[0, 1]), math.log(0.5), rel_tol=1e-6)


def test_prefill_chunks_bound_padding() -> None:
    # longest first; 100+90+50 pads 60 of 300 (= 20%, allowed); adding 48 would pad 112 of 400
    assert _prefill_chunks([10, 100, 90, 50, 48]) == [[1, 2, 3], [4], [0]]
    assert _prefill_chunks([7, 7, 7, 7], max_tokens=14) == [[0, 1], [2, 3]]


def test_bad_requests_fail_clearly(sampler: HFSampler) -> None:
    with pytest.raises(ValueError, match="empty"):
        run(sampler.sample(SampleRequest([], GREEDY)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(sampler.sample(SampleRequest([1, 10**7], GREEDY)))
    with pytest.raises(PolicyError, match="valid: "):
        load_policy("nope")
    with pytest.raises(PolicyError, match="hf:/no/such/dir"):
        load_policy("hf:/no/such/dir")


def test_training_mode_restored(sampler: HFSampler, prompt: list[int]) -> None:
    sampler.model.train()
    try:
        res = run(sampler.sample(SampleRequest(prompt, GREEDY)))
        assert sampler.model.training
        ref = run(sampler.sample(SampleRequest(prompt, GREEDY)))
        assert res.token_ids == ref.token_ids  # sampled in eval mode both times
    finally:
        sampler.model.eval()


def test_hf_local_checkpoint_roundtrip(sampler: HFSampler, prompt: list[int], tmp_path) -> None:
    sampler.model.save_pretrained(tmp_path)
    sampler.tokenizer.save_pretrained(tmp_path)
    again = load_policy(f"hf:{tmp_path}")
    assert isinstance(again, HFSampler) and again.policy == f"hf:{tmp_path}"
    a = run(sampler.sample(SampleRequest(prompt, GREEDY)))
    b = run(again.sample(SampleRequest(again.render([{"role": "user", "content": "What is 2+2?"}]), GREEDY)))
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_continuous_batching_admits_and_returns_early(sampler: HFSampler, prompt: list[int]) -> None:
    short = SampleRequest(prompt[:15], SamplingParams(temperature=0.0, max_tokens=3))
    alone = run(sampler.sample(short))

    async def scenario() -> None:
        steps = sampler.stats["steps"]
        long = asyncio.ensure_future(
            sampler.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=300)))
        )
        while sampler.stats["steps"] < steps + 2:  # the long request is decoding
            await asyncio.sleep(0.001)
        admissions = sampler.stats["admissions"]
        got = await sampler.sample(short)
        assert not long.done()  # joined the running batch and came back first
        assert sampler.stats["admissions"] == admissions + 1
        assert got.token_ids == alone.token_ids
        assert max(abs(x - y) for x, y in zip(got.logprobs, alone.logprobs, strict=True)) < 1e-4
        assert len((await long).token_ids) == 300

    run(scenario())


def test_paused_holds_requests_back(sampler: HFSampler, prompt: list[int]) -> None:
    async def scenario() -> None:
        with sampler.paused():
            task = asyncio.ensure_future(sampler.sample(SampleRequest(prompt, GREEDY)))
            await asyncio.sleep(0.1)
            assert not task.done()
        assert len((await task).token_ids) == 12

    run(scenario())


def test_abandoned_request_is_dropped(sampler: HFSampler, prompt: list[int]) -> None:
    async def scenario() -> None:
        steps = sampler.stats["steps"]
        task = asyncio.ensure_future(
            sampler.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=5000)))
        )
        while sampler.stats["steps"] < steps + 2:
            await asyncio.sleep(0.001)
        task.cancel()
        res = await asyncio.wait_for(sampler.sample(SampleRequest(prompt, GREEDY)), timeout=30)
        assert len(res.token_ids) == 12
        steps_after = sampler.stats["steps"]
        await asyncio.sleep(0.1)
        assert sampler.stats["steps"] == steps_after  # idle: the abandoned row stopped decoding

    run(scenario())


def test_failed_step_fails_its_requests_only(prompt: list[int]) -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    s = HFSampler(model, tok, "tiny")

    def boom(module, args):
        raise RuntimeError("disk on fire")

    hook = model.register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="HF sampler failed: RuntimeError: disk on fire"):
        run(s.sample(SampleRequest(prompt, GREEDY)))
    hook.remove()
    assert len(run(s.sample(SampleRequest(prompt, GREEDY))).token_ids) == 12
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        run(s.sample(SampleRequest(prompt, GREEDY)))


def test_reseed_makes_unseeded_sampling_reproducible(sampler: HFSampler, prompt: list[int]) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=8)
    reqs = [SampleRequest(prompt, params, group_key="g") for _ in range(3)] + [SampleRequest(prompt[:20], params)]
    sampler.reseed(7)
    first = run(_gather(sampler, reqs))
    sampler.reseed(7)
    again = run(_gather(sampler, list(reversed(reqs))))  # other arrival order: same multiset of samples
    assert sorted(r.token_ids for r in first) == sorted(r.token_ids for r in again)
    assert first[3].token_ids == again[0].token_ids  # the distinct prompt gets the same sample
    assert len({tuple(r.token_ids) for r in first[:3]}) == 3  # group members differ
    sampler.reseed(8)
    assert run(sampler.sample(reqs[3])).token_ids != first[3].token_ids


# --- the decode layout: a group's prompt KV is stored once, its samples are slots of one cache row ---
def _alone(model, req: SampleRequest, seed: int):
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    row = RowState(req.params, make_generator(req.params, torch.device("cpu"), seed))
    generate_batch(model, [req], [row], spec, torch.device("cpu"), share_head=False)  # the whole prompt in its row
    return row


def _drain(batch: RunningBatch) -> None:
    while batch.rows:
        batch.step()


def _assert_same(got: RowState, ref: RowState) -> None:
    assert got.token_ids == ref.token_ids
    assert max(abs(x - y) for x, y in zip(got.logprobs, ref.logprobs, strict=True)) < 1e-4


def test_slot_width_groups_samples_and_avoids_dummy_slots() -> None:
    assert _slot_width([8, 8, 8, 8], length=700, rows0=0, width0=0) == 8  # GRPO: a cache row per group
    assert _slot_width([1, 1, 1], length=500, rows0=0, width0=0) == 1
    # 20 running rows one slot wide: a new group of 8 is split rather than widen all 21 rows to 8 slots
    assert _slot_width([8], length=1000, rows0=20, width0=1) == 1
    assert _slot_width([5], length=300, rows0=2, width0=8) == 5  # fits the running width: no copies


def test_group_prompt_is_stored_once_and_decodes_as_alone(sampler: HFSampler, prompt: list[int]) -> None:
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    group = [SampleRequest(prompt, SamplingParams(temperature=1.0, max_tokens=3 + 2 * i)) for i in range(4)]
    other = [SampleRequest(prompt[:20], SamplingParams(temperature=1.0, max_tokens=7 - i)) for i in range(4)]
    reqs = group + other
    seeds = list(range(100, 100 + len(reqs)))
    rows = [
        RowState(r.params, make_generator(r.params, torch.device("cpu"), s)) for r, s in zip(reqs, seeds, strict=True)
    ]
    batch = RunningBatch(model, spec, torch.device("cpu"))
    with torch.inference_mode():
        batch.admit(reqs, rows)
        n_rows, width, length = batch.shape
        head = batch.head_len  # the two prompts' common prefix (all of prompt[:20] but its last position) once
        assert head == 19 and batch.cache.layers[0].keys.shape[2] == length
        assert (n_rows, width, length) == (2, 4, len(prompt) - head)  # each group's prompt once, not once per sample
        assert batch.cache.layers[0].keys.shape[0] == 2
        batch.step()
        batch.step()
        assert batch.shape[1] == 4 and batch.shape[2] == len(prompt) - head + 2 * 4  # each slot adds its own column
        _drain(batch)
        for row, req, seed in zip(
            rows, reqs, seeds, strict=True
        ):  # members finished at different steps (slots renumbered)
            _assert_same(row, _alone(model, req, seed))


def test_rows_joining_a_wider_batch_decode_as_alone(sampler: HFSampler, prompt: list[int]) -> None:
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    group = [SampleRequest(prompt, SamplingParams(temperature=1.0, max_tokens=9)) for _ in range(4)]
    late = [SampleRequest(prompt[: 12 + 3 * i], SamplingParams(temperature=0.0, max_tokens=5)) for i in range(3)]
    g_rows = [RowState(r.params, make_generator(r.params, torch.device("cpu"), 7 + i)) for i, r in enumerate(group)]
    l_rows = [RowState(r.params, None) for r in late]
    batch = RunningBatch(model, spec, torch.device("cpu"))
    with torch.inference_mode():
        batch.admit(group, g_rows)
        batch.step()
        batch.step()
        batch.admit(late, l_rows)  # distinct prompts join rows 4 slots wide: they get dummy slots beside them
        assert batch.shape[:2] == (4, 4)
        _drain(batch)
        for row, req, seed in zip(g_rows + l_rows, group + late, [7, 8, 9, 10, 0, 0, 0], strict=True):
            _assert_same(row, _alone(model, req, seed))


def test_eager_attention_gets_an_additive_mask(prompt: list[int]) -> None:
    model, _ = tiny_model_and_tokenizer(seed=1)
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    reqs = [SampleRequest(prompt, SamplingParams(temperature=1.0, max_tokens=4 + i)) for i in range(3)]
    rows = [RowState(r.params, make_generator(r.params, torch.device("cpu"), i)) for i, r in enumerate(reqs)]
    batch = RunningBatch(model, spec, torch.device("cpu"))
    with torch.inference_mode():
        batch.admit(reqs, rows)
        assert batch.shape[:2] == (1, 3)
        _drain(batch)
        for i, (row, req) in enumerate(zip(rows, reqs, strict=True)):
            _assert_same(row, _alone(model, req, i))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_admissions_finishes_and_abandons_decode_as_alone(
    sampler: HFSampler, prompt: list[int], seed: int
) -> None:
    import random

    rng = random.Random(seed)
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    batch = RunningBatch(model, spec, torch.device("cpu"))
    done: list[tuple[RowState, SampleRequest, int]] = []
    abandoned: list[RowState] = []
    n = 0
    with torch.inference_mode():
        for _ in range(6):
            reqs, rows, seeds = [], [], []
            for _ in range(rng.randint(1, 3)):  # a few prompts, each asked 1-5 times
                cut = rng.randint(8, len(prompt))
                for _ in range(rng.choice([1, 1, 3, 5])):
                    p = SamplingParams(temperature=1.0, max_tokens=rng.randint(1, 9))
                    reqs.append(SampleRequest(prompt[:cut], p))
                    rows.append(RowState(p, make_generator(p, torch.device("cpu"), n)))
                    seeds.append(n)
                    n += 1
            batch.admit(reqs, rows)
            done += list(zip(rows, reqs, seeds, strict=True))
            for _ in range(rng.randint(0, 3)):
                batch.step()
            if batch.rows and rng.random() < 0.5:  # a caller gives up
                a = rng.randrange(len(batch.rows))
                abandoned.append(batch.rows[a])
                batch.retire([a])
        _drain(batch)
    assert batch.shape == (0, 0, 0)
    for row, req, s in done:
        ref = _alone(model, req, s)
        if any(row is r for r in abandoned):  # what it had so far is a prefix of its solo run
            assert ref.token_ids[: len(row.token_ids)] == row.token_ids
        else:
            _assert_same(row, ref)


def test_the_shared_head_shrinks_as_prompts_sharing_less_join(sampler: HFSampler, prompt: list[int]) -> None:
    """The batch's head is its prompts' longest common prefix: prompts sharing less shrink it (the old rows take
    the positions back into their columns), one sharing under MIN_HEAD ends it; every row decodes as alone, and
    the turns it remembers hold the KV of rows that held the whole prompt."""
    from agentrft.samplers.prefix_cache import PrefixCache, as_tokens
    from agentrft.samplers.shared_head import MIN_HEAD

    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    waves = [prompt, prompt[:24], prompt[: MIN_HEAD - 4] + prompt[-6:]]
    caches = {share: PrefixCache(max_tokens=1 << 16, min_tokens=4, remember_turns=True) for share in (True, False)}
    results: dict[bool, list[RowState]] = {}
    heads = []
    whole: dict[bool, list] = {True: [], False: []}
    with torch.inference_mode():
        for share, pc in caches.items():
            batch = RunningBatch(model, spec, torch.device("cpu"), prefix_cache=pc, share_head=share)
            results[share] = []
            for w, p in enumerate(waves):
                reqs = [
                    SampleRequest(p, SamplingParams(temperature=1.0, max_tokens=4 + 3 * (2 - w) + i)) for i in range(2)
                ]
                rows = [
                    RowState(r.params, make_generator(r.params, torch.device("cpu"), 10 * w + i))
                    for i, r in enumerate(reqs)
                ]
                batch.admit(reqs, rows)
                results[share] += rows
                if share:
                    heads.append(batch.head_len)
                batch.step()
                c, slot = batch.slot[0]  # the oldest row's whole sequence so far, head included
                whole[share].append(batch._row_kv(c, batch.visible[c, slot].nonzero()[:, 0]))
            _drain(batch)
    assert heads == [len(prompt) - 1, 23, 0]
    for kv_a, kv_b in zip(whole[True], whole[False], strict=True):
        for (k1, v1), (k2, v2) in zip(kv_a, kv_b, strict=True):
            assert k1.shape == k2.shape and torch.allclose(k1, k2, atol=1e-5, rtol=0)
            assert torch.allclose(v1, v2, atol=1e-5, rtol=0)
    for got, ref in zip(results[True], results[False], strict=True):
        _assert_same(got, ref)
    seqs = {share: sorted(tuple(q.tolist()) for q in pc.sequences()) for share, pc in caches.items()}
    assert seqs[True] == seqs[False] and seqs[True]
    for q in seqs[True]:
        kv = {share: pc.lookup(as_tokens(list(q)), len(q))[0].materialize() for share, pc in caches.items()}
        for (k1, v1), (k2, v2) in zip(kv[True], kv[False], strict=True):
            assert torch.allclose(k1, k2, atol=1e-5, rtol=0) and torch.allclose(v1, v2, atol=1e-5, rtol=0)


def test_prompts_admitted_after_a_weight_update_share_no_head(sampler: HFSampler, prompt: list[int]) -> None:
    """A prompt that shares all of the head joins it as it is; the head's KV is the weights' of its admission: after
    `weights_epoch` moves, new prompts share none of it (the old rows take it back into their columns). Every row
    decodes as alone."""
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    batch = RunningBatch(model, spec, torch.device("cpu"))
    reqs = [SampleRequest(prompt, SamplingParams(temperature=1.0, max_tokens=9)) for _ in range(2)]
    same = [SampleRequest(prompt, SamplingParams(temperature=1.0, max_tokens=6))]  # joins: the head is kept as it is
    late = [SampleRequest(prompt[:30], SamplingParams(temperature=1.0, max_tokens=5))]
    every = reqs + same + late
    rows = [RowState(r.params, make_generator(r.params, torch.device("cpu"), i)) for i, r in enumerate(every)]
    with torch.inference_mode():
        batch.admit(reqs, rows[:2])
        assert batch.head_len == len(prompt) - 1
        batch.step()
        batch.admit(same, rows[2:3])
        assert batch.head_len == len(prompt) - 1
        batch.step()
        batch.weights_epoch = 1
        batch.admit(late, rows[3:])
        assert batch.head_len == 0
        _drain(batch)
    for seed, (row, req) in enumerate(zip(rows, every, strict=True)):
        _assert_same(row, _alone(model, req, seed))


def test_cache_grows_in_place_and_past_its_room(sampler: HFSampler, prompt: list[int]) -> None:
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    reqs = [SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=6)) for _ in range(2)]
    rows = [RowState(r.params, None) for r in reqs]
    batch = RunningBatch(model, spec, torch.device("cpu"))
    with torch.inference_mode():
        batch.admit(reqs, rows)
        layer = batch.cache.layers[0]
        buf = layer._bufs[0]
        batch.step()
        assert batch.cache.layers[0]._bufs[0] is buf  # written in place, no copy
        assert layer.keys.data_ptr() == buf.data_ptr() and layer.keys.shape[2] == len(prompt) - batch.head_len + 2
        rows[0].params = rows[1].params = SamplingParams(temperature=0.0, max_tokens=40)  # beyond the planned room
        _drain(batch)
    for row, req in zip(rows, reqs, strict=True):
        ref = _alone(model, SampleRequest(req.prompt_ids, SamplingParams(temperature=0.0, max_tokens=40)), 0)
        assert row.token_ids == ref.token_ids


def test_the_kv_estimate_is_the_cache_admission_builds_also_when_a_prompt_is_split_over_rows(
    sampler: HFSampler, prompt: list[int]
) -> None:
    model = sampler.model
    spec = DecodeSpec(eos_ids=frozenset(), max_positions=1 << 20, decode=lambda ids: "")
    batch = RunningBatch(model, spec, torch.device("cpu"))
    params = SamplingParams(temperature=0.0, max_tokens=5)
    many_narrow = [SampleRequest(prompt[: 6 + i], params) for i in range(12) for _ in range(2)]  # 12 rows, 2 wide
    wide = [SampleRequest(prompt[:20], SamplingParams(temperature=0.0, max_tokens=7)) for _ in range(8)]
    with torch.inference_mode():
        for reqs in (many_narrow, wide):
            estimate = batch.positions_with(reqs)
            batch.admit(reqs, [RowState(r.params, None) for r in reqs])
            rows, width, length = batch.shape
            left = max(r.params.max_tokens - len(r.token_ids) for r in batch.rows)
            assert estimate == batch.head_len + rows * (length + width * left)
        assert batch.shape[0] > 12 + 1  # the 8 requests of one prompt took more than one row: the case estimated
        _drain(batch)
        # with a shared head (counted once, as it is stored), also once a prompt that shares less shrinks it
        headed = RunningBatch(model, spec, torch.device("cpu"))
        for reqs in (
            [SampleRequest(prompt[: 30 + i], params) for i in range(4) for _ in range(2)],
            [SampleRequest(prompt[:24], SamplingParams(temperature=0.0, max_tokens=7))],
        ):
            estimate = headed.positions_with(reqs)
            headed.admit(reqs, [RowState(r.params, None) for r in reqs])
            rows, width, length = headed.shape
            left = max(r.params.max_tokens - len(r.token_ids) for r in headed.rows)
            assert headed.head_len >= 16 and estimate == headed.head_len + rows * (length + width * left)
            assert headed.cache_positions == headed.head_len + rows * length
        assert headed.head_len == 23  # shrunk from 29 by the second admission
        # after a weight update the head is not shared with new prompts: the estimate counts it in every row
        headed.weights_epoch += 1
        reqs = [SampleRequest(prompt[:26], params)]
        estimate = headed.positions_with(reqs)
        headed.admit(reqs, [RowState(r.params, None) for r in reqs])
        rows, width, length = headed.shape
        left = max(r.params.max_tokens - len(r.token_ids) for r in headed.rows)
        assert headed.head_len == 0 and estimate == rows * (length + width * left) == headed.positions_with([])
        _drain(headed)


def test_default_kv_budgets_are_one_size_in_memory_whatever_the_kv_format() -> None:
    """Both KV budgets default to the positions `KV_BUDGET_MIB` holds in the engine's KV format: an fp32 engine
    gets half the positions of a bf16 one, so it uses no more memory."""
    from agentrft.samplers.hf import KV_BUDGET_MIB
    from agentrft.samplers.kv_cache import position_bytes

    model, tok = tiny_model_and_tokenizer()
    cfg = model.config
    per_fp32 = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert position_bytes(cfg, 4) == per_fp32
    fp32 = HFSampler(model, tok, policy="tiny")
    bf16 = HFSampler(model, tok, policy="tiny", precision="bf16")
    given = HFSampler(model, tok, policy="tiny", max_kv_positions=100, prefix_cache_tokens=50)
    try:
        assert fp32.max_kv_positions == KV_BUDGET_MIB * 2**20 // per_fp32 == fp32.prefix_cache.max_tokens
        assert bf16.max_kv_positions == KV_BUDGET_MIB * 2**20 // (per_fp32 // 2) == bf16.prefix_cache.max_tokens
        assert given.max_kv_positions == 100 and given.prefix_cache.max_tokens == 50
    finally:
        for s in (fp32, bf16, given):
            s.close()


def test_kv_budget_holds_requests_back_and_changes_no_result(prompt: list[int]) -> None:
    model, tok = tiny_model_and_tokenizer()
    reqs = [
        SampleRequest(prompt[: 8 + 4 * i], SamplingParams(temperature=0.8, max_tokens=4 + i, seed=i)) for i in range(8)
    ]
    free = HFSampler(model, tok, policy="tiny", max_kv_positions=None)
    bounded = HFSampler(model, tok, policy="tiny", max_kv_positions=60)
    try:
        unbounded = run(_gather(free, reqs))
        got = run(_gather(bounded, reqs))
        # one request alone needs at most (8 + 28) + 11 = 47 positions: each fits, all 8 together do not
        assert bounded.stats["kv_wait_steps"] > 0
        assert 0 < bounded.stats["kv_peak_positions"] <= 60 < free.stats["kv_peak_positions"]
        for a, b in zip(unbounded, got, strict=True):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        # a request larger than the whole budget still runs (alone)
        big = run(bounded.sample(SampleRequest(prompt[:40], SamplingParams(temperature=0.0, max_tokens=30))))
        assert len(big.token_ids) == 30
    finally:
        free.close()
        bounded.close()
    with pytest.raises(ValueError, match="max_kv_positions"):
        HFSampler(model, tok, policy="tiny", max_kv_positions=0)

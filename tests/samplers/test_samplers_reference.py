"""The reference sampler (one plain `generate` per request) is the engine's oracle: same ids, same log-probs."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrft.samplers.base import SampleRequest, SamplingParams, TrainablePolicy
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.hf_reference import ReferenceHFSampler
from agentrft.samplers.policies import PolicyError, load_trainable_policy, tiny_model_and_tokenizer

QUESTIONS = ["What is 2+2?", "Revenue 2019 was 5,829; 2018 was 5,735. Growth?", "Name a prime.", "Say hi."]


@pytest.fixture(scope="module")
def pair() -> tuple[HFSampler, ReferenceHFSampler]:
    model, tok = tiny_model_and_tokenizer(seed=2)
    return HFSampler(model, tok, "tiny", prefix_min_tokens=8), ReferenceHFSampler(model, tok, "tiny")


def _random_requests(engine: HFSampler, rng: random.Random, n: int) -> list[SampleRequest]:
    prompts = [
        engine.render([{"role": "system", "content": "You are terse."}, {"role": "user", "content": q}])
        for q in QUESTIONS
    ]
    reqs = []
    for _i in range(n):
        prompt = rng.choice(prompts)
        greedy = rng.random() < 0.25
        params = SamplingParams(
            temperature=0.0 if greedy else rng.choice([0.5, 0.7, 1.0, 1.4]),
            top_p=rng.choice([1.0, 1.0, 0.9, 0.5]),
            top_k=rng.choice([None, None, 20]),
            max_tokens=rng.randint(1, 24),
            seed=rng.randrange(1 << 30),
            stop=[engine.decode([rng.randrange(100, 2000)]).strip() or "x"] if rng.random() < 0.3 else [],
        )
        reqs.append(SampleRequest(prompt, params, group_key=str(prompts.index(prompt))))
    return reqs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_equals_reference_on_random_concurrent_batches(pair, seed: int) -> None:
    engine, ref = pair
    reqs = _random_requests(engine, random.Random(seed), 12)

    async def together():
        return await asyncio.gather(*(engine.sample(r) for r in reqs))

    got = asyncio.run(together())
    for r, g in zip(reqs, got, strict=True):
        want = asyncio.run(ref.sample(r))
        assert g.token_ids == want.token_ids, (r.params, g.token_ids, want.token_ids, g.logprobs, want.logprobs)
        assert (g.finish_reason, g.text) == (want.finish_reason, want.text)
        # fp32 noise of batched vs solo forwards (arrival timing changes the batch shapes), scaled by 1/T:
        # up to ~1.5e-4 seen; a wrong temperature or truncation is off by 0.1 or more
        assert max((abs(a - b) for a, b in zip(g.logprobs, want.logprobs, strict=True)), default=0.0) < 1e-3


def test_reference_is_selectable_and_trainable(pair) -> None:
    engine, ref = pair
    assert isinstance(ref, TrainablePolicy)
    prompt = engine.render([{"role": "user", "content": "hi"}])

    async def scenario() -> None:
        with ref.paused():  # the caller has the model: a request waits until the pause ends
            task = asyncio.ensure_future(
                ref.sample(SampleRequest(prompt, SamplingParams(temperature=0.0, max_tokens=3)))
            )
            await asyncio.sleep(0.2)
            assert not task.done()
        assert len((await task).token_ids) == 3

    asyncio.run(scenario())
    ref.weights_updated(4)
    assert ref.policy_version == 4
    ref.weights_updated(0)
    assert isinstance(load_trainable_policy("tiny", sampler="reference"), ReferenceHFSampler)
    with pytest.raises(PolicyError, match="valid: engine, reference"):
        load_trainable_policy("tiny", sampler="fast")
    with pytest.raises(PolicyError, match="cannot be trained in this process"):
        load_trainable_policy("openai:gpt-x")

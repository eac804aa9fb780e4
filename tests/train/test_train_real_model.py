"""One sampling distribution, on the real model: at T = 0.7 the sampler's log-probs are what the trainer
recomputes at the first on-policy step (SmolLM2-135M, finqa-lite level 1, the demo's recipe).

Tolerances: with both sides in fp32 the gap is float noise (measured on the 2-core dev CPU: mean 1.9e-6,
max 2.5e-5 over ~300 sampled tokens); under bf16 autocast in the trainer (what ``auto`` picks where the
CPU multiplies bf16 natively; run explicitly, so every CPU checks it) it is bf16 rounding of the trainer's
forward (measured: mean 0.013-0.016, max 0.18-0.33 here; over the demo's ten steps the per-step mean stayed
within 0.009-0.046 and the max reached 1.5 on rare tokens).
The last test shows the check has teeth: the same samples recomputed at the wrong temperature.
"""

from __future__ import annotations

import pytest

from agentrft.precision import bf16_works
from agentrft.train import train
from agentrft.train.config import PRESETS, build_config
from agentrft.train.core.update import autocast_dtype


@pytest.mark.real_model
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sampler_logprobs_equal_trainer_logprobs_at_t07(tmp_path, precision: str) -> None:
    if precision == "bf16" and not bf16_works():
        pytest.skip("this CPU runs no bf16 matmul")
    cfg = build_config(
        PRESETS["demo"],
        [
            "steps=1",
            "rollout.tasks_per_step=2",
            "rollout.group_size=4",
            "rollout.max_tokens=32",
            f"policy.precision={precision}",
            "checkpoint.every_steps=0",
            "logging.tensorboard=false",
        ],
    )
    assert cfg.rollout.temperature == 0.7
    m = train(cfg, tmp_path).history[0]
    print(
        f"precision {precision}: gap mean {m['sampler_logprob_gap_mean']:.3g} max {m['sampler_logprob_gap_max']:.3g} "
        f"over {m['train_tokens']:.0f} tokens"
    )
    assert m["train_tokens"] > 0
    if autocast_dtype(precision) is None:  # fp32 on both sides
        assert m["sampler_logprob_gap_mean"] < 1e-4 and m["sampler_logprob_gap_max"] < 1e-3
    else:
        assert m["sampler_logprob_gap_mean"] < 0.05 and m["sampler_logprob_gap_max"] < 3.0


@pytest.mark.real_model
def test_the_gap_separates_the_right_distribution_from_the_wrong_one() -> None:
    """The check above has teeth: recomputing the same samples at temperature 1 instead of 0.7 (the bug this
    contract removed) misses by far more than float noise."""
    import asyncio

    import torch

    from agentrft.envs.registry import make_env
    from agentrft.samplers.base import SampleRequest, SamplingParams
    from agentrft.samplers.distribution import Distribution
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.train.core.logprobs import sampled_logprobs

    policy = load_trainable_policy("smollm2-135m")
    env = make_env("finqa-lite:1")
    task = env.tasks("train")[0]
    prompt = policy.render(
        [{"role": "system", "content": env.system_prompt()}, *[m.to_openai() for m in task.messages]]
    )
    params = SamplingParams(temperature=0.7, max_tokens=32, seed=11)
    res = asyncio.run(policy.sample(SampleRequest(prompt, params)))
    ids = torch.tensor([prompt + res.token_ids])
    mask = torch.tensor([[0] * len(prompt) + [1] * len(res.token_ids)])
    sampler = torch.tensor(res.logprobs, dtype=torch.float64)
    gaps = {}
    for t in (0.7, 1.0):
        with torch.no_grad():
            lp, _ = sampled_logprobs(policy.model, ids, torch.ones_like(ids), mask, dist=Distribution(temperature=t))
        gaps[t] = float((lp[0, len(prompt) :].double() - sampler).abs().mean())
    print(f"mean |gap| over {len(res.token_ids)} tokens: T=0.7 {gaps[0.7]:.3g}, T=1 {gaps[1.0]:.3g}")
    assert gaps[0.7] < 1e-4 and gaps[1.0] > 100 * gaps[0.7] and gaps[1.0] > 0.01

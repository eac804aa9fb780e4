"""The real default model through the real agent loop: token-in-token-out on SmolLM2-135M."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_smollm2_plays_finqa_lite_level1_greedy() -> None:
    from agentrft.envs.registry import make_env
    from agentrft.graders import load_grader
    from agentrft.rollout.runner import Runner
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.policies import load_policy

    env = make_env("finqa-lite:1")
    sampler = load_policy("smollm2-135m")
    runner = Runner(
        env,
        sampler,
        grader=load_grader(env.grader_spec()),
        params=SamplingParams(temperature=0.0, max_tokens=48),
        progress=False,
    )
    trajs = runner.run_sync(env.tasks("held-out")[:6], 1, run_id="real")
    for t in trajs:
        assert t.tokens is not None and t.grade is not None
        # the loss mask covers exactly what the sampler produced, turn by turn
        sampled = sum(e.completion_tokens for e in t.events if e.type == "model_call")
        assert t.tokens.num_sampled == sampled
        assert t.env.tool_schema_hash == env.tool_schema_hash()
    # greedy SmolLM2 with the level-1 worked examples solved 8 of 16 held-out tasks when measured
    assert any(t.tool_calls and t.tool_calls[0].name == "calculate" for t in trajs)
    assert sum(t.grade.success for t in trajs) >= 1

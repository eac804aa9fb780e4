"""The agent loop and runner with the real pieces: tiny HF sampler, finqa-lite environment, SQLite store.

Skips only while those modules are not importable (they are written in parallel).
"""

from __future__ import annotations

import pytest

from agentrft.samplers.base import SamplingParams


def _real():
    pytest.importorskip("torch")
    policies = pytest.importorskip("agentrft.samplers.policies")
    registry = pytest.importorskip("agentrft.envs.registry")
    return policies, registry


@pytest.mark.parametrize("tool_format", ["xml", "hermes"])
def test_tiny_policy_on_finqa_lite_keeps_token_invariant(tool_format: str, tmp_path) -> None:
    policies, registry = _real()
    from agentrft.rollout.runner import Runner
    from agentrft.store import Store

    sampler = policies.load_policy("tiny")
    env = registry.make_env("finqa-lite:1")
    tasks = env.tasks("train")[:2]
    seen: list[tuple[list[int], list[int]]] = []
    original = sampler.sample

    async def recording(request):
        result = await original(request)
        seen.append((list(request.prompt_ids), list(result.token_ids)))
        return result

    together = sampler.sample_together

    def recording_together(requests):  # the runner's lockstep waves (rollout/lockstep.py) come this way
        futures = together(requests)
        for request, fut in zip(requests, futures, strict=True):
            fut.add_done_callback(
                lambda f, r=request: (
                    f.cancelled() or f.exception() or seen.append((list(r.prompt_ids), list(f.result().token_ids)))
                )
            )
        return futures

    sampler.sample = recording  # type: ignore[method-assign]
    sampler.sample_together = recording_together  # type: ignore[method-assign]
    store = Store(tmp_path / "t.db")
    runner = Runner(
        env,
        sampler,
        store=store,
        tool_format=tool_format,
        progress=False,
        max_concurrency=4,
        params=SamplingParams(temperature=1.0, max_tokens=24),
    )  # unseeded: the G samples of a task must differ
    trajs = runner.run_sync(tasks, 2, run_id="it")
    assert len(trajs) == 4 and runner.stats.store_errors == []
    for traj in trajs:
        tok = traj.tokens
        assert tok is not None and traj.status in ("completed", "max_turns", "truncated")
        assert store.get_trajectory(traj.id).tokens == tok
        # every sampler call of this episode: its prompt is a prefix of the record, followed by its output
        mine = [(p, s) for p, s in seen if tok.ids[: len(p)] == p and tok.ids[len(p) : len(p) + len(s)] == s]
        assert sum(tok.loss_mask) == sum(len(s) for _, s in mine)
        assert len(mine) == sum(1 for e in traj.events if e.type == "model_call")
    # the first prompt is exactly the chat template's rendering of the opening messages
    from agentrft.rollout.agent import to_render
    from agentrft.rollout.formats import make_format

    fmt = make_format(tool_format, env.tool_schemas())
    t0 = trajs[0]
    opening = t0.messages[: len(env.initial_messages(tasks[0]))]
    first = sampler.render([to_render(m, fmt) for m in opening], None, True)
    assert t0.tokens.ids[: len(first)] == first
    store.close()


def test_scripted_outputs_through_smollm2_template() -> None:
    """Real tokenizer and chat template, scripted model text: the record decodes to the exact ChatML transcript."""
    policies, registry = _real()
    from agentrft.rollout.agent import run_episode
    from agentrft.samplers.base import SampleResult

    tok = policies.smollm2_tokenizer()
    real = policies.load_policy("tiny")
    env = registry.make_env("finqa-lite:1")
    task = env.tasks("train")[0]
    program = task.data["program"]

    class Scripted:
        policy, policy_version = "scripted", 0
        render, decode = real.render, real.decode

        def __init__(self) -> None:
            self.outputs = [f"<calculate>{program}</calculate>", "The answer is 42."]
            self.prompts: list[list[int]] = []

        async def sample(self, request):
            self.prompts.append(list(request.prompt_ids))
            text = self.outputs.pop(0)
            ids = tok.encode(text, add_special_tokens=False)
            finish = "stop_string"
            if not text.endswith("</calculate>"):
                ids, finish = [*ids, tok.eos_token_id], "stop"
            return SampleResult(ids, [-0.5] * len(ids), text, finish, len(request.prompt_ids), len(ids))

    sampler = Scripted()
    traj = asyncio_run(run_episode(env, sampler, task, params=SamplingParams(max_tokens=64)))
    assert traj.status == "completed" and traj.final_answer == "The answer is 42."
    result = traj.tool_calls[0].result
    text = real.decode(traj.tokens.ids)
    first = real.decode(sampler.prompts[0])
    assert text == (
        first + f"<calculate>{program}</calculate><|im_end|>\n<|im_start|>tool\n{result}<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 42.<|im_end|>"
    )
    assert traj.tokens.ids[: len(sampler.prompts[1])] == sampler.prompts[1]


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


def test_cli_rollout_json(tmp_path) -> None:
    _real()
    pytest.importorskip("agentrft.graders")
    import json

    from typer.testing import CliRunner

    from agentrft.cli.main import app
    from agentrft.store import Store

    db = tmp_path / "r.db"
    r = CliRunner().invoke(
        app,
        [
            "rollout",
            "--policy",
            "tiny",
            "--tasks",
            "2",
            "--samples",
            "2",
            "--max-tokens",
            "8",
            "--db",
            str(db),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["episodes"] == 4 and summary["generated_tokens"] > 0 and summary["store_errors"] == []
    with Store(db) as store:
        trajs = store.query_trajectories(run_id=summary["run_id"])
        assert len(trajs) == 4 and all(t.grade is not None for t in trajs)
    bad = CliRunner().invoke(app, ["rollout", "--env", "nope", "--policy", "tiny"])
    assert bad.exit_code == 2 and "unknown environment" in bad.output

"""evaluate + report + export over the real finqa-lite env, rollout runner, grader and store.

The policy is a scripted chat sampler (no model): the first sample of each task
answers correctly, the second answers "0" — so every figure is known by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrft.eval.exports import export_run, read_rft_rows
from agentrft.eval.harness import evaluate
from agentrft.eval.report import build_report


class ScriptedChat:
    policy = "scripted"
    policy_version = 0

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.seen = answers, {}

    async def chat(self, messages: list[dict[str, Any]], tools: Any, params: Any) -> Any:
        from agentrft.samplers.base import ChatResult

        question = [m for m in messages if m["role"] == "user"][-1]["content"]
        n = self.seen[question] = self.seen.get(question, 0) + 1
        text = f"The answer is {self.answers[question]}." if n == 1 else "The answer is 0."
        return ChatResult(
            message={"role": "assistant", "content": text}, finish_reason="stop", prompt_tokens=50, completion_tokens=7
        )


def test_evaluate_real_stack(tmp_path: Path) -> None:
    from agentrft.envs.registry import make_env
    from agentrft.store import Store

    env = make_env("finqa-lite:1")
    tasks = env.tasks("held-out")[:3]
    sampler = ScriptedChat({t.messages[-1].text(): t.data["answer"] for t in tasks})
    store = Store(tmp_path / "agentrft.db")
    res = evaluate(
        env, sampler, samples=2, tasks=3, store=store, run_name="baseline", env_spec="finqa-lite:1", progress=False
    )
    assert res.n_trajectories == 6 and res.n_ungraded == 0
    assert res.pass_at_k == {1: pytest.approx(0.5), 2: pytest.approx(1.0)}
    assert res.pass_hat_k[2] == 0.0
    assert res.failures["no_tool_call"] == 3 and sum(res.failures.values()) == 3
    assert res.usage.tokens_per_episode == pytest.approx(57.0) and res.cost.tokens_per_success == pytest.approx(114.0)
    assert store.get_run(res.run_id).kind == "eval"
    assert len(store.query_trajectories(run_id=res.run_id)) == 6

    out = tmp_path / "rft.jsonl"
    assert export_run(store, res.run_id, "rft", out) == 3
    assert {t.id: t.data for t in read_rft_rows(out)} == {t.id: t.data for t in tasks}
    assert export_run(store, res.run_id, "dpo", tmp_path / "dpo.jsonl") == 3
    store.close()
    html = build_report(tmp_path)
    assert all(t.id in html for t in tasks) and "baseline" in html
    json.loads(res.model_dump_json())

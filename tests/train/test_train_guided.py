"""Guided groups (``rollout.expert_per_group``, train/stages.guided_rollout_stage): the expert's episodes join the
policy's groups, are graded and trained with them, and stay out of the policy's pass rates."""

from __future__ import annotations

from typing import Any

import fakes_train as F
import pytest

from agentrft.inputs import InputError
from agentrft.samplers.base import SampleRequest, SampleResult
from agentrft.store import Store
from agentrft.train import train
from agentrft.train.config import ConfigError
from agentrft.train.core.metrics import read_metrics


class FakeExpert(F.FakeSampler):
    """Writes the fake grader's best answer (every token below VOCAB/2) through the policy's renderer."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = "expert"

    async def sample(self, request: SampleRequest) -> SampleResult:
        ids = [3, 4, 5, 6, 7, 8][: request.params.max_tokens]
        return SampleResult(
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            text=self.decode(ids),
            finish_reason="stop",
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            policy_version=None,
        )


GUIDED = {"rollout.expert_per_group": 1, "steps": 2, "eval.every_steps": 0, "checkpoint.every_steps": 0}


def _run(run_dir: Any, expert: bool = True, **sets: Any) -> Any:
    comps = F.components(run_dir)
    if expert:
        comps.expert = FakeExpert()
    return train(F.config(**{**GUIDED, **sets}), run_dir, components=comps)


def test_expert_episodes_join_each_group_train_with_it_and_stay_out_of_the_policys_rates(tmp_path) -> None:
    result = _run(tmp_path / "r")
    with Store(tmp_path / "r" / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        trajs = s.query_trajectories(run_id=run.id)
    groups: dict[str, list[Any]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == 4  # 2 steps x 2 tasks
    for members in groups.values():
        assert len(members) == 3 and len({t.task_id for t in members}) == 1  # group_size 3: 2 policy + 1 expert
        experts = [t for t in members if t.metadata.get("expert")]
        assert [t.policy for t in experts] == ["expert"]
        assert experts[0].grade is not None and experts[0].grade.reward == pytest.approx(1.0, abs=1e-12)
        assert all(t.tokens is not None and "trained_step" in t.metadata for t in members)  # all three trained
    for row in read_metrics(tmp_path / "r"):
        assert row["train_episodes"] == 4.0 and row["expert_episodes"] == 2.0  # the policy's 2 x 2, the expert's 2
        assert row["expert_success_rate"] == 1.0
    policy = [t for t in trajs if not t.metadata.get("expert") and t.grade is not None]
    rate = sum(t.grade.success for t in policy if t.policy_version == 0) / 4  # type: ignore[union-attr]
    assert result.history[0]["train_success_rate"] == pytest.approx(rate, abs=1e-12)  # the policy's alone


def test_guided_groups_are_refused_where_they_cannot_run(tmp_path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="leaves no policy episode"):
        F.config(**{"rollout.expert_per_group": 3})  # group_size 3
    with pytest.raises(ConfigError, match="synchronous in-process loop"):
        F.config(**{"rollout.expert_per_group": 1, "async.max_staleness": 1})
    with pytest.raises(ConfigError, match="the expert's have none"):
        F.config(**{"rollout.expert_per_group": 1, "algorithm.off_policy.correction": "tis"})
    with pytest.raises(InputError, match="no expert to play guided episodes"):
        _run(tmp_path / "none", expert=False)
    assert not (tmp_path / "none" / "config.yaml").exists()  # refused before the session wrote anything

    from agentrft.train.loop import build_components

    def no_model(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr("agentrft.samplers.policies.load_trainable_policy", no_model)
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n')
    cfg = F.config(**{"rollout.expert_per_group": 1, "rollout.env": f"jsonl:{data}"})
    with pytest.raises(InputError, match="has no expert that solves its tasks"):
        build_components(cfg, tmp_path)


def test_finqa_lites_expert_guides_a_grpo_step_of_the_tiny_model(tmp_path) -> None:
    from agentrft.train.config import build_config

    cfg = build_config(
        {
            "steps": 1,
            "seed": 0,
            "policy": {"name": "tiny", "finetune": "full", "precision": "fp32"},  # sampler_precision is fp32 too
            "rollout": {
                "env": "finqa-lite:3?shots=0",
                "tasks_per_step": 1,
                "group_size": 2,
                "max_tokens": 96,
                "expert_per_group": 1,
            },
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    train(cfg, tmp_path / "run")
    with Store(tmp_path / "run" / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        trajs = s.query_trajectories(run_id=run.id)
    (expert,) = [t for t in trajs if t.metadata.get("expert")]
    (policy,) = [t for t in trajs if not t.metadata.get("expert")]
    assert expert.group_id == policy.group_id and expert.policy == "oracle"
    assert expert.grade is not None and expert.grade.success  # search, open, calculate, answer
    assert [e.name for e in expert.tool_calls] == ["search", "open", "calculate"]
    assert expert.untrainable_reason() is None and expert.metadata["trained_step"] == 1
    row = read_metrics(tmp_path / "run")[0]
    assert row["expert_success_rate"] == 1.0 and row["train_episodes"] == 1.0
    assert row["sampler_logprob_gap_max"] < 1e-3  # the policy's tokens alone (the oracle's "logprob" 0 is not one)

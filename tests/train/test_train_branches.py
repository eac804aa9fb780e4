"""Training from branches of recorded episodes (``rollout.branch``, train/rl/branches.py): each group continues a
stored episode from the chosen turn, token-exactly, and only the continuation trains."""

from __future__ import annotations

import asyncio
from typing import Any

import fakes_train as F
import pytest

from agentrft.envs.base import EnvLimits, Episode
from agentrft.inputs import InputError
from agentrft.rollout.replay import prefix_of
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SampleRequest, SampleResult, SamplingParams
from agentrft.store import Store
from agentrft.tools.base import ToolResult
from agentrft.train import train
from agentrft.train.config import ConfigError
from agentrft.train.config.check import check_references
from agentrft.train.core.metrics import read_metrics
from agentrft.train.core.packing import to_sequence
from agentrft.train.rl.branches import BranchSource, branch_turn
from agentrft.types import Grade, Run, Task, TokenRecord, ToolCallEvent, Trajectory

TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "a flaky tool",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


class ToolEpisode(Episode):
    """Its first call fails (a tool error the policy sees), later ones succeed."""

    def __init__(self, task: Task) -> None:
        self.task, self.calls = task, 0

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        self.calls += 1
        if self.calls == 1:
            return ToolResult("Error: the service is down", error="down", error_kind="exception")
        return ToolResult("ok")


class ToolEnv(F.FakeEnv):
    def __init__(self) -> None:
        super().__init__()
        self.limits = EnvLimits(max_turns=3, max_tokens_per_turn=6, max_total_tokens=512)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [TOOL]

    def start(self, task: Task) -> Episode:
        return ToolEpisode(task)


class CallsFirst(F.FakeSampler):
    """The recorded agent: calls the tool in its first turn, then samples from the tiny model."""

    async def sample(self, request: SampleRequest) -> SampleResult:
        if request.prompt_ids.count(2) == 0:  # no tool result in its context yet: turn 0
            text = "<f>1</f>"
            ids = [2 + ord(c) % 50 for c in text]
            return SampleResult(
                token_ids=ids,
                logprobs=[-0.5] * len(ids),
                text=text,
                finish_reason="stop",
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=len(ids),
                policy_version=None,
            )
        return await super().sample(request)

    def render(
        self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True
    ) -> list[int]:
        ids = [1]
        for m in messages:  # a tool result is marked by token 2, so the script knows its turn
            ids += ([2] if m.get("role") == "tool" else []) + [3 + ord(c) % 50 for c in str(m.get("content") or "")]
        return ids


def _record_parents(db: Any) -> list[Any]:
    """Six recorded episodes of the flaky env: a failed call at turn 0, then the tiny model's text."""
    env, sampler = ToolEnv(), CallsFirst(seed=1)
    with Store(db) as store:
        store.add_run(Run(id="parents-id", name="parents", kind="eval"))
        runner = Runner(
            env, sampler, store=store, grader=F.FakeGrader(), params=SamplingParams(max_tokens=6), progress=False
        )
        trajs = asyncio.run(runner.run(env.tasks("train"), 1, run_id="parents-id"))
    assert all(branch_turn(t, "after_tool_error") == 1 for t in trajs)
    return trajs


def _config(db: Any, **sets: Any) -> Any:
    over = {
        "rollout.branch": {"run": "parents", "db": str(db), "turn": "after_tool_error", "failed_only": False},
        "steps": 2,
        "eval.every_steps": 0,
        "checkpoint.every_steps": 0,
        **sets,
    }
    return F.config(**over)


def _components(run_dir: Any) -> Any:
    comps = F.components(run_dir)
    comps.env, comps.sampler = ToolEnv(), CallsFirst()
    return comps


def test_groups_continue_their_parent_from_the_turn_after_its_tool_error_and_only_that_trains(tmp_path) -> None:
    parents = {t.id: t for t in _record_parents(tmp_path / "parents.db")}
    cfg = _config(tmp_path / "parents.db")
    check_references(cfg, env=ToolEnv())
    train(cfg, tmp_path / "r", components=_components(tmp_path / "r"))
    with Store(tmp_path / "r" / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        trajs = s.query_trajectories(run_id=run.id)
    assert len(trajs) == 2 * 2 * 3  # steps x tasks_per_step x group_size
    groups: dict[str, list[Any]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
        parent = parents[t.metadata["branch_of"]]
        assert t.metadata["branch_turn"] == 1 and parent.task_id == t.task_id
        prefix = prefix_of(parent, 1).ids
        assert t.tokens.ids[: len(prefix)] == prefix  # the parent's record, token for token
        assert t.tokens.turn[len(prefix)] == 1 and t.tokens.loss_mask[len(prefix)] == 1  # then the policy's
        # the packer trains only the continuation: the parent's turn-0 call keeps its record but not the loss
        seq = to_sequence(0, t, [1.0] * len(t.tokens.ids))
        assert sum(seq.loss_mask[: len(prefix)]) == 0 and sum(t.tokens.loss_mask[: len(prefix)]) > 0
        assert seq.loss_mask[len(prefix) :] == t.tokens.loss_mask[len(prefix) :]
    assert len(groups) == 4 and all(len({t.metadata["branch_of"] for t in g}) == 1 for g in groups.values())
    metrics = read_metrics(tmp_path / "r")
    assert [m["branch/parents"] for m in metrics] == [6.0, 6.0]


def test_parents_are_chosen_by_the_config_and_a_run_without_any_is_refused_before_training(tmp_path) -> None:
    _record_parents(tmp_path / "parents.db")
    with pytest.raises(ConfigError, match="rollout.branch: no run with id or name 'nope'"):
        check_references(_config(tmp_path / "parents.db", **{"rollout.branch.run": "nope"}), env=ToolEnv())
    with pytest.raises(ConfigError, match=r"rollout.branch: no parent episode.*6 no turn"):
        check_references(_config(tmp_path / "parents.db", **{"rollout.branch.turn": 2}), env=ToolEnv())
    with pytest.raises(ConfigError, match="rollout.branch: .*missing.db"):
        check_references(_config(tmp_path / "missing.db"), env=ToolEnv())
    # the default keeps failures only: two parents graded a success are left out, the other four branch
    with Store(tmp_path / "parents.db") as s:
        for i, t in enumerate(s.query_trajectories()):
            s.set_grade(t.id, Grade(reward=float(i < 2), success=i < 2))
        cfg = _config(tmp_path / "parents.db", **{"rollout.branch.failed_only": True})
        source = BranchSource.from_store(cfg.rollout.branch, s, ToolEnv().tasks("train"), 0)
    assert len(source.tasks) == 4 and source.metrics()["branch/left_out/succeeded"] == 2.0
    # parents played with other tool schemas than the environment's now are left out (the drift check)
    with Store(tmp_path / "parents.db") as s, pytest.raises(InputError, match="6 tool schema drift"):
        BranchSource.from_store(_config(tmp_path / "parents.db").rollout.branch, s, ToolEnv().tasks("train"), 0, "x")


@pytest.mark.parametrize(
    "sets,why",
    [
        ({"method": "sft", "data.source": "x.db"}, "GRPO's"),
        ({"rollout.expert_per_group": 1}, "parents choose the tasks"),
        ({"async.max_staleness": 1}, "synchronous in-process loop"),
    ],
)
def test_branching_is_refused_where_it_cannot_run(tmp_path, sets: dict[str, Any], why: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=why):
        _config(tmp_path / "p.db", **sets)


def test_after_tool_branches_after_the_first_error_free_call_of_that_tool() -> None:
    calls = [
        ToolCallEvent(turn=0, name="search", arguments={}, result="hits"),
        ToolCallEvent(turn=1, name="open", arguments={}, result="Error: no such doc", error="no such doc"),
        ToolCallEvent(turn=2, name="open", arguments={}, result="the table"),
        ToolCallEvent(turn=3, name="open", arguments={}, result="the table again"),
    ]
    record = TokenRecord(ids=[1, 2, 3, 4, 5], loss_mask=[1, 1, 1, 1, 1], logprobs=[0.0] * 5, turn=[0, 1, 2, 3, 4])
    traj = Trajectory(run_id="r", task_id="t", group_id="g", messages=[], events=calls, tokens=record)
    assert branch_turn(traj, "after_tool:open") == 3  # the failed open at turn 1 does not count
    assert branch_turn(traj, "after_tool:search") == 1
    assert branch_turn(traj, "after_tool:calculate") is None  # never called: the parent is left out
    assert branch_turn(traj, "after_tool_error") == 2
    cfg = _config("p.db", **{"rollout.branch.turn": "after_tool:open"})
    assert cfg.rollout.branch.turn == "after_tool:open"
    assert _config("p.db", **{"rollout.branch.turn": "2"}).rollout.branch.turn == 2  # a quoted index (YAML "2")
    with pytest.raises((ConfigError, ValueError), match="rollout.branch.turn"):
        _config("p.db", **{"rollout.branch.turn": "after:open"})


def test_after_tool_of_a_tool_the_environment_lacks_is_refused_before_training(tmp_path) -> None:
    _record_parents(tmp_path / "parents.db")
    with pytest.raises(ConfigError, match=r"rollout.branch.turn: the environment has no tool 'g'; its tools: \['f'\]"):
        check_references(_config(tmp_path / "parents.db", **{"rollout.branch.turn": "after_tool:g"}), env=ToolEnv())
    # a tool it has passes the name check; these parents' only call of f failed, so none has that turn
    with pytest.raises(ConfigError, match=r"config: rollout.branch: no parent episode.*6 no turn"):
        check_references(_config(tmp_path / "parents.db", **{"rollout.branch.turn": "after_tool:f"}), env=ToolEnv())

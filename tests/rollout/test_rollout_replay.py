"""Branch from any turn (rollout/replay.py, `agentrft replay`): a stored episode's prefix is token-identical to its
record, for an in-process episode and for a stitched session, and the branches continue from exactly there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from rollout_fakes import FakeEnv, FakeSampler, task
from test_rollout_stitch import SCRIPT, play_session, turn_prompts
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.eval.report import build_report
from agentrft.inputs import InputError
from agentrft.rollout.agent import run_episode
from agentrft.rollout.replay import branch, prefix_of
from agentrft.samplers.base import SamplingParams
from agentrft.store import Store
from agentrft.types import Trajectory

PARAMS = SamplingParams(max_tokens=200)


def _shape(m: Any) -> tuple[Any, ...]:
    return m.role, m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]


def _episode() -> Trajectory:
    traj = asyncio.run(run_episode(FakeEnv(few_shot=True), FakeSampler(list(SCRIPT)), task(), params=PARAMS))
    assert traj.status == "completed" and traj.tokens is not None and max(traj.tokens.turn) == 2
    return traj


def test_an_in_process_prefix_is_the_record_up_to_that_turn_and_a_branch_continues_from_it() -> None:
    parent = _episode()
    for turn in range(3):
        prefix = prefix_of(parent, turn)
        assert prefix.ids == turn_prompts(parent)[turn]  # exactly what the sampler consumed at that turn
        n = len(prefix.ids)
        assert (prefix.loss_mask, prefix.logprobs, prefix.turns) == (
            parent.tokens.loss_mask[:n],
            parent.tokens.logprobs[:n],
            parent.tokens.turn[:n],
        )
    # the same policy continuing from turn 1 writes the same episode: the record is rebuilt token for token
    sampler = FakeSampler(list(SCRIPT[1:]))
    (again,) = asyncio.run(branch(FakeEnv(few_shot=True), sampler, parent, task(), 1, 1, params=PARAMS))
    assert again.tokens == parent.tokens
    assert [_shape(m) for m in again.messages] == [_shape(m) for m in parent.messages]  # call ids are new
    assert sampler.prompts[0] == turn_prompts(parent)[1]
    assert again.metadata["branch_of"] == parent.id and again.metadata["replayed_calls_differ"] == []
    # another policy from turn 1: the first turn is the record's, the rest its own; K branches share a group
    others = asyncio.run(
        branch(FakeEnv(few_shot=True), FakeSampler(["The answer is 94"] * 3), parent, task(), 1, 3, params=PARAMS)
    )
    assert len({t.group_id for t in others}) == 1 and all(t.final_answer == "The answer is 94" for t in others)
    assert all(t.tokens.ids[: len(turn_prompts(parent)[1])] == turn_prompts(parent)[1] for t in others)


def test_a_stitched_sessions_prefix_is_what_its_requests_consumed() -> None:
    loop = _episode()
    sampler = FakeSampler(list(SCRIPT))
    traj = play_session(sampler, FakeEnv(few_shot=True), task(), loop)
    for turn in range(3):
        assert prefix_of(traj, turn).ids == sampler.prompts[turn]


def test_a_turn_it_cannot_be_cut_at_is_refused() -> None:
    parent = _episode()
    with pytest.raises(InputError, match=r"sampled turns \[0, 1, 2\]"):
        prefix_of(parent, 3)
    parent.tokens = None
    with pytest.raises(InputError, match="no token record"):
        prefix_of(parent, 0)


def test_replay_command_branches_a_stored_episode(tmp_path: Path) -> None:
    db = tmp_path / "agentrft.db"  # a run dir's store: the report shows the branches beside the original
    run = ["rollout", "--env", "finqa-lite:3", "--policy", "oracle:tiny", "--tasks", "1", "--db", str(db), "--json"]
    assert CliRunner().invoke(app, run).exit_code == 0
    with Store(db) as store:
        (parent,) = store.query_trajectories()
    args = ["replay", "--db", str(db), "--traj", parent.id[:10], "--turn", "1", "--policy", "oracle:tiny"]
    res = CliRunner().invoke(app, [*args, "--samples", "2", "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output.strip().splitlines()[-1])
    assert out["parent"] == parent.id and len(out["branches"]) == 2
    assert all(b["reward"] == parent.grade.reward for b in out["branches"])  # the oracle finishes as it did
    with Store(db) as store:
        branches = store.query_trajectories(run_id=out["run_id"])
    assert {t.metadata["branch_of"] for t in branches} == {parent.id}
    assert all(t.tokens.ids == parent.tokens.ids for t in branches)  # the oracle again: token for token
    html = build_report(tmp_path)
    assert '<section id="branches">' in html and html.count("<td>branch</td>") == 2 and parent.id in html
    bad = CliRunner().invoke(app, [*args[:-2], "--turn", "99", "--policy", "oracle:tiny"])
    assert bad.exit_code == 2 and "--turn 99" in bad.output

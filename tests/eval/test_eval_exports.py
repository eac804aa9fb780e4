"""RFT / SFT / DPO / Parquet exports, with round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_fakes import FakeStore, make_task, make_traj

from agentrft.eval.exports import dpo_rows, export_run, read_parquet, read_rft_rows, rft_rows, sft_rows, split_prompt
from agentrft.types import Message, Run


def _store() -> FakeStore:
    store = FakeStore()
    tasks = [make_task("a", 2, level=1), make_task("b", 5, level=3, template="ratio")]
    store.add_run(
        Run(
            id="r1",
            name="baseline",
            kind="eval",
            config={"env": "fake:1"},
            metadata={"task_data": {t.id: t.data for t in tasks}},
        )
    )
    for t in [
        make_traj("a", 1.0),
        make_traj("a", 0.0, answer="3"),
        make_traj("a", 1.0, tools=2),
        make_traj("b", 0.0, answer="7"),
        make_traj("b", 0.0, answer="8"),
    ]:
        store.add_trajectory(t)
    return store


def test_split_prompt_keeps_up_to_last_user() -> None:
    msgs = [
        Message(role="system", content="s"),
        Message(role="user", content="u1"),
        Message(role="assistant", content="a"),
        Message(role="user", content="u2"),
        Message(role="assistant", content="b"),
    ]
    prompt, rest = split_prompt(msgs)
    assert [m.content for m in prompt] == ["s", "u1", "a", "u2"] and [m.content for m in rest] == ["b"]
    with pytest.raises(ValueError, match="no user message"):
        split_prompt([Message(role="system", content="s")])


def test_rft_round_trip(tmp_path: Path) -> None:
    store = _store()
    out = tmp_path / "rft.jsonl"
    assert export_run(store, "r1", "rft", out) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["messages"][-1]["role"] == "user" and rows[0]["answer"] == 2 and rows[1]["level"] == 3
    assert all(m["role"] in ("system", "user") for m in rows[0]["messages"])
    tasks = read_rft_rows(out)
    expected = {t.id: t.data for t in [make_task("a", 2, level=1), make_task("b", 5, level=3, template="ratio")]}
    assert {t.id: t.data for t in tasks} == expected
    assert tasks[0].messages[-1].content == "Question a: 5 and 3?"


def test_rft_round_trip_through_jsonl_env(tmp_path: Path) -> None:
    from agentrft.envs.jsonl import JsonlEnv

    out = tmp_path / "rft.jsonl"
    export_run(_store(), "r1", "rft", out)
    env = JsonlEnv(out)
    expected = {t.id: t.data for t in [make_task("a", 2, level=1), make_task("b", 5, level=3, template="ratio")]}
    # JsonlEnv keeps every non-reserved key as data, the row's id included
    assert {t.id: {k: v for k, v in t.data.items() if k != "id"} for t in env.tasks("train")} == expected
    assert [t.messages[-1].content for t in env.tasks("train")] == ["Question a: 5 and 3?", "Question b: 5 and 3?"]


def test_rft_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no grading data for task 'a'"):
        rft_rows([make_traj("a", 1.0)], {})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}]}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_rft_rows(bad)


def test_sft_takes_best_successful_per_task() -> None:
    store = _store()
    rows = sft_rows(store.query_trajectories(run_id="r1"))
    assert len(rows) == 1 and rows[0]["task_id"] == "a"
    # both successes have reward 1; the shorter one (one tool call) wins
    assert sum(1 for m in rows[0]["messages"] if m["role"] == "tool") == 1
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "2"}


def test_dpo_pairs_only_when_rewards_differ() -> None:
    trajs = _store().query_trajectories(run_id="r1")
    assert len(dpo_rows(trajs)) == 2  # task a: two successes over one failure; task b has rewards 0, 0
    rows = dpo_rows(trajs, per_task=1)  # best vs worst
    assert len(rows) == 1
    row = rows[0]
    assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)
    assert row["chosen"][-1]["content"] == "2" and row["rejected"][-1]["content"] == "3"
    assert row["prompt"][-1]["role"] == "user" and row["chosen_id"] == trajs[0].id


def test_parquet_round_trip(tmp_path: Path) -> None:
    store = _store()
    out = tmp_path / "all.parquet"
    assert export_run(store, "r1", "parquet", out) == 5
    assert read_parquet(out) == store.query_trajectories(run_id="r1")
    import pyarrow.parquet as pq

    table = pq.read_table(str(out))
    assert table.column("reward").to_pylist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_export_rejects_unknown_format_and_empty_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown export format 'csv'"):
        export_run(_store(), "r1", "csv", tmp_path / "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no trajectories"):
        export_run(_store(), "nope", "sft", tmp_path / "x")

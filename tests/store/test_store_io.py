"""Export/import round-trips (JSONL, Parquet, chat logs) and bad-input reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from store_factories import make_traj

from agentrft.store import BadRecordError, Store, StoreError
from agentrft.types import FinalAnswerEvent, ToolCallEvent, Trajectory


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "a.db") as s:
        yield s


@pytest.fixture
def other(tmp_path: Path) -> Store:
    with Store(tmp_path / "b.db") as s:
        yield s


def _mixed() -> list[Trajectory]:
    trajs = [make_traj(i, run_id="r1" if i % 2 else "r2", reward=None if i == 4 else i / 10) for i in range(9)]
    # eval-only trajectory (no tokens) and odd floats must survive too
    trajs.append(make_traj(20).model_copy(update={"tokens": None, "status": "max_turns", "error": "x" * 3}))
    return sorted(trajs, key=lambda t: t.id)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_is_exact(store: Store, other: Store, tmp_path: Path, fmt: str) -> None:
    trajs = _mixed()
    store.add_trajectories(trajs)
    out = tmp_path / f"out.{fmt}"
    assert getattr(store, f"export_{fmt}")(out) == len(trajs)
    report = getattr(other, f"import_{fmt}")(out)
    assert (report.imported, report.skipped, report.problems) == (len(trajs), 0, [])
    assert report.ids == [t.id for t in trajs]
    assert other.query_trajectories() == trajs  # pydantic equality, field by field
    # a second export of the imported copy is byte-identical
    again = tmp_path / f"again.{fmt}"
    getattr(other, f"export_{fmt}")(again)
    if fmt == "jsonl":
        assert again.read_bytes() == out.read_bytes()


def test_export_filters(store: Store, tmp_path: Path) -> None:
    trajs = _mixed()
    store.add_trajectories(trajs)
    n = store.export_jsonl(tmp_path / "r1.jsonl", run_id="r1", min_reward=0.5)
    want = [t for t in trajs if t.run_id == "r1" and t.reward is not None and t.reward >= 0.5]
    assert n == len(want) == 2  # odd i are r1: rewards 0.5 and 0.7
    lines = (tmp_path / "r1.jsonl").read_text().splitlines()
    assert [Trajectory.from_json(x) for x in lines] == want


def test_parquet_flat_columns(store: Store, tmp_path: Path) -> None:
    t = make_traj(3, reward=0.75)
    store.add_trajectory(t)
    store.export_parquet(tmp_path / "x.parquet")
    row = pq.read_table(tmp_path / "x.parquet").to_pylist()[0]
    assert row["id"] == t.id and row["task_id"] == "task-3" and row["env"] == "finqa-lite"
    assert (row["reward"], row["success"], row["num_turns"], row["num_tool_calls"]) == (0.75, True, 2, 2)
    assert row["num_tokens"] == 80 and row["final_answer"] == t.final_answer
    assert Trajectory.from_json(row["trajectory"]) == t


def test_empty_export(store: Store, other: Store, tmp_path: Path) -> None:
    assert store.export_parquet(tmp_path / "e.parquet") == 0
    assert store.export_jsonl(tmp_path / "e.jsonl") == 0
    assert other.import_parquet(tmp_path / "e.parquet").imported == 0  # a schema and no rows: zero, on purpose
    # An empty JSONL file cannot be told from a wrong or truncated one: refused, and nothing is written.
    with pytest.raises(BadRecordError, match=r"^e\.jsonl: empty file \(no records\)$"):
        other.import_jsonl(tmp_path / "e.jsonl")
    (tmp_path / "c.jsonl").write_text("\n  \n")
    with pytest.raises(BadRecordError, match="empty file"):
        other.import_chat_logs(tmp_path / "c.jsonl", run_id="logs")
    assert other.count_trajectories() == 0 and not other.has_run("logs")


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _bad_file(tmp_path: Path) -> tuple[Path, list[Trajectory]]:
    good = [make_traj(i) for i in range(5)]
    broken_tokens = json.loads(make_traj(10).to_json())
    broken_tokens["tokens"]["loss_mask"] = broken_tokens["tokens"]["loss_mask"][:-1]
    bad_event = json.loads(make_traj(11).to_json())
    del bad_event["events"][2]["name"]
    lines = [
        good[0].to_json(),
        good[1].to_json(),
        "",  # blank lines are ignored, but still counted
        '{"id": "oops", "run_id": ',  # line 4: truncated JSON
        good[2].to_json(),
        good[3].to_json(),
        json.dumps(broken_tokens),  # line 7
        good[4].to_json(),
        json.dumps(bad_event),  # line 9
        good[0].to_json(),  # line 10: same id twice
    ]
    return _write_lines(tmp_path / "bad.jsonl", lines), good


def test_bad_line_stops_import_and_names_file_line_field(store: Store, tmp_path: Path) -> None:
    path, good = _bad_file(tmp_path)
    with pytest.raises(BadRecordError) as info:
        store.import_jsonl(path)
    assert str(info.value).startswith("bad.jsonl line 4: not valid JSON:")
    assert store.count_trajectories() == 0  # nothing imported

    # Fix line 4: the next failure is the token record on line 7.
    lines = path.read_text().splitlines()
    lines[3] = good[2].model_copy(update={"id": "fixed"}).to_json()
    _write_lines(path, lines)
    with pytest.raises(BadRecordError) as info:
        store.import_jsonl(path)
    assert str(info.value) == "bad.jsonl line 7: field 'tokens.loss_mask': tokens.loss_mask has length 79, ids has 80"
    assert store.count_trajectories() == 0


def test_skip_bad_imports_the_rest_and_reports_each_line(store: Store, tmp_path: Path) -> None:
    path, good = _bad_file(tmp_path)
    report = store.import_jsonl(path, skip_bad=True)
    assert report.imported == 5 and report.skipped == 4
    assert [p.line for p in report.problems] == [4, 7, 9, 10]
    msgs = [p.message for p in report.problems]
    assert msgs[0].startswith("bad.jsonl line 4: not valid JSON")
    assert msgs[1].startswith("bad.jsonl line 7: field 'tokens.loss_mask'")
    assert msgs[2] == "bad.jsonl line 9: field 'events.2.tool_call.name': Field required"
    assert msgs[3] == f"bad.jsonl line 10: trajectory {good[0].id} is already in the store"
    assert sorted(report.ids) == sorted(t.id for t in good)
    assert "skipped 4 bad records" in report.summary()
    assert sorted(store.query_trajectories(), key=lambda t: t.id) == sorted(good, key=lambda t: t.id)


def test_reimport_of_existing_ids_is_refused(store: Store, tmp_path: Path) -> None:
    t = make_traj(1)
    store.add_trajectory(t)
    store.export_jsonl(tmp_path / "x.jsonl")
    with pytest.raises(BadRecordError, match=f"x.jsonl line 1: trajectory {t.id} is already in the store"):
        store.import_jsonl(tmp_path / "x.jsonl")


def test_other_bad_inputs(store: Store, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        store.import_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b'{"id": "\xff"}\n')
    with pytest.raises(BadRecordError, match=r"bin\.jsonl line 1: not UTF-8 text \(byte 0xff at byte 9\)$"):
        store.import_jsonl(tmp_path / "bin.jsonl")
    _write_lines(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(BadRecordError, match="list.jsonl line 1: Input should be"):
        store.import_jsonl(tmp_path / "list.jsonl")
    _write_lines(tmp_path / "ver.jsonl", [make_traj(1).model_copy(update={"schema_version": 9}).to_json()])
    with pytest.raises(BadRecordError, match="ver.jsonl line 1: schema_version 9 is newer"):
        store.import_jsonl(tmp_path / "ver.jsonl")
    (tmp_path / "notpq.parquet").write_text("hello")
    with pytest.raises(BadRecordError, match="notpq.parquet: not a readable Parquet file"):
        store.import_parquet(tmp_path / "notpq.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"a": [1]}), tmp_path / "cols.parquet")
    with pytest.raises(BadRecordError, match="no 'trajectory' column \\(has a\\)"):
        store.import_parquet(tmp_path / "cols.parquet")
    assert store.count_trajectories() == 0


def test_parquet_bad_row_reported_by_row(store: Store, other: Store, tmp_path: Path) -> None:
    import pyarrow as pa

    good = make_traj(1)
    pq.write_table(pa.table({"trajectory": [good.to_json(), '{"status": "lost"}', None]}), tmp_path / "p.parquet")
    with pytest.raises(BadRecordError, match="p.parquet row 2: field 'status': Input should be"):
        store.import_parquet(tmp_path / "p.parquet")
    report = other.import_parquet(tmp_path / "p.parquet", skip_bad=True)
    assert (report.imported, [p.line for p in report.problems]) == (1, [2, 3])
    assert report.problems[1].message == "p.parquet row 3: field 'trajectory': null"


def test_import_into_run_creates_run_and_reassigns(store: Store, other: Store, tmp_path: Path) -> None:
    store.add_trajectories([make_traj(1, run_id="old"), make_traj(2, run_id="old")])
    store.export_jsonl(tmp_path / "x.jsonl")
    report = other.import_jsonl(tmp_path / "x.jsonl", run_id="imported")
    assert report.imported == 2
    assert other.get_run("imported").kind == "import"
    assert other.count_trajectories(run_id="imported") == 2
    assert other.count_trajectories(run_id="old") == 0


CHAT = [
    {
        "model": "gpt-4o-mini",
        "task_id": "q-17",
        "tags": ["a"],
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Revenue growth 2019?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "revenue 2019"}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "open", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "doc-3"},
            {
                "role": "tool",
                "tool_call_id": "c2",
                "content": [{"type": "text", "text": "page "}, {"type": "text", "text": "2"}],
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c3",
                        "type": "function",
                        "function": {"name": "calculate", "arguments": '{"expr": "1.1*2"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c3", "content": "2.2"},
            {"role": "assistant", "content": "Growth was 12%.", "refusal": None},
        ],
    },
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "id": "log-2"},
    {
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "z", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
            },
        ]
    },
]


def test_chat_log_import_derives_events(store: Store, other: Store, tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "chat.jsonl", [json.dumps(r) for r in CHAT])
    report = store.import_chat_logs(path, run_id="logs")
    assert report.imported == 3
    assert store.get_run("logs").kind == "import"
    first, second, third = (store.get_trajectory(i) for i in report.ids)

    assert first.run_id == "logs" and first.task_id == "q-17" and first.policy == "gpt-4o-mini"
    assert first.env.name == "chat-log" and first.tokens is None
    assert first.metadata == {"model": "gpt-4o-mini", "task_id": "q-17", "tags": ["a"]}
    assert [m.role for m in first.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert first.messages[-1].model_extra == {"refusal": None}
    calls = first.tool_calls
    assert [(c.turn, c.call_id, c.name, c.arguments, c.result) for c in calls] == [
        (0, "c1", "search", {"q": "revenue 2019"}, "doc-3"),
        (0, "c2", "open", "not json", "page 2"),
        (1, "c3", "calculate", {"expr": "1.1*2"}, "2.2"),
    ]
    assert isinstance(first.events[-1], FinalAnswerEvent) and first.events[-1].turn == 2
    assert first.final_answer == "Growth was 12%." and first.num_turns == 3

    assert second.final_answer == "hello" and second.tool_calls == [] and second.metadata == {"id": "log-2"}
    # ends on a tool call: no final answer, the call has no result
    assert third.final_answer is None
    assert [(c.name, c.result) for c in third.tool_calls] == [("search", None)]
    assert all(isinstance(e, ToolCallEvent) for e in third.events)

    # chat-log trajectories round-trip through the store's own formats as well
    store.export_jsonl(tmp_path / "rt.jsonl", run_id="logs")
    other.import_jsonl(tmp_path / "rt.jsonl")
    assert other.query_trajectories() == store.query_trajectories(run_id="logs")


def test_chat_log_bad_lines(store: Store, tmp_path: Path) -> None:
    lines = [
        json.dumps(CHAT[1]),
        json.dumps({"conversation": []}),
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        "{bad",
        json.dumps([1]),
    ]
    path = _write_lines(tmp_path / "chat.jsonl", lines)
    with pytest.raises(BadRecordError, match="^chat.jsonl line 2: field 'messages': missing$"):
        store.import_chat_logs(path, run_id="logs")
    assert store.count_trajectories() == 0
    assert not store.has_run("logs")  # the run creation was rolled back too
    report = store.import_chat_logs(path, run_id="logs", skip_bad=True)
    assert report.imported == 1
    assert [p.message for p in report.problems] == [
        "chat.jsonl line 2: field 'messages': missing",
        "chat.jsonl line 3: field 'messages[0].role': must be one of system, user, assistant, tool, developer; not 'robot'",
        "chat.jsonl line 4: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        "chat.jsonl line 5: expected a JSON object with 'messages', got list",
    ]

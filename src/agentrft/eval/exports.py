"""Dataset exports of a run's trajectories: OpenAI RFT rows, SFT, DPO pairs, Parquet.

* ``rft`` — one row per task, the OpenAI RFT layout (SPECS §1): ``messages`` up
  to and including the last user message, then every key of ``Task.data`` as
  free grading data, plus ``id`` = the task id (unless the data already has an
  ``id``; `agentrft.envs.JsonlEnv` takes a row's ``id`` as its task id). Task
  tools, when a task brings its own, go under the reserved ``tools`` key.
* ``sft`` — the best *successful* trajectory of each task (highest reward, then
  fewest tokens, then oldest), full OpenAI messages.
* ``dpo`` — preference pairs by the one pairing rule of `agentrft.pairs` (per
  task and prompt, reward gap >= margin, at most ``pairs_per_task`` per task,
  largest gap first), in TRL's conversational layout: ``prompt`` (messages up to
  the last user message), ``chosen`` / ``rejected`` (the assistant and tool
  messages after it), with the rewards and ids alongside.
* ``parquet`` — one row per trajectory: indexed columns for filtering plus the
  full record as JSON text (``trajectory``), so it reads back losslessly.

Grading data for ``rft`` is looked up in the run's metadata (``task_data``,
written by the eval harness), then in each trajectory's
``metadata["task_data"]``, then in the environment named by the run config.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agentrft.inputs import InputError
from agentrft.pairs import DEFAULT_MARGIN, DEFAULT_PAIRS_PER_TASK, build_pairs, pair_row, require_pairs, split_prompt
from agentrft.types import Grade, Message, Task, Trajectory

ExportFormat = Literal["rft", "sft", "dpo", "parquet"]
EXPORT_FORMATS: tuple[str, ...] = ("rft", "sft", "dpo", "parquet")
_RESERVED = ("messages", "tools")


def _dump(messages: Iterable[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in messages]


def rft_rows(
    trajectories: Sequence[Trajectory],
    task_data: Mapping[str, Mapping[str, Any]],
    task_tools: Mapping[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One RFT row per task (first trajectory of each task gives the prompt)."""
    rows, seen = [], set()
    for t in trajectories:
        if t.task_id in seen:
            continue
        seen.add(t.task_id)
        if t.task_id not in task_data:
            raise ValueError(f"no grading data for task {t.task_id!r}; the RFT export needs Task.data")
        data = dict(task_data[t.task_id])
        clash = [k for k in _RESERVED if k in data]
        if clash:
            raise ValueError(f"task {t.task_id!r} data uses the reserved RFT key(s) {clash}")
        prompt, _ = split_prompt(t.messages)
        row: dict[str, Any] = {"messages": _dump(prompt)}
        if task_tools and task_tools.get(t.task_id):
            row["tools"] = task_tools[t.task_id]
        row.update(data)
        row.setdefault("id", t.task_id)
        rows.append(row)
    return rows


def read_rft_rows(path: str | Path) -> list[Task]:
    """Tasks from an RFT JSONL file (the reader the round-trip test uses); one clear error per bad line."""
    tasks = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
            raise ValueError(f"{where}: an RFT row needs a non-empty 'messages' list")
        messages = [Message.model_validate(m) for m in row.pop("messages")]
        if messages[-1].role != "user":
            raise ValueError(f"{where}: the last message must be the user's, got {messages[-1].role!r}")
        tools = row.pop("tools", None)
        task_id = str(row.get("id", f"row-{lineno}"))
        data = {k: v for k, v in row.items() if k != "id"}
        tasks.append(Task(id=task_id, messages=messages, tools=tools, data=data))
    return tasks


def _tokens(t: Trajectory) -> int:
    if t.tokens is not None:
        return len(t.tokens.ids)
    return sum(len(m.text()) for m in t.messages)  # characters: a stand-in ordering when no token record


def sft_rows(trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Best successful trajectory per task, full messages."""
    best: dict[str, tuple[Trajectory, Grade]] = {}
    for t in trajectories:
        grade = t.grade
        if grade is None or not grade.success:
            continue
        cur = best.get(t.task_id)
        if cur is None or (grade.reward, -_tokens(t)) > (cur[1].reward, -_tokens(cur[0])):
            best[t.task_id] = (t, grade)
    return [
        {"messages": _dump(t.messages), "task_id": t.task_id, "trajectory_id": t.id, "reward": grade.reward}
        for t, grade in best.values()
    ]


def dpo_rows(
    trajectories: Sequence[Trajectory], *, margin: float = DEFAULT_MARGIN, per_task: int = DEFAULT_PAIRS_PER_TASK
) -> list[dict[str, Any]]:
    """TRL pairs file rows of `agentrft.pairs.build_pairs`; no pair at all is an `InputError` saying why."""
    pairs, stats = build_pairs(trajectories, margin=margin, per_task=per_task)
    return [pair_row(p) for p in require_pairs(pairs, stats, source="export --format dpo", margin=margin)]


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_parquet(trajectories: Sequence[Trajectory], path: str | Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list[Any]] = defaultdict(list)
    for t in trajectories:
        cols["id"].append(t.id)
        cols["run_id"].append(t.run_id)
        cols["task_id"].append(t.task_id)
        cols["group_id"].append(t.group_id)
        cols["policy"].append(t.policy)
        cols["policy_version"].append(t.policy_version)
        cols["status"].append(t.status)
        cols["reward"].append(t.reward)
        cols["success"].append(None if t.grade is None else t.grade.success)
        cols["num_turns"].append(t.num_turns)
        cols["num_tool_calls"].append(len(t.tool_calls))
        cols["created_at"].append(t.created_at)
        cols["trajectory"].append(t.to_json())
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("run_id", pa.string()),
            ("task_id", pa.string()),
            ("group_id", pa.string()),
            ("policy", pa.string()),
            ("policy_version", pa.int64()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("num_turns", pa.int64()),
            ("num_tool_calls", pa.int64()),
            ("created_at", pa.float64()),
            ("trajectory", pa.string()),
        ]
    )
    table = pa.table({name: cols.get(name, []) for name in schema.names}, schema=schema)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path))
    return len(trajectories)


def read_parquet(path: str | Path) -> list[Trajectory]:
    import pyarrow.parquet as pq

    return [Trajectory.from_json(s) for s in pq.read_table(str(path), columns=["trajectory"]).column(0).to_pylist()]


def find_task_data(store: Any, run_id: str, trajectories: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    """Grading data per task id (see the module docstring for the lookup order)."""
    run = store.get_run(run_id)
    data: dict[str, dict[str, Any]] = dict(run.metadata.get("task_data") or {})
    for t in trajectories:
        if t.task_id not in data and isinstance(t.metadata.get("task_data"), dict):
            data[t.task_id] = t.metadata["task_data"]
    missing = {t.task_id for t in trajectories} - set(data)
    spec = run.config.get("env")
    if missing and isinstance(spec, str):
        from agentrft.envs.registry import make_env

        env = make_env(spec)
        for split in ("train", "held-out", "ood"):
            try:
                for task in env.tasks(split):
                    if task.id in missing:
                        data[task.id] = task.data
            except (KeyError, ValueError):  # an environment without this split
                continue
    return data


def export_run(
    store: Any,
    run_id: str,
    fmt: ExportFormat,
    out: str | Path,
    *,
    margin: float = DEFAULT_MARGIN,
    pairs_per_task: int = DEFAULT_PAIRS_PER_TASK,
) -> int:
    """Write the run's trajectories in ``fmt`` to ``out``; returns the number of rows written.
    ``margin`` and ``pairs_per_task`` are the pairing rule's (``dpo`` only)."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    trajs = store.query_trajectories(run_id=run_id)
    if not trajs:
        raise InputError(f"run {run_id!r} has no trajectories")
    if fmt == "parquet":
        return write_parquet(trajs, out)
    if fmt == "sft":
        return write_jsonl(sft_rows(trajs), out)
    if fmt == "dpo":
        return write_jsonl(dpo_rows(trajs, margin=margin, per_task=pairs_per_task), out)
    return write_jsonl(rft_rows(trajs, find_task_data(store, run_id, trajs)), out)

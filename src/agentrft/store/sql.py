"""The SQL of the store's rows and queries, apart from its connections (`sqlite_store.Store`): a trajectory's row,
inserting runs and trajectories (a duplicate id named), and the WHERE clause and id query of the trajectory
filters (`Store.query_trajectories`), shaped so that SQLite answers them from the covering indexes of
`schema.DDL`."""

from __future__ import annotations

import sqlite3
from typing import Any

from agentrft.store.errors import DuplicateIdError
from agentrft.types import Run, Trajectory

TRAJ_COLUMNS = "id, run_id, task_id, group_id, policy_version, reward, success, status, created_at, data"
INSERT_TRAJ = f"INSERT INTO trajectories ({TRAJ_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def traj_row(traj: Trajectory) -> tuple[Any, ...]:
    grade = traj.grade
    return (
        traj.id,
        traj.run_id,
        traj.task_id,
        traj.group_id,
        traj.policy_version,
        None if grade is None else grade.reward,
        None if grade is None else int(grade.success),
        traj.status,
        traj.created_at,
        traj.to_json(),
    )


def insert_run(conn: sqlite3.Connection, run: Run) -> None:
    try:
        conn.execute(
            "INSERT INTO runs (id, name, kind, created_at, data) VALUES (?, ?, ?, ?, ?)",
            (run.id, run.name, run.kind, run.created_at, run.model_dump_json()),
        )
    except sqlite3.IntegrityError:
        raise DuplicateIdError(f"run {run.id} is already in the store") from None


def insert_trajectory_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    # A row at a time (not executemany) so a duplicate is named exactly. SQLite undoes only the
    # failed statement, so the caller's transaction goes on (or rolls the batch back, its choice).
    for row in rows:
        try:
            conn.execute(INSERT_TRAJ, row)
        except sqlite3.IntegrityError:
            raise DuplicateIdError(f"trajectory {row[0]} is already in the store") from None


def where_clause(
    run_id: str | None = None,
    task_id: str | None = None,
    group_id: str | None = None,
    policy_version: int | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    status: str | None = None,
) -> tuple[str, list[Any]]:
    """The filters' WHERE clause (" WHERE ..." or "") and its parameters; reward bounds are inclusive and leave
    ungraded trajectories (reward NULL) out."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("run_id", run_id),
        ("task_id", task_id),
        ("group_id", group_id),
        ("policy_version", policy_version),
        ("status", status),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if min_reward is not None:
        clauses.append("reward >= ?")
        params.append(float(min_reward))
    if max_reward is not None:
        clauses.append("reward <= ?")
        params.append(float(max_reward))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def select_ids_sql(filters: dict[str, Any], limit: int | None, offset: int) -> tuple[str, list[Any]]:
    """The query of the matching trajectories' ids in id order (creation order), and its parameters."""
    where, params = where_clause(**filters)
    # Every equality filter has an (x, id) index that yields ids in order. With only a reward
    # bound SQLite would rather scan the big table in id order than sort a few ids; `+id`
    # takes the primary key out of the running so the covering (reward, id) index is used.
    reward_only = filters.get("min_reward") is not None or filters.get("max_reward") is not None
    reward_only = reward_only and all(
        filters.get(k) is None for k in ("run_id", "task_id", "group_id", "policy_version", "status")
    )
    sql = f"SELECT id FROM trajectories{where} ORDER BY {'+id' if reward_only else 'id'}"
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params += [-1 if limit is None else int(limit), int(offset)]
    return sql, params

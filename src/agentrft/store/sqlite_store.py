"""`Store`: runs, trajectories (with their grades) and step metrics in one SQLite file.

Thread and process safety: every thread gets its own connection (sqlite3
connections must not be shared mid-transaction), writes take the database write
lock up front with `BEGIN IMMEDIATE`, and `busy_timeout` makes other writers
wait for it. Several processes may open the same file; a forked child opens
fresh connections instead of reusing its parent's. See `schema.py` for the
durability choice (WAL, synchronous=NORMAL).
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from agentrft.store import io as _io
from agentrft.store.errors import AmbiguousIdError, NotAStoreError, NotFoundError, StoreError
from agentrft.store.io import ImportReport
from agentrft.store.schema import BUSY_TIMEOUT_MS, DDL, PRAGMAS, SCHEMA_VERSION
from agentrft.store.sql import insert_run, insert_trajectory_rows, select_ids_sql, traj_row, where_clause
from agentrft.types import Grade, Run, RunKind, Trajectory

_FETCH_CHUNK = 500  # ids per `WHERE id IN (...)`, well under SQLite's variable limit


def _metric_default(value: Any) -> Any:
    # numpy / torch scalars expose .item(); anything else is a caller bug worth naming.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"metric value of type {type(value).__name__} is not JSON-serializable")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many trajectories.

    A 300-token trajectory is ~1,500 Python objects, none of them in cycles; with
    the GC on, collections triggered by those allocations rescan the growing heap
    and made a 10k-row query ~2x slower in benchmarks/store_bench.py.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Transaction:
    """The writes of one `Store.transaction()` block: committed together when it exits, or not at all.

    For batches that decide record by record (an import that skips bad lines): a write that fails
    with `DuplicateIdError` changes nothing and leaves the transaction usable.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def ensure_run(self, run_id: str, kind: RunKind = "other") -> bool:
        """Create the run `run_id` (named after its id) unless it exists; True when it was created."""
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None:
            return False
        insert_run(self._conn, Run(id=run_id, name=run_id, kind=kind))
        return True

    def add_trajectory(self, traj: Trajectory) -> str:
        """Insert one trajectory (visible to others once the block commits); `DuplicateIdError` if its id is stored."""
        insert_trajectory_rows(self._conn, [traj_row(traj)])
        return traj.id


class Store:
    """SQLite store of runs, trajectories, grades and step metrics.

    `path` is a file path (parent folders are created); `synchronous="FULL"`
    also survives power loss at the cost of an fsync per commit.
    Use as a context manager or call `close()`.
    """

    def __init__(
        self, path: str | Path, *, synchronous: Literal["NORMAL", "FULL"] = "NORMAL", existing: bool = False
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        self.path = Path(path)
        if str(path) == ":memory:":
            raise ValueError("Store needs a file path: each thread opens its own connection to it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._synchronous = synchronous
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        try:
            self._refuse_foreign(existing)
            self._init_schema()
        except sqlite3.DatabaseError as err:
            self.close()
            raise NotAStoreError(f"{self.path}: not an agentrft store ({err})") from None
        except StoreError:
            self.close()
            raise

    @classmethod
    def open_existing(cls, path: str | Path, **kw: Any) -> Store:
        """The store already at ``path``, for a command that reads: a missing or empty file, a file that is not
        SQLite or another program's database is refused (`NotAStoreError`) before anything is written to it."""
        path = Path(path)
        if not path.is_file():
            raise NotAStoreError(f"{path}: no such store file")
        if path.stat().st_size == 0:
            raise NotAStoreError(f"{path}: an empty file, not an agentrft store")
        return cls(path, existing=True, **kw)

    # ------------------------------------------------------------ connections

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        if self._pid != os.getpid():
            # Forked child: the parent's connections must not be used (SQLite forbids it).
            self._local = threading.local()
            self._conns = []
            self._pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
            for pragma in PRAGMAS:
                conn.execute(pragma).fetchall()
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block exits, rolled back on any exception."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (e.g. disk full); never leave the
            # thread's connection inside a transaction, or its next BEGIN fails.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _refuse_foreign(self, existing: bool) -> None:
        """Before any connection that writes (even its pragmas: WAL mode rewrites the header): a file that is not
        SQLite, or another program's database, is not a store; with ``existing`` neither is an SQLite file without
        our tables. Read through a read-only connection."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        probe = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {row[0] for row in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            probe.close()
        if (tables or existing) and "trajectories" not in tables:
            raise NotAStoreError(f"{self.path}: an SQLite database without agentrft's tables, not a store")

    def _init_schema(self) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has store schema {version}, newer than this agentrft understands ({SCHEMA_VERSION})"
                )
            for statement in DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One write transaction for many writes; an exception leaving the block rolls all of them back.

        It holds the database's write lock until the block exits: keep the block short.
        """
        with self._write() as conn:
            yield Transaction(conn)

    def close(self) -> None:
        """Close every connection this store opened (in any thread)."""
        self._closed = True
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # ------------------------------------------------------------ runs

    def add_run(self, run: Run) -> str:
        with self._write() as conn:
            insert_run(conn, run)
        return run.id

    def update_run(self, run: Run) -> None:
        """Replace a stored run's record (status, metadata, ...); the id must exist."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE runs SET name = ?, kind = ?, data = ? WHERE id = ?",
                (run.name, run.kind, run.model_dump_json(), run.id),
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no run with id {run.id!r} in {self.path}")

    def delete_run(self, run_id: str) -> int:
        """Remove a run with its trajectories and step metrics; returns the trajectories removed."""
        with self._write() as conn:
            n = conn.execute("DELETE FROM trajectories WHERE run_id = ?", (run_id,)).rowcount
            conn.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        return int(n)

    def rewind_run(self, run_id: str, *, policy_version: int, step: int, trajectories: bool = True) -> int:
        """Forget what a run recorded after a checkpoint: its trajectories sampled by weights of
        `policy_version` or later in a step after `step` (``metadata.step``, which the training loops record;
        a record without one goes by its version alone), unless ``trajectories`` is False (an asynchronous run
        keeps and marks them), and its step metrics after `step`. A resumed training run redoes those steps,
        so they would otherwise be counted twice. A step whose update was skipped left the version as it was:
        its trajectories share their version with the next step's, and only the step tells them apart.
        Returns the trajectories removed."""
        with self._write() as conn:
            n = 0
            if trajectories:
                n = conn.execute(
                    "DELETE FROM trajectories WHERE run_id = ? AND policy_version >= ? AND "
                    "coalesce(json_extract(data, '$.metadata.step'), ? + 1) > ?",
                    (run_id, int(policy_version), int(step), int(step)),
                ).rowcount
            conn.execute("DELETE FROM metrics WHERE run_id = ? AND step > ?", (run_id, int(step)))
        return int(n)

    def get_run(self, run_id: str) -> Run:
        row = self._conn().execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no run with id {run_id!r} in {self.path}")
        return Run.model_validate_json(row[0])

    def has_run(self, run_id: str) -> bool:
        return self._conn().execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None

    def list_runs(self) -> list[Run]:
        rows = self._conn().execute("SELECT data FROM runs ORDER BY created_at, id").fetchall()
        return [Run.model_validate_json(r[0]) for r in rows]

    def find_run(self, ref: str) -> Run:
        """A run by id, else by its name (the latest of that name wins, as users re-run evals)."""
        if self.has_run(ref):
            return self.get_run(ref)
        named = [r for r in self.list_runs() if r.name == ref]
        if not named:
            raise NotFoundError(f"no run with id or name {ref!r} in {self.path}")
        return named[-1]

    # ------------------------------------------------------------ trajectories

    def add_trajectory(self, traj: Trajectory) -> str:
        """Insert one trajectory; it is committed when this returns."""
        return self.add_trajectories([traj])[0]

    def add_trajectories(self, trajs: Iterable[Trajectory]) -> list[str]:
        """Insert many trajectories in one transaction: all or none."""
        rows = [traj_row(t) for t in trajs]
        with self._write() as conn:
            insert_trajectory_rows(conn, rows)  # a duplicate rolls the whole batch back
        return [r[0] for r in rows]

    def get_trajectory(self, traj_id: str) -> Trajectory:
        """The trajectory with this id, or with the unique id that starts with `traj_id`."""
        return Trajectory.model_validate_json(self._get_data(traj_id))

    def resolve_id(self, traj_id: str) -> str:
        """Full id of the trajectory named by an id or a unique id prefix."""
        return Trajectory.model_validate_json(self._get_data(traj_id)).id

    def _get_data(self, traj_id: str) -> str:
        conn = self._conn()
        row = conn.execute("SELECT data FROM trajectories WHERE id = ?", (traj_id,)).fetchone()
        if row is not None:
            return row[0]
        candidates = [traj_id] if traj_id == traj_id.upper() else [traj_id, traj_id.upper()]
        for prefix in candidates:
            if not prefix:
                continue
            # Range scan on the primary key: every string starting with `prefix` sorts in [prefix, prefix+U+10FFFF).
            rows = conn.execute(
                "SELECT id, data FROM trajectories WHERE id >= ? AND id < ? ORDER BY id LIMIT 6",
                (prefix, prefix + "\U0010ffff"),
            ).fetchall()
            if len(rows) == 1:
                return rows[0][1]
            if len(rows) > 1:
                shown = ", ".join(r[0] for r in rows[:5])
                raise AmbiguousIdError(f"id prefix {traj_id!r} matches several trajectories: {shown}, ...")
        raise NotFoundError(f"no trajectory with id (or id prefix) {traj_id!r} in {self.path}")

    def _iter_data(self, filters: dict[str, Any], limit: int | None, offset: int) -> Iterator[str]:
        """JSON rows matching the filters, in id order: ids from an index first, then rows by key."""
        conn = self._conn()
        sql, params = select_ids_sql(filters, limit, offset)
        ids = [r[0] for r in conn.execute(sql, params).fetchall()]
        for start in range(0, len(ids), _FETCH_CHUNK):
            chunk = ids[start : start + _FETCH_CHUNK]
            rows = dict(
                conn.execute(
                    f"SELECT id, data FROM trajectories WHERE id IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
            )
            for traj_id in chunk:
                if traj_id in rows:  # nothing deletes rows today; stay correct if something does
                    yield rows[traj_id]

    def query_trajectories(
        self,
        *,
        run_id: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        policy_version: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Trajectory]:
        """Trajectories matching every given filter, oldest first (ids sort by creation time).

        Reward filters are inclusive and skip ungraded trajectories.
        """
        filters = dict(
            run_id=run_id, task_id=task_id, group_id=group_id, policy_version=policy_version,
            min_reward=min_reward, max_reward=max_reward, status=status,
        )  # fmt: skip
        with _gc_paused():
            return [Trajectory.model_validate_json(d) for d in self._iter_data(filters, limit, offset)]

    def iter_trajectory_json(self, *, limit: int | None = None, offset: int = 0, **filters: Any) -> Iterator[str]:
        """Stored JSON text of matching trajectories, oldest first, streamed (for exports)."""
        yield from self._iter_data(filters, limit, offset)

    def count_trajectories(self, **filters: Any) -> int:
        """Number of trajectories matching the filters of `query_trajectories` (limit/offset ignored)."""
        filters.pop("limit", None)
        filters.pop("offset", None)
        where, params = where_clause(**filters)
        return int(self._conn().execute(f"SELECT COUNT(*) FROM trajectories{where}", params).fetchone()[0])

    def set_grade(self, traj_id: str, grade: Grade) -> None:
        """Attach (or replace) the grade of a trajectory and update its indexed reward."""
        with self._write() as conn:
            row = conn.execute("SELECT data FROM trajectories WHERE id = ?", (traj_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no trajectory with id {traj_id!r} in {self.path}")
            traj = Trajectory.model_validate_json(row[0]).model_copy(update={"grade": grade})
            conn.execute(
                "UPDATE trajectories SET reward = ?, success = ?, data = ? WHERE id = ?",
                (grade.reward, int(grade.success), traj.to_json(), traj_id),
            )

    def update_metadata(self, updates: dict[str, dict[str, Any]]) -> None:
        """Merge ``{traj_id: {key: value}}`` into each trajectory's metadata in one transaction (a None value
        removes the key); `NotFoundError` (and nothing written) if any id is not stored."""
        with self._write() as conn:
            for traj_id, values in updates.items():
                row = conn.execute("SELECT data FROM trajectories WHERE id = ?", (traj_id,)).fetchone()
                if row is None:
                    raise NotFoundError(f"no trajectory with id {traj_id!r} in {self.path}")
                traj = Trajectory.model_validate_json(row[0])
                meta = {**traj.metadata, **values}
                traj.metadata = {k: v for k, v in meta.items() if v is not None}
                conn.execute("UPDATE trajectories SET data = ? WHERE id = ?", (traj.to_json(), traj_id))

    # ------------------------------------------------------------ metrics

    def log_metrics(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        """Record metrics of one training step; a second call for the same step merges keys (newer wins)."""
        if "step" in metrics and metrics["step"] != step:
            raise ValueError(f"metrics hold step={metrics['step']!r} but step={step} was passed")
        payload = {k: v for k, v in metrics.items() if k != "step"}
        text = json.dumps(payload, default=_metric_default)
        with self._write() as conn:
            row = conn.execute("SELECT data FROM metrics WHERE run_id = ? AND step = ?", (run_id, step)).fetchone()
            if row is not None:
                merged = json.loads(row[0])
                merged.update(json.loads(text))
                text = json.dumps(merged)
            conn.execute(
                "INSERT OR REPLACE INTO metrics (run_id, step, logged_at, data) VALUES (?, ?, ?, ?)",
                (run_id, int(step), time.time(), text),
            )

    def get_metrics(self, run_id: str) -> list[dict[str, Any]]:
        """Every logged step of a run, by step: `[{"step": 0, "loss": ...}, ...]`."""
        rows = (
            self._conn().execute("SELECT step, data FROM metrics WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
        )
        return [{"step": step, **json.loads(data)} for step, data in rows]

    # ------------------------------------------------------------ export / import (see io.py)

    def export_jsonl(self, path: str | Path, **filters: Any) -> int:
        return _io.export_jsonl(self, path, **filters)

    def import_jsonl(self, path: str | Path, *, skip_bad: bool = False, run_id: str | None = None) -> ImportReport:
        return _io.import_jsonl(self, path, skip_bad=skip_bad, run_id=run_id)

    def export_parquet(self, path: str | Path, **filters: Any) -> int:
        return _io.export_parquet(self, path, **filters)

    def import_parquet(self, path: str | Path, *, skip_bad: bool = False, run_id: str | None = None) -> ImportReport:
        return _io.import_parquet(self, path, skip_bad=skip_bad, run_id=run_id)

    def import_chat_logs(self, path: str | Path, *, run_id: str, skip_bad: bool = False) -> ImportReport:
        return _io.import_chat_logs(self, path, run_id=run_id, skip_bad=skip_bad)

    def integrity_check(self) -> str:
        """`PRAGMA integrity_check` result: 'ok' for a healthy file."""
        rows = self._conn().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(r[0]) for r in rows)

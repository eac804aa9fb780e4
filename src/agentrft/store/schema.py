"""SQLite schema and connection settings of the trajectory store.

Design choices (see also `Store`):

* **Full JSON + indexed columns.** Each trajectory row keeps the whole record as
  JSON text (`data`, the source of truth, readable with the `sqlite3` shell) and
  copies of the fields people filter on into plain indexed columns.
* **The grade lives inside the trajectory** (`data.grade`) with its reward and
  success copied to indexed columns. A separate grades table would need a join
  for every "reward > x" query and could drift from the record; `set_grade`
  rewrites both in one transaction instead.
* **WAL + synchronous=NORMAL by default.** In WAL mode a commit has been
  written to the WAL file by `write()` before `COMMIT` returns, so a process
  killed with SIGKILL never loses a committed transaction and the database stays
  consistent; NORMAL only skips the fsync, i.e. risks the last commits on an OS
  crash or power cut. `Store(..., synchronous="FULL")` adds that guarantee at the
  price of one fsync per commit.
* **Every index ends in `id`**, so each filter can be answered from an index
  alone, already in id (= creation) order. Queries run in two phases: the
  matching ids from an index, then the JSON rows by primary key; that keeps
  the planner from scanning the large table to avoid a sort of small ids.
* **busy_timeout** makes concurrent writers (threads or processes) wait for the
  write lock instead of failing; writes start with `BEGIN IMMEDIATE` so a
  reader never has to upgrade to a writer mid-transaction (which SQLite cannot
  wait for).
"""

from __future__ import annotations

SCHEMA_VERSION = 1

BUSY_TIMEOUT_MS = 60_000

DDL = """
CREATE TABLE IF NOT EXISTS runs (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    data        TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS trajectories (
    id              TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    group_id        TEXT NOT NULL,
    policy_version  INTEGER NOT NULL,
    reward          REAL,
    success         INTEGER,
    status          TEXT NOT NULL,
    created_at      REAL NOT NULL,
    data            TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_traj_run     ON trajectories (run_id, id);
CREATE INDEX IF NOT EXISTS ix_traj_task    ON trajectories (task_id, id);
CREATE INDEX IF NOT EXISTS ix_traj_group   ON trajectories (group_id, id);
CREATE INDEX IF NOT EXISTS ix_traj_policy  ON trajectories (policy_version, id);
CREATE INDEX IF NOT EXISTS ix_traj_reward  ON trajectories (reward, id);
CREATE INDEX IF NOT EXISTS ix_traj_status  ON trajectories (status, id);

CREATE TABLE IF NOT EXISTS metrics (
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    logged_at  REAL NOT NULL,
    data       TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
"""

# Per-connection settings; journal_mode=WAL is persistent in the file but cheap to re-assert.
PRAGMAS = (
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode = WAL",
    "PRAGMA foreign_keys = OFF",
    # Checkpoint every ~40 MB of WAL instead of 4 MB: each checkpoint costs two fsyncs, and
    # trajectories are ~10 KB each (benchmarks/store_bench.py: ~25% faster bulk inserts).
    "PRAGMA wal_autocheckpoint = 10000",
)

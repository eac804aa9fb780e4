"""Jobs as local objects: a row per job in ``JOBS_DIR/jobs.db`` and a run directory ``JOBS_DIR/<id>/``.

The row holds the job object in the hosted shape (``object: "fine_tuning.job"``: id, status,
model, files, method, seed, suffix, metadata, fine_tuned_model, created_at, finished_at, error)
plus an ``agentrft`` part: the run directory, the worker's pid (and its start time, so a reused pid
is not mistaken for it), the step reached, and a cancel request. The run directory holds what
the job runs on and produces (see `runner.py`).

Status: ``validating`` (created; the worker loads the policy and tools) -> ``running`` (baseline
eval, training, evals) -> ``succeeded`` | ``failed`` | ``cancelled``. A worker killed outright
(``kill -9``, a power cut) cannot say so: its job stays ``running`` and `Job.worker_alive` is
False; ``agentrft rft resume`` continues it from its last checkpoint, as it does a cancelled or
failed one.

One small SQLite table (WAL, busy timeout), not the trajectory store: a job spans many runs and
run stores, and the worker and the commands (``cancel`` from another shell) write it
concurrently; every change is one ``BEGIN IMMEDIATE`` read-modify-write. No torch.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrft.inputs import InputError
from agentrft.rft.spec import JobSpec
from agentrft.types import new_id

JobStatus = Literal["validating", "running", "succeeded", "failed", "cancelled"]
TERMINAL: tuple[JobStatus, ...] = ("succeeded", "failed", "cancelled")
JOBS_DB = "jobs.db"
ID_PREFIX = "ftjob-"

_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    id          TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    data        TEXT NOT NULL
);
"""


class JobError(InputError):
    """An unknown job id, or an action the job's status does not allow; the message says which."""


class JobErrorInfo(BaseModel):
    code: str
    message: str
    param: str | None = None


class LocalState(BaseModel):
    """The ``agentrft`` part of a job object: where it runs and how far it got."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str
    pid: int | None = None
    pid_start: int | None = None  # /proc start time of the worker: a reused pid is not the worker
    step: int = 0
    total_steps: int = 0
    cancel_requested_at: float | None = None
    report: str | None = None


class Job(BaseModel):
    """A fine-tuning job object in the hosted shape, plus `LocalState`."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None = None
    status: JobStatus = "validating"
    model: str
    training_file: str
    validation_file: str
    method: dict[str, Any]
    hyperparameters: None = None  # the hosted object fills this for supervised jobs only
    seed: int
    suffix: str | None = None
    metadata: dict[str, str] | None = None
    fine_tuned_model: str | None = None
    result_files: list[str] = Field(default_factory=list)
    error: JobErrorInfo | None = None
    agentrft: LocalState

    @property
    def run_dir(self) -> Path:
        return Path(self.agentrft.run_dir)

    def worker_alive(self) -> bool:
        """Whether the process that runs this job is still there (False once it ended or was killed)."""
        return process_alive(self.agentrft.pid, self.agentrft.pid_start)

    def public(self) -> dict[str, Any]:
        """The object as `rft get` prints it: the hosted fields, and the local part with the liveness of the
        worker of an unfinished job (None once the job ended, or before a worker took it)."""
        out = self.model_dump(mode="json")
        unfinished = self.status not in TERMINAL and self.agentrft.pid is not None
        out["agentrft"]["worker_alive"] = self.worker_alive() if unfinished else None
        return out


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a process, None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def process_alive(pid: int | None, start: int | None) -> bool:
    """Whether ``pid`` runs and is the same process (same start time); a zombie counts as dead."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc here: the signal check is all there is
    if stat[stat.rindex(")") + 2 :].startswith("Z"):
        return False
    return start is None or process_start(pid) == start


def new_job_id() -> str:
    return ID_PREFIX + new_id().lower()


class JobStore:
    """The jobs of one jobs directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / JOBS_DB

    @contextmanager
    def _conn(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        if not write and not self.path.exists():
            raise JobError(f"no jobs in {self.root} (no {JOBS_DB}; pass --jobs-dir where the jobs are)")
        self.root.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 60000")
            conn.execute("PRAGMA journal_mode = WAL")
            if write:
                conn.executescript(_DDL)
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if write:
                conn.execute("COMMIT")
        except BaseException:
            if write and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def create(self, spec: JobSpec, *, total_steps: int) -> Job:
        """A new job in status ``validating``; its run directory is ``root/<id>`` (created here)."""
        job_id = new_job_id()
        run_dir = (self.root / job_id).resolve()
        job = Job(
            id=job_id,
            created_at=int(time.time()),
            model=spec.model,
            training_file=spec.training_file,
            validation_file=spec.validation_file,
            method=spec.method.model_dump(mode="json"),
            seed=spec.seed,
            suffix=spec.suffix,
            metadata=spec.metadata,
            agentrft=LocalState(run_dir=str(run_dir), total_steps=total_steps),
        )
        run_dir.mkdir(parents=True)
        with self._conn(write=True) as conn:
            conn.execute(
                "INSERT INTO jobs (id, created_at, data) VALUES (?, ?, ?)",
                (job.id, time.time(), job.model_dump_json()),
            )
        return job

    def _resolve(self, conn: sqlite3.Connection, ref: str) -> str:
        rows = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE id = ? OR id LIKE ?", (ref, f"{ref}%"))]
        if ref in rows:
            return ref
        if not rows:
            raise JobError(f"no job {ref!r} in {self.path}")
        if len(rows) > 1:
            raise JobError(f"job id prefix {ref!r} matches {len(rows)} jobs; give more of it")
        return str(rows[0])

    def get(self, ref: str) -> Job:
        """A job by id (or a unique prefix of it)."""
        with self._conn() as conn:
            job_id = self._resolve(conn, ref)
            row = conn.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return Job.model_validate_json(row[0])

    def all(self) -> list[Job]:
        """Every job, newest first."""
        if not self.path.exists():
            return []
        with self._conn() as conn:
            rows = conn.execute("SELECT data FROM jobs ORDER BY id DESC").fetchall()
        return [Job.model_validate_json(r[0]) for r in rows]

    def update(self, ref: str, change: Callable[[Job], Job]) -> Job:
        """Apply ``change`` to the job as stored now, atomically (concurrent writers wait); returns the new job."""
        with self._conn(write=True) as conn:
            job_id = self._resolve(conn, ref)
            row = conn.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
            job = change(Job.model_validate_json(row[0]))
            conn.execute("UPDATE jobs SET data = ? WHERE id = ?", (job.model_dump_json(), job_id))
        return job

    def set(self, ref: str, **fields: Any) -> Job:
        """Set top-level fields of a job (and ``agentrft=...`` updates of its local part, as a dict)."""
        local = fields.pop("agentrft", None)

        def change(job: Job) -> Job:
            update = dict(fields)
            if local is not None:
                update["agentrft"] = job.agentrft.model_copy(update=local)
            return job.model_copy(update=update)

        return self.update(ref, change)


def cancel_requested(job: Job) -> bool:
    return job.agentrft.cancel_requested_at is not None


def dumps(job: Job) -> str:
    return json.dumps(job.public(), indent=2)

"""Several writer processes on one file, and a writer killed with SIGKILL mid-stream."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_factories import make_traj

from agentrft.store import Store

HERE = Path(__file__).parent

WRITER = r"""
import sys
from store_factories import make_traj
from agentrft.store import Store

db, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = []
with Store(db) as store:
    trajs = [make_traj(k * 10_000 + i, run_id=f"proc{k}", per_turn=10) for i in range(n)]
    half = n // 2
    for t in trajs[:half]:                      # one commit each
        ids.append(store.add_trajectory(t))
        store.log_metrics(f"proc{k}", len(ids), {"n": len(ids)})
    for j in range(half, n, 25):                # batches of 25
        ids += store.add_trajectories(trajs[j : j + 25])
print("\n".join(ids))
"""

KILLED_WRITER = r"""
import sys
from store_factories import make_traj
from agentrft.store import Store

store = Store(sys.argv[1])
i = int(sys.argv[2])
while True:
    if i % 5 == 4:   # every fifth step a 50-trajectory batch, never reported: all or nothing
        batch = [make_traj(1_000_000 + 50 * i + j, per_turn=150).model_copy(update={"id": f"B{i:07d}-{j:02d}"})
                 for j in range(50)]
        store.add_trajectories(batch)
        print(f"batch {i}", flush=True)
    else:
        t = make_traj(i, per_turn=150).model_copy(update={"id": f"K{i:08d}"})
        store.add_trajectory(t)
        print(t.id, flush=True)   # printed only after the commit returned
    i += 1
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
def test_four_processes_write_2000_trajectories(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"  # does not exist yet: the processes also race to create the schema
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), str(k), "500"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for k in range(4)
    ]
    reported: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        reported += out.split()
    assert len(reported) == 2000 and len(set(reported)) == 2000

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM trajectories").fetchone() == (2000, 2000)
    conn.close()
    with Store(db) as store:
        assert {t.id for t in store.query_trajectories()} == set(reported)
        for k in range(4):
            assert store.count_trajectories(run_id=f"proc{k}") == 500
            assert [m["n"] for m in store.get_metrics(f"proc{k}")] == list(range(1, 251))
        # spot-check whole records
        for k, i in ((0, 0), (1, 499), (3, 250)):
            want = make_traj(k * 10_000 + i, run_id=f"proc{k}", per_turn=10)
            got = store.query_trajectories(run_id=f"proc{k}", task_id=want.task_id, group_id=want.group_id)
            assert [g.model_copy(update={"id": want.id}) for g in got if g.created_at == want.created_at] == [want]


def _write_until_killed(db: Path, start: int, wait_for: int) -> list[str]:
    """Run the writer, SIGKILL it after `wait_for` reported commits; return every id it reported."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(db), str(start)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while len(lines) < wait_for and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)  # while it is in the middle of further writes
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    return [x for x in lines + rest.split("\n") if x.startswith("K")]


@pytest.mark.slow
def test_sigkilled_writer_loses_no_committed_trajectory(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    reported: list[str] = []
    for round_, wait_for in enumerate((60, 17, 33)):  # three kills at different points, same file
        got = _write_until_killed(db, 100_000 * round_, wait_for)
        assert len(got) >= wait_for * 3 // 5
        reported += got

        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        batch_sizes = conn.execute(
            "SELECT substr(id, 1, 8), COUNT(*) FROM trajectories WHERE id LIKE 'B%' GROUP BY 1"
        ).fetchall()
        conn.close()
        assert batch_sizes and all(n == 50 for _, n in batch_sizes)  # batches are all-or-nothing

    with Store(db) as store:
        for traj_id in reported:
            i = int(traj_id[1:])
            assert store.get_trajectory(traj_id) == make_traj(i, per_turn=150).model_copy(update={"id": traj_id})
        store.add_trajectory(make_traj(0, per_turn=5))  # the file is writable again after recovery
        assert store.integrity_check() == "ok"

"""Store CRUD, queries, indexes, grades, metrics and thread use."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from store_factories import make_traj

from agentrft.store import AmbiguousIdError, DuplicateIdError, NotFoundError, Store, StoreError
from agentrft.store.sql import select_ids_sql
from agentrft.types import Grade, Run, Trajectory


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "sub" / "agentrft.db") as s:
        yield s


def test_pragmas_wal_and_schema(store: Store) -> None:
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "trajectories", "metrics"} <= tables
    assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store._conn().execute("PRAGMA busy_timeout").fetchone()[0] == 60_000
    assert store._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 10_000
    conn.close()


def test_synchronous_full_option(tmp_path: Path) -> None:
    with Store(tmp_path / "f.db", synchronous="FULL") as s:
        assert s._conn().execute("PRAGMA synchronous").fetchone()[0] == 2
    with pytest.raises(ValueError, match="synchronous"):
        Store(tmp_path / "g.db", synchronous="OFF")  # type: ignore[arg-type]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="schema 99"):
        Store(path)


def test_runs(store: Store) -> None:
    a = Run(name="eval-1", kind="eval", config={"k": 4}, created_at=10.0)
    b = Run(name="train-1", kind="train", created_at=5.0)
    assert store.add_run(a) == a.id
    store.add_run(b)
    assert store.get_run(a.id) == a
    assert store.list_runs() == [b, a]  # by created_at
    with pytest.raises(DuplicateIdError, match=a.id):
        store.add_run(a)
    with pytest.raises(NotFoundError, match="no run with id 'nope'") as info:
        store.get_run("nope")
    assert isinstance(info.value, KeyError)


def test_add_get_exact_and_prefix(store: Store) -> None:
    t = make_traj(1)
    assert store.add_trajectory(t) == t.id
    assert store.get_trajectory(t.id) == t
    assert store.get_trajectory(t.id[:-4]) == t
    assert store.get_trajectory(t.id[:-4].lower()) == t
    assert store.resolve_id(t.id[:-2]) == t.id
    with pytest.raises(NotFoundError, match="no trajectory with id"):
        store.get_trajectory("ZZZZ")
    with pytest.raises(KeyError):
        store.get_trajectory("")


def test_ambiguous_prefix(store: Store) -> None:
    a = make_traj(1).model_copy(update={"id": "ABC1"})
    b = make_traj(2).model_copy(update={"id": "ABC2"})
    store.add_trajectories([a, b])
    with pytest.raises(AmbiguousIdError, match="ABC1, ABC2"):
        store.get_trajectory("ABC")
    assert store.get_trajectory("ABC2") == b


def test_duplicate_trajectory_rolls_back_whole_batch(store: Store) -> None:
    t = make_traj(1)
    store.add_trajectory(t)
    with pytest.raises(DuplicateIdError, match=t.id):
        store.add_trajectory(t)
    fresh = make_traj(2)
    with pytest.raises(DuplicateIdError, match=t.id):
        store.add_trajectories([fresh, t])
    with pytest.raises(DuplicateIdError, match=fresh.id):
        store.add_trajectories([fresh, fresh])
    assert store.count_trajectories() == 1  # neither batch left anything behind


def _fill(store: Store) -> list[Trajectory]:
    trajs = [
        make_traj(i, run_id="r1" if i < 12 else "r2", policy_version=i // 5, reward=None if i == 3 else i / 20,
                  status="error" if i == 7 else "completed")
        for i in range(20)
    ]  # fmt: skip
    store.add_trajectories(trajs)
    return sorted(trajs, key=lambda t: t.id)


def test_query_filters(store: Store) -> None:
    trajs = _fill(store)

    def ids(**f: object) -> list[str]:
        got = [t.id for t in store.query_trajectories(**f)]
        assert store.count_trajectories(**f) == len(got) or "limit" in f or "offset" in f
        return got

    assert ids() == [t.id for t in trajs]  # ordered by id = creation order
    assert ids(run_id="r2") == [t.id for t in trajs if t.run_id == "r2"]
    assert len(ids(run_id="r2")) == 8
    assert ids(task_id="task-3") == [t.id for t in trajs if t.task_id == "task-3"]
    assert len(ids(task_id="task-3")) == 2
    assert ids(group_id="group-1") == [t.id for t in trajs if t.group_id == "group-1"]
    assert len(ids(group_id="group-1")) == 4
    assert len(ids(policy_version=3)) == 5
    assert len(ids(status="error")) == 1
    # rewards i/20, i != 3 ungraded; inclusive bounds; ungraded excluded.
    assert sorted(t.reward for t in store.query_trajectories(min_reward=0.8)) == [0.8, 0.85, 0.9, 0.95]
    assert sorted(t.reward for t in store.query_trajectories(max_reward=0.1)) == [0.0, 0.05, 0.1]
    assert len(ids(min_reward=0.1, max_reward=0.3)) == 4  # 0.1, 0.2, 0.25, 0.3 (0.15 is i=3, ungraded)
    assert ids(run_id="r1", min_reward=0.5) == [t.id for t in trajs if t.run_id == "r1" and (t.reward or 0) >= 0.5]
    assert ids(limit=3) == [t.id for t in trajs[:3]]
    assert ids(limit=3, offset=18) == [t.id for t in trajs[18:]]
    assert ids(offset=17) == [t.id for t in trajs[17:]]
    assert store.count_trajectories(run_id="r1", limit=1) == 12
    assert ids(run_id="missing") == []


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"run_id": "x"}, "ix_traj_run"),
        ({"task_id": "x"}, "ix_traj_task"),
        ({"group_id": "x"}, "ix_traj_group"),
        ({"policy_version": 1}, "ix_traj_policy"),
        ({"min_reward": 0.5}, "ix_traj_reward"),
        ({"min_reward": 0.5, "max_reward": 0.9}, "ix_traj_reward"),
        ({"status": "error"}, "ix_traj_status"),
    ],
)
def test_queries_use_indexes(store: Store, filters: dict, index: str) -> None:
    """Phase one of every query (ids in order) is answered from a covering index."""
    _fill(store)
    sql, params = select_ids_sql(filters, 10, 0)
    plan = " ".join(str(r[-1]) for r in store._conn().execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert f"COVERING INDEX {index}" in plan
    assert "SCAN trajectories" not in plan


def test_set_grade_updates_record_and_reward_index(store: Store) -> None:
    t = make_traj(1, reward=None)
    store.add_trajectory(t)
    assert store.query_trajectories(min_reward=0.0) == []
    grade = Grade(reward=0.75, sub_rewards={"a": 0.5}, success=True)
    store.set_grade(t.id, grade)
    got = store.get_trajectory(t.id)
    assert got.grade == grade
    assert got == t.model_copy(update={"grade": grade})
    assert [x.id for x in store.query_trajectories(min_reward=0.75)] == [t.id]
    store.set_grade(t.id, Grade(reward=0.25))
    assert store.query_trajectories(min_reward=0.5) == []
    with pytest.raises(NotFoundError):
        store.set_grade("missing", grade)


def test_metrics_ordered_and_merged(store: Store) -> None:
    store.log_metrics("r", 2, {"loss": 0.5})
    store.log_metrics("r", 0, {"loss": 1.25, "reward/mean": 0.1})
    store.log_metrics("r", 2, {"kl": 0.01, "loss": 0.4})  # same step: merge, newer wins
    store.log_metrics("other", 0, {"loss": 9.0})

    class Scalar:  # numpy / torch scalar stand-in
        def item(self) -> float:
            return 3.5

    store.log_metrics("r", 5, {"grad_norm": Scalar(), "step": 5})
    assert store.get_metrics("r") == [
        {"step": 0, "loss": 1.25, "reward/mean": 0.1},
        {"step": 2, "loss": 0.4, "kl": 0.01},
        {"step": 5, "grad_norm": 3.5},
    ]
    assert store.get_metrics("none") == []
    with pytest.raises(ValueError, match="step=3"):
        store.log_metrics("r", 4, {"step": 3})
    with pytest.raises(TypeError, match="object"):
        store.log_metrics("r", 6, {"x": object()})


def test_many_threads_share_one_store(store: Store) -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(25):
                t = make_traj(k * 100 + j, run_id=f"t{k}", per_turn=5)
                store.add_trajectory(t)
                assert store.get_trajectory(t.id) == t
                store.log_metrics(f"t{k}", j, {"v": j})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.count_trajectories() == 150
    assert all(store.count_trajectories(run_id=f"t{k}") == 25 for k in range(6))
    assert [m["v"] for m in store.get_metrics("t3")] == list(range(25))


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    s.add_trajectory(make_traj(0))
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.count_trajectories()
    with Store(tmp_path / "c.db") as again:  # data survived
        assert again.count_trajectories() == 1
        assert again.integrity_check() == "ok"

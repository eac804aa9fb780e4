"""`Store.transaction()`: the public write path of imports (all or nothing, record-by-record decisions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_factories import make_traj

from agentrft.store import DuplicateIdError, Store
from agentrft.store.sqlite_store import Transaction
from agentrft.types import Run


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "a.db") as s:
        yield s


def test_writes_commit_together_when_the_block_exits(store: Store, tmp_path: Path) -> None:
    a, b = make_traj(1, run_id="imp"), make_traj(2, run_id="imp")
    with Store(tmp_path / "a.db") as reader, store.transaction() as tx:
        assert isinstance(tx, Transaction)
        assert tx.ensure_run("imp", "import") is True
        assert tx.add_trajectory(a) == a.id and tx.add_trajectory(b) == b.id
        # another connection sees nothing until the commit
        assert not reader.has_run("imp") and reader.count_trajectories() == 0
    run = store.get_run("imp")
    assert (run.name, run.kind) == ("imp", "import")
    assert [t.id for t in store.query_trajectories(run_id="imp")] == sorted([a.id, b.id])
    assert store.get_trajectory(a.id) == a


def test_an_exception_rolls_everything_back(store: Store) -> None:
    with pytest.raises(RuntimeError, match="stop"), store.transaction() as tx:
        tx.ensure_run("imp", "import")
        tx.add_trajectory(make_traj(1))
        raise RuntimeError("stop")
    assert not store.has_run("imp") and store.count_trajectories() == 0


def test_a_duplicate_fails_alone_and_the_transaction_goes_on(store: Store) -> None:
    kept = make_traj(1)
    store.add_trajectory(kept)
    new = make_traj(2)
    with store.transaction() as tx:
        with pytest.raises(DuplicateIdError, match=f"trajectory {kept.id} is already in the store"):
            tx.add_trajectory(kept.model_copy(update={"task_id": "changed"}))
        tx.add_trajectory(new)
    assert store.count_trajectories() == 2
    assert store.get_trajectory(kept.id) == kept  # the failed insert changed nothing


def test_ensure_run_keeps_an_existing_run(store: Store) -> None:
    store.add_run(Run(id="r1", name="baseline", kind="eval", metadata={"k": 1}))
    with store.transaction() as tx:
        assert tx.ensure_run("r1", "import") is False
        assert tx.ensure_run("r2") is True
    r1 = store.get_run("r1")
    assert (r1.name, r1.kind, r1.metadata) == ("baseline", "eval", {"k": 1})
    assert store.get_run("r2").kind == "other"


def test_the_store_stays_usable_after_a_failed_transaction(store: Store) -> None:
    with pytest.raises(ValueError), store.transaction() as tx:
        tx.add_trajectory(make_traj(1))
        raise ValueError("bad record")
    store.add_trajectory(make_traj(3))  # the thread's connection is not left inside a transaction
    assert store.count_trajectories() == 1

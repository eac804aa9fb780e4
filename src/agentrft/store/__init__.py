"""Trajectory store: runs, trajectories (with grades) and step metrics in SQLite (WAL),
with JSONL / Parquet export and import and OpenAI chat-log ingestion. No torch.
"""

from agentrft.store.errors import (
    AmbiguousIdError,
    BadRecordError,
    DuplicateIdError,
    NotAStoreError,
    NotFoundError,
    StoreError,
)
from agentrft.store.io import ImportReport, SkippedRecord
from agentrft.store.sqlite_store import Store

RUN_STORE_NAME = "agentrft.db"  # the store's file name inside a run directory (train, demo, report)

__all__ = [
    "RUN_STORE_NAME",
    "AmbiguousIdError",
    "BadRecordError",
    "DuplicateIdError",
    "ImportReport",
    "NotAStoreError",
    "NotFoundError",
    "SkippedRecord",
    "Store",
    "StoreError",
]

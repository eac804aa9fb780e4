"""Recorded trajectories to learn from: the selection shared by SFT, DPO and the reward model.

A `DataConfig` names a source (a store file, or a trajectory export in JSONL or
Parquet as `agentrft traj export` / `export --format parquet` write them) and filters
(runs by id or name, tasks, policy versions, statuses, a reward threshold, success
only, the best n per task, deduplication of identical answers). `select_trajectories`
applies them in that order and never returns an empty selection silently: an empty
result is an `InputError` saying which filter emptied it.

Trajectories that may not be learned from are left out first, whatever the filters:
an episode error, a grade with an error flag, or (when a reward filter is set) no
grade at all (`Trajectory.untrainable_reason`). A trajectory without a token record
(an imported chat log, an eval-only endpoint) is kept: methods render it through the
policy's chat template and say so in their metrics.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrft.inputs import InputError
from agentrft.types import Status, Trajectory


class DataConfig(BaseModel):
    """Which recorded trajectories to learn from."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(
        default=None,
        description="a store (.db / .sqlite) or a trajectory export (.jsonl / .parquet); relative to the cwd",
    )
    runs: list[str] = Field(default_factory=list, description="run ids or names to keep (empty: every run)")
    tasks: list[str] = Field(default_factory=list, description="task ids to keep (empty: every task)")
    policy_versions: list[int] = Field(default_factory=list, description="weights versions to keep (empty: all)")
    statuses: list[Status] = Field(
        default_factory=lambda: list[Status](["completed"]), description="episode statuses to keep"
    )
    min_reward: float | None = Field(default=None, description="keep trajectories graded at least this")
    success_only: bool = Field(default=False, description="keep trajectories graded a success")
    best_of_n: int | None = Field(default=None, ge=1, description="keep the n highest-reward trajectories per task")
    dedupe: bool = Field(default=True, description="one trajectory per (task, identical assistant turns)")


def _load(source: str) -> list[Trajectory]:
    from agentrft.store import Store, StoreError

    path = Path(source)
    if not path.is_file():
        raise InputError(f"data.source: {source}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".parquet"):  # read through a scratch store: the import's checks, one reader
        with tempfile.TemporaryDirectory(prefix="agentrft-data-") as tmp:
            scratch = Store(Path(tmp) / "data.db")
            try:
                report = (scratch.import_jsonl if suffix == ".jsonl" else scratch.import_parquet)(path)
                if report.imported == 0:
                    raise InputError(f"data.source: {source}: holds no trajectories")
                return scratch.query_trajectories()
            except StoreError as exc:
                raise InputError(f"data.source: {exc}") from None
            finally:
                scratch.close()
    try:
        store = Store.open_existing(path)
    except StoreError as exc:
        raise InputError(f"data.source: {exc}") from None
    try:
        return store.query_trajectories()
    finally:
        store.close()


def _run_ids(source: str, wanted: list[str]) -> set[str]:
    """Run ids for names or ids (a store's run names are known; an export holds only ids)."""
    if not wanted or Path(source).suffix.lower() in (".jsonl", ".parquet"):
        return set(wanted)
    from agentrft.store import Store

    store = Store.open_existing(source)
    try:
        runs = store.list_runs()
    finally:
        store.close()
    ids = {r.id for r in runs if r.id in wanted or r.name in wanted}
    unknown = [w for w in wanted if not any(w in (r.id, r.name) for r in runs)]
    if unknown:
        raise InputError(
            f"data.runs: no run {unknown[0]!r} in {source} (runs: {', '.join(r.name or r.id for r in runs)})"
        )
    return ids


def answer_key(traj: Trajectory) -> str:
    """What makes two trajectories of one task the same answer: their assistant turns, as text and tool calls
    (name and arguments; a call's id is minted per episode and says nothing about the answer)."""
    own = traj.messages[traj.n_prompt_messages :]
    return json.dumps(
        [
            [m.text(), [[c.function.name, c.function.arguments] for c in m.tool_calls or []]]
            for m in own
            if m.role == "assistant"
        ]
    )


def select_trajectories(cfg: DataConfig) -> tuple[list[Trajectory], dict[str, int]]:
    """The selected trajectories (oldest first) and how many each step kept, e.g. ``{"loaded": 320, ...}``."""
    if cfg.source is None:
        raise InputError("data.source: this method learns from recorded trajectories; name a store or export")
    trajs = _load(cfg.source)
    run_ids = _run_ids(cfg.source, cfg.runs) if cfg.runs else None
    kept, counts = filter_trajectories(trajs, cfg, run_ids=run_ids)
    if not kept:
        step = list(counts)[-1]
        raise InputError(f"data: no trajectory of {cfg.source} is left after the {step!r} filter ({counts})")
    return kept, counts


def filter_trajectories(
    trajs: list[Trajectory], cfg: DataConfig, *, run_ids: set[str] | None = None
) -> tuple[list[Trajectory], dict[str, int]]:
    """`select_trajectories`'s filters on trajectories in hand (a rejection-sampling round's samples too):
    the kept ones in their order and the count after each filter that ran; it stops at the first filter
    that leaves nothing. ``run_ids``: the ids ``cfg.runs`` resolved to (None: every run)."""
    graded = cfg.min_reward is not None or cfg.success_only or cfg.best_of_n is not None

    def learnable(t: Trajectory) -> bool:
        reason = t.untrainable_reason()
        return reason in (None, "no_tokens") or (not graded and reason == "ungraded")

    def first_per_answer(ts: list[Trajectory]) -> list[Trajectory]:
        seen: set[tuple[str, str]] = set()
        out = []
        for t in ts:
            key = (t.task_id, answer_key(t))
            if key not in seen:
                seen.add(key)
                out.append(t)
        return out

    def best_per_task(ts: list[Trajectory], n: int) -> list[Trajectory]:
        by_task: dict[str, list[Trajectory]] = defaultdict(list)
        for t in ts:
            by_task[t.task_id].append(t)
        # stable: oldest first on ties
        best = {t.id for group in by_task.values() for t in sorted(group, key=lambda t: -(t.reward or 0.0))[:n]}
        return [t for t in ts if t.id in best]

    def where(pred: Any) -> Any:
        return lambda ts: [t for t in ts if pred(t)]

    steps: list[tuple[str, Any]] = [("learnable", where(learnable))]
    if run_ids is not None:
        steps.append(("runs", where(lambda t: t.run_id in run_ids)))
    if cfg.tasks:
        steps.append(("tasks", where(lambda t: t.task_id in set(cfg.tasks))))
    if cfg.policy_versions:
        steps.append(("policy_versions", where(lambda t: t.policy_version in set(cfg.policy_versions))))
    steps.append(("statuses", where(lambda t: t.status in set(cfg.statuses))))
    if cfg.min_reward is not None:
        min_reward = cfg.min_reward
        steps.append(("min_reward", where(lambda t: t.grade is not None and t.grade.reward >= min_reward)))
    if cfg.success_only:
        steps.append(("success_only", where(lambda t: t.grade is not None and t.grade.success)))
    if cfg.dedupe:
        steps.append(("dedupe", first_per_answer))
    if cfg.best_of_n is not None:
        n = cfg.best_of_n
        steps.append(("best_of_n", lambda ts: best_per_task(ts, n)))
    counts = {"loaded": len(trajs)}
    for name, apply in steps:
        trajs = apply(trajs)
        counts[name] = len(trajs)
        if not trajs:
            break
    return trajs, counts

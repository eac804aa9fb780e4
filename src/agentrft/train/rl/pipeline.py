"""Asynchronous GRPO: rollouts keep running with the newest weights while the trainer updates.

A producer thread plays groups (one task x ``group_size`` episodes each) on its own
asyncio loop, grades them and filters them as `stages.filter_stage` does (errors never
train); the trainer takes finished groups oldest first, ``tasks_per_step`` per update.
In process the producer and the trainer share one model: the sampler is paused during
an update, so what overlaps the update is everything else an episode waits on (tools,
graders, a remote judge) and the next groups' prompts queue up.

**Staleness.** A trajectory sampled by weights of version v (its oldest assistant turn:
`TokenRecord.turn_versions`) and used in the update that starts from version n (and
makes n + 1) has staleness n - v. ``async.max_staleness`` = k bounds it by pacing the
producer, never by throwing finished work away: a group about to start would be taken
by the update that starts from version ``published + pending + position // per_step``
(``position`` = groups queued before it, ``pending`` = 1 while an update is running),
so it starts only when that is at most ``published + k``. Groups the filter drops only
move later ones earlier. The trainer checks the bound again on every trajectory it takes
and drops (counts, stores the reason) any that would break it; none should. At most
``async.max_inflight_groups`` (default ``tasks_per_step``) groups are being played at
once: more would only split an in-process sampler among groups the trainer does not
need yet (measured: 8 groups in flight made the demo's steps 0.6-0.7x as fast).

**What each trajectory says.** ``metadata.draw``: its task's position in the task
stream; ``metadata.trained_step``: the 1-based update that used it; ``metadata.dropped``:
why it never will (an episode or grader error, a group left too small or without signal,
staleness, an interruption).

**Resume.** The checkpoint's ``cursor`` is the first draw no update has taken. After a
kill, `resume_plan` puts back (oldest first) every complete, stored group from that draw
on that the resumed run may still use: sampled by weights no newer than the checkpoint's
(those after it are lost) and either never trained or trained by an update the kill
lost. A complete group the kill caught between storing its episodes and grading them is
graded then. Draws whose group is incomplete, lost or unusable are played again; their stored
trajectories are marked dropped with the reason. So no finished trajectory is lost and
none is trained twice into the weights that survive.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrft.algos import staleness_histogram
from agentrft.graders import Grader, agrade_trajectories
from agentrft.rollout.runner import Runner
from agentrft.store import Store
from agentrft.train.config import TrainConfig
from agentrft.train.core.metrics import rollout_metrics
from agentrft.train.rl.stages import Filtered, drop_reasons, filter_stage, next_tasks
from agentrft.types import Task, Trajectory


@dataclass
class Slot:
    """One group: its task's draw position, the version it started under, and (once finished) its members."""

    draw: int
    task: Task
    start_version: int
    trajs: list[Trajectory] = field(default_factory=list)
    group: list[Trajectory] | None = None  # the healthy members, once finished and kept
    finished: bool = False


class Player(Protocol):
    """Who plays a group: the trainer's own sampler (`InProcessPlayer`) or rollout workers elsewhere
    (`train/ray_rollout.RayPlayer`)."""

    stores_episodes: bool  # True: each episode is in the store as it finishes (only grades are left to write)
    restarts: int  # rollout workers that died and were replaced

    async def play(self, task: Task, group_size: int, run_id: str) -> list[Trajectory]:
        """The group's episodes, graded."""
        ...

    def publish(self, version: int) -> None:
        """The trainer's weights are now ``version``: sample with them from the next request on."""
        ...

    def close(self) -> None: ...


class InProcessPlayer:
    """Plays on the trainer's own sampler, which shares the trained model (nothing to publish)."""

    stores_episodes = True
    restarts = 0

    def __init__(self, runner: Runner, grader: Grader) -> None:
        self.runner, self.grader = runner, grader

    async def play(self, task: Task, group_size: int, run_id: str) -> list[Trajectory]:
        trajs = await self.runner.run([task], group_size, run_id=run_id, policy_version=None)
        grades = await agrade_trajectories(self.grader, trajs, [task.data] * len(trajs))
        for t, grade in zip(trajs, grades, strict=True):
            t.grade = grade
        return trajs

    def publish(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


class Producer:
    """Plays groups on a background thread within the staleness bound; `take` hands them out oldest first."""

    def __init__(
        self,
        cfg: TrainConfig,
        player: Player,
        tasks: Sequence[Task],
        store: Store | None,
        run_id: str,
        *,
        version: int,
        requeued: Sequence[Slot] = (),
        redo: Sequence[int] = (),
        cursor: int,
    ) -> None:
        self.cfg, self.player, self.tasks, self.store, self.run_id = cfg, player, tasks, store, run_id
        self.k, self.per_step = cfg.async_.max_staleness, cfg.rollout.tasks_per_step
        self.group_size = cfg.rollout.group_size
        self.max_inflight = cfg.async_.max_inflight_groups or cfg.rollout.tasks_per_step
        self._cond = threading.Condition()
        self._live: list[Slot] = sorted(requeued, key=lambda s: s.draw)  # in draw order: taken oldest first
        self._redo: deque[int] = deque(sorted(redo))
        self._version, self._pending, self._cursor = version, 0, cursor
        self._filtered = Filtered()
        # producer utilisation: the share of wall time with at least one group in flight
        self._busy_s, self._since = 0.0, time.perf_counter()
        self._busy_from: float | None = None
        self._stop = False
        # groups dropped in a row (none kept since): past the synchronous loop's own budget, the trainer would
        # wait for a group that never comes (a grader that fails every episode, a task set the policy has
        # saturated under dynamic sampling), so the producer fails with the causes instead
        self._dropped_in_a_row = 0
        self._drop_causes: Counter[str] = Counter()  # the dropped episodes' reasons, over those groups
        self._drop_limit = cfg.algorithm.dynamic_sampling.max_rounds * cfg.rollout.tasks_per_step
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="agentrft-producer", daemon=True)

    # --- trainer side -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def take(self, n: int) -> tuple[list[Slot], dict[str, float]]:
        """The ``n`` oldest groups, once all of them are finished (blocks); marks an update as pending."""
        t0 = time.perf_counter()
        with self._cond:
            while True:
                if isinstance(self._error, NoTrainableGroups):
                    raise self._error
                if self._error is not None:
                    raise RuntimeError(f"the rollout producer failed: {self._error!r}") from self._error
                head = self._live[:n]
                if len(head) == n and all(s.finished for s in head):
                    break
                self._cond.wait(timeout=0.5)
            del self._live[:n]
            self._pending = 1
            filtered, self._filtered = self._filtered, Filtered()
            now = time.perf_counter()
            metrics = {
                "async/queue_groups": float(sum(s.finished for s in self._live)),
                "async/inflight_groups": float(sum(not s.finished for s in self._live)),
                "async/producer_utilisation": self._busy_time(now) / max(now - self._since, 1e-9),
                "time/wait_s": now - t0,
                "async/worker_restarts": float(self.player.restarts),
                **{k: v for k, v in filtered.metrics().items() if k != "zero_signal_frac"},
            }
            self._busy_s, self._since = 0.0, now
            if self._busy_from is not None:
                self._busy_from = now
        return head, metrics

    def _busy_time(self, now: float) -> float:
        return self._busy_s + (now - self._busy_from if self._busy_from is not None else 0.0)

    def _set_busy(self, busy: bool) -> None:
        """Under the lock: the producer has groups in flight (or has none) from now on."""
        now = time.perf_counter()
        if busy and self._busy_from is None:
            self._busy_from = now
        elif not busy and self._busy_from is not None:
            self._busy_s += now - self._busy_from
            self._busy_from = None

    def publish(self, version: int) -> None:
        """The update made ``version``: the player samples with it from its next request on."""
        self.player.publish(version)
        with self._cond:
            self._version, self._pending = version, 0
        self._poke()

    def first_untaken_draw(self) -> int:
        """The checkpoint's cursor: the oldest draw no update has taken."""
        with self._cond:
            draws = [s.draw for s in self._live] + list(self._redo)
            return min(draws, default=self._cursor)

    def close(self) -> None:
        with self._cond:
            self._stop = True
        self._poke()
        self._thread.join(timeout=60)
        self.player.close()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(wake.set)

    # --- producer side ------------------------------------------------------------------------------
    def _may_start(self) -> bool:
        """The staleness bound (module docstring) and the cap on groups being played at once."""
        inflight = sum(not s.finished for s in self._live)
        return self._pending + len(self._live) // self.per_step <= self.k and inflight < self.max_inflight

    def _next_slot(self) -> Slot:
        draw = self._redo.popleft() if self._redo else self._cursor
        if draw == self._cursor:
            self._cursor += 1
        task = next_tasks(self.tasks, draw, 1, self.cfg.seed)[0]
        return Slot(draw=draw, task=task, start_version=self._version)

    def _main(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # handed to the trainer, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    async def _produce(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                with self._cond:
                    if self._stop:
                        return
                    while self._may_start():
                        slot = self._next_slot()
                        bisect.insort(self._live, slot, key=lambda s: s.draw)
                        running.add(asyncio.create_task(self._play(slot)))
                    self._set_busy(bool(running))
                    self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                done, _ = await asyncio.wait({*running, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                for job in done - {waiter}:
                    running.discard(job)
                    job.result()  # a bug in the loop itself surfaces here
                with self._cond:
                    self._set_busy(bool(running))
        finally:
            for job in running:
                job.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _play(self, slot: Slot) -> None:
        trajs = await self.player.play(slot.task, self.group_size, self.run_id)
        for t in trajs:
            t.metadata["draw"] = slot.draw
        with self._cond:
            before = len(self._filtered.groups)
            filter_stage(trajs, drop_zero_signal=self.cfg.algorithm.dynamic_sampling.enabled, into=self._filtered)
            kept = self._filtered.groups[-1] if len(self._filtered.groups) > before else None
        dropped = drop_reasons(trajs, {t.id for t in kept or []})
        for t in trajs:
            if t.id in dropped:
                t.metadata["dropped"] = dropped[t.id]
        if self.store is not None:
            if self.player.stores_episodes:  # stored as they finished: add their grades and marks
                for t in trajs:
                    self.store.set_grade(t.id, t.grade)  # type: ignore[arg-type]
                self.store.update_metadata({t.id: {"draw": slot.draw, "dropped": dropped.get(t.id)} for t in trajs})
            else:
                self.store.add_trajectories(trajs)
        with self._cond:
            slot.trajs, slot.group, slot.finished = trajs, kept, True
            if kept is None:
                self._live.remove(slot)
                self._dropped_in_a_row += 1
                self._drop_causes.update(set(dropped.values()))
                if self._dropped_in_a_row >= self._drop_limit:
                    raise NoTrainableGroups(self._dropped_in_a_row, self._drop_causes)
            else:
                self._dropped_in_a_row, self._drop_causes = 0, Counter()
            self._cond.notify_all()
        self._poke()


class NoTrainableGroups(RuntimeError):
    """Every group played lately was dropped: the trainer would wait forever for one to train on."""

    def __init__(self, n: int, causes: Counter[str]) -> None:
        why = ", ".join(sorted(causes)) or "unknown"
        super().__init__(
            f"async GRPO: the last {n} groups played were all dropped (their episodes: {why}); no update can "
            "start. zero_signal: every episode of each group got the same reward (the tasks are too easy or too "
            "hard: other tasks, or a curriculum); grader_error: see the trajectories' grade errors "
            "(agentrft traj show); the synchronous loop would stop sampling after "
            "algorithm.dynamic_sampling.max_rounds rounds as well"
        )


def check_staleness(
    slots: Sequence[Slot], version: int, k: int
) -> tuple[list[list[Trajectory]], list[int], dict[str, str]]:
    """The groups to train on (members within the bound), each trained member's staleness, and the reason
    for any member that would break the bound (dropped; pacing should make this never happen)."""
    groups: list[list[Trajectory]] = []
    staleness: list[int] = []
    dropped: dict[str, str] = {}
    for slot in slots:
        assert slot.group is not None
        keep = []
        for t in slot.group:
            s = version - t.policy_version
            if s > k:
                dropped[t.id] = f"stale: sampled by version {t.policy_version}, update starts from {version} (k={k})"
            else:
                keep.append(t)
                staleness.append(s)
        if len(keep) >= 2:
            groups.append(keep)
        else:
            dropped.update({t.id: dropped.get(t.id, "small_group") for t in keep})
    return groups, staleness, dropped


def step_metrics(slots: Sequence[Slot], staleness: list[int], k: int) -> dict[str, float]:
    """Rollout metrics of every member of the taken groups, the staleness histogram of the trained ones."""
    out = rollout_metrics([t for s in slots for t in s.trajs], "train")
    out.update({f"async/{key}": v for key, v in staleness_histogram(staleness, k).items()})
    out["groups_trained"] = float(len(slots))
    return out


def resume_plan(
    store: Store,
    run_id: str,
    cfg: TrainConfig,
    tasks: Sequence[Task],
    *,
    step: int,
    version: int,
    cursor: int,
    grader: Grader | None = None,
    tool_schema_hash: str | None = None,
) -> tuple[list[Slot], list[int], int]:
    """(groups put back, draws to play again, the producer's next new draw) for a run resumed at checkpoint
    (``step``, ``version``, ``cursor``); marks the stored trajectories it will not use (module docstring). A
    complete group the kill caught between storing its episodes and grading them is graded now (``grader``)
    and put back like any other, not dropped as ungraded; one played with other tool schemas than
    ``tool_schema_hash`` (the environment's now) is flagged ``tool_schema_drift`` by that grade and not trained."""
    by_draw: dict[int, list[Trajectory]] = {}
    trained_draws: set[int] = set()
    marks: dict[str, dict[str, Any]] = {}
    for t in store.query_trajectories(run_id=run_id):
        trained, draw = t.metadata.get("trained_step"), t.metadata.get("draw")
        if trained is not None and trained <= step:  # in the surviving weights
            if draw is not None:
                trained_draws.add(int(draw))
            continue
        if draw is None or draw < cursor:
            marks[t.id] = {"dropped": "interrupted: in flight when the run stopped", "trained_step": None}
            continue
        by_draw.setdefault(int(draw), []).append(t)
    requeued: list[Slot] = []
    redo: list[int] = []
    last = max(by_draw, default=cursor - 1)
    for draw in range(cursor, last + 1):
        if draw in trained_draws:
            continue
        members = by_draw.get(draw, [])
        task = next_tasks(tasks, draw, 1, cfg.seed)[0]
        groups = {t.group_id for t in members}
        why = None
        if len(members) != cfg.rollout.group_size or len(groups) != 1:
            why = "interrupted: its group was unfinished when the run stopped; the task is played again"
        elif any(t.policy_version > version for t in members):
            why = "interrupted: sampled by weights newer than the checkpoint (lost); the task is played again"
        if why is not None:
            marks.update({t.id: {"dropped": why, "trained_step": None} for t in members})
            redo.append(draw)
            continue
        ungraded = [t for t in members if t.grade is None]
        if ungraded and grader is not None:
            grades = asyncio.run(
                agrade_trajectories(
                    grader, ungraded, [task.data] * len(ungraded), expected_tool_schema_hash=tool_schema_hash
                )
            )
            for t, grade in zip(ungraded, grades, strict=True):
                t.grade = grade
                store.set_grade(t.id, grade)
        filtered = filter_stage(members, drop_zero_signal=cfg.algorithm.dynamic_sampling.enabled)
        kept = filtered.groups[0] if filtered.groups else None
        reasons = drop_reasons(members, {t.id for t in kept or []})
        marks.update({t.id: {"trained_step": None, "dropped": reasons.get(t.id)} for t in members})
        if kept is not None:
            start = min(t.policy_version for t in members)
            requeued.append(Slot(draw, task, start, trajs=members, group=kept, finished=True))
    if marks:
        store.update_metadata(marks)
    return requeued, redo, last + 1


def mark_unused(store: Store, run_id: str) -> int:
    """At the end of a run: every trajectory no update took and none dropped is marked so (queued or in flight
    when the last update was made). Returns how many."""
    marks = {
        t.id: {"dropped": "unused: the run ended before an update took it"}
        for t in store.query_trajectories(run_id=run_id)
        if "trained_step" not in t.metadata and "dropped" not in t.metadata
    }
    if marks:
        store.update_metadata(marks)
    return len(marks)

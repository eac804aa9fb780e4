"""The runner: N×G concurrent episodes, groups, grading, store writes as episodes finish."""

from __future__ import annotations

import asyncio
import random

import pytest
from rollout_fakes import FakeEnv, FakeSampler, decode, task

from agentrft.envs.base import EnvLimits
from agentrft.graders import Grader, Sample, Score
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.types import Trajectory


class ReactiveSampler(FakeSampler):
    """Calls the calculator first, answers once a tool result is in the prompt; tracks concurrency."""

    def __init__(self, delay_s: float = 0.01) -> None:
        super().__init__(delay_s=delay_s)
        self.in_flight = 0
        self.max_in_flight = 0

    def next_output(self, request: SampleRequest) -> str:
        text = decode(request.prompt_ids)
        if text.count("<|im_start|>tool") == 0:
            return "<calculate>5829 - 5735</calculate>"
        return "94"

    async def sample(self, request: SampleRequest):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await super().sample(request)
        finally:
            self.in_flight -= 1


class RecordingStore:
    def __init__(self, sampler: ReactiveSampler) -> None:
        self.sampler = sampler
        self.written: list[Trajectory] = []
        self.pending_at_write: list[int] = []

    def add_trajectory(self, traj: Trajectory) -> str:
        self.written.append(traj)
        self.pending_at_write.append(len([t for t in asyncio.all_tasks() if not t.done()]))
        return traj.id


class AnswerGrader(Grader):
    type = "answer"

    def __init__(self) -> None:
        super().__init__("answer")

    def score(self, sample: Sample, item: dict) -> Score:
        return Score(float(sample.output_text == item["answer"]))


class BrokenGrader(Grader):
    type = "broken"

    def __init__(self) -> None:
        super().__init__("broken")

    def score(self, sample: Sample, item: dict) -> Score:
        raise KeyError("answer")


def _tasks(n: int) -> list:
    return [task(f"t{i}", answer="94" if i % 2 == 0 else "95") for i in range(n)]


def test_n_by_g_episodes_groups_grades_and_store() -> None:
    sampler = ReactiveSampler()
    # random tool latency: some episodes finish while others are still waiting on tools
    rng = random.Random(0)
    env = FakeEnv(tool_delay=lambda t: rng.uniform(0.0, 0.05))
    store = RecordingStore(sampler)
    runner = Runner(
        env,
        sampler,
        store=store,
        grader=AnswerGrader(),
        max_concurrency=8,
        progress=False,
        params=SamplingParams(max_tokens=64),
    )
    trajs = runner.run_sync(_tasks(4), 3, run_id="run-1", policy_version=5)
    assert len(trajs) == 12
    assert [t.task_id for t in trajs] == [f"t{i}" for i in range(4) for _ in range(3)]
    groups = [t.group_id for t in trajs]
    assert all(groups[3 * i] == groups[3 * i + k] for i in range(4) for k in range(3))
    assert len(set(groups)) == 4
    assert all(t.run_id == "run-1" and t.policy_version == 5 and t.status == "completed" for t in trajs)
    assert [t.grade.reward for t in trajs] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0] * 2
    # the group id reaches the sampler as the prefill-sharing key
    assert {r.group_key for r in sampler.requests} == set(groups)
    # every episode was written once, and writes happened while other episodes were still running
    assert sorted(t.id for t in store.written) == sorted(t.id for t in trajs)
    assert store.pending_at_write[0] > 1
    assert 1 < sampler.max_in_flight <= 8
    s = runner.stats
    assert (s.episodes, s.tool_calls, s.statuses) == (12, 12, {"completed": 12})
    assert s.mean_reward == pytest.approx(0.5) and s.generated_tokens == sum(t.tokens.num_sampled for t in trajs)


def test_max_concurrency_one_is_sequential() -> None:
    sampler = ReactiveSampler()
    Runner(FakeEnv(), sampler, max_concurrency=1, progress=False).run_sync(_tasks(3), 2)
    assert sampler.max_in_flight == 1


def test_grader_error_is_flagged_not_silent() -> None:
    runner = Runner(FakeEnv(), ReactiveSampler(), grader=BrokenGrader(), progress=False)
    trajs = runner.run_sync(_tasks(1), 2)
    assert all(t.grade.error_flags == ["other_error"] and "KeyError" in t.grade.errors[0].message for t in trajs)
    assert runner.stats.grader_errors == 2


def test_store_failure_keeps_trajectories() -> None:
    class FullDisk:
        def add_trajectory(self, traj: Trajectory) -> str:
            raise OSError("disk full")

    runner = Runner(FakeEnv(), ReactiveSampler(), store=FullDisk(), progress=False)
    trajs = runner.run_sync(_tasks(2), 1)
    assert len(trajs) == 2 and len(runner.stats.store_errors) == 2 and "disk full" in runner.stats.store_errors[0]


def test_runner_wall_time_returns_finished_episodes() -> None:
    env = FakeEnv(EnvLimits(max_turns=3), tool_delay=lambda t: 0.0 if t.id == "t0" else 5.0)
    # free scheduling: t0's turns do not wait for the slow tools of the others (in lockstep they would)
    runner = Runner(env, ReactiveSampler(delay_s=0.0), progress=False, wall_time_s=0.5, lockstep=False)
    trajs = runner.run_sync(_tasks(3), 1)
    assert [t.task_id for t in trajs] == ["t0"]


def test_lockstep_runner_wall_time_cancels_the_waiting_wave() -> None:
    # in lockstep t0's second turn waits for the others' slow tools; the wall time ends all three, and
    # nothing hangs: the held request of each cancelled episode is dropped
    env = FakeEnv(EnvLimits(max_turns=3), tool_delay=lambda t: 0.0 if t.id == "t0" else 5.0)
    runner = Runner(env, ReactiveSampler(delay_s=0.0), progress=False, wall_time_s=0.5)
    assert runner.run_sync(_tasks(3), 1) == []


def test_progress_bar_runs() -> None:
    runner = Runner(FakeEnv(), ReactiveSampler(), progress=True, grader=AnswerGrader())
    assert len(runner.run_sync(_tasks(2), 2)) == 4


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        Runner(FakeEnv(), ReactiveSampler(), max_concurrency=0)
    with pytest.raises(ValueError, match="samples_per_task"):
        Runner(FakeEnv(), ReactiveSampler(), progress=False).run_sync(_tasks(1), 0)


def test_real_store_receives_trajectories(tmp_path) -> None:
    store_mod = pytest.importorskip("agentrft.store")
    store = store_mod.Store(tmp_path / "traj.db")
    runner = Runner(FakeEnv(), ReactiveSampler(), store=store, progress=False)
    trajs = runner.run_sync(_tasks(2), 2, run_id="r-store")
    assert runner.stats.store_errors == []
    for t in trajs:
        back = store.get_trajectory(t.id)
        assert back.tokens == t.tokens and back.group_id == t.group_id
    store.close()


def test_lockstep_a_sampler_that_refuses_a_wave_fails_its_episodes_instead_of_hanging() -> None:
    class Refusing(ReactiveSampler):
        def sample_together(self, requests):  # type: ignore[no-untyped-def]
            raise RuntimeError("engine gone")

    trajs = Runner(FakeEnv(), Refusing(delay_s=0.0), progress=False).run_sync(_tasks(3), 2)
    assert len(trajs) == 6 and all(t.status == "error" and "engine gone" in (t.error or "") for t in trajs)

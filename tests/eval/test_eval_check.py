"""Eligibility check: figures and verdicts on hand-built groups."""

from __future__ import annotations

import itertools

import pytest
from eval_fakes import (
    FakeEnv,
    FakeSampler,
    FakeStore,
    install_fake_graders,
    install_fake_runner,
    make_task,
    make_traj,
    numeric_grade,
)

from agentrft.eval.check import assess, check, trivial_answers
from agentrft.eval.metrics import wilson_interval
from agentrft.types import Grade, Task, Trajectory


def grade_fn(traj: Trajectory, task: Task) -> Grade:
    return numeric_grade(traj.final_answer, task.data["answer"])


TASKS = [make_task(t, 2) for t in "abcd"]


def groups(pattern: dict[str, list[float]]) -> list[Trajectory]:
    return [make_traj(t, r, answer="2" if r == 1.0 else "9") for t, rs in pattern.items() for r in rs]


def test_trivial_answers_read_the_prompt() -> None:
    task = make_task("x", 1, prompt="Revenue rose from 1,200 to -3.5 in 2019")
    assert trivial_answers(task) == {"constant_0": "0", "first_number": "1200", "last_number": "2019"}


def test_worth_it_with_hand_computed_figures() -> None:
    trajs = groups({"a": [1, 0, 0, 0], "b": [1, 1, 0, 0], "c": [0, 0, 0, 0], "d": [1, 1, 1, 1]})
    res = assess(trajs, TASKS, grade_fn)
    assert res.success_rate == pytest.approx(7 / 16)
    assert res.success_ci == pytest.approx(wilson_interval(7, 16))
    assert res.solved_at_least_once == pytest.approx(0.75)
    assert res.pass_at_k[1] == pytest.approx(7 / 16)
    assert res.guessability == {"constant_0": 0.0, "first_number": 0.0, "last_number": 0.0}
    assert res.grader_agreement == 1.0 and res.n_regraded == 16
    assert res.reward_at_min == pytest.approx(9 / 16) and res.reward_at_max == pytest.approx(7 / 16)
    assert res.zero_variance_groups == pytest.approx(0.5)  # c and d
    assert res.verdict == "worth_it" and len(res.reasons) == 4


def test_never_succeeding_is_not_yet() -> None:
    res = assess(groups({t: [0, 0] for t in "abcd"}), TASKS, grade_fn)
    assert res.verdict == "not_yet"
    assert any("never succeeds" in r for r in res.reasons)
    assert any("identical rewards" in r for r in res.reasons)


def test_always_succeeding_is_not_suitable() -> None:
    res = assess(groups({t: [1, 1] for t in "abcd"}), TASKS, grade_fn)
    assert res.verdict == "not_suitable" and any("already solved" in r for r in res.reasons)


def test_guessable_answers_are_not_suitable() -> None:
    tasks = [make_task(t, 3) for t in "ab"]  # the prompt "... 5 and 3?" ends with the answer
    res = assess(groups({"a": [1, 0], "b": [0, 0]}), tasks, grade_fn)
    assert res.guessability["last_number"] == 1.0
    assert res.verdict == "not_suitable" and any("guessable" in r for r in res.reasons)


def test_nondeterministic_grader_is_not_suitable() -> None:
    flip = itertools.cycle([1.0, 0.0, 0.0])

    def flaky(traj: Trajectory, task: Task) -> Grade:
        r = next(flip)
        return Grade(reward=r, success=r == 1.0)

    res = assess(groups({"a": [1, 0], "b": [0, 1]}), [make_task("a", 2), make_task("b", 2)], flaky)
    assert res.grader_agreement < 1.0
    assert res.verdict == "not_suitable" and any("not deterministic" in r for r in res.reasons)


def test_check_runs_episodes(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_graders(monkeypatch)
    install_fake_runner(monkeypatch)
    sampler = FakeSampler({"a": ["2", "1", "7"], "b": ["0", "8", "2"], "c": ["9", "9", "9"], "d": ["1", "1", "1"]})
    res = check(FakeEnv(TASKS), sampler, samples=3, tasks=3, store=FakeStore())
    assert res.n_tasks == 3 and res.success_rate == pytest.approx(2 / 9)
    assert res.verdict == "worth_it"
    with pytest.raises(ValueError, match="at least 2 samples"):
        check(FakeEnv(TASKS), sampler, samples=1, store=FakeStore())

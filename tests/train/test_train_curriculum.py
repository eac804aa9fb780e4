"""The curriculum (train/rl/curriculum.py): weights by hand, promotion, task preference, and exact resume."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import fakes_train as F
import pytest

from agentrft.inputs import InputError
from agentrft.train import train
from agentrft.train.config import ConfigError
from agentrft.train.config.rollout import CurriculumConfig
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.train.rl.curriculum import Curriculum, ShuffledTasks, stratified_levels
from agentrft.train.rl.stages import next_tasks
from agentrft.types import Grade, Message, Task, Trajectory


def _tasks(per_level: int = 4, levels: tuple[int, ...] = (1, 2, 3)) -> list[Task]:
    return [
        Task(id=f"L{lv}-{i}", messages=[Message(role="user", content="q")], data={"level": lv})
        for lv in levels
        for i in range(per_level)
    ]


def _group(task_id: str, successes: list[bool], group: str = "g") -> list[Trajectory]:
    return [
        Trajectory(
            task_id=task_id, group_id=f"{group}-{task_id}", status="completed", grade=Grade(reward=float(s), success=s)
        )
        for s in successes
    ]


CFG = CurriculumConfig(enabled=True, window=4, min_episodes=4, promote_at=0.75, keep_share=0.2)


def test_levels_unlock_in_order_when_the_rolling_pass_rate_reaches_the_threshold() -> None:
    c = Curriculum(_tasks(), CFG, seed=0)
    assert c.level_weights() == {1: 1.0, 2: 0.0, 3: 0.0}
    c.observe(_group("L1-0", [True, True, True]))  # 3 episodes < min_episodes: no promotion yet
    assert c.unlocked == 1 and c.pass_rate(1) == 1.0
    c.observe(_group("L1-1", [False, True, True, True]))  # window 4: [1, 1, 1, 1] then... last 4 = [0,1,1,1]
    assert c.recent[1] == [0, 1, 1, 1] and c.pass_rate(1) == 0.75 and c.unlocked == 2
    assert c.level_weights() == {1: pytest.approx(0.2), 2: pytest.approx(0.8), 3: 0.0}
    c.observe(_group("L2-0", [True, True, False, False]))  # 0.5 < 0.75: level 3 stays locked
    assert c.unlocked == 2
    c.observe(_group("L2-1", [True, True, True, True]))
    assert c.unlocked == 3
    assert c.level_weights() == {1: pytest.approx(0.1), 2: pytest.approx(0.1), 3: pytest.approx(0.8)}
    m = c.metrics()
    assert m["curriculum/unlocked_levels"] == 3.0 and m["curriculum/level_3_weight"] == pytest.approx(0.8)
    assert m["curriculum/level_2_pass_rate"] == 1.0 and "curriculum/level_3_pass_rate" not in m


def test_learnability_weights_follow_p_times_one_minus_p_by_hand() -> None:
    cfg = CurriculumConfig(
        enabled=True,
        window=4,
        min_episodes=4,
        promote_at=0.75,
        keep_share=0.2,
        start_unlocked=3,
        weighting="learnability",
    )
    c = Curriculum(_tasks(), cfg, seed=0)
    assert c.unlocked == 3  # every level open from the start
    # nothing measured: each level's signal is the most, 0.25, so the draws are even
    assert c.level_weights() == {lv: pytest.approx(1 / 3) for lv in (1, 2, 3)}
    c.observe(_group("L1-0", [True, True, True, True]))  # p 1: no signal
    c.observe(_group("L2-0", [True, False, False, False]))  # p 1/4: s = 3/16
    c.observe(_group("L3-0", [True, True, False]))  # 3 < min_episodes: still 0.25
    # s = 0, 3/16, 4/16 (sum 7/16); weight = 0.8 * s / sum + 0.2 / 3
    assert c.level_weights() == {
        1: pytest.approx(0.2 / 3),
        2: pytest.approx(0.8 * 3 / 7 + 0.2 / 3),
        3: pytest.approx(0.8 * 4 / 7 + 0.2 / 3),
    }
    assert sum(c.level_weights().values()) == pytest.approx(1.0)
    c.observe(_group("L2-1", [True, True, True, True]) + _group("L3-1", [True, True, True, True]))
    c.observe(_group("L3-2", [True, True, True, True]))  # every level now all-pass: no signal anywhere, even draws
    assert c.level_weights() == {lv: pytest.approx(1 / 3) for lv in (1, 2, 3)}


def test_guided_groups_keep_signal_on_a_level_the_policy_fails() -> None:
    cfg = CurriculumConfig(enabled=True, window=4, min_episodes=4, start_unlocked=2, weighting="learnability")
    plain, guided = Curriculum(_tasks(), cfg, seed=0), Curriculum(_tasks(), cfg, seed=0, guided_share=0.25)
    for c in (plain, guided):
        c.observe(_group("L1-0", [False] * 4) + _group("L2-0", [True] * 4))  # the policy fails 1, passes 2
    assert plain.learnability(1) == 0.0 and plain.learnability(2) == 0.0
    # a group of 4 with one expert episode: p' = 0.25 + 0.75 p; level 1 p' = 1/4 (s = 3/16), level 2 p' = 1 (s = 0)
    assert guided.learnability(1) == pytest.approx(3 / 16, abs=1e-12) and guided.learnability(2) == 0.0
    # level 2's pass rate unlocked level 3 (unmeasured: 1/4); weight 0.8 * s / (3/16 + 0 + 4/16) + 0.2 / 3
    assert guided.unlocked == 3 and guided.level_weights()[1] == pytest.approx(0.8 * 3 / 7 + 0.2 / 3, abs=1e-12)
    assert plain.level_weights()[1] == pytest.approx(0.2 / 3, abs=1e-12)  # unguided: the keep share alone
    by_id = {t.id: t for t in _tasks()}
    assert (plain.task_weight(by_id["L1-0"]), guided.task_weight(by_id["L1-0"])) == (0.5, 2.0)  # all-fail: mixed
    assert guided.task_weight(by_id["L2-0"]) == 0.5  # all-pass stays flat


def test_learnability_keeps_locked_levels_at_zero_and_start_unlocked_is_capped_and_resumed() -> None:
    cfg = CurriculumConfig(enabled=True, window=4, min_episodes=4, start_unlocked=2, weighting="learnability")
    c = Curriculum(_tasks(), cfg, seed=0)
    assert c.unlocked == 2 and c.level_weights()[3] == 0.0
    assert {t.id[:2] for cursor in range(50) for t in c.draw(cursor, 2)} == {"L1", "L2"}
    assert Curriculum(_tasks(), cfg.model_copy(update={"start_unlocked": 9}), seed=0).unlocked == 3
    c.observe(_group("L2-0", [True, True, True, False]))  # level 2 at 0.75 >= promote_at 0.5: level 3 unlocks
    assert c.unlocked == 3
    assert Curriculum(_tasks(), cfg, seed=0, state=c.state_dict()).level_weights() == c.level_weights()


def test_errors_do_not_count_in_the_pass_rates() -> None:
    c = Curriculum(_tasks(), CFG, seed=0)
    crashed = _group("L1-0", [False, False])
    crashed[0].status = "error"
    crashed[1].grade = Grade(reward=0.0, errors=[{"flag": "other_error", "grader": "g", "message": "boom"}])
    c.observe([*crashed, Trajectory(task_id="L1-0", group_id="x", status="completed")])  # last one ungraded
    assert c.recent[1] == [] and c.task_success == {}


def test_task_weights_prefer_groups_neither_all_right_nor_all_wrong() -> None:
    c = Curriculum(_tasks(), CFG, seed=0)
    c.observe(_group("L1-0", [True, False]) + _group("L1-1", [True, True]) + _group("L1-2", [False, False]))
    by_id = {t.id: t for t in _tasks()}
    assert [c.task_weight(by_id[f"L1-{i}"]) for i in range(4)] == [2.0, 0.5, 0.5, 1.0]
    # drawn frequencies follow the weights (2 : 0.5 : 0.5 : 1 over 400 draws of one task each)
    counts = Counter(t.id for cursor in range(400) for t in c.draw(cursor, 1))
    assert set(counts) == {"L1-0", "L1-1", "L1-2", "L1-3"}
    assert counts["L1-0"] > counts["L1-3"] > max(counts["L1-1"], counts["L1-2"])


def test_a_draw_keeps_to_unlocked_levels_repeats_no_task_and_is_a_function_of_seed_cursor_and_state() -> None:
    c = Curriculum(_tasks(), CFG, seed=5)
    batch = c.draw(0, 4)
    assert sorted(t.id for t in batch) == ["L1-0", "L1-1", "L1-2", "L1-3"]
    assert [t.id for t in c.draw(7, 6)] == [t.id for t in Curriculum(_tasks(), CFG, seed=5).draw(7, 6)]
    c.unlocked = 3
    restored = Curriculum(_tasks(), CFG, seed=5, state=c.state_dict())
    assert [t.id for t in restored.draw(9, 8)] == [t.id for t in c.draw(9, 8)]
    assert [t.id for t in c.draw(9, 8)] != [
        t.id for t in Curriculum(_tasks(), CFG, seed=6, state=c.state_dict()).draw(9, 8)
    ]


def test_stratified_levels_give_each_level_its_floor_and_the_remainder_by_fractions() -> None:
    rng = random.Random(0)
    # n x weight = 0.3, 1.233, 1.233, 1.233: one each of levels 2-4, the fourth draw by fractions .3 : .233 x 3
    weights = {1: 0.075, 2: 0.925 / 3, 3: 0.925 / 3, 4: 0.925 / 3}
    draws = [stratified_levels(weights, 4, rng) for _ in range(3000)]
    assert all(len(d) == 4 and {2, 3, 4} <= set(d) and max(Counter(d).values()) <= 2 for d in draws)
    extra = Counter(lv for d in draws for lv, k in Counter(d).items() if k == 2 or lv == 1)
    total = sum(extra.values())
    assert total == 3000  # exactly one draw beyond the floors
    for lv, w in weights.items():
        share = 4 * w - (lv != 1)  # the fraction left over the floor (the fractions sum to the one draw left)
        assert extra[lv] / total == pytest.approx(share, abs=0.03)  # drawn in proportion to the fractions
    assert Counter(stratified_levels({1: 0.5, 2: 0.5, 3: 0.0}, 6, rng)) == {1: 3, 2: 3}  # exact quotas, no zero level
    assert sorted(stratified_levels({1: 1 / 3, 2: 1 / 3, 3: 1 / 3}, 3, rng)) == [1, 2, 3]  # 3 x (1/3) is not < 1


def test_stratified_draws_hold_every_level_weighted_one_in_n_in_every_step() -> None:
    cfg = CFG.model_copy(update={"start_unlocked": 4, "weighting": "learnability", "keep_share": 0.3})
    tasks = _tasks(levels=(1, 2, 3, 4))
    plain = Curriculum(tasks, cfg, seed=1)
    strat = Curriculum(tasks, cfg.model_copy(update={"stratified": True}), seed=1)
    for c in (plain, strat):
        c.observe(_group("L1-0", [True] * 4))  # level 1 all-pass: 0.075; levels 2-4 unmeasured: 0.3083 each
    assert strat.level_weights() == plain.level_weights()
    levels = [[int(t.id[1]) for t in c.draw(cursor, 4)] for c in (plain, strat) for cursor in range(200)]
    plain_steps, strat_steps = levels[:200], levels[200:]
    assert all({2, 3, 4} <= set(step) for step in strat_steps)
    assert sum(not {3, 4} <= set(step) for step in plain_steps) > 40  # independent draws miss one often (~44%)
    assert [t.id for t in strat.draw(3, 4)] == [
        t.id for t in Curriculum(tasks, strat.cfg, 1, strat.state_dict()).draw(3, 4)
    ]


def test_tasks_without_a_level_or_a_checkpoint_of_other_levels_are_refused() -> None:
    with pytest.raises(InputError, match="no integer data.level"):
        Curriculum([Task(id="t", messages=[], data={"i": 1})], CFG, seed=0)
    state = Curriculum(_tasks(levels=(1, 2)), CFG, seed=0).state_dict()
    with pytest.raises(InputError, match=r"levels \[1, 2\] are not the training tasks' levels \[1, 2, 3\]"):
        Curriculum(_tasks(), CFG, seed=0, state=state)


def test_the_shuffle_is_the_seeded_stream() -> None:
    tasks = _tasks()
    assert ShuffledTasks(tasks, 3).draw(5, 4) == next_tasks(tasks, 5, 4, 3)


def test_the_config_refuses_the_curriculum_where_it_cannot_run() -> None:
    with pytest.raises(ConfigError, match="asynchronous"):
        F.config(**{"rollout.curriculum.enabled": "true", "async.max_staleness": 1})
    with pytest.raises(ConfigError, match="min_episodes must be <= window"):
        F.config(**{"rollout.curriculum.enabled": "true", "rollout.curriculum.window": 2})


# ---------------------------------------------------------------- the loop, stopped and resumed


class LevelledEnv(F.FakeEnv):
    def tasks(self, split: str = "train") -> list[Task]:
        return [
            t.model_copy(update={"data": {**t.data, "level": 1 + i % 3}}) for i, t in enumerate(super().tasks(split))
        ]


def _components(run_dir: Any) -> Any:
    comps = F.components(run_dir)
    comps.env = LevelledEnv(n_tasks=9)
    return comps


CURRICULUM = {
    "rollout.curriculum.enabled": "true",
    "rollout.curriculum.window": 6,
    "rollout.curriculum.min_episodes": 3,
    "rollout.curriculum.promote_at": 0.3,
    "steps": 5,
    "eval.every_steps": 0,
}


LEARNABILITY = {**CURRICULUM, "rollout.curriculum.weighting": "learnability", "rollout.curriculum.start_unlocked": 2}
STRATIFIED = {**LEARNABILITY, "rollout.curriculum.stratified": "true"}


def _run(run_dir: Any, resume: bool = False, stop_after: int | None = None, sets: dict[str, Any] = CURRICULUM) -> Any:
    return train(F.config(**sets), run_dir, resume=resume, components=_components(run_dir), stop_after=stop_after)


def _strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _trained_tasks(run_dir: Any) -> list[tuple[str, int]]:
    from agentrft.store import Store

    with Store(run_dir / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        return sorted((t.task_id, t.policy_version) for t in s.query_trajectories(run_id=run.id))


@pytest.mark.parametrize("sets", [CURRICULUM, LEARNABILITY, STRATIFIED], ids=["frontier", "learnability", "stratified"])
def test_a_stopped_and_resumed_curriculum_run_equals_an_uninterrupted_one(tmp_path, sets: dict[str, Any]) -> None:
    ref = _run(tmp_path / "ref", sets=sets)
    weights = [(r["curriculum/level_1_weight"], r["curriculum/unlocked_levels"]) for r in ref.history]
    assert len(set(weights)) > 1  # the mix changed during the run, so the state matters
    _run(tmp_path / "b", stop_after=2, sets=sets)
    _run(tmp_path / "b", resume=True, sets=sets)
    assert _strip(read_metrics(tmp_path / "b")) == _strip(read_metrics(tmp_path / "ref"))
    assert _trained_tasks(tmp_path / "b") == _trained_tasks(tmp_path / "ref")


def test_a_curriculum_over_tasks_without_levels_fails_before_the_model_loads(tmp_path, monkeypatch) -> None:
    from agentrft.train.loop import build_components

    def no_model(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr("agentrft.samplers.policies.load_trainable_policy", no_model)
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n')
    cfg = F.config(**{"rollout.curriculum.enabled": "true", "rollout.env": f"jsonl:{data}"})
    with pytest.raises(InputError, match="no integer data.level"):
        build_components(cfg, tmp_path)

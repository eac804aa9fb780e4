"""A task's episode is its own level's whatever levels the environment serves (prompt, tools, limits)."""

from __future__ import annotations

import asyncio

import pytest

from agentrft.envs.finqa.env import LEVEL_LIMITS, FinqaLiteEnv
from agentrft.eval.harness import select_tasks
from agentrft.inputs import InputError
from agentrft.rollout.agent import prompt_messages
from agentrft.rollout.formats import make_format


@pytest.fixture(scope="module")
def mixed() -> FinqaLiteEnv:
    return FinqaLiteEnv(levels=(1, 2, 3, 4), seed=0)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_a_task_is_prompted_as_its_own_level_is(mixed: FinqaLiteEnv, level: int) -> None:
    alone = FinqaLiteEnv(levels=(level,), seed=0)
    task = next(t for t in mixed.tasks("held-out") if t.data["level"] == level)
    assert task.id in {t.id for t in alone.tasks("held-out")}
    fmt_mixed = make_format("xml", mixed.task_tool_schemas(task))
    fmt_alone = make_format("xml", alone.task_tool_schemas(task))
    got = [m.model_dump() for m in prompt_messages(mixed, task, fmt_mixed)]
    want = [m.model_dump() for m in prompt_messages(alone, task, fmt_alone)]
    assert got == want
    assert mixed.task_tool_schemas(task) == alone.tool_schemas()
    assert mixed.task_limits(task) == alone.limits == LEVEL_LIMITS[level]
    # the env-wide view is still every level's: all tools, the most generous limits, every example
    assert {s["function"]["name"] for s in mixed.tool_schemas()} == {"search", "open", "calculate"}
    assert mixed.limits.max_turns == max(lim.max_turns for lim in LEVEL_LIMITS.values())
    assert len(mixed.few_shot()) > len(alone.few_shot())


def test_a_level_two_episode_is_offered_the_calculator_only(mixed: FinqaLiteEnv) -> None:
    task = next(t for t in mixed.tasks("train") if t.data["level"] == 2)
    ep = mixed.start(task)
    refused = asyncio.run(ep.call_tool("search", {"query": "anything"}))
    assert not refused.ok and "unknown" in refused.content.lower()


def test_explicit_limits_apply_to_every_task() -> None:
    env = FinqaLiteEnv(levels=(1, 4), seed=0, limits=LEVEL_LIMITS[2])
    task = next(t for t in env.tasks("train") if t.data["level"] == 4)
    assert env.task_limits(task) == LEVEL_LIMITS[2]
    # limits set after construction (benchmarks/rollout_bench.py does) apply to every task too
    later = FinqaLiteEnv(levels=(1, 4), seed=0)
    assert later.task_limits(task) == LEVEL_LIMITS[4]
    later.limits = later.limits.model_copy(update={"max_turns": 2})
    assert later.task_limits(task).max_turns == 2


def test_an_eval_takes_the_first_tasks_of_each_level(mixed: FinqaLiteEnv) -> None:
    tasks = mixed.tasks("held-out")
    chosen = select_tasks(tasks, 3)
    assert [t.data["level"] for t in chosen] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert [t.id for t in chosen if t.data["level"] == 3] == [t.id for t in tasks if t.data["level"] == 3][:3]
    one_level = FinqaLiteEnv(levels=(3,), seed=0).tasks("held-out")
    assert select_tasks(one_level, 5) == one_level[:5]
    assert select_tasks(tasks, None) == tasks
    by_level = select_tasks(tasks, {1: 2, 3: 1, 4: 3})  # a count per level; level 2 not named: none
    assert [t.data["level"] for t in by_level] == [1, 1, 3, 4, 4, 4]
    assert [t.id for t in by_level if t.data["level"] == 4] == [t.id for t in chosen if t.data["level"] == 4]
    with pytest.raises(InputError, match="at least 1"):
        select_tasks(tasks, {1: 0})


def test_shots_keeps_the_first_worked_examples_of_each_level_or_none() -> None:
    from agentrft.envs.registry import make_env

    full = FinqaLiteEnv(levels=(1, 3), seed=0)
    task = next(t for t in full.tasks("held-out") if t.data["level"] == 1)
    one = make_env("finqa-lite:1,3?shots=1")
    zero = make_env("finqa-lite?shots=0")  # every level, no worked example
    assert isinstance(one, FinqaLiteEnv) and isinstance(zero, FinqaLiteEnv)
    assert (one.levels, one.shots, zero.levels, zero.shots) == ((1, 3), 1, (1, 2, 3, 4), 0)
    # level 1 shows three worked examples, each a question, a call, its result and the answer; shots=1 the first
    examples = full.initial_messages(task)[1:-1]
    assert [m.role for m in examples].count("user") == 3
    assert [m.model_dump() for m in one.initial_messages(task)] == [
        m.model_dump() for m in [full.initial_messages(task)[0], *examples[:4], task.messages[-1]]
    ]
    # zero-shot: the system prompt, then the question; tools and limits are the level's as before
    assert [m.model_dump() for m in zero.initial_messages(task)] == [
        m.model_dump() for m in [full.initial_messages(task)[0], *task.messages]
    ]
    assert zero.task_tool_schemas(task) == full.task_tool_schemas(task)
    assert zero.few_shot() == [] and zero.tasks("held-out") == FinqaLiteEnv(seed=0).tasks("held-out")


def test_shots_per_level_shows_the_worked_example_where_it_is_named() -> None:
    from agentrft.envs.registry import make_env

    full = FinqaLiteEnv(seed=0)
    env = make_env("finqa-lite?shots=0,4:1")  # zero-shot but for one worked example at level 4
    only4 = make_env("finqa-lite?shots=4:0")  # levels not named keep all of their own
    assert isinstance(env, FinqaLiteEnv) and isinstance(only4, FinqaLiteEnv)
    assert (env.shots, only4.shots) == ({1: 0, 2: 0, 3: 0, 4: 1}, {4: 0})
    task = {lv: next(t for t in full.tasks("held-out") if t.data["level"] == lv) for lv in (3, 4)}
    assert [m.model_dump() for m in env.initial_messages(task[3])] == [
        m.model_dump() for m in [full.initial_messages(task[3])[0], *task[3].messages]
    ]
    assert [m.model_dump() for m in env.initial_messages(task[4])] == [
        m.model_dump() for m in full.initial_messages(task[4])
    ]  # level 4 has one worked example: shots=1 is all of it
    assert [m.model_dump() for m in only4.initial_messages(task[3])] == [
        m.model_dump() for m in full.initial_messages(task[3])
    ]
    assert len(only4.initial_messages(task[4])) == 2


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("finqa-lite:3?shots=0,5:1", "shots must be an integer >= 0 or LEVEL:N pairs"),
        ("finqa-lite:3?shots=0,", "shots must be an integer >= 0 or LEVEL:N pairs"),
        ("finqa-lite:3?shots=4:1,4:2", "shots names a level twice"),
        ("finqa-lite:3?shots=x", "shots must be an integer >= 0"),
        ("finqa-lite:3?shots=-1", "shots must be an integer >= 0"),
        ("finqa-lite:3?shots=²", "shots must be an integer >= 0"),
        ("finqa-lite:3?shot=0", r"unknown option\(s\) shot \(known: shots\)"),
        ("finqa?shots=0:data/test.json", "finqa takes no options"),  # the option would vanish, not apply
    ],
)
def test_a_bad_shots_option_is_named(spec: str, says: str) -> None:
    from agentrft.envs.registry import make_env

    with pytest.raises(InputError, match=says):
        make_env(spec)


def test_negative_shots_are_refused_by_the_constructor() -> None:
    with pytest.raises(InputError, match="shots must be >= 0"):
        FinqaLiteEnv(levels=(3,), shots=-1)

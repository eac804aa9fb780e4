"""reasoning-gym as an environment: seeded disjoint splits, the optional calculator, and grades that are the
package's own score_answer (partial credit included)."""

from __future__ import annotations

import asyncio

import pytest
import reasoning_gym as rg

from agentrft.envs import make_env
from agentrft.envs.reasoning_gym.env import calculate
from agentrft.graders import load_grader
from agentrft.inputs import InputError
from agentrft.rollout.agent import run_episode
from agentrft.samplers.base import ChatResult, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=32)


class Chat:
    policy, policy_version = "scripted", 0

    def __init__(self, replies: list[dict]) -> None:
        self.replies = list(replies)

    async def chat(self, messages, tools, params):  # type: ignore[no-untyped-def]
        return ChatResult({"role": "assistant", **self.replies.pop(0)}, "stop")


def test_splits_are_seeded_disjoint_and_levelled_by_dataset() -> None:
    env = make_env("reasoning-gym:chain_sum,products?train=20&test=10&seed=3")
    again = make_env("reasoning-gym:chain_sum,products?train=20&test=10&seed=3")
    train, held = env.tasks("train"), env.tasks("held-out")
    assert [t.messages[0].content for t in train] == [t.messages[0].content for t in again.tasks("train")]
    assert len(train) == 40 and 0 < len(held) <= 20
    assert not {t.messages[0].content for t in train} & {t.messages[0].content for t in held}
    assert {t.data["level"] for t in train} == {1, 2} and {t.data["dataset"] for t in held} == {"chain_sum", "products"}
    other = make_env("reasoning-gym:chain_sum?train=20&seed=4")
    assert [t.messages[0].content for t in other.tasks("train")] != [t.messages[0].content for t in train[:20]]


def test_grades_are_the_packages_score_answer_with_partial_credit() -> None:
    env = make_env("reasoning-gym:chain_sum?train=4&test=4")
    task = env.tasks("held-out")[0]
    entry, answer = task.data["entry"], task.data["answer"]
    grader = load_grader(env.grader_spec())
    score = rg.get_score_answer_fn("chain_sum")
    for text in (answer, f"The answer is {answer}", "nothing", f"<answer>{answer}</answer>"):
        grade = grader.grade(text, task.data)
        expected = score(text.replace("<answer>", "").replace("</answer>", ""), entry)
        assert grade.reward == pytest.approx(expected) and grade.success is (expected >= 1.0)
    assert 0 < grader.grade(f"The answer is {answer}", task.data).reward < 1


def test_the_calculator_tool_is_offered_with_tools_calc_and_its_call_shown_in_the_prompt() -> None:
    plain = make_env("reasoning-gym:chain_sum?train=2&test=2")
    assert plain.tool_schemas() == [] and plain.few_shot() == [] and plain.limits.max_turns == 1
    env = make_env("reasoning-gym:chain_sum?tools=calc&train=2&test=2")
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["calculate"]
    assert len(env.few_shot()) == 8 and len(make_env("reasoning-gym:chain_sum?tools=calc&shots=1").few_shot()) == 4
    task = env.tasks("held-out")[0]
    expression = task.data["entry"]["metadata"]["expression"]
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculate", "arguments": f'{{"expression": "{expression}"}}'},
    }
    chat = Chat([{"content": None, "tool_calls": [call]}, {"content": task.data["answer"]}])
    traj = asyncio.run(run_episode(env, chat, task, params=PARAMS))
    assert traj.tool_calls[0].result == task.data["answer"]
    assert load_grader(env.grader_spec()).grade(traj, task.data).success


def test_calculate_reads_the_expression_before_an_equals_sign() -> None:
    assert calculate("48 - 58 - 80 = 2") == "-90" and calculate("7 / 2") == "3.5" and calculate("2 ** 10") == "1024"
    with pytest.raises(ValueError):
        calculate("import os")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reasoning-gym:", "name one or more reasoning-gym datasets"),
        ("reasoning-gym:no_such_dataset", "reasoning-gym dataset 'no_such_dataset'"),
        ("reasoning-gym:chain_sum?tools=web", "tools must be calc or none"),
        ("reasoning-gym:chain_sum?colour=1", "unknown option colour"),
        ("reasoning-gym:chain_sum?shots=1", "it needs tools=calc"),
        ("reasoning-gym:chain_sum?products.max_terms=2", "sets a dataset not named"),
    ],
)
def test_bad_specs_are_refused_before_any_model_loads(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        make_env(spec)


def test_a_generator_setting_reaches_the_dataset() -> None:
    env = make_env("reasoning-gym:chain_sum?chain_sum.min_terms=2&chain_sum.max_terms=2&train=8&test=2")
    assert all(t.data["entry"]["metadata"]["num_terms"] == 2 for t in env.tasks("train"))


@pytest.mark.parametrize("name", ["arc_agi", "rearc", "chain_sum", "number_sorting"])
def test_the_gold_answer_scores_one_through_the_stored_task(name: str) -> None:
    env = make_env(f"reasoning-gym:{name}?train=2&test=2")
    grader = load_grader(env.grader_spec())
    for task in env.tasks("train") + env.tasks("held-out"):
        gold = task.data["entry"]["answer"]
        assert grader.grade(gold if isinstance(gold, str) else str(gold), task.data).success

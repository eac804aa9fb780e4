"""The `oracle` policy: the env's expert through the agent loop, token-exact for the student's chat template."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from agentrft.envs.base import Environment, EnvLimits, Episode
from agentrft.envs.finqa.env import FinqaLiteEnv
from agentrft.envs.finqa.expert import decomposes, report_programs
from agentrft.graders import load_grader
from agentrft.rollout.agent import run_episode
from agentrft.rollout.formats import make_format
from agentrft.samplers.base import EpisodeView, SampleRequest, SamplingParams
from agentrft.samplers.chat_template import TokenizerRenderer
from agentrft.samplers.oracle import OracleError, OracleSampler
from agentrft.samplers.policies import PolicyError, load_policy
from agentrft.train.data.records import render_token_record, token_record_problem
from agentrft.types import Task, Trajectory

TASKS_PER_LEVEL = 40


@pytest.fixture(scope="module")
def env() -> FinqaLiteEnv:
    return FinqaLiteEnv(levels=(1, 2, 3, 4), seed=0)


@pytest.fixture(scope="module")
def oracle(env: FinqaLiteEnv) -> OracleSampler:
    sampler = load_policy("oracle:tiny", env=env)
    assert isinstance(sampler, OracleSampler)
    return sampler


def _play(env: Environment, sampler: OracleSampler, tasks: list[Task], fmt: str = "xml") -> list[Trajectory]:
    params = SamplingParams(temperature=0.0, max_tokens=env.limits.max_tokens_per_turn)

    async def go() -> list[Trajectory]:
        return list(
            await asyncio.gather(*(run_episode(env, sampler, t, params=params, tool_format=fmt) for t in tasks))
        )

    return asyncio.run(go())


def _sample(env: FinqaLiteEnv, per_level: int) -> list[Task]:
    by_level: dict[int, list[Task]] = {}
    for t in env.tasks("train"):
        by_level.setdefault(t.data["level"], []).append(t)
    return [t for level in sorted(by_level) for t in by_level[level][:: len(by_level[level]) // per_level][:per_level]]


@pytest.mark.parametrize("fmt", ["xml", "hermes"])
def test_oracle_trajectories_are_the_chat_templates_tokens(env: FinqaLiteEnv, oracle: OracleSampler, fmt: str) -> None:
    tasks = _sample(env, 3)
    renderer = TokenizerRenderer(oracle.tokenizer)
    for traj in _play(env, oracle, tasks, fmt):
        assert traj.status == "completed", traj.error
        assert token_record_problem(traj, len(oracle.tokenizer)) is None
        rendered = render_token_record(traj, renderer, fmt, env.tool_schemas())
        assert traj.tokens == rendered  # ids, loss mask, turns, log-probs 0.0


def test_oracle_solves_the_train_tasks_at_every_level(env: FinqaLiteEnv, oracle: OracleSampler) -> None:
    tasks = _sample(env, TASKS_PER_LEVEL)
    grader = load_grader(env.grader_spec())
    right: Counter[int] = Counter()
    total: Counter[int] = Counter()
    tools_used: dict[int, set[str]] = {}
    for task, traj in zip(tasks, _play(env, oracle, tasks), strict=True):
        level = task.data["level"]
        total[level] += 1
        right[level] += bool(grader.grade(traj, task.data).success)
        tools_used.setdefault(level, set()).update(e.name for e in traj.tool_calls)
    assert sorted(total) == [1, 2, 3, 4] and set(total.values()) == {TASKS_PER_LEVEL}
    for level in total:
        assert right[level] / total[level] >= 0.95, (level, right[level], total[level])
    assert tools_used[1] == tools_used[2] == {"calculate"}
    assert tools_used[3] == tools_used[4] == {"search", "open", "calculate"}


def test_level_four_demonstration_calculates_each_report_then_the_difference(
    env: FinqaLiteEnv, oracle: OracleSampler
) -> None:
    task = next(t for t in env.tasks("train") if t.data["level"] == 4 and decomposes(t.data))
    (traj,) = _play(env, oracle, [task])
    calls = [(e.name, e.arguments) for e in traj.tool_calls]
    d = task.data
    first, second = report_programs(d)
    results = [e.result for e in traj.tool_calls if e.name == "calculate"]
    assert calls == [
        ("search", {"query": f"{d['companies'][0]} {d['years'][0]}"}),
        ("open", {"doc_id": d["doc_ids"][0]}),
        ("calculate", {"expression": first}),
        ("search", {"query": f"{d['companies'][1]} {d['years'][1]}"}),
        ("open", {"doc_id": d["doc_ids"][1]}),
        ("calculate", {"expression": second}),
        ("calculate", {"expression": f"subtract({results[0]}, {results[1]})"}),
    ]
    assert traj.messages[-1].text() == f"The answer is {traj.tool_calls[-1].result}."
    assert traj.policy == "oracle:tiny" and traj.tokens is not None
    assert set(traj.tokens.logprobs) == {0.0}


def test_a_turn_over_the_token_cap_is_cut_like_a_models(env: FinqaLiteEnv, oracle: OracleSampler) -> None:
    task = next(t for t in env.tasks("train") if t.data["level"] == 3)
    view = EpisodeView(task=task, turns=[], writer=make_format("xml", env.tool_schemas()))
    full = asyncio.run(oracle.sample(SampleRequest([1, 2], SamplingParams(max_tokens=256), episode=view)))
    assert full.finish_reason == "stop" and full.token_ids[-1] == oracle.tokenizer.eos_token_id
    assert full.text.startswith("I need one report: ") and full.text.endswith("</search>")  # the plan, then the call
    cut = asyncio.run(oracle.sample(SampleRequest([1, 2], SamplingParams(max_tokens=4), episode=view)))
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:4]
    assert cut.text == oracle.decode(full.token_ids[:4])


def test_outside_an_episode_the_oracle_refuses(oracle: OracleSampler) -> None:
    with pytest.raises(OracleError, match="inside the agent loop"):
        asyncio.run(oracle.sample(SampleRequest([1, 2], SamplingParams())))


class _NoExpertEnv(Environment):
    name = "no-expert"
    limits = EnvLimits()

    def system_prompt(self) -> str:
        return ""

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def tasks(self, split: str = "train") -> list[Task]:
        return []

    def start(self, task: Task) -> Episode:
        raise AssertionError("not played")


def test_bad_oracle_names_fail_before_any_tokenizer_loads(monkeypatch: pytest.MonkeyPatch, env: FinqaLiteEnv) -> None:
    def no_tokenizer(name: str) -> Any:
        raise AssertionError("a tokenizer was loaded")

    monkeypatch.setattr("agentrft.samplers.policies.load_tokenizer", no_tokenizer)
    with pytest.raises(PolicyError, match="needs the environment"):
        load_policy("oracle")
    with pytest.raises(PolicyError, match="'no-expert' has no expert"):
        load_policy("oracle", env=_NoExpertEnv())
    with pytest.raises(PolicyError, match="in-process policy"):
        load_policy("oracle:openai:gpt-4o", env=env)


class _TemplateThatRewritesContent:
    """A tokenizer stand-in whose template upper-cases assistant text: not token-exact."""

    eos_token_id = 9

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
        out: list[int] = []
        for m in messages:
            text = m["content"].upper() if m["role"] == "assistant" else m["content"]
            out += [1, *[ord(c) for c in text], 9]
        return out + ([1] if kw.get("add_generation_prompt") else [])


def test_a_template_that_rewrites_assistant_text_is_refused(env: FinqaLiteEnv) -> None:
    expert = env.expert()
    assert expert is not None
    with pytest.raises(OracleError, match="not be token-exact"):
        OracleSampler(expert, _TemplateThatRewritesContent())


@pytest.mark.parametrize("fmt", ["xml", "hermes"])
def test_the_first_call_at_levels_three_and_four_states_the_reports_needed(
    env: FinqaLiteEnv, oracle: OracleSampler, fmt: str
) -> None:
    tasks = _sample(env, 2)
    for task, traj in zip(tasks, _play(env, oracle, tasks, fmt), strict=True):
        d = task.data
        asked = max(i for i, m in enumerate(traj.messages) if m.role == "user")  # after the worked examples
        said = [m.content for m in traj.messages[asked:] if m.role == "assistant" and m.tool_calls]
        if d["level"] <= 2:
            assert not any(said), said  # the figures are in the question: nothing to look up
            continue
        reports = [f"{c}'s {y} annual report" for c, y in zip(d["companies"], d["years"], strict=True)]
        plan = (
            f"I need one report: {reports[0]}." if d["level"] == 3 else f"I need two reports: {' and '.join(reports)}."
        )
        # the plan comes back out of the rendered text (the stored message is what was parsed from the tokens)
        assert said[0] == plan and not any(said[1:]), said

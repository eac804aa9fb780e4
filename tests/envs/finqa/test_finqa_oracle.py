"""A scripted oracle drives the real tools of every held-out (and ood) task and must always be right."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter

import pytest

from agentrft.envs.finqa.env import FinqaLiteEnv
from agentrft.types import Task


@pytest.fixture(scope="module")
def env() -> FinqaLiteEnv:
    return FinqaLiteEnv(levels=(1, 2, 3, 4), seed=0)


async def oracle(env: FinqaLiteEnv, task: Task) -> tuple[str, int]:
    """search → open each gold report (checking its figures are on the page) → calculate → answer."""
    ep = env.start(task)
    literals = set(re.findall(r"(?<![#\w.])\d+(?:\.\d+)?(?![\w.])", task.data["program"])) - {"0.5"}
    seen = ""
    if task.data["level"] >= 3:
        for company, year, gold in zip(task.data["companies"], task.data["years"], task.data["doc_ids"], strict=True):
            found = await ep.call_tool("search", {"query": f"{company} {year}", "k": 3})
            assert found.ok, found.content
            doc_id = re.search(r"doc_id=(\S+)", found.content).group(1)  # type: ignore[union-attr]
            assert doc_id == gold, (task.id, found.content)
            page = await ep.call_tool("open", f'{{"doc_id": "{doc_id}"}}')
            assert page.ok and not page.truncated, page.content
            seen += page.content
        shown = {x.replace(",", "").replace("$ ", "") for x in re.findall(r"\$ [\d,]+(?:\.\d+)?|\b[\d,]+\b", seen)}
        assert literals <= shown, (task.id, literals - shown)
    result = await ep.call_tool("calculate", {"expression": task.data["program"]})
    assert result.ok, result.content
    return f"The answer is {result.content}.", ep.calls_made


def _correct(answer_text: str, gold: float | str) -> bool:
    value = answer_text.removeprefix("The answer is ").rstrip(".")
    return value == gold if isinstance(gold, str) else float(value) == gold


@pytest.mark.parametrize("split", ["held-out", "ood"])
def test_oracle_solves_every_task(env: FinqaLiteEnv, split: str) -> None:
    tasks = env.tasks(split)

    async def run_all() -> list[tuple[str, int]]:
        return [await oracle(env, t) for t in tasks]

    results = asyncio.run(run_all())
    right: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for task, (text, calls) in zip(tasks, results, strict=True):
        level = task.data["level"]
        total[level] += 1
        right[level] += _correct(text, task.data["answer"])
        if level == 4:
            assert calls >= 4
    print(f"\noracle {split}: " + ", ".join(f"level {lv}: {right[lv]}/{total[lv]}" for lv in sorted(total)))
    assert sorted(total) == [1, 2, 3, 4]
    assert right == total


def test_budget_and_unknown_tool(env: FinqaLiteEnv) -> None:
    task = env.tasks("held-out")[0]
    assert task.data["level"] == 1
    ep = env.start(task)

    async def go() -> list:
        return [
            await ep.call_tool("frobnicate", {}),
            await ep.call_tool("calculate", {"expression": "1+1"}),
            await ep.call_tool("calculate", {"expression": "1+1"}),
        ]

    unknown, ok, over = asyncio.run(go())
    assert unknown.error_kind == "unknown_tool"
    assert ok.content == "2"
    assert over.error_kind == "budget" and "budget of 2 tool calls" in over.content


def test_few_shot_structure(env: FinqaLiteEnv) -> None:
    msgs = env.few_shot()
    # three worked examples for level 1, one for each other level
    assert sum(m.role == "user" for m in msgs) == 6
    finals = [m for m in msgs if m.role == "assistant" and not m.tool_calls]
    assert len(finals) == 6 and all(m.text().startswith("The answer is ") for m in finals)
    names = [m.tool_calls[0].function.name for m in msgs if m.tool_calls]
    # level 4 calculates each report's part, then their difference (`envs/finqa/expert.py`)
    assert names.count("calculate") == 8 and names.count("search") == 3 and names.count("open") == 3
    for call, result in itertools.pairwise(msgs):
        if call.tool_calls:
            assert result.role == "tool" and result.tool_call_id == call.tool_calls[0].id
            assert not result.text().startswith("Error")
    example_co = env.data.example_company.name
    assert example_co in msgs[0].text()
    level1 = FinqaLiteEnv(levels=(1,)).few_shot()
    call = level1[1].tool_calls[0].function
    # the figures are in the prompt at level 1, so the example computes in infix arithmetic
    assert call.name == "calculate" and json.loads(call.arguments)["expression"].startswith("(")
    tool_result, final = float(level1[2].text()), float(level1[3].text().removeprefix("The answer is ").rstrip("."))
    assert abs(tool_result - final) <= 1e-5 * max(1.0, abs(final))


def test_calculator_only_levels_offer_one_tool() -> None:
    env1 = FinqaLiteEnv(levels=(1, 2))
    assert [s["function"]["name"] for s in env1.tool_schemas()] == ["calculate"]
    task = env1.tasks("held-out")[0]
    result = asyncio.run(env1.start(task).call_tool("search", {"query": "x"}))
    assert result.error_kind == "unknown_tool"


def test_env_contract(env: FinqaLiteEnv) -> None:
    assert env.grader_spec() == {
        "type": "numeric",
        "name": "answer",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.answer }}",
        "rel_tol": 0.01,
    }
    ref = env.ref()
    assert ref.name == "finqa-lite" and len(ref.tool_schema_hash) == 16
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["search", "open", "calculate"]
    assert env.limits.max_tool_calls == 10 and FinqaLiteEnv(levels=1).limits.max_tool_calls == 2
    init = env.initial_messages(env.tasks("train")[0])
    assert init[0].role == "system" and "The answer is" in init[0].text() and init[-1].role == "user"

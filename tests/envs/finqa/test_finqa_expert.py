"""The finqa-lite expert (`Environment.expert()`): decisions from gold data and what the tools showed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrft.envs.finqa.curriculum import numbers_in
from agentrft.envs.finqa.env import EXAMPLE_TEMPLATES, FinqaLiteEnv
from agentrft.envs.finqa.expert import FinqaExpert, decomposes, plan_text, report_operands, report_programs
from agentrft.envs.finqa.program import execute_program
from agentrft.graders import load_grader
from agentrft.types import Message, Task, ToolCall, ToolCallFunction


@pytest.fixture(scope="module")
def env() -> FinqaLiteEnv:
    return FinqaLiteEnv(levels=(1, 2, 3, 4), seed=0)


def play(env: FinqaLiteEnv, task: Task, max_turns: int = 12) -> list[Message]:
    """The expert's turns against the env's real tools (no model, no tokenizer)."""
    expert = env.expert()
    episode = env.start(task)
    turns: list[Message] = []
    for _ in range(max_turns):
        msg = expert.next_turn(task, turns)
        turns.append(msg)
        if not msg.tool_calls:
            return turns
        for call in msg.tool_calls:
            result = asyncio.run(episode.call_tool(call.function.name, json.loads(call.function.arguments)))
            turns.append(Message(role="tool", tool_call_id=call.id, name=call.function.name, content=result.content))
    raise AssertionError(f"no answer in {max_turns} turns: {turns}")


def _calls(turns: list[Message]) -> list[tuple[str, dict[str, object]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for m in turns for c in m.tool_calls or []]


def test_the_expert_answers_every_train_task_right(env: FinqaLiteEnv) -> None:
    grader = load_grader(env.grader_spec())
    wrong: Counter[int] = Counter()
    for task in env.tasks("train"):
        answer = play(env, task)[-1].text()
        if not grader.grade({"output_text": answer}, task.data).success:
            wrong[task.data["level"]] += 1
    assert not wrong, wrong


def test_level_four_operands_are_split_by_report(env: FinqaLiteEnv) -> None:
    task = next(t for t in env.tasks("train") if t.data["level"] == 4 and t.data["template"] == "revenue_growth")
    # subtract(a, b), divide(#0, b), subtract(c, d), divide(#2, d), subtract(#1, #3)
    steps = [s.strip() for s in task.data["program"].replace("(", ",").replace(")", "").split(",")]
    a, b, c, d = float(steps[1]), float(steps[2]), float(steps[7]), float(steps[8])
    assert report_operands(task.data) == [{a, b}, {c, d}]


def test_level_four_parts_are_the_gold_program_halves(env: FinqaLiteEnv) -> None:
    tasks = [t for t in env.tasks("train") if t.data["level"] == 4]
    for task in tasks:
        first, second = report_programs(task.data)
        gold = execute_program(task.data["program"])
        assert isinstance(gold, float)
        parts = execute_program(first), execute_program(second)
        assert all(isinstance(p, float) for p in parts)
        assert parts[0] - parts[1] == pytest.approx(gold, rel=1e-4, abs=2e-5)  # each rounded to 5 decimals
    # the expert decomposes where the calculator's rounding keeps the answer, i.e. nearly everywhere
    assert sum(decomposes(t.data) for t in tasks) >= 0.95 * len(tasks)


def test_level_four_example_reads_like_the_expert(env: FinqaLiteEnv) -> None:
    four = FinqaLiteEnv(levels=(4,), seed=0)
    msgs = four.few_shot()
    names = [m.tool_calls[0].function.name for m in msgs if m.tool_calls]
    assert names == ["search", "open", "calculate", "search", "open", "calculate", "calculate"]
    results = [m.text() for m in msgs if m.role == "tool" and m.name == "calculate"]
    last_call = json.loads([m for m in msgs if m.tool_calls][-1].tool_calls[0].function.arguments)
    assert last_call == {"expression": f"subtract({results[0]}, {results[1]})"}
    assert msgs[-1].text() == f"The answer is {results[-1]}."


def _search_turn(query: str, result: str, n: int) -> list[Message]:
    call = ToolCall(id=f"c{n}", function=ToolCallFunction(name="search", arguments=json.dumps({"query": query})))
    return [
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", tool_call_id=f"c{n}", name="search", content=result),
    ]


def test_a_search_that_misses_is_retried_once_then_the_known_report_is_opened(env: FinqaLiteEnv) -> None:
    task = next(t for t in env.tasks("train") if t.data["level"] == 3)
    company, year, doc_id = task.data["company"], task.data["year"], task.data["doc_ids"][0]
    expert = FinqaExpert()
    miss = "1. doc_id=OTHER/2020/page_1.pdf | Other Co | 2020 | ..."
    turns = _search_turn(f"{company} {year}", miss, 1)
    assert _calls([expert.next_turn(task, turns)]) == [("search", {"query": f"{company} annual report {year}"})]
    turns += _search_turn(f"{company} annual report {year}", miss, 2)
    assert _calls([expert.next_turn(task, turns)]) == [("open", {"doc_id": doc_id})]
    # a hit opens the listed report at once
    hit = _search_turn(f"{company} {year}", f"1. doc_id={doc_id} | {company} | {year} | ...", 1)
    assert _calls([expert.next_turn(task, hit)]) == [("open", {"doc_id": doc_id})]


def test_a_figure_on_a_later_page_is_read_there(env: FinqaLiteEnv) -> None:
    small = FinqaLiteEnv(levels=(3,), seed=0, page_chars=400)
    pages_opened = Counter()
    for task in small.tasks("train")[:60]:
        turns = play(small, task)
        opens = [args for name, args in _calls(turns) if name == "open"]
        pages_opened[len(opens)] += 1
        shown = set().union(*(numbers_in(m.text()) for m in turns if m.role == "tool" and m.name == "open"))
        assert report_operands(task.data)[0] <= shown, task.id
        assert turns[-1].text() == f"The answer is {turns[-2].text()}."
    assert max(pages_opened) >= 2  # some figures were past page 1 and the expert turned the page


@pytest.mark.parametrize("level", [3, 4])
def test_worked_examples_open_with_the_plan_like_the_expert(level: int) -> None:
    one = FinqaLiteEnv(levels=(level,), seed=0)
    calls = [m for m in one.few_shot() if m.tool_calls]
    example = one.data.example_task(level, EXAMPLE_TEMPLATES[level][0])
    assert calls[0].content == plan_text(example.data)
    assert calls[0].content.startswith("I need one report: " if level == 3 else "I need two reports: ")
    assert not any(m.content for m in calls[1:])

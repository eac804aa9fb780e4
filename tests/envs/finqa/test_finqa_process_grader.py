"""`finqa_process`: per-turn rewards hand-checked on stored trajectories played through the agent loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentrft.envs.base import EnvLimits
from agentrft.envs.finqa.env import FinqaLiteEnv
from agentrft.envs.finqa.expert import report_programs
from agentrft.envs.finqa.process_grader import expression_figures
from agentrft.graders import grade_trajectory, load_grader
from agentrft.graders.base import GraderSpecError, Sample
from agentrft.rollout.agent import run_episode
from agentrft.samplers.base import SamplingParams
from agentrft.samplers.oracle import OracleSampler
from agentrft.samplers.policies import load_tokenizer
from agentrft.store import Store
from agentrft.types import Message, Task, Trajectory

PROCESS = {"type": "finqa_process"}
LIMITS = EnvLimits(max_turns=10, max_tokens_per_turn=128, max_total_tokens=8192, max_tool_calls=10)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def env() -> FinqaLiteEnv:
    return FinqaLiteEnv(levels=(1, 2, 3, 4), seed=0, limits=LIMITS)


class Script:
    """An `Expert` that writes the given texts, one per turn, whatever the tools return."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def next_turn(self, task: Task, turns: list[Message]) -> Message:
        return Message(role="assistant", content=self.texts[sum(m.role == "assistant" for m in turns)])


def play_and_store(env: FinqaLiteEnv, sampler: OracleSampler, task: Task, db: Path) -> Trajectory:
    params = SamplingParams(temperature=0.0, max_tokens=LIMITS.max_tokens_per_turn)
    traj = asyncio.run(run_episode(env, sampler, task, params=params))
    store = Store(db)
    try:
        store.add_trajectory(traj)
        return store.get_trajectory(traj.id)
    finally:
        store.close()


def _task(env: FinqaLiteEnv, level: int, template: str = "revenue_growth") -> Task:
    return next(t for t in env.tasks("train") if t.data["level"] == level and t.data["template"] == template)


def _turns_in_record(traj: Trajectory) -> int:
    assert traj.tokens is not None
    return len({k for k, m in zip(traj.tokens.turn, traj.tokens.loss_mask, strict=True) if m})


# level 4: search, open and calculate the first report's part (half the gold figures), the same for the
# second, then the difference of the two results (no gold figure), then the answer
@pytest.mark.parametrize(
    ("level", "expected"),
    [(1, [1.0, 0.0]), (3, [1.0, 1.0, 1.0, 0.0]), (4, [1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0])],
)
def test_an_oracle_episode_earns_every_milestone_once(env, tokenizer, tmp_path, level, expected) -> None:
    task = _task(env, level)
    traj = play_and_store(env, OracleSampler(env.expert(), tokenizer), task, tmp_path / "s.db")
    grade = grade_trajectory(load_grader(PROCESS), traj, task.data)
    assert grade.turn_rewards == pytest.approx(expected, abs=1e-12)
    assert grade.reward == pytest.approx(1.0, abs=1e-12) and grade.success
    assert _turns_in_record(traj) == len(expected)  # one reward per assistant turn of the token record


def test_wrong_calls_are_hand_checked_turn_by_turn(env, tokenizer, tmp_path) -> None:
    task = _task(env, 3)  # revenue_growth: subtract(a, b), divide(#0, b); gold figures {a, b}
    d = task.data
    a = d["program"].split("(")[1].split(",")[0]
    other = next(t for t in env.tasks("train") if t.data["company"] != d["company"])
    gold_query = json.dumps({"query": f"{d['company']} {d['year']}"})
    texts = [
        '<open>{"doc_id": </open>',  # malformed: -1
        f'<search>{{"query": "{other.data["company"]} {other.data["year"]}"}}</search>',  # lists other reports: 0
        '<open>{"doc_id": "NOPE/2020/page_1.pdf"}</open>',  # no such document: tool error -0.5
        f"<search>{gold_query}</search>",  # lists the gold report: +1
        f"<search>{gold_query}</search>",  # again: 0
        f'<open>{{"doc_id": "{d["doc_ids"][0]}"}}</open>',  # both gold figures shown: +1
        f'<open>{{"doc_id": "{d["doc_ids"][0]}"}}</open>',  # again: 0
        f"<calculate>{a} / 7</calculate>",  # one of the two gold figures: +0.5
        f"<calculate>{d['program']}</calculate>",  # both: +0.5 more
        "The answer is 1.",  # answer turn: 0
    ]
    traj = play_and_store(env, OracleSampler(Script(texts), tokenizer), task, tmp_path / "s.db")
    assert traj.status == "completed" and traj.num_turns == 10
    assert f"doc_id={d['doc_ids'][0]} " not in (traj.tool_calls[1].result or "")
    assert [e.error_kind for e in traj.tool_calls[:3]] == ["malformed", None, "exception"]
    grade = grade_trajectory(load_grader(PROCESS), traj, task.data)
    assert grade.turn_rewards == pytest.approx([-1.0, 0.0, -0.5, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.0], abs=1e-12)
    assert grade.reward == pytest.approx(1.5 / 3, abs=1e-15) and not grade.success
    assert _turns_in_record(traj) == 10
    # beside the outcome grader in multi: the outcome (wrong answer: 0) plus a share of the process reward
    multi = {
        "type": "multi",
        "graders": {"answer": env.grader_spec(), "process": {**PROCESS, "malformed": -2.0}},
        "calculate_output": "answer + 0.1 * process",
    }
    combined = grade_trajectory(load_grader(multi), traj, task.data)
    assert combined.turn_rewards == [-2.0, 0.0, -0.5, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.0]
    assert combined.reward == pytest.approx(0.1 * 0.5 / 3, abs=1e-15)
    assert combined.sub_rewards == {"answer": 0.0, "process": pytest.approx(0.5 / 3, abs=1e-15)}


def test_answer_when_done_pays_the_answer_after_every_milestone_and_not_before(env, tokenizer, tmp_path) -> None:
    spec = {**PROCESS, "answer_when_done": 1.0}
    # the expert's level-3 episode: search, open, calculate (each +1), then the answer: +1 (every milestone reached)
    l3 = _task(env, 3)
    traj = play_and_store(env, OracleSampler(env.expert(), tokenizer), l3, tmp_path / "a.db")
    grade = grade_trajectory(load_grader(spec), traj, l3.data)
    assert grade.turn_rewards == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=1e-12)
    assert grade.reward == pytest.approx(1.0, abs=1e-12)  # the total counts the answer's milestone too
    # the expert's level-4 episode answers after the difference, its last call: +1 there
    l4 = _task(env, 4)
    traj = play_and_store(env, OracleSampler(env.expert(), tokenizer), l4, tmp_path / "b.db")
    grade = grade_trajectory(load_grader(spec), traj, l4.data)
    assert grade.turn_rewards == pytest.approx([1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 0.0, 1.0], abs=1e-12)
    # a level-4 episode that answers after the first report's part (level 3's pattern): its answer earns nothing
    d = l4.data
    first, _ = report_programs(d)
    company, year = d["companies"][0], d["years"][0]
    texts = [
        f'<search>{{"query": "{company} {year}"}}</search>',  # lists the first gold report: +1
        f'<open>{{"doc_id": "{d["doc_ids"][0]}"}}</open>',  # its figures: +1
        f"<calculate>{first}</calculate>",  # half the gold figures: +0.5
        "The answer is 1.",  # not done (the second report is never reached): 0
    ]
    traj = play_and_store(env, OracleSampler(Script(texts), tokenizer), l4, tmp_path / "c.db")
    grade = grade_trajectory(load_grader(spec), traj, d)
    assert grade.turn_rewards == pytest.approx([1.0, 1.0, 0.5, 0.0], abs=1e-12)
    assert grade.reward == pytest.approx(2.5 / 6, abs=1e-12)  # 2 x (1 + 1) + 1 + 1


def test_done_needs_result_pays_the_answer_after_the_gold_number_not_after_half_a_program(
    env, tokenizer, tmp_path
) -> None:
    task = _task(env, 3)  # revenue_growth: subtract(a, b), divide(#0, b)
    d = task.data
    half = d["program"].split("), ")[0] + ")"  # subtract(a, b): both gold figures, not the answer
    search = f'<search>{{"query": "{d["company"]} {d["year"]}"}}</search>'
    opened = f'<open>{{"doc_id": "{d["doc_ids"][0]}"}}</open>'
    spec = {**PROCESS, "answer_when_done": 1.0}
    strict = {**spec, "done_needs_result": True}
    for calc, paid_then, paid_strictly in [(half, 1.0, 0.0), (d["program"], 1.0, 1.0)]:
        texts = [search, opened, f"<calculate>{calc}</calculate>", "The answer is 1."]
        traj = play_and_store(env, OracleSampler(Script(texts), tokenizer), task, tmp_path / f"{len(calc)}.db")
        assert [e.error for e in traj.tool_calls] == [None, None, None]
        assert grade_trajectory(load_grader(spec), traj, d).turn_rewards == pytest.approx(
            [1.0, 1.0, 1.0, paid_then], abs=1e-12
        )
        assert grade_trajectory(load_grader(strict), traj, d).turn_rewards == pytest.approx(
            [1.0, 1.0, 1.0, paid_strictly], abs=1e-12
        )
    # level 4's expert reaches the answer with its last calculation (the difference): still every milestone
    l4 = _task(env, 4)
    traj = play_and_store(env, OracleSampler(env.expert(), tokenizer), l4, tmp_path / "l4.db")
    assert grade_trajectory(load_grader(strict), traj, l4.data).reward == pytest.approx(1.0, abs=1e-12)


def test_a_gold_figure_pays_once_whichever_calculation_writes_it(env, tokenizer, tmp_path) -> None:
    task = _task(env, 4)  # subtract(a, b), divide(#0, b), subtract(c, d), divide(#2, d), subtract(#1, #3)
    first, second = report_programs(task.data)
    texts = [
        f"<calculate>{first}</calculate>",  # a and b: half the gold figures, +0.5
        f"<calculate>{first}</calculate>",  # again: 0
        f"<calculate>{task.data['program']}</calculate>",  # all four, c and d new: +0.5
        f"<calculate>{second}</calculate>",  # c and d again: 0
        "The answer is 1.",
    ]
    traj = play_and_store(env, OracleSampler(Script(texts), tokenizer), task, tmp_path / "s.db")
    grade = grade_trajectory(load_grader(PROCESS), traj, task.data)
    assert grade.turn_rewards == pytest.approx([0.5, 0.0, 0.5, 0.0, 0.0], abs=1e-12)
    score = load_grader(PROCESS).grade(Sample.from_trajectory(traj), task.data)
    assert score.metadata["milestones"]["calculated_share"] == pytest.approx(1.0, abs=1e-12)


def test_a_later_page_earns_its_share_of_the_open(env, tokenizer, tmp_path) -> None:
    small = FinqaLiteEnv(levels=(3,), seed=0, page_chars=400, limits=LIMITS)
    grader = load_grader(PROCESS)
    for task in small.tasks("train")[:60]:
        traj = play_and_store(small, OracleSampler(small.expert(), tokenizer), task, tmp_path / f"{task.id}.db")
        opens = [k for k, e in enumerate(traj.tool_calls) if e.name == "open"]
        if len(opens) < 2:
            continue
        grade = grade_trajectory(grader, traj, task.data)
        assert grade.turn_rewards is not None and grade.reward == pytest.approx(1.0, abs=1e-12)
        shares = [grade.turn_rewards[traj.tool_calls[k].turn] for k in opens]
        assert sum(shares) == pytest.approx(1.0, abs=1e-12) and all(0 <= s < 1 for s in shares)
        return
    pytest.fail("no task needed a second page at page_chars=400")


def test_figures_of_an_expression_leave_out_step_references_and_constants() -> None:
    assert expression_figures("add(5,829, 12), divide(#1, const_3)") == {5829.0, 12.0}
    assert expression_figures("(94 - 3.5) / 7%") == {94.0, 3.5, 7.0}


def test_a_plain_sample_or_a_foreign_item_is_flagged_not_zero(env) -> None:
    grader = load_grader(PROCESS)
    g = grader.grade({"output_text": "The answer is 1."}, _task(env, 1).data)
    assert [e.flag for e in g.errors or []] == ["sample_parse_error"]
    traj = Trajectory(messages=[Message(role="user", content="q"), Message(role="assistant", content="1")])
    traj.n_prompt_messages = 1
    g = grade_trajectory(grader, traj, {"answer": 1.0})
    assert [e.flag for e in g.errors or []] == ["invalid_variable_error"]


def test_spec_fields_are_checked() -> None:
    with pytest.raises(GraderSpecError, match="malformed"):
        load_grader({**PROCESS, "malformed": 1.0})
    with pytest.raises(GraderSpecError, match="unknown field"):
        load_grader({**PROCESS, "bonus": 1.0})

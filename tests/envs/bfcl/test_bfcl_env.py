"""BFCL through agentrft equals BFCL scored by its own package: each stored output (ground truth, wrong variants,
SmolLM2-135M's recorded episodes) is played through the agent loop by a scripted endpoint, graded by the `bfcl`
grader, and compared with the verdict of the package's own file runners on the same output."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrft.envs import make_env
from agentrft.envs.bfcl import package
from agentrft.envs.bfcl.env import BfclEnv, held_out
from agentrft.envs.bfcl.grader import model_result
from agentrft.graders import load_grader
from agentrft.inputs import InputError
from agentrft.rollout.agent import run_episode
from agentrft.samplers.base import ChatResult, SamplingParams
from agentrft.tools.base import ToolResult
from agentrft.types import Task

OUTPUTS = json.loads(Path(__file__).with_name("bfcl_outputs.json").read_text())
PARAMS = SamplingParams(temperature=1.0, max_tokens=256)


class ReplayChat:
    """Replies with a stored output's steps in order: calls as tool_calls, text as content."""

    policy, policy_version = "stored", 0

    def __init__(self, steps: list[Any], truncated: bool = False) -> None:
        self.steps, self.truncated = list(steps), truncated

    async def chat(self, messages: Any, tools: Any, params: Any) -> ChatResult:
        if not self.steps:
            raise RuntimeError("the stored output has no more steps")
        step = self.steps.pop(0)
        if isinstance(step, str):  # a recorded reply cut by its token limit ends the episode where it ended
            return ChatResult(
                {"role": "assistant", "content": step}, "length" if self.truncated and not self.steps else "stop"
            )
        calls = [
            {"id": f"c{uuid.uuid4().hex[:8]}", "type": "function", "function": {"name": name, "arguments": raw}}
            for call in step
            for name, raw in call.items()
        ]
        return ChatResult({"role": "assistant", "content": None, "tool_calls": calls}, "stop")


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    categories = sorted({o["category"] for o in OUTPUTS})
    env = make_env("bfcl:" + ",".join(categories))
    return {t.id: t for split in ("train", "held-out") for t in env.tasks(split)}


def official_verdict(output: dict[str, Any], task: Task, score_dir: Path) -> bool:
    """The package's own file runner on one output (the path `bfcl evaluate` takes), its accuracy as a verdict."""
    b = package.bfcl()
    category, entry, truth = output["category"], json.loads(json.dumps(task.data["bfcl"])), task.data["truth"]
    results = [{"id": output["id"], "result": output["result"]}]
    if category in package.MULTI_TURN:
        name = f"official_{uuid.uuid4().hex}"
        try:
            accuracy, _ = b.runner.multi_turn_runner(b.handler, results, [entry], [truth], name, category, score_dir)
        finally:
            package.release(name)
    elif truth is None:
        accuracy, _ = b.runner.relevance_file_runner(
            b.handler, results, [entry], package.CHECKER_MODEL, category, score_dir
        )
    else:
        accuracy, _ = b.runner.ast_file_runner(
            b.handler, results, [entry], [truth], category, package.CHECKER_MODEL, score_dir
        )
    return accuracy == 1


def play(output: dict[str, Any], task: Task) -> Any:
    env = BfclEnv([output["category"]])
    result = output["result"]
    steps = [s for turn in result for s in turn] if output["category"] in package.MULTI_TURN else [result]
    return asyncio.run(run_episode(env, ReplayChat(steps, output.get("truncated", False)), task, params=PARAMS))


def test_the_stored_outputs_cover_enough_tasks_and_categories() -> None:
    assert len({o["id"] for o in OUTPUTS}) >= 30
    assert {o["category"] for o in OUTPUTS} >= {
        *package.MULTI_TURN,
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "irrelevance",
    }


@pytest.mark.parametrize("output", OUTPUTS, ids=[f"{o['id']}-{o['kind']}-{i}" for i, o in enumerate(OUTPUTS)])
def test_agentrfts_grade_equals_the_packages_verdict(
    output: dict[str, Any], tasks: dict[str, Task], tmp_path: Path
) -> None:
    task = tasks[output["id"]]
    traj = play(output, task)
    recorded = model_result(traj, task.data)
    if output["kind"] == "missing_turn":  # the episode served the next user turn before its endpoint ran dry:
        assert traj.status == "error" and recorded == [*output["result"], []]  # a turn begun and cut off, as the
    else:  # benchmark's inference records a force-quit turn
        assert recorded == output["result"]  # the episode is recorded as the handler records it
    grade = load_grader({"type": "bfcl"}).grade(traj, task.data)
    assert not grade.errors
    assert grade.success is official_verdict(output, task, tmp_path)
    if output["kind"] == "truth":
        assert grade.success  # the ground truth passes, as a sanity check of the replay itself


def test_multi_turn_tools_run_on_the_benchmarks_state_and_turns_follow_replies(tasks: dict[str, Task]) -> None:
    output = next(o for o in OUTPUTS if o["category"] == "multi_turn_base" and o["kind"] == "truth")
    traj = play(output, tasks[output["id"]])
    assert traj.status == "completed"
    users = [m for m in traj.messages[traj.n_prompt_messages :] if m.role == "user"]
    assert len(users) == len(output["result"]) - 1  # the first user turn is the prompt's
    assert all(e.error is None for e in traj.tool_calls)
    assert traj.metadata["env"] == {"user_turns_served": len(output["result"]), "user_turns": len(output["result"])}


def test_miss_func_offers_the_held_out_functions_at_their_turn(tasks: dict[str, Task]) -> None:
    output = next(o for o in OUTPUTS if o["category"] == "multi_turn_miss_func" and o["kind"] == "truth")
    task = tasks[output["id"]]
    ((turn, missed),) = task.data["bfcl"]["missed_function"].items()
    names = {f["name"] for f in missed}
    offered = {s["function"]["name"] for s in BfclEnv(["miss_func"]).task_tool_schemas(task)}
    assert not names & offered
    traj = play(output, task)
    users = [m for m in traj.messages[traj.n_prompt_messages :] if m.role == "user"]
    assert all(n in users[int(turn) - 1].text() for n in names)


def test_unsafe_calls_are_refused_not_evaluated(tasks: dict[str, Task]) -> None:
    task = next(t for t in tasks.values() if t.data["category"] == "multi_turn_base")
    episode = BfclEnv(["multi_turn_base"]).start(task)
    evil = {"a=1) or __import__('os').getpid() or (": 1}
    result = asyncio.run(episode.call_tool("ls", evil))
    assert result.error_kind == "bad_arguments"
    result = asyncio.run(episode.call_tool("__import__", {}))
    assert result.error_kind == "unknown_tool"
    episode.close()


def test_the_split_is_fixed_by_task_id() -> None:
    env = make_env("bfcl:simple")
    held = env.tasks("held-out")
    assert held and all(held_out(t.id) for t in held) and not any(held_out(t.id) for t in env.tasks("train"))
    assert 0.15 < len(held) / (len(held) + len(env.tasks("train"))) < 0.35


def test_an_unknown_category_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(InputError, match="unknown BFCL category 'nope'.*multi_turn_base"):
        make_env("bfcl:nope")


def test_a_worked_example_is_in_the_prompt_only_when_asked_for_and_never_graded(tasks: dict[str, Task]) -> None:
    output = next(o for o in OUTPUTS if o["category"] == "simple_python" and o["kind"] == "truth")
    task = tasks[output["id"]]
    assert BfclEnv(["simple"]).few_shot() == [] and make_env("bfcl:simple").few_shot() == []
    env = make_env("bfcl:simple?shots=3")
    opening = env.initial_messages(task)
    # single-turn: each example is a question and its call, the whole answer of such a task
    assert [m.role for m in opening] == ["system", *(["user", "assistant"] * 3), "user"]
    names = {m.tool_calls[0].function.name for m in opening if m.tool_calls}
    offered = {
        f["name"]
        for category in package.SINGLE_TURN + package.MULTI_TURN
        if not category.startswith("live_")
        for entry, _ in package.load_category(category)
        for f in entry["function"]
    }
    assert len(names) == 3 and not names & offered
    traj = asyncio.run(run_episode(env, ReplayChat([output["result"]]), task, params=PARAMS))
    assert model_result(traj, task.data) == output["result"]
    assert load_grader({"type": "bfcl"}).grade(traj, task.data).success
    multi = next(t for t in tasks.values() if t.data["category"] == "multi_turn_base")
    roles = [m.role for m in make_env("bfcl:multi_turn_base?shots=1").initial_messages(multi)]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    with pytest.raises(InputError, match="shots must be 0 to 3"):
        make_env("bfcl:simple?shots=4")


def test_a_single_turn_call_is_refused_when_its_arguments_do_not_fit(tasks: dict[str, Task]) -> None:
    task = next(t for t in tasks.values() if t.data["category"] == "simple_python")
    (fn,) = task.data["bfcl"]["function"]
    name, required = fn["name"].replace(".", "_"), fn["parameters"]["required"]
    params = list(fn["parameters"]["properties"])

    def result(arguments: dict[str, Any] | str, called: str = name) -> ToolResult:
        return asyncio.run(BfclEnv(["simple"]).start(task).call_tool(called, arguments))

    assert result(dict.fromkeys(required, 1)).error is None
    assert result(dict.fromkeys(params, 1)).error is None
    assert result({**dict.fromkeys(required, 1), "not_a_param": 1}).error_kind == "bad_arguments"
    assert result(dict.fromkeys(required[1:], 1)).error_kind == "bad_arguments"
    assert result("5").error_kind == "bad_arguments"
    assert result({}, called="nope").error_kind == "unknown_tool"


def test_the_xml_format_reads_calls_to_functions_miss_func_announces_later(tasks: dict[str, Task]) -> None:
    from agentrft.rollout.formats import make_format

    task = next(t for t in tasks.values() if t.data["category"] == "multi_turn_miss_func")
    env = BfclEnv(["miss_func"])
    ((_, missed),) = task.data["bfcl"]["missed_function"].items()
    name = missed[0]["name"]
    assert name not in {s["function"]["name"] for s in env.task_tool_schemas(task)}
    parsed = make_format("xml", env.task_parse_schemas(task)).parse(f"<{name}>{{}}</{name}>")
    assert [c.function.name for c in parsed.tool_calls] == [name]


def test_partial_credit_follows_the_checkers_order_and_success_stays_the_verdict(tasks: dict[str, Task]) -> None:
    output = next(o for o in OUTPUTS if o["category"] == "simple_python" and o["kind"] == "truth")
    task = tasks[output["id"]]
    ((name, raw),) = output["result"][0].items()
    right = json.loads(raw)
    key = next(k for k, v in right.items() if isinstance(v, str | int | float) and not isinstance(v, bool))
    required = task.data["bfcl"]["function"][0]["parameters"]["required"]
    wrong_type = [1.5] if not isinstance(right[key], list) else "x"
    wrong_value = right[key] + "zz" if isinstance(right[key], str) else right[key] + 7
    cases = {
        "right": ({name: raw}, 1.0),
        "wrong name": ({name + "_x": raw}, 0.0),
        "missing required": ({name: json.dumps({k: v for k, v in right.items() if k != required[0]})}, 0.1),
        "unexpected param": ({name: json.dumps({**right, "not_a_param": 1})}, 0.1),
        "wrong type": ({name: json.dumps({**right, key: wrong_type})}, 0.2),
        "wrong value": ({name: json.dumps({**right, key: wrong_value})}, 0.3),
    }
    plain, partial = load_grader({"type": "bfcl"}), load_grader({"type": "bfcl", "partial": True})
    for case, (call, credit) in cases.items():
        traj = asyncio.run(run_episode(BfclEnv(["simple"]), ReplayChat([[call]]), task, params=PARAMS))
        got, official = partial.grade(traj, task.data), plain.grade(traj, task.data)
        assert got.reward == pytest.approx(credit), (case, got)
        assert got.success is official.success is (credit == 1.0), case
        assert official.reward == pytest.approx(1.0 if credit == 1.0 else 0.0), case

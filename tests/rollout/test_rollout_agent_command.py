"""An agent program as the policy's client (`rollout/agent_command.py`): the example agent (plain `openai`
client, its own tool loop) becomes a graded episode with its tool calls and stitched tokens; a command that
crashes, exits non-zero or hangs is an episode error, never a reward to train on."""

from __future__ import annotations

import asyncio
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from rollout_fakes import FakeEnv, FakeSampler, task

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from agentrft.graders import load_grader
from agentrft.rollout.agent_command import AgentCommandConfig, CommandAgent, read_answer, task_payload
from agentrft.rollout.runner import Runner
from agentrft.rollout.serve_request import ServeLimits
from agentrft.samplers.base import SamplingParams
from agentrft.types import Trajectory

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "agent.py"


def command(script: Path) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def play(
    cmd: str, sampler: FakeSampler, samples: int = 1, limits: ServeLimits | None = None, **agent_kw: object
) -> list[Trajectory]:
    env = FakeEnv()
    agent = CommandAgent(
        AgentCommandConfig(command=cmd, **agent_kw),  # type: ignore[arg-type]
        env,
        sampler,
        params=SamplingParams(temperature=0.7, max_tokens=64),
        limits=limits,
    )
    runner = Runner(env, sampler, grader=load_grader(env.grader_spec()), progress=False, player=agent)
    return asyncio.run(runner.run([task()], samples, run_id="run-1", policy_version=3))


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_the_example_openai_agent_is_one_graded_episode_with_its_tool_calls() -> None:
    pytest.importorskip("openai")
    sampler = FakeSampler(["<calculate>5829 - 5735</calculate>", "The answer is 94"])
    (traj,) = play(command(EXAMPLE), sampler)
    assert traj.status == "completed", traj.error
    assert traj.final_answer == "The answer is 94"
    assert traj.grade is not None and traj.grade.success and traj.untrainable_reason() is None
    assert [(e.name, e.arguments, e.result) for e in traj.tool_calls] == [
        ("calculate", {"expression": "5829 - 5735"}, "94")
    ]
    assert traj.run_id == "run-1" and traj.task_id == "t0" and traj.env.name == "fake-env"
    assert traj.metadata["request_kinds"] == ["first", "reuse"]
    # token-exact: the record is the second prompt the sampler consumed, then what it sampled
    assert traj.tokens is not None and traj.tokens.ids == sampler.prompts[1] + sampler.results[1].token_ids
    # the run's distribution, whatever the agent asked for (its temperature, its 128 max_tokens)
    assert {(r.params.temperature, r.params.max_tokens) for r in sampler.requests} == {(0.7, 64)}


def test_a_crashing_agent_command_is_an_episode_error_not_a_reward(tmp_path: Path) -> None:
    crash = script(
        tmp_path,
        "crash.py",
        """
        import json, os, sys, httpx
        task = json.load(sys.stdin)
        assert "answer" not in task["item"]  # the reference answer is withheld
        base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
        r = httpx.post(base + "/chat/completions", headers={"Authorization": "Bearer " + key},
                       json={"model": "m", "messages": task["messages"]}, timeout=30)
        r.raise_for_status()
        raise RuntimeError("agent bug after one model call")
        """,
    )
    sampler = FakeSampler(["thinking", "thinking"])
    trajs = play(command(crash), sampler, samples=2)
    assert len(trajs) == 2 and len({t.group_id for t in trajs}) == 1
    for traj in trajs:
        assert traj.status == "error"
        assert traj.error is not None and "exited with code 1" in traj.error and "agent bug" in traj.error
        assert traj.untrainable_reason() == "episode_error"  # excluded from training, never a reward of 0
        assert traj.final_answer is None and traj.tokens is not None  # what it sampled is still recorded


def test_timeouts_signals_and_a_missing_program_are_episode_errors(tmp_path: Path) -> None:
    hang = script(tmp_path, "hang.py", "import time\ntime.sleep(60)\n")
    (traj,) = play(command(hang), FakeSampler([]), timeout_s=1.0)
    assert traj.status == "error" and traj.error == "agent command timed out after 1 s"
    assert traj.tokens is None and traj.untrainable_reason() == "episode_error"
    killed = script(tmp_path, "killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (traj,) = play(command(killed), FakeSampler([]))
    assert traj.error == "agent command was killed by signal SIGKILL"
    missing = AgentCommandConfig(command="no-such-agent-program --flag")
    assert missing.missing_program() == "no-such-agent-program: not found on PATH"
    (traj,) = play(missing.command, FakeSampler([]))
    assert traj.status == "error" and traj.error is not None and "could not start" in traj.error
    with pytest.raises(ValueError, match="cannot split"):
        AgentCommandConfig(command="python 'unclosed")


def test_the_answer_file_wins_over_stdout(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "file.py",
        """
        import json, os
        print("a log line on stdout")
        with open(os.environ["AGENTRFT_ANSWER_FILE"], "w") as f:
            json.dump({"answer": 94}, f)
        """,
    )
    (traj,) = play(command(agent), FakeSampler([]))
    assert traj.status == "completed" and traj.final_answer == "94"
    assert traj.grade is not None and traj.grade.success and traj.untrainable_reason() == "no_tokens"
    assert read_answer(tmp_path / "absent.json", b"  42\n") == "42"


def test_the_task_payload_withholds_the_reference() -> None:
    t = task()
    payload = task_payload(t, ["answer"])
    assert payload == {
        "task_id": "t0",
        "question": "What is 5829 minus 5735?",
        "messages": [{"role": "user", "content": "What is 5829 minus 5735?"}],
        "item": {},
    }


def _two_episodes_under_one_open_session(tmp_path: Path, calls: int) -> list[Trajectory]:
    """Two episodes at once under a bound of one open session, each calling the model ``calls`` times; the first
    call of each waits until both have made it, so the second one's first call has evicted the first's session."""
    called = tmp_path / "called"
    called.mkdir()
    both = script(
        tmp_path,
        "both.py",
        f"""
        import json, os, sys, time, httpx
        task = json.load(sys.stdin)
        base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
        for n in range({calls}):
            r = httpx.post(base + "/chat/completions", headers={{"Authorization": "Bearer " + key}},
                           json={{"model": "m", "messages": task["messages"]}}, timeout=30)
            r.raise_for_status()
            if n == 0:
                open(os.path.join({str(called)!r}, os.environ["AGENTRFT_SESSION_ID"]), "w").close()
                while len(os.listdir({str(called)!r})) < 2:  # both have called the model once
                    time.sleep(0.05)
        print("The answer is 94")
        """,
    )
    sampler = FakeSampler(["The answer is 94"] * 2 * calls)
    return play(command(both), sampler, samples=2, max_concurrency=2, limits=ServeLimits(max_sessions=1))


def test_a_session_evicted_mid_episode_is_an_error_that_keeps_its_calls(tmp_path: Path) -> None:
    trajs = _two_episodes_under_one_open_session(tmp_path, calls=1)
    evicted = [t for t in trajs if t.status == "error"]
    assert len(evicted) == 1 and "session evicted: the bound of 1 open sessions was reached" in str(evicted[0].error)
    assert evicted[0].untrainable_reason() == "episode_error"
    assert evicted[0].tokens is not None and len(evicted[0].metadata["request_kinds"]) == 1  # its call is kept
    (kept,) = [t for t in trajs if t.status != "error"]
    assert kept.final_answer == "The answer is 94"


def test_calls_after_an_eviction_join_the_evicted_calls_and_the_episode_stays_an_error(tmp_path: Path) -> None:
    """The evicted episode's second call opens its session again (which may evict the other's in turn, or not,
    if the other has finished by then): an episode evicted at any point is an error, and every record holds both
    of its episode's calls."""
    trajs = _two_episodes_under_one_open_session(tmp_path, calls=2)
    errors = [t for t in trajs if t.status == "error"]
    assert 1 <= len(errors) <= 2
    assert all("session evicted: the bound of 1 open sessions was reached" in str(t.error) for t in errors)
    assert all(t.final_answer == "The answer is 94" for t in trajs if t not in errors)
    for traj in trajs:
        assert len(traj.metadata["request_kinds"]) == 2 and traj.tokens is not None, traj.metadata

"""The environment plugin API: `module:Class` and entry points resolve through one path (finqa-lite included),
a Gymnasium-style text env plays multi-turn episodes graded by its own reward, and a user's env trains."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agentrft.envs import make_env
from agentrft.envs.gym_text import GymTextEnv
from agentrft.envs.plugins import BUILTIN
from agentrft.graders import load_grader
from agentrft.graders.registry import PLUGIN_BUILTIN
from agentrft.inputs import InputError
from agentrft.rollout.agent import run_episode
from agentrft.samplers.base import ChatResult, SamplingParams

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
PARAMS = SamplingParams(temperature=1.0, max_tokens=16)


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


class ScriptedChat:
    """A chat endpoint that replies with the given assistant messages in order."""

    policy, policy_version = "scripted", 0

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    async def chat(self, messages: list[dict[str, Any]], tools: Any, params: Any) -> ChatResult:
        self.seen.append(messages)
        return ChatResult({"role": "assistant", **self.replies.pop(0)}, "stop", 1, 1)


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def test_pyproject_declares_every_builtin_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]
    assert points["agentrft.envs"] == BUILTIN
    assert {k: v.partition(":")[0] for k, v in points["agentrft.graders"].items()} == PLUGIN_BUILTIN


def test_module_class_spec_builds_a_text_env_with_its_options(on_path: None) -> None:
    env = make_env("guess_env:GuessEnv?size=16&train=5&test=3")
    assert isinstance(env, GymTextEnv) and env.name == "guess"
    train, held_out = env.tasks("train"), env.tasks("held-out")
    assert len(train) == 5 and len(held_out) == 3 and not {t.id for t in train} & {t.id for t in held_out}
    assert train[0].messages[0].content == "I picked a number from 1 to 16. What is it?"
    (schema,) = env.tool_schemas()
    assert schema["function"]["name"] == "compare"
    assert schema["function"]["parameters"]["properties"]["number"]["type"] == "integer"
    assert env.limits.max_turns == 4 and env.grader_spec()["type"] == "env_reward"


def test_a_text_env_episode_steps_on_replies_and_its_reward_is_the_grade(on_path: None) -> None:
    env = make_env("guess_env:GuessEnv?size=8")
    task = env.tasks("train")[0]
    secret = env.start(task).instance.secret  # type: ignore[attr-defined]
    low = 1 if secret > 1 else 2
    chat = ScriptedChat(
        [_call("compare", f'{{"number": {low}}}'), {"content": str(low)}, {"content": f"It is {secret}"}]
        if low != secret
        else [{"content": str(secret)}]
    )
    traj = asyncio.run(run_episode(env, chat, task, params=PARAMS))
    assert traj.status == "completed" and traj.final_answer == f"It is {secret}"
    assert traj.metadata["env"]["reward"] == pytest.approx(1.0) and traj.metadata["env"]["terminated"] is True
    assert [m.role for m in traj.messages[traj.n_prompt_messages :]] == [
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert traj.messages[-2].content in ("Higher.", "Lower.")
    assert traj.tool_calls[0].result in ("above", "below")
    grade = load_grader(env.grader_spec()).grade(traj, task.data)
    assert grade.reward == pytest.approx(1.0) and grade.success


def test_an_episode_cut_off_before_the_env_ends_keeps_the_reward_so_far(on_path: None) -> None:
    env = make_env("guess_env:GuessEnv?size=8")
    task = env.tasks("train")[0]
    wrong = [{"content": "0"}] * 4
    traj = asyncio.run(run_episode(env, ScriptedChat(wrong), task, params=PARAMS))
    assert traj.status == "max_turns" and traj.metadata["env"]["reward"] == pytest.approx(0.0)
    grade = load_grader(env.grader_spec()).grade(traj, task.data)
    assert grade.reward == pytest.approx(0.0) and not grade.success and not grade.errors


def test_env_reward_without_a_measurement_is_a_flagged_error() -> None:
    from agentrft.types import Trajectory

    grade = load_grader({"type": "env_reward"}).grade(Trajectory(), {})
    assert grade.error_flags == ["sample_parse_error"]


def test_environment_code_that_raises_ends_the_episode_as_an_error(
    on_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_env.py").write_text(
        textwrap.dedent(
            """
            class Broken:
                def reset(self, seed):
                    return "Say something."
                def step(self, action):
                    raise RuntimeError("boom")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("broken_env:Broken?train=1")
    traj = asyncio.run(run_episode(env, ScriptedChat([{"content": "hi"}]), env.tasks("train")[0], params=PARAMS))
    assert traj.status == "error" and "environment failed in reply: RuntimeError: boom" in (traj.error or "")
    assert traj.untrainable_reason() == "episode_error"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("guess_env:NoSuchClass", "has no attribute 'NoSuchClass'"),
        ("no_such_module_xyz:Env", "cannot import 'no_such_module_xyz'"),
        ("guess_env:GuessEnv?colour=red", "does not accept these options"),
        ("guess_env:GuessEnv?train=x", "option train must be an integer"),
        ("finqa-lite?bad=1", "unknown option(s) bad"),
        ("guess_env:GuessEnv?size=abc", "GuessEnv failed to start: ValueError"),
        ("guess_env:GuessEnv?train=1000001", "train must be at most 1,000,000"),
        ("os:system?command=echo hacked", "os:system is not an environment class"),
        ("nope", "unknown environment 'nope'"),
    ],
)
def test_a_bad_spec_is_one_clear_error(on_path: None, spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_env(spec)


def test_an_installed_entry_point_is_found(on_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "guess_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: guess-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[agentrft.envs]\nguess = guess_env:GuessEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("guess?size=4&test=2")
    assert isinstance(env, GymTextEnv) and len(env.tasks("held-out")) == 2


def test_finqa_lite_resolves_through_the_same_path() -> None:
    from agentrft.envs.finqa.env import FinqaLiteEnv
    from agentrft.envs.plugins import EnvSpec, resolve

    target, _ = resolve(EnvSpec.parse("finqa-lite:1?shots=0"))
    assert target is FinqaLiteEnv
    env = make_env("finqa-lite:1,2?shots=0")
    assert isinstance(env, FinqaLiteEnv) and env.levels == (1, 2) and env.shots == 0


def test_a_users_env_trains_two_grpo_steps_with_the_tiny_policy(on_path: None, tmp_path: Path) -> None:
    from agentrft.store import Store
    from agentrft.train import train
    from agentrft.train.config import build_config
    from agentrft.train.core.metrics import read_metrics

    cfg = build_config(
        {
            "steps": 2,
            "seed": 0,
            "policy": {"name": "tiny", "finetune": "full", "precision": "fp32"},
            "rollout": {
                "env": "guess_env:GuessEnv?size=4&train=8&test=4",
                "tasks_per_step": 2,
                "group_size": 2,
                "temperature": 1.0,
                "max_tokens": 8,
            },
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    result = train(cfg, tmp_path / "run")  # type: ignore[arg-type]
    assert result.steps == 2
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(r["train_sequences"] == 4 for r in rows)
    with Store(tmp_path / "run" / "agentrft.db") as store:
        train_run = next(r for r in store.list_runs() if r.kind == "train")
        trajs = store.query_trajectories(run_id=train_run.id)
    assert len(trajs) == 8
    for t in trajs:
        assert t.grade is not None and not t.grade.errors and t.grade.grader == "reward"
        assert t.grade.reward == pytest.approx(t.metadata["env"]["reward"])
    assert sys.modules["guess_env"].GuessEnv.name == "guess"

"""GRPO on an agent program (`agent.command`): its episodes are served sessions of the policy being trained,
grouped and trained like the built-in loop's; a command that cannot start is refused before any model loads."""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from agentrft.store import Store
from agentrft.train import ConfigError, train
from agentrft.train.config import build_config
from agentrft.train.config.check import check_references
from agentrft.train.core.metrics import read_metrics

AGENT = """
import json, os, sys, httpx
task = json.load(sys.stdin)
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
messages = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": task["question"]}]
for _ in range(2):  # two requests: the second continues the first (one segment)
    r = httpx.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", headers=headers,
                   json={"model": "m", "messages": messages, "max_tokens": 6}, timeout=120)
    r.raise_for_status()
    messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "Once more."}]
print(messages[-2]["content"])
"""


def _config(cmd: str, **over: object) -> object:
    base = {
        "steps": 2,
        "seed": 0,
        "policy": {"name": "tiny", "finetune": "full"},
        "rollout": {"env": "finqa-lite:1", "tasks_per_step": 1, "group_size": 2, "temperature": 1.0, "max_tokens": 4},
        "agent": {"command": cmd, "max_concurrency": 2, "timeout_s": 300},
        "checkpoint": {"every_steps": 0},
        "logging": {"tensorboard": False},
        **over,
    }
    return build_config(base)


def test_grpo_trains_on_an_agent_commands_sessions(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(AGENT))
    cfg = _config(f"{shlex.quote(sys.executable)} {shlex.quote(str(agent))}")
    check_references(cfg)  # type: ignore[arg-type]
    res = train(cfg, tmp_path / "run")  # type: ignore[arg-type]
    assert res.steps == 2  # the second step serves again, on the event loop of its own rollout
    rows = read_metrics(tmp_path / "run")
    assert [r["train_sequences"] for r in rows] == [2, 2] and not any(r.get("excluded_trajectories") for r in rows)
    with Store(tmp_path / "run" / "agentrft.db") as store:
        train_run = next(r for r in store.list_runs() if r.kind == "train")
        trajs = store.query_trajectories(run_id=train_run.id)
    assert len(trajs) == 4 and len({t.group_id for t in trajs}) == 2
    assert sorted(t.policy_version for t in trajs) == [0, 0, 1, 1]  # the version that sampled each session
    for t in trajs:
        assert t.status in ("completed", "truncated") and t.untrainable_reason() is None  # 4 tokens: cut short
        assert t.metadata["request_kinds"][0] == "first" and t.metadata["requests"] == 2
        assert t.tokens is not None and t.tokens.num_segments == 1 and set(t.tokens.turn) == {0, 1}
    first = [t for t in trajs if t.policy_version == 0]
    assert sum(t.tokens.num_sampled for t in first if t.tokens) == rows[0]["train_sampled_tokens"] > 0
    assert rows[0]["train_tokens"] == rows[0]["train_sampled_tokens"]  # every sampled token of both sessions trained


def test_an_agent_command_that_cannot_start_is_refused_before_the_model_loads() -> None:
    with pytest.raises(ConfigError, match="agent.command: no-such-agent: not found on PATH"):
        check_references(_config("no-such-agent run"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="agent: agent.command runs episodes for method grpo"):
        check_references(_config("python x.py", method="sft", data={"source": "x.db"}))  # type: ignore[arg-type]

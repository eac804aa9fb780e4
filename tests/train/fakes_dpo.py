"""Graded two-turn trajectories with token records, in a store, for the DPO tests.

Each task has a prompt of its own (a shared system part, then the question); each episode
samples a tool call, gets a tool result, samples an answer. Reward = fraction of sampled
tokens below VOCAB/2, as `fakes_train.FakeGrader` has it: a preference a tiny model can learn.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from fakes_train import VOCAB

from agentrft.store import Store
from agentrft.types import Grade, Message, Run, TokenRecord, ToolCall, ToolCallFunction, Trajectory

SYSTEM = [1, 5, 9, 14, 3, 7]


def episode(rng: random.Random, task: int, k: int) -> Trajectory:
    task_rng = random.Random(task)
    question = [task_rng.randrange(2, VOCAB) for _ in range(3)]  # one prompt per task
    call = [rng.randrange(2, VOCAB) for _ in range(rng.randint(2, 4))]
    result = [rng.randrange(2, VOCAB) for _ in range(2)]
    answer = [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 4))]
    ids = SYSTEM + question + call + result + answer
    n_prompt = len(SYSTEM) + len(question)
    mask = [0] * n_prompt + [1] * len(call) + [0] * len(result) + [1] * len(answer)
    turn = [0] * (n_prompt + len(call)) + [1] * (len(result) + len(answer))
    sampled = call + answer
    reward = sum(1 for t in sampled if t < VOCAB // 2) / len(sampled)
    tc = ToolCall(id=f"c{task}-{k}", function=ToolCallFunction(name="calc", arguments='{"x": 1}'))
    return Trajectory(
        run_id="r-train",
        task_id=f"task-{task}",
        group_id=f"g-{task}",
        messages=[
            Message(role="system", content="sys"),
            Message(role="user", content=f"question {task}"),
            Message(role="assistant", content=None, tool_calls=[tc]),
            Message(role="tool", content="2", tool_call_id=tc.id),
            Message(role="assistant", content=f"answer {k}"),
        ],
        n_prompt_messages=2,
        tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=[-0.5 * m for m in mask], turn=turn),
        grade=Grade(reward=reward, success=reward > 0.5),
        policy="fake-tiny",
    )


def make_store(path: Path, tasks: int = 4, group: int = 4, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with Store(path) as s:
        s.add_run(Run(id="r-train", name="train", kind="train"))
        for task in range(tasks):
            for k in range(group):
                s.add_trajectory(episode(rng, task, k))
    return path


def config(source: str | None = None, pairs: str | None = None, **over: Any) -> Any:
    from agentrft.train.config import build_config

    base: dict[str, Any] = {
        "method": "dpo",
        "steps": 4,
        "seed": 3,
        "policy": {"finetune": "full", "precision": "fp32"},
        "dpo": {"pairs_per_step": 3, "beta": 0.5, "margin": 0.1, "pairs_per_task": 4, "pairs": pairs},
        "data": {"source": source},
        "optimizer": {"lr": 1e-2, "micro_batch_tokens": 64, "warmup_steps": 1, "schedule": "cosine"},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
        "logging": {"tensorboard": False},
    }
    return build_config(base, [f"{k}={v}" for k, v in over.items()])

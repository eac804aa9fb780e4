"""A synthetic, separable preference set for reward-model tests: chosen answers contain a marker token.

Every task's trajectories share a system prompt (as finqa-lite's do) and their task's question,
then answer with random tokens and an end token; those graded 1 contain ``MARKER`` somewhere in
the answer, those graded 0 never do. Token ids stay below 61 so that any tiny test model fits.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from agentrft.store import Store
from agentrft.types import Grade, Message, Run, TokenRecord, Trajectory

MARKER = 7
END = 2
TOP = 61


def separable_trajectories(n_tasks: int = 20, per_side: int = 2, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    system = [rng.randrange(8, TOP) for _ in range(6)]
    out: list[Trajectory] = []
    for k in range(n_tasks):
        question = [rng.randrange(8, TOP) for _ in range(rng.randint(3, 5))]
        for j in range(2 * per_side):
            good = j % 2 == 0
            answer = [rng.randrange(8, TOP) for _ in range(rng.randint(3, 6))]
            if good:
                answer.insert(rng.randrange(len(answer) + 1), MARKER)
            prompt = [1, *system, *question]
            ids = [*prompt, *answer, END]
            mask = [0] * len(prompt) + [1] * (len(answer) + 1)
            out.append(
                Trajectory(
                    run_id="r1",
                    task_id=f"task-{k:02d}",
                    group_id=f"task-{k:02d}",
                    messages=[
                        Message(role="system", content="s"),
                        Message(role="user", content=f"q{k}"),
                        Message(role="assistant", content=f"answer {k}-{j} {'good' if good else 'bad'}"),
                    ],
                    n_prompt_messages=2,
                    tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), turn=[0] * len(ids)),
                    grade=Grade(reward=1.0 if good else 0.0, success=good),
                )
            )
    return out


def separable_store(path: Path, **kw: Any) -> Path:
    with Store(path) as s:
        s.add_run(Run(id="r1", name="graded", kind="train"))
        for t in separable_trajectories(**kw):
            s.add_trajectory(t)
    return path


def rm_config(source: Path | str | None, **over: Any) -> Any:
    from agentrft.train.config import build_config

    base: dict[str, Any] = {
        "method": "reward_model",
        "steps": 30,
        "seed": 3,
        "policy": {"finetune": "full", "precision": "fp32"},
        "reward_model": {"margin": 0.5, "pairs_per_task": 4, "pairs_per_step": 8, "heldout_fraction": 0.25},
        "optimizer": {"lr": 3e-3, "micro_batch_tokens": 512, "warmup_steps": 1, "schedule": "cosine"},
        "checkpoint": {"every_steps": 5, "keep_last": 2},
        "logging": {"tensorboard": False},
    }
    if source is not None:
        base["data"] = {"source": str(source)}
    return build_config(base, [f"{k}={v}" for k, v in over.items()])

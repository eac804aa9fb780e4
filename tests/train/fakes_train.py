"""A deterministic fake environment, sampler and grader around a tiny Llama, for loop and resume tests.

The sampler samples from the very model the trainer updates, with a torch generator
seeded from (step seed, request counter), so a run is a pure function of its seed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrft.envs.base import Environment, EnvLimits, Episode
from agentrft.graders import Grader, Sample, Score
from agentrft.samplers.base import SampleRequest, SampleResult
from agentrft.tools.base import ToolResult
from agentrft.types import Message, Task

VOCAB = 61


class FakeEpisode(Episode):
    def __init__(self, task: Task) -> None:
        self.task = task

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:  # never called: no tools
        raise AssertionError("no tools in the fake env")


class FakeEnv(Environment):
    name = "fake"
    version = "1"

    def __init__(self, n_tasks: int = 6) -> None:
        self.limits = EnvLimits(max_turns=1, max_tokens_per_turn=6, max_total_tokens=256)
        self._n = n_tasks

    def system_prompt(self) -> str:
        return "s"

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def tasks(self, split: str = "train") -> list[Task]:
        base = 0 if split == "train" else 100
        return [
            Task(id=f"{split}-{i}", messages=[Message(role="user", content=f"q{base + i}")], data={"i": i})
            for i in range(self._n)
        ]

    def start(self, task: Task) -> Episode:
        return FakeEpisode(task)


class FakeSampler:
    def __init__(self, seed: int = 0) -> None:
        cfg = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        torch.manual_seed(seed)
        self.model = LlamaForCausalLM(cfg).eval()
        self.tokenizer = None
        self.policy = "fake-tiny"
        self.policy_version = 0
        self.model_lock = threading.Lock()
        self._base, self._count = 0, 0

    def reseed(self, seed: int) -> None:
        self._base, self._count = seed, 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self.model_lock:
            yield

    def weights_updated(self, version: int) -> None:
        self.policy_version = version

    def render(
        self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True
    ) -> list[int]:
        text = "".join(str(m.get("content") or "") for m in messages)
        return [1] + [ord(c) % VOCAB for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)

    async def sample(self, request: SampleRequest) -> SampleResult:
        gen = torch.Generator().manual_seed(self._base * 7919 + self._count)
        self._count += 1
        ids = list(request.prompt_ids)
        out: list[int] = []
        lps: list[float] = []
        with self.model_lock, torch.no_grad():
            version = self.policy_version  # weights change only under model_lock (paused)
            for _ in range(request.params.max_tokens):
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                logp = torch.log_softmax(logits, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(tok)
                out.append(tok)
                lps.append(float(logp[tok]))
        return SampleResult(
            token_ids=out,
            logprobs=lps,
            text=self.decode(out),
            finish_reason="stop",
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(out),
            policy_version=version,
        )


class FakeGrader(Grader):
    """Reward = fraction of sampled tokens below VOCAB/2: learnable, and it varies within a group."""

    type = "fake"

    def __init__(self) -> None:
        super().__init__("low_tokens", pass_threshold=0.5 + 1e-9)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        traj = sample.trajectory
        assert traj is not None and traj.tokens is not None
        sampled = [i for i, m in zip(traj.tokens.ids, traj.tokens.loss_mask, strict=True) if m]
        r = sum(1 for i in sampled if i < VOCAB // 2) / max(len(sampled), 1)
        return Score(r, sub={"low": r}, turn_rewards=[r])


def components(run_dir: Any) -> Any:
    from agentrft.store import Store
    from agentrft.train import Components

    return Components(env=FakeEnv(), sampler=FakeSampler(), grader=FakeGrader(), store=Store(run_dir / "agentrft.db"))


def config(**over: Any) -> Any:
    from agentrft.train.config import build_config

    base = {
        "steps": 4,
        "seed": 3,
        "policy": {"finetune": "full", "precision": "fp32"},
        "rollout": {"env": "fake", "tasks_per_step": 2, "group_size": 3, "max_tokens": 6},
        "optimizer": {"lr": 1e-2, "micro_batch_tokens": 40, "warmup_steps": 1, "schedule": "cosine"},
        "eval": {"every_steps": 2, "num_tasks": 2},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
        "logging": {"tensorboard": False},
    }
    return build_config(base, [f"{k}={v}" for k, v in over.items()])


def write_sft_store(path: Any, n: int = 10, *, seed: int = 0, tokenless: int = 2) -> Any:
    """A store of recorded trajectories in the fake vocabulary: one shared system prompt, then per task a
    question, a tool-calling turn, a tool result and a final answer (two sampled runs), some failures,
    and ``tokenless`` trajectories without a token record (rendered by `FakeSampler.render`)."""
    import random

    from agentrft.store import Store
    from agentrft.types import Grade, Run, TokenRecord, ToolCall, ToolCallFunction, Trajectory

    rng = random.Random(seed)
    system = [1, 5, 6, 7, 8, 9, 10, 11]
    with Store(path) as s:
        s.add_run(Run(id="rec", name="recorded", kind="train"))
        for i in range(n):
            q = [12 + i % 40, 13 + i % 40]
            call = [rng.randrange(30) for _ in range(3)]
            tool = [40, 41, rng.randrange(VOCAB)]
            answer = [rng.randrange(30) for _ in range(rng.randint(2, 5))]
            ids = system + q + call + tool + answer
            mask = [0] * len(system + q) + [1] * len(call) + [0] * len(tool) + [1] * len(answer)
            turn = [0] * len(system + q + call) + [1] * len(tool + answer)
            messages = [
                Message(role="system", content="s"),
                Message(role="user", content=f"q{i}"),
                Message(
                    role="assistant",
                    tool_calls=[ToolCall(id=f"c{i}", function=ToolCallFunction(name="f", arguments="{}"))],
                ),
                Message(role="tool", tool_call_id=f"c{i}", content="r"),
                Message(role="assistant", content=f"answer {i}"),
            ]
            success = i % 4 != 3
            s.add_trajectory(
                Trajectory(
                    run_id="rec",
                    task_id=f"t{i}",
                    messages=messages,
                    n_prompt_messages=2,
                    tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), turn=turn),
                    grade=Grade(reward=float(success), success=success),
                )
            )
        for i in range(tokenless):
            s.add_trajectory(
                Trajectory(
                    run_id="rec",
                    task_id=f"chat{i}",
                    messages=[
                        Message(role="system", content="s"),
                        Message(role="user", content=f"what is {i}?"),
                        Message(role="assistant", content=f"it is {i}"),
                    ],
                    n_prompt_messages=2,
                    grade=Grade(reward=1.0, success=True),
                )
            )
    return path


def sft_config(data: Any, **over: Any) -> Any:
    """The fake SFT run: the loop tests' config with ``method: sft`` on the trajectories of ``data``."""
    sft = {
        "method": "sft",
        "data.source": str(data),
        "data.success_only": "true",
        "sft.batch_size": 3,
        "steps": 5,
        "eval.every_steps": 0,
        "optimizer.micro_batch_tokens": 48,
    }
    return config(**{**sft, **over})

"""Rollout throughput: multi-turn episodes through the Runner vs plain batched `model.generate`.

Prints one JSON object per figure, then a summary:

* ``generate`` — `model.generate` on the opening prompts of the same batch (left
  padded, sampling, `max_new_tokens` = the per-turn cap): generated tokens/s,
  counting tokens up to and including each row's EOS.
* ``runner`` — the same B episodes (tasks × samples) played by the Runner with
  the same policy object (HFSampler batching the concurrent requests), several
  turns each: sampled tokens/s over the whole run.
* ``runner+latency`` — the same, each tool call first sleeping uniform(0, L) s.

Goals (see the issue): runner ≥ 0.9 × generate; runner+latency ≥ 0.8 × runner.

    .venv/bin/python benchmarks/rollout_bench.py --policy smollm2-135m --tasks 8 --samples 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from agentrft.envs.base import Environment, EnvironmentWrapper, Episode
from agentrft.rollout.agent import prompt_messages, to_render
from agentrft.rollout.formats import make_format
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams
from agentrft.tools.base import ToolResult
from agentrft.types import Task


class _SlowEpisode(Episode):
    def __init__(self, inner: Episode, max_latency_s: float, rng: random.Random) -> None:
        self.inner, self.task, self.max_latency_s, self.rng = inner, inner.task, max_latency_s, rng

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        await asyncio.sleep(self.rng.uniform(0.0, self.max_latency_s))
        return await self.inner.call_tool(name, arguments)


class SlowToolsEnv(EnvironmentWrapper):
    """Wraps an environment so every tool call first sleeps uniform(0, max_latency_s) seconds."""

    def __init__(self, inner: Environment, max_latency_s: float, seed: int = 0) -> None:
        super().__init__(inner)
        self.max_latency_s, self.rng = max_latency_s, random.Random(seed)

    def start(self, task: Task) -> Episode:
        return _SlowEpisode(self.inner.start(task), self.max_latency_s, self.rng)


def bench_generate(
    sampler: Any, env: Environment, tasks: list[Task], samples: int, max_new: int, tool_format: str, temperature: float
) -> dict[str, Any]:
    import torch

    model, tok = sampler.model, sampler.tokenizer
    fmt = make_format(tool_format, env.tool_schemas())
    prompts = [
        sampler.render([to_render(m, fmt) for m in prompt_messages(env, t, fmt)], None, True)
        for t in tasks
        for _ in range(samples)
    ]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=sampler.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=sampler.device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=1.0,
            top_k=0,
            pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
        )
        seconds = time.perf_counter() - t0
    generated = 0
    for row in out[:, width:].tolist():
        n = len(row)
        if tok.eos_token_id in row:
            n = row.index(tok.eos_token_id) + 1
        generated += n
    return {
        "mode": "generate",
        "batch": len(prompts),
        "tokens": generated,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1),
        "prompt_len_max": width,
    }


def bench_runner(
    label: str,
    env: Environment,
    sampler: Any,
    tasks: list[Task],
    samples: int,
    params: SamplingParams,
    tool_format: str,
) -> dict[str, Any]:
    runner = Runner(
        env, sampler, tool_format=tool_format, params=params, progress=False, max_concurrency=len(tasks) * samples
    )
    t0 = time.perf_counter()
    trajs = runner.run_sync(tasks, samples, run_id=label)
    seconds = time.perf_counter() - t0
    tokens = sum(t.tokens.num_sampled for t in trajs if t.tokens is not None)
    model_calls = sum(1 for t in trajs for e in t.events if e.type == "model_call")
    statuses: dict[str, int] = {}
    for t in trajs:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    return {
        "mode": label,
        "episodes": len(trajs),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "model_calls": model_calls,
        "tool_calls": sum(len(t.tool_calls) for t in trajs),
        "statuses": statuses,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--env", default="finqa-lite:1")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48, help="per-turn cap (and generate's max_new_tokens)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=1.0, help="tool sleep upper bound, seconds")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--tool-format", default="xml")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from agentrft.envs.registry import make_env
    from agentrft.samplers.policies import load_policy

    sampler = load_policy(args.policy, max_batch_size=args.tasks * args.samples, device=args.device)
    env = make_env(args.env)
    env.limits = env.limits.model_copy(update={"max_turns": args.max_turns, "max_tokens_per_turn": args.max_tokens})
    tasks = env.tasks("train")[: args.tasks]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)

    # Warm-up: first-call costs (weights to cache, kernels) stay out of the figures.
    bench_runner("warmup", env, sampler, tasks[:1], 1, params, args.tool_format)
    gen = bench_generate(sampler, env, tasks, args.samples, args.max_tokens, args.tool_format, args.temperature)
    print(json.dumps(gen))
    run = bench_runner("runner", env, sampler, tasks, args.samples, params, args.tool_format)
    print(json.dumps(run))
    slow = bench_runner(
        "runner+latency", SlowToolsEnv(env, args.latency), sampler, tasks, args.samples, params, args.tool_format
    )
    print(json.dumps(slow))
    print(
        json.dumps(
            {
                "policy": args.policy,
                "device": args.device,
                "runner_vs_generate": round(run["tokens_per_s"] / gen["tokens_per_s"], 3),
                "latency_vs_runner": round(slow["tokens_per_s"] / run["tokens_per_s"], 3),
                "goals": {"runner_vs_generate": 0.9, "latency_vs_runner": 0.8},
            }
        )
    )


if __name__ == "__main__":
    main()

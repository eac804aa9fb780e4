"""Throughput of HFSampler vs plain `model.generate` on the same batch; load times.

    .venv/bin/python benchmarks/sampler_bench.py [--policy smollm2-135m] [--n 32] [--new 64] [--cold]

Each of the N requests gets a distinct ~250-token prompt (so no prefix sharing
helps), greedy decoding, at most `--new` tokens. Tokens/s counts generated
tokens up to and including EOS. A second HFSampler figure uses one shared prompt
for all N (a GRPO group) to show the prefill sharing. The agent-shaped case gives
the N prompts one ~400-token shared prefix (system prompt, tool instructions,
worked examples) and distinct ~60-token questions, sampled with the prefix KV
cache off and on (each on a fresh cache); the other cases run with it off, as
before it existed. `--cold` also times the GGUF conversion into a fresh
temporary cache. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import torch

from agentrft.samplers.base import SampleRequest, SamplingParams
from agentrft.samplers.hf import HFSampler
from agentrft.samplers.policies import load_model_and_tokenizer

FILLER = (
    "The quarterly report lists revenue, operating costs, and net income for each segment. "
    "Analysts compare the figures with the previous year and note the growth rate. "
)


def prompts(sampler: HFSampler, n: int, target: int = 250) -> list[list[int]]:
    out = []
    for i in range(n):
        body = FILLER * 12
        msgs = [
            {"role": "system", "content": "You answer questions about financial reports."},
            {
                "role": "user",
                "content": f"Report {i}. {body}\nQuestion {i}: write a detailed summary of the report, segment by segment.",
            },
        ]
        ids = sampler.render(msgs)
        out.append(ids[-target:] if len(ids) > target else ids)
    return out


def shared_prefix_prompts(sampler: HFSampler, n: int, prefix: int = 400, suffix: int = 60) -> list[list[int]]:
    """N chat prompts: one system message of ~`prefix` tokens, then distinct ~`suffix`-token questions."""
    tok = sampler.tokenizer
    system = tok.decode(
        tok.encode(
            "You are a financial analyst agent. Call the calculator tool for arithmetic. " + FILLER * 40,
            add_special_tokens=False,
        )[: prefix - 5]
    )
    out = []
    for i in range(n):
        q = (
            f"Question {i}: segment {i} had revenue {100 + 7 * i} million and costs {40 + 3 * i} million in "
            f"{1990 + i}; the year before, revenue was {90 + 5 * i} million. " + FILLER
        )
        q = tok.decode(tok.encode(q, add_special_tokens=False)[: suffix - 8])
        out.append(sampler.render([{"role": "system", "content": system}, {"role": "user", "content": q}]))
    return out


def count_generated(row: list[int], eos: int) -> int:
    return row.index(eos) + 1 if eos in row else len(row)


def bench_generate(model, tok, batch: list[list[int]], new: int) -> tuple[float, int]:
    p_max = max(map(len, batch))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (p_max - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (p_max - len(p)) + [1] * len(p) for p in batch])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad)
    dt = time.perf_counter() - t0
    gen = out[:, p_max:].tolist()
    return dt, sum(count_generated(r, tok.eos_token_id) for r in gen)


async def bench_sampler(s: HFSampler, batch: list[list[int]], new: int) -> tuple[float, int]:
    params = SamplingParams(temperature=0.0, max_tokens=new)
    t0 = time.perf_counter()
    res = await asyncio.gather(*(s.sample(SampleRequest(p, params, group_key="g")) for p in batch))
    return time.perf_counter() - t0, sum(r.completion_tokens for r in res)


async def bench_mixed(s: HFSampler, batch: list[list[int]], new: int) -> tuple[float, int, float]:
    """Half the requests want 8 tokens, half `new`: per-request max_tokens and early delivery."""

    async def one(i: int, p: list[int]) -> tuple[int, float]:
        t = time.perf_counter()
        r = await s.sample(SampleRequest(p, SamplingParams(temperature=0.0, max_tokens=8 if i % 2 else new)))
        return r.completion_tokens, time.perf_counter() - t

    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(i, p) for i, p in enumerate(batch)))
    short = [lat for i, (_, lat) in enumerate(res) if i % 2]
    return time.perf_counter() - t0, sum(n for n, _ in res), sum(short) / len(short)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=1, help="alternate the measurements this many times (noisy hosts)")
    ap.add_argument("--only-agent", action="store_true", help="run only the shared-prefix (agent) case")
    ap.add_argument("--cold", action="store_true", help="also time the GGUF conversion into a fresh cache")
    a = ap.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    if a.cold:
        old = os.environ.get("AGENTRFT_CACHE")
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["AGENTRFT_CACHE"] = tmp
            t0 = time.perf_counter()
            load_model_and_tokenizer(a.policy)
            print(f"cold load (GGUF tokenizer + weights → safetensors): {time.perf_counter() - t0:.1f} s")
            t0 = time.perf_counter()
            load_model_and_tokenizer(a.policy)
            print(f"cached load from that fresh cache: {time.perf_counter() - t0:.2f} s")
        if old is None:
            os.environ.pop("AGENTRFT_CACHE", None)
        else:
            os.environ["AGENTRFT_CACHE"] = old
    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer(a.policy)
    print(f"load ({a.policy}, default cache): {time.perf_counter() - t0:.2f} s")
    s = HFSampler(model, tok, a.policy, max_batch_size=a.n)
    batch = prompts(s, a.n)
    print(f"batch: {a.n} prompts of {min(map(len, batch))}-{max(map(len, batch))} tokens, ≤{a.new} new each")
    plain = HFSampler(model, tok, a.policy, max_batch_size=a.n, prefix_cache_tokens=0)
    agent = shared_prefix_prompts(s, a.n)
    lcp = min(next((k for k, (x, y) in enumerate(zip(agent[0], p, strict=False)) if x != y), len(p)) for p in agent[1:])
    print(f"agent batch: {a.n} prompts of {min(map(len, agent))}-{max(map(len, agent))} tokens, {lcp} of them shared")
    asyncio.run(bench_sampler(plain, batch[:2], 4))  # warm-up
    for rep in range(a.reps):
        if not a.only_agent:
            dt, n = bench_generate(model, tok, batch, a.new)
            print(f"[{rep}] model.generate, padded batch: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)
            # the original cases on the uncached sampler, comparable with earlier figures
            dt, n = asyncio.run(bench_sampler(plain, batch, a.new))
            print(f"[{rep}] HFSampler, distinct prompts:  {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)
            dt, n = asyncio.run(bench_sampler(plain, [batch[0]] * a.n, a.new))
            print(f"[{rep}] HFSampler, one shared prompt: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)
            dt, n, short = asyncio.run(bench_mixed(plain, batch, a.new))
            print(
                f"[{rep}] HFSampler, half ask 8 tokens: {n} tokens in {dt:.1f} s; the 8-token ones "
                f"return after {short:.1f} s on average",
                flush=True,
            )
        for sampler, name in ((plain, "off"), (s, "on ")):
            sampler.weights_updated(sampler.policy_version)  # start from an empty prefix cache
            before = dict(sampler.stats)
            dt, n = asyncio.run(bench_sampler(sampler, agent, a.new))
            computed = sampler.stats["prefill_tokens"] - before["prefill_tokens"]
            print(
                f"[{rep}] HFSampler, shared {lcp}-token prefix, prefix cache {name}: {n} tokens in {dt:.1f} s "
                f"= {n / dt:.1f} tok/s ({computed} prompt tokens prefilled)",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Long multi-turn episodes: a finqa-lite level-3 eval through the HF engine.

    .venv/bin/python benchmarks/long_episodes.py [--level 3] [--tasks 32] [--samples 2] [--policy smollm2-135m]
        [--set precision=bf16] [--set prefix_cache_tokens=16384] [--set remember_turns=0] [--set frozen=0]
        [--set share_head=0] [--set max_kv_positions=16384]
        (HFSampler options)
    .venv/bin/python benchmarks/long_episodes.py --env 'finqa-lite:4?shots=0,4:1' --policy hf:RUN/imitation-late/policy
        (any environment spec, e.g. level 4 with the prompt a policy was trained on)

Prints one JSON object: wall time, peak RSS, episodes and pass@1, the engine's
prefilled vs reused (shared or cached) prompt tokens, the share of the batch KV
cache that is left padding (summed at each admission), prefill and decode seconds,
sampled tokens, and the fraction of the bf16 matmul bound reached on the tokens
actually computed (2 x parameters x (prefilled + sampled tokens) / engine
seconds, over the peak bf16 matmul rate `--peak-gflops` measured by a square
matmul on this machine in the same run), and of the bound of the format the engine
computes in (`fraction_of_engine_bound`: fp32's on a CPU without native bf16, where
`--set precision=auto` computes in fp32). Asserts nothing.

Goal (issue 15): a 64-episode level-3 eval in <= 5 minutes at <= 3 GiB peak RSS on the 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 8) -> float:
    """The machine's square-matmul rate in this dtype (GFLOP/s), best of `reps`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def parse_sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = int(raw)
        except ValueError:
            try:
                out[key] = float(raw)
            except ValueError:
                out[key] = raw
    return out


def main() -> None:
    from agentrft.envs.registry import make_env
    from agentrft.eval.harness import evaluate
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.store import Store

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--env", default="", help="an environment spec instead of finqa-lite:LEVEL (finqa-lite:4?shots=1)")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="HFSampler option KEY=VALUE (precision=bf16, ...)"
    )
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    peak_bf16 = matmul_gflops(torch.bfloat16)
    peak_fp32 = matmul_gflops(torch.float32)
    env = make_env(args.env or f"finqa-lite:{args.level}")
    t_load = time.perf_counter()
    # HFSampler options; frozen, as `agentrft eval` builds it (`--set frozen=0`: with fp32 masters, as in training)
    options = parse_sets(args.sets)
    if options.get("sampler", "engine") == "engine":
        options = {"frozen": True, **options}
    sampler = load_trainable_policy(args.policy, seed=0, **options)
    load_s = time.perf_counter() - t_load
    params_n = sum(p.numel() for p in sampler.model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        t0 = time.perf_counter()
        result = evaluate(
            env,
            sampler,
            split="held-out",
            samples=args.samples,
            tasks=args.tasks,
            store=store,
            run_name="bench",
            params=SamplingParams(temperature=args.temperature, max_tokens=env.limits.max_tokens_per_turn),
            progress=False,
        )
        wall = time.perf_counter() - t0
        # episodes that ended on an error (a failed engine batch fails every row in it, and a short episode is a
        # cheap one): a run with any is no measurement of the engine
        errored = store.query_trajectories(status="error")
        store.close()
    st = {"prefill_s": 0.0, "decode_s": 0.0, "kv_positions": 0, "kv_used_positions": 0, **sampler.stats}
    engine_s = st["prefill_s"] + st["decode_s"] or wall  # engines before these counters: the wall time
    computed = st["prefill_tokens"] + st["tokens"]
    achieved = 2 * params_n * computed / max(engine_s, 1e-9) / 1e9
    out = {
        "label": args.label,
        "env": args.env or f"finqa-lite:{args.level}",
        "episodes": result.n_trajectories,
        "errored_episodes": len(errored),
        "first_error": errored[0].error if errored else None,
        "pass@1": round(result.pass_at_k[1], 3),
        "wall_s": round(wall, 1),
        "load_s": round(load_s, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "prompt_tokens_prefilled": st["prefill_tokens"],
        "prompt_tokens_reused": st["reused_tokens"],
        "sampled_tokens": st["tokens"],
        "requests": st["requests"],
        "decode_steps": st["steps"],
        "kv_padding_fraction": round(1 - st["kv_used_positions"] / max(st["kv_positions"], 1), 3),
        "prefill_s": round(st["prefill_s"], 1),
        "decode_s": round(st["decode_s"], 1),
        "trim_s": round(st.get("trim_s", 0.0), 2),
        "kv_peak_positions": st.get("kv_peak_positions"),
        "kv_peak_mib": round(st.get("kv_peak_positions", 0) * getattr(sampler, "position_bytes", 0) / 2**20),
        "kv_wait_steps": st.get("kv_wait_steps"),
        "model_dtype": str(next(sampler.model.parameters()).dtype),
        "matmul_gflops_bf16": round(peak_bf16, 1),
        "matmul_gflops_fp32": round(peak_fp32, 1),
        "achieved_gflops": round(achieved, 2),
        "fraction_of_bf16_bound": round(achieved / peak_bf16, 4),
        # the bound of the format the engine computes in: on a CPU without native bf16 (agentrft.precision)
        # the bf16 rate is an emulation's, below fp32's, so the bf16 fraction alone flatters an fp32 engine
        "engine_precision": sampler.precision,
        "frozen": getattr(sampler, "frozen", False),
        "fraction_of_engine_bound": round(achieved / (peak_bf16 if sampler.precision == "bf16" else peak_fp32), 4),
        # the engine's budgets (by default sized in memory: samplers.hf.KV_BUDGET_MIB)
        "kv_budget_positions": getattr(sampler, "max_kv_positions", None),
        "prefix_cache_budget_positions": sampler.prefix_cache.max_tokens,
        "prefix_cache": dict(sampler.prefix_cache.stats),
        "prefix_cache_mib_at_end": round(sampler.prefix_cache.nbytes / 2**20),  # with the batch KV: the engine's share
        # distinct positions (a shared prefix counts once) and the cached sequences (token runs) they serve
        "prefix_cache_positions_at_end": sampler.prefix_cache.tokens,
        "prefix_cache_sequences_at_end": len(sampler.prefix_cache),
        "sets": args.sets,
    }
    print(json.dumps(out), flush=True)
    sampler.close()


if __name__ == "__main__":
    main()

"""Training step on long episodes that share a prompt: plain vs prefix tree vs segment layout, side by side.

    .venv/bin/python benchmarks/shared_prefix_layouts.py [--level 3] [--demos 8] [--mixed] [--repeat 2]

The oracle plays ``--demos`` training tasks of finqa-lite level ``--level`` on the environment's few-shot prompt
(``--mixed``: a quarter of them from each of levels 1-4, a batch without ``sft.group_by_prompt``); each layout then runs one forward and backward
(bf16 autocast, SmolLM2-135M, the SFT loss on the demonstrations' assistant tokens) in its own process, so that
peak RSS is the layout's own. Layouts are run in turn, ``--repeat`` rounds, and the median per layout printed with
its ratio to the plain layout. Prints one JSON line per layout; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = {
    # name: (shared_prefix, layout, row_tokens, micro_batch_tokens)
    "plain": (False, "tree", 0, 4096),
    "tree": (True, "tree", 2048, 4096),
    "segments": (True, "segments", 4096, 4096),
    "segments-8k": (True, "segments", 8192, 8192),
}


def make_demos(level: int, n: int, mixed: bool, out: Path) -> None:
    from agentrft.envs.registry import make_env
    from agentrft.eval.harness import evaluate
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.oracle import load_oracle
    from agentrft.store import Store

    spec = "finqa-lite:1,2,3,4" if mixed else f"finqa-lite:{level}"
    env = make_env(spec)
    store = Store(out)
    evaluate(
        env,
        load_oracle("oracle:smollm2-135m", env),
        split="train",
        samples=1,
        tasks=max(1, n // 4) if mixed else n,
        store=store,
        run_name="demos",
        params=SamplingParams(temperature=0.0, max_tokens=env.limits.max_tokens_per_turn),
        env_spec=spec,
        grader=None,
        progress=False,
    )


def one(layout: str, db: Path) -> dict[str, float]:
    import torch

    from agentrft.samplers.distribution import Distribution
    from agentrft.samplers.policies import load_model_and_tokenizer
    from agentrft.store import Store
    from agentrft.train.core.packing import PackedSequence, micro_batches
    from agentrft.train.core.shared_prefix import shared_prefix_micro_batches
    from agentrft.train.core.update import autocast, batch_logprobs

    shared, kind, row_tokens, mb_tokens = LAYOUTS[layout]
    trajs = [t for t in Store(db).query_trajectories() if t.tokens is not None]
    seqs = [
        PackedSequence(
            i,
            list(t.tokens.ids),
            [float(m) for m in t.tokens.loss_mask],
            [0.0] * len(t.tokens.ids),
            [float(m) for m in t.tokens.loss_mask],
        )
        for i, t in enumerate(trajs)
        if t.tokens is not None
    ]
    model, _ = load_model_and_tokenizer("smollm2-135m")
    model.train()
    if shared and kind == "segments":
        from agentrft.train.core.segment_attention import use_segment_attention

        use_segment_attention(model)
    if shared:
        mbs = shared_prefix_micro_batches(seqs, mb_tokens, row_tokens, 0, layout=kind)
    else:
        mbs = micro_batches(seqs, mb_tokens, 0)
    n_loss = sum(mb.num_loss_tokens for mb in mbs)
    t0 = time.perf_counter()
    for mb in mbs:
        with autocast(torch.bfloat16):
            logp, _ = batch_logprobs(model, mb, chunk=1024, dist=Distribution())
        (-(logp * mb.loss_mask).sum() / n_loss).backward()
    seconds = time.perf_counter() - t0
    return {
        "seconds": round(seconds, 2),
        "micro_batches": len(mbs),
        "forward_tokens": sum(mb.num_forward_tokens for mb in mbs),
        "sequence_tokens": sum(len(s.input_ids) for s in seqs),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "grad_norm": round(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--demos", type=int, default=8)
    ap.add_argument("--mixed", action="store_true", help="a quarter of the demos from each of levels 1-4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, Path(args.db))), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "demos.db"
        make_demos(args.level, args.demos, args.mixed, db)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.layouts.split(",")}
        for _ in range(args.repeat):
            for name in runs:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", name, "--db", str(db)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=os.environ,
                )
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        base = statistics.median(r["seconds"] for r in runs.get("plain", next(iter(runs.values()))))
        for name, rs in runs.items():
            med = statistics.median(r["seconds"] for r in rs)
            print(
                json.dumps(
                    {
                        "layout": name,
                        "level": "1-4" if args.mixed else args.level,
                        "demos": args.demos,
                        "median_s": med,
                        "ratio_to_plain": round(med / base, 3),
                        "runs_s": [r["seconds"] for r in rs],
                        **{
                            k: rs[-1][k]
                            for k in ("micro_batches", "forward_tokens", "sequence_tokens", "peak_rss_mib", "grad_norm")
                        },
                        "load": os.getloadavg()[0],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()

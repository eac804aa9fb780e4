"""One layer's segment attention, forward and backward, by the two suffix paths, side by side.

    .venv/bin/python benchmarks/segment_attention.py [--repeat 5]

Random bf16 tensors with SmolLM2-135M's heads (9 query heads, 3 key/value heads of 64) in the packed rows the
agentic imitation trains on: a prompt prefix, then several demonstrations' suffixes (lengths drawn around the
oracle's, finqa-lite levels 3 and 4, with the worked example in the prompt or zero-shot). Each case runs
``segmented_attention`` with ``path="masked"`` and ``path="causal"`` in turn, ``--repeat`` rounds, and prints one
JSON line: the median seconds of each path, their ratio, and the path ``suffix_path`` picks. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from agentrft.train.core.segment_attention import segmented_attention, suffix_path

HEADS, KV_HEADS, DIM = 9, 3, 64
# (name, prefix tokens, suffixes per row, suffix length range): the oracle's demonstrations in the recipe's rows
CASES = [
    ("level 3, worked example", 1365, 6, (1000, 1150)),
    ("level 3, zero-shot", 290, 7, (1000, 1150)),
    ("level 4, zero-shot", 300, 3, (2100, 2300)),
]


def one_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list, path: str) -> float:
    start = time.perf_counter()
    out = segmented_attention(q, k, v, segments, None, path=path)  # type: ignore[arg-type]
    out.float().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    torch.manual_seed(0)
    for name, prefix, n, (lo, hi) in CASES:
        lens = [rng.randint(lo, hi) for _ in range(n)]
        spans, start = [], prefix
        for length in lens:
            spans.append((start, start + length))
            start += length
        segments = [(prefix, spans)]

        def leaf(heads: int, row: int = start) -> torch.Tensor:
            return torch.randn(1, heads, row, DIM, dtype=torch.bfloat16, requires_grad=True)

        q, k, v = leaf(HEADS), leaf(KV_HEADS), leaf(KV_HEADS)
        times: dict[str, list[float]] = {"masked": [], "causal": []}
        for path in times:  # warm-up
            one_pass(q, k, v, segments, path)
        for _ in range(args.repeat):
            for path, seen in times.items():
                seen.append(one_pass(q, k, v, segments, path))
        median = {path: statistics.median(seen) for path, seen in times.items()}
        print(
            json.dumps(
                {
                    "case": name,
                    "row_tokens": start,
                    "masked_s": round(median["masked"], 4),
                    "causal_s": round(median["causal"], 4),
                    "causal_over_masked": round(median["causal"] / median["masked"], 3),
                    "picked": suffix_path(prefix, n, max(lens)),
                    "threads": torch.get_num_threads(),
                }
            )
        )


if __name__ == "__main__":
    main()

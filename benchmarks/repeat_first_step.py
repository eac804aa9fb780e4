"""Does vs_trl's agentrft side sample the same first step in every fresh process? Token hashes per run.

    .venv/bin/python benchmarks/repeat_first_step.py [--runs 8] [--finetune full-bf16]

Each run is a process of its own that plays `vs_trl.py`'s agentrft child (`run_ours`: hand-built components,
4 level-1 prompts x 8 samples, one GRPO step) and records the token ids of every sampled reply as the engine
delivers them. It prints one line per run (a hash over all 32 replies, the step's mean reward, a short hash
per reply) and whether every run sampled the same tokens. Start a CPU hog beside it to check the result does
not move with load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def one_run(finetune: str) -> str:
    sys.path.insert(0, str(HERE))
    import vs_trl
    from agentrft.samplers import hf

    replies: list[tuple[int, list[int]]] = []
    deliver = hf._resolve

    def record(p: Any, result: Any = None, exc: BaseException | None = None) -> None:
        if result is not None:
            replies.append((p.seed, list(result.token_ids)))
        deliver(p, result, exc)

    hf._resolve = record  # the engine thread calls it once per finished request
    res = vs_trl.run_ours(argparse.Namespace(steps=1, finetune=finetune, no_shared_prefix=False))
    replies.sort()

    def digest(x: Any) -> str:
        return hashlib.sha256(json.dumps(x).encode()).hexdigest()[:12]

    return f"{digest(replies)} reward {res['steps'][0]['reward']:.4f} replies {len(replies)} " + " ".join(
        digest(r)[:6] for r in replies
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--finetune", choices=["full", "full-bf16", "lora"], default="full-bf16")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RUN", one_run(args.finetune), flush=True)
        return
    lines = []
    for i in range(args.runs):
        cmd = [sys.executable, __file__, "--one", "--finetune", args.finetune]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent).stdout
        line = next(s for s in out.splitlines() if s.startswith("RUN "))[4:]
        lines.append(line)
        print(f"run {i + 1}: {line}", flush=True)
    hashes = {line.split()[0] for line in lines}
    print(f"{args.finetune}: {len(lines)} runs, {len(hashes)} distinct first steps", flush=True)


if __name__ == "__main__":
    main()

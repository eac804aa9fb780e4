"""The demo over several seeds: mean and range of held-out pass@1, wall time per stage and peak RSS.

    .venv/bin/python benchmarks/demo_seeds.py [--seeds 0,1,2] [--out-dir runs/seeds] [--set k=v ...]

Runs `agentrft demo --seed N --json` once per seed, one after the other (each a process of its own, so peak
RSS is per run: the process's peak up to its last training step, as the step metrics record it), and prints a markdown table: seed x (pass@1 before/after, pass^2 after, wall time of the
baseline eval, training and final eval, the whole run, peak RSS), then the mean and range of each column, the
CPU model and the load average before the first run. Extra ``--set`` options go to every demo. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                bf16 = "avx512_bf16" in flags
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores, avx512_bf16: {bf16})"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out-dir", default="runs/demo-seeds")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--quick", action="store_true", help="the demo's --quick (a smoke run of this script)")
    args = ap.parse_args()
    agentrft = str(Path(sys.executable).with_name("agentrft"))
    print(f"CPU: {_cpu()}; load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run_dir = Path(args.out_dir) / f"seed{seed}"
        cmd = [agentrft, "demo", "--seed", str(seed), "--run-dir", str(run_dir), "--json"]
        cmd += [x for s in args.sets for x in ("--set", s)] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rss_mib = max(m.get("mem/peak_rss_mib", 0.0) for m in steps)  # the process's peak up to its last step
        summary = json.loads(out.strip().splitlines()[-1])
        sec = summary["seconds"]
        rows.append(
            {
                "seed": seed,
                "before": summary["before"]["pass_at_k"]["1"],
                "after": summary["after"]["pass_at_k"]["1"],
                "pass^2 after": summary["after"]["pass_hat_k"]["2"],
                "baseline eval s": sec["eval_baseline"],
                "train s": sec["train"],
                "final eval s": sec["eval_final"],
                "total s": sec["total"],
                "peak RSS MiB": rss_mib,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    cols = list(rows[0])
    rates = {"before", "after", "pass^2 after"}

    def cell(col: str, value: float) -> str:
        return f"{value:.3f}" if col in rates else f"{value:.0f}"

    print("\n| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
    for r in rows:
        print("| " + " | ".join(cell(c, r[c]) for c in cols) + " |")
    for name, fn in (("mean", statistics.mean), ("min", min), ("max", max)):
        print("| " + " | ".join([name] + [cell(c, fn([r[c] for r in rows])) for c in cols[1:]]) + " |")


if __name__ == "__main__":
    main()

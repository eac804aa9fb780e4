"""Lockstep vs free scheduling of a rollout: what reproducibility costs, and what it buys.

    .venv/bin/python benchmarks/lockstep.py [--env finqa-lite:1] [--tasks 8] [--samples 4] [--rounds 2]
        [--policy smollm2-135m] [--precision auto] [--no-hog]

Plays the same rollout (the same seed) with `Runner(lockstep=True)` and `lockstep=False`, alternating, `--rounds`
times each on the quiet machine, then once more each beside a CPU hog (one busy process per core). Prints one
JSON object: per mode the wall seconds of each quiet round, their median, and how many episodes of the busy run
sampled other tokens than the first quiet run (lockstep: 0 by design; free: whatever the load did); and the ratio
of the medians (free / lockstep: below 1 means lockstep is slower). Each run loads a fresh sampler, so no run
reuses another's prefix cache. Asserts nothing: read the figures beside the CPU and the load they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def _hog() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]


def _run(args: argparse.Namespace, lockstep: bool) -> tuple[float, list[tuple[str, list[int]]], dict[str, Any]]:
    from agentrft.envs import make_env
    from agentrft.eval.harness import select_tasks
    from agentrft.precision import resolve
    from agentrft.rollout.runner import Runner
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.policies import load_policy

    env = make_env(args.env)
    sampler = load_policy(args.policy, env=env, precision=resolve(args.precision), frozen=True)
    try:
        params = SamplingParams(temperature=1.0, max_tokens=env.limits.max_tokens_per_turn)
        runner = Runner(env, sampler, params=params, progress=False, seed=args.seed, lockstep=lockstep)
        tasks = select_tasks(env.tasks("train"), args.tasks)
        t0 = time.perf_counter()
        trajs = runner.run_sync(tasks, args.samples)
        wall = time.perf_counter() - t0
        tokens = [(t.task_id, list(t.tokens.ids) if t.tokens else []) for t in trajs]
        stats = {k: sampler.stats[k] for k in ("admissions", "steps", "tokens")}
        return wall, tokens, stats
    finally:
        sampler.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="finqa-lite:1")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hog", action="store_true")
    args = ap.parse_args()
    modes = {"lockstep": True, "free": False}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    first: dict[str, list[tuple[str, list[int]]]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for mode, lockstep in modes.items():
            wall, tokens, st = _run(args, lockstep)
            walls[mode].append(round(wall, 2))
            first.setdefault(mode, tokens)
            stats.setdefault(mode, st)
    out: dict[str, Any] = {"env": args.env, "episodes": args.tasks * args.samples, "cpu_count": os.cpu_count()}
    for mode in modes:
        out[mode] = {"quiet_wall_s": walls[mode], "median_s": statistics.median(walls[mode]), "engine": stats[mode]}
    if not args.no_hog:
        for mode, lockstep in modes.items():
            hogs = _hog()
            try:
                wall, tokens, st = _run(args, lockstep)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            differ = sum(a != b for a, b in zip(first[mode], tokens, strict=True))
            out[mode].update({"busy_wall_s": round(wall, 2), "busy_episodes_differing": differ, "busy_engine": st})
    out["free_over_lockstep"] = round(out["free"]["median_s"] / out["lockstep"]["median_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Synchronous GRPO against asynchronous (k = 1, k = 2) on the demo's configuration, with tools that sleep.

    .venv/bin/python benchmarks/async_vs_sync.py [--steps 6] [--policy smollm2-135m] [--json out.json]

Each mode trains the demo's recipe (`train.config.PRESETS["demo"]`: SmolLM2-135M, full fine-tune,
finqa-lite level 1, 4 tasks x 8 samples, T 0.7) for ``--steps`` updates from the same initial weights
and seed, in its own process, one after the other, with every tool call delayed by a uniform 0-1 s
sleep (seeded), as a real agent waits on its tools. Printed per mode: wall time of the steps (model
load excluded), trained episodes per second and its ratio to sync, trainer utilisation (update time /
wall time), cores busy (the process's CPU seconds over wall: what overlap can add is the idle rest),
peak RSS, and the reward curve (train_reward_mean per step: for async, the reward of the
groups each update took).

In process, the sampler and the trainer share one model and the sampler is paused during an update,
so what async overlaps with an update is what episodes wait on (tool sleeps, grading) and the
pipeline's queued groups; sampling and training do not run at once on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = {"sync": 0, "k1": 1, "k2": 2}


def sleepy(env: Any, seed: int) -> Any:
    """``env`` with every tool call delayed by U(0, 1) s (its own seeded generator)."""
    rng = random.Random(seed)
    start = env.start

    def start_with_delays(task: Any) -> Any:
        episode = start(task)
        call = episode.call_tool

        async def delayed(name: str, arguments: Any) -> Any:
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            return await call(name, arguments)

        episode.call_tool = delayed
        return episode

    env.start = start_with_delays
    return env


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    from agentrft.envs.registry import make_env
    from agentrft.graders.registry import load_grader
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.store import Store
    from agentrft.train import Components, train
    from agentrft.train.config import PRESETS, build_config

    over = [f"steps={args.steps}", f"policy.name={args.policy}", f"async.max_staleness={MODES[args.mode]}"]
    over += ["checkpoint.every_steps=0", "logging.tensorboard=false"]
    cfg = build_config(PRESETS["demo"], over)
    run_dir = Path(tempfile.mkdtemp(prefix=f"async-vs-sync-{args.mode}-"))
    env = sleepy(make_env(cfg.rollout.env), cfg.seed)
    comps = Components(
        env=env,
        sampler=load_trainable_policy(cfg.policy.name, sampler=cfg.policy.sampler, seed=cfg.seed),
        grader=load_grader(env.grader_spec()),
        store=Store(run_dir / "agentrft.db"),
    )
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    try:
        res = train(cfg, run_dir, components=comps)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)  # the saved policy alone is ~2 GB per mode
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    h = res.history
    trained = sum(r.get("train_sequences", 0.0) for r in h)
    return {
        "mode": args.mode,
        "wall_s": wall,
        "steps_s": sum(r["time/step_s"] for r in h),
        "trained_episodes": trained,
        "training_s": sum(r["time/training_s"] for r in h),
        "rewards": [r.get("train_reward_mean") for r in h],
        "step_s": [r["time/step_s"] for r in h],
        "staleness_mean": [r.get("async/staleness/mean", 0.0) for r in h],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpu_s": cpu,
        "cores": len(os.sched_getaffinity(0)),
    }


def cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads (torch's included)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["sync", "k1", "k2"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)  # one mode, in a child process
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        args.out.write_text(json.dumps(run_mode(args)))
        return
    results = {}
    for mode in args.modes:
        out = Path(tempfile.mkstemp(suffix=".json")[1])
        cmd = [sys.executable, __file__, "--mode", mode, "--out", str(out), "--steps", str(args.steps)]
        cmd += ["--policy", args.policy]
        print(f"[{mode}] running", flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        results[mode] = json.loads(out.read_text())
    base = results.get("sync")
    print(
        "\n| mode | steps wall s | s/step (median) | trained episodes/s | ratio to sync | trainer utilisation "
        "| mean staleness | cores busy | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        thr = r["trained_episodes"] / r["steps_s"]
        ratio = thr / (base["trained_episodes"] / base["steps_s"]) if base else float("nan")
        stale = statistics.mean(r["staleness_mean"]) if r["staleness_mean"] else 0.0
        busy = r["cpu_s"] / r["wall_s"]
        print(
            f"| {mode} | {r['steps_s']:.1f} | {statistics.median(r['step_s']):.1f} | {thr:.3f} | {ratio:.2f} "
            f"| {r['training_s'] / r['steps_s']:.2f} | {stale:.2f} | {busy:.2f} of {r['cores']} "
            f"| {r['peak_rss_mib']:.0f} |"
        )
    if base:
        # Overlap can only fill cores the synchronous loop leaves idle: on the same cores, sync's wall time
        # times its busy share is a floor on any schedule's CPU time, hence this bound on the ratio.
        bound = base["cores"] / (base["cpu_s"] / base["wall_s"])
        print(f"\nbound on any overlap of sampling and training on these {base['cores']} cores: {bound:.2f}x sync")
    print("\nreward per step (train_reward_mean of the groups each update used)")
    for mode, r in results.items():
        print(f"  {mode}: " + ", ".join("-" if x is None else f"{x:.3f}" for x in r["rewards"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Seconds per GRPO step on CPU, split into sampling / grading / update, and how close the update gets to the CPU's bf16 matmul rate.

    .venv/bin/python benchmarks/grpo_step.py [--policy smollm2-135m] [--steps 2] [--finetune lora|full]

Default: SmolLM2-135M, finqa-lite level 1, 4 prompts x 8 samples. Prints the last
step's figures (the first also pays one-off costs), peak RSS (getrusage), and
``6 x params x tokens / update seconds`` as a fraction of a measured bf16 matmul
GFLOP/s. The 6N rule counts weight gradients of all parameters; with LoRA the base
weights get no gradient, so the fraction overstates the useful work by ~1/3.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch


def bf16_matmul_gflops(n: int = 2048, reps: int = 5, trials: int = 5) -> float:
    """Best of ``trials`` timings of a bf16 n x n matmul: the machine's attainable rate, not its load at one moment."""
    a = torch.randn(n, n, dtype=torch.bfloat16)
    b = torch.randn(n, n, dtype=torch.bfloat16)
    a @ b
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="smollm2-135m")
    ap.add_argument("--env", default="finqa-lite:1")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--finetune", choices=["lora", "full"], default="lora")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--no-shared-prefix", action="store_true", help="run every sequence's prompt separately")
    ap.add_argument("--run-dir", type=Path, default=None)
    args = ap.parse_args()

    from agentrft.train import train
    from agentrft.train.config import build_config

    peak = bf16_matmul_gflops()
    print(f"measured bf16 matmul: {peak:.1f} GFLOP/s", flush=True)
    cfg = build_config(
        {
            "steps": args.steps,
            "seed": 0,
            "policy": {
                "name": args.policy,
                "finetune": args.finetune,
                "gradient_checkpointing": args.gradient_checkpointing,
            },
            "optimizer": {"micro_batch_tokens": args.micro_batch_tokens, "shared_prefix": not args.no_shared_prefix},
            "rollout": {
                "env": args.env,
                "tasks_per_step": args.tasks,
                "group_size": args.group,
                "max_tokens": args.max_tokens,
            },
            "eval": {"every_steps": 0},
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    t0 = time.perf_counter()
    try:
        result = train(cfg, run_dir)
    finally:
        if not args.run_dir:  # a scratch directory: its saved policy is ~2 GB
            shutil.rmtree(run_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    m = result.history[-1]
    from agentrft.samplers.policies import load_model_and_tokenizer

    n_params = sum(p.numel() for p in load_model_and_tokenizer(args.policy)[0].parameters())
    upd = m["time/training_s"]
    achieved = 6 * n_params * m["train_forward_tokens"] / upd / 1e9
    figures = {
        "policy": args.policy,
        "finetune": args.finetune,
        "env": args.env,
        "prompts_x_samples": f"{args.tasks}x{args.group}",
        "torch_threads": torch.get_num_threads(),
        "step_s": m["time/step_s"],
        "sampling_s": m["time/sampling_s"],
        "grading_s": m["time/grading_s"],
        "update_s": upd,
        "sampled_tokens": m["train_sampled_tokens"],
        "sampling_tokens_per_s": m["sampling_tokens_per_s"],
        "update_forward_tokens": m["train_forward_tokens"],
        "update_padded_tokens": m["train_padded_tokens"],
        # tokens of the sequences themselves; more than forward tokens when shared prefixes run once
        "update_sequence_tokens": m.get("train_sequence_tokens", m["train_forward_tokens"]),
        "update_tokens_per_s": m["train_forward_tokens"] / upd,
        "train_reward_mean": m["train_reward_mean"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bf16_matmul_gflops": peak,
        "update_gflops_6N": achieved,
        "fraction_of_bf16_peak": achieved / peak,
        "total_wall_s": wall,
        "run_dir": str(run_dir),
    }
    for k, v in figures.items():
        print(f"{k:<24} {v:.3f}" if isinstance(v, float) else f"{k:<24} {v}")
    (run_dir / "benchmark.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

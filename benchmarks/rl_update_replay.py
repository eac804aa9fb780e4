"""A GRPO run's recorded updates replayed: seconds per update with and without the two savings, side by side.

    .venv/bin/python benchmarks/rl_update_replay.py --run-dir runs/ag4 [--run ag4] [--steps 3,7] [--repeat 1]

Reads the trajectories each step of a finished GRPO run trained on (``metadata.trained_step``), recomputes their
advantages with the run's ``algorithm`` config, and runs the run's update (SmolLM2-135M, the run's optimizer
layout and precision, gradient checkpointing as configured) once per variant, interleaved:

* ``before``: every trajectory computed;
* ``skip``: zero-advantage trajectories skipped (`stages.skip_zero_advantage`).

The optimizer is SGD at learning rate 0, so every variant starts from the same weights; ``loss`` and the
gradient norm agree across variants up to float summation order (printed). One JSON line per step and
variant, then the median ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from agentrft.samplers.policies import load_model_and_tokenizer
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import load_config
from agentrft.train.core.segment_attention import use_segment_attention
from agentrft.train.core.update import autocast_dtype, policy_update
from agentrft.train.rl.stages import advantage_stage, pack_stage, skip_zero_advantage

VARIANTS = ("before", "skip")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--run", default=None, help="the GRPO run's name in the store (default: the run dir's name)")
    ap.add_argument("--steps", default="", help="comma-separated steps (default: all)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    cfg = load_config(str(args.run_dir / "config.yaml"))
    store = Store(args.run_dir / RUN_STORE_NAME)
    name = args.run or args.run_dir.name
    [run] = [r for r in store.list_runs() if r.name == name and r.kind == "train"]
    by_step: dict[int, list] = defaultdict(list)
    for t in store.query_trajectories(run_id=run.id):
        if (step := t.metadata.get("trained_step")) is not None:
            by_step[int(step)].append(t)
    steps = [int(s) for s in args.steps.split(",") if s] or sorted(by_step)
    model, tok = load_model_and_tokenizer(cfg.policy.name)
    if cfg.policy.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    use_segment_attention(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    precision = autocast_dtype(cfg.policy.precision)
    pad_id = getattr(tok, "pad_token_id", None) or 0
    times: dict[tuple[int, str], list[float]] = defaultdict(list)
    for _ in range(args.repeat):
        for step in steps:
            groups: dict[str, list] = defaultdict(list)
            for t in by_step[step]:
                groups[t.group_id].append(t)
            trajs, per_token, _ = advantage_stage(list(groups.values()), cfg.algorithm)
            for variant in VARIANTS:
                if variant == "skip":
                    kept, kept_adv, skipped = skip_zero_advantage(trajs, per_token, cfg.algorithm)
                else:
                    kept, kept_adv, skipped = trajs, per_token, (0, 0)
                batches = pack_stage(kept, kept_adv, cfg, pad_id)
                t0 = time.perf_counter()
                m = policy_update(
                    model,
                    opt,
                    sched,
                    batches,
                    cfg.algorithm,
                    cfg.optimizer,
                    dist=cfg.sampling_distribution(),
                    precision=precision,
                    skipped=skipped,
                )
                seconds = time.perf_counter() - t0
                times[(step, variant)].append(seconds)
                row = {
                    "step": step,
                    "variant": variant,
                    "seconds": round(seconds, 2),
                    "loss": m.get("loss"),
                    "grad_norm": m.get("grad_norm"),
                    "forward_tokens": m.get("train_forward_tokens"),
                    "skipped_sequences": m.get("train_skipped_sequences"),
                    "load": round(os.getloadavg()[0], 2),
                }
                print(json.dumps(row), flush=True)
    for variant in VARIANTS[1:]:
        ratios = [statistics.median(times[(s, variant)]) / statistics.median(times[(s, "before")]) for s in steps]
        total = sum(statistics.median(times[(s, variant)]) for s in steps)
        before = sum(statistics.median(times[(s, "before")]) for s in steps)
        print(
            json.dumps(
                {
                    "variant": variant,
                    "median_ratio_to_before": round(statistics.median(ratios), 3),
                    "total_s": round(total, 1),
                    "before_total_s": round(before, 1),
                    "total_ratio": round(total / before, 3),
                }
            )
        )


if __name__ == "__main__":
    main()

"""agentrft vs TRL's SFTTrainer and DPOTrainer on CPU: same model, data, batches, lr; s/step, peak RSS, step-1 loss.

    bash benchmarks/setup_trl.sh                                   # once: TRL in its own venv, .venv-trl
    .venv/bin/python benchmarks/vs_trl_offline.py --db STORE [--run NAME] [--steps 4] [--json out.json]

STORE is an agentrft store holding graded finqa-lite trajectories in groups (the training run of an
`agentrft demo` run dir, `RUN_DIR/agentrft.db`; ``--run`` names the run, default the store's train run).
TRL is a benchmark dependency only, in its own venv (see vs_trl.py).

The same data for both systems, built here once from the store by agentrft's own selection:
* SFT: the run's successful trajectories (deduplicated), their recorded token ids and loss masks (the
  sampled tokens: TRL gets them as ``labels``, -100 elsewhere), in the order agentrft's SFT draws them
  (seeded shuffle, ``sft.batch_size`` per step); TRL reads that order sequentially.
* DPO: the pairs agentrft builds from the run's groups (`agentrft.pairs`, reward gap >= 0.1, at most 8 per
  task), as token sequences (prompt = the shared prefix; TRL's completion is everything after it, so
  its loss also counts tool-result tokens, ours only the sampled ones: the step-1 loss is log 2 for both
  either way), in agentrft's draw order. TRL's reference log-probs are precomputed (its fastest setting,
  and what agentrft does: once, before step 1), so neither's step time includes the reference.
Both: SmolLM2-135M-Instruct (full fine-tune), lr 1e-5 constant, no warmup, grad clip 1.0, bf16 autocast
where the CPU has it, gradient checkpointing, one optimizer step per batch (no accumulation), seed 0.

Each system runs in its own subprocess, one after the other, so peak RSS (ru_maxrss) is its own and
they never share the CPU. Step time is the median over steps (the first pays one-off costs).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LR, SEED, SFT_BATCH, DPO_BATCH = 1e-5, 0, 8, 4


# ------------------------------------------------------------------ data (agentrft side, parent process)
def _train_run(db: str, name: str | None) -> str:
    from agentrft.store import Store

    with Store(db) as s:
        runs = s.list_runs()
    if name is not None:
        return name
    trains = [r for r in runs if r.kind == "train"]
    if not trains:
        raise SystemExit(f"{db} holds no training run; pass --run NAME")
    return trains[-1].name or trains[-1].id


def build_data(db: str, run: str, steps: int) -> dict[str, Any]:
    """Token sequences for both systems, in agentrft's draw order for ``steps`` steps."""
    from agentrft.samplers.chat_template import TokenizerRenderer
    from agentrft.samplers.policies import smollm2_tokenizer
    from agentrft.train.data import DataConfig, select_trajectories
    from agentrft.train.data.preference_data import encode_pair, load_pairs
    from agentrft.train.rl.stages import next_tasks

    sft_sel, _ = select_trajectories(DataConfig(source=db, runs=[run], success_only=True))
    sft = [
        {
            "input_ids": t.tokens.ids,
            "labels": [i if m else -100 for i, m in zip(t.tokens.ids, t.tokens.loss_mask, strict=True)],
        }
        for t in next_tasks(sft_sel, 0, steps * SFT_BATCH, SEED)
        if t.tokens is not None
    ]
    pairs, _ = load_pairs(None, DataConfig(source=db, runs=[run]), margin=0.1, per_task=8)
    renderer = TokenizerRenderer(smollm2_tokenizer())
    encoded = [encode_pair(p, renderer, "xml", []) for p in pairs]
    order = next_tasks(list(range(len(encoded))), 0, steps * DPO_BATCH, SEED)
    dpo = []
    for k in order:
        e = encoded[k]
        n = 0
        while n < min(len(e.chosen_ids), len(e.rejected_ids)) and e.chosen_ids[n] == e.rejected_ids[n]:
            n += 1
        n = min(n, e.chosen_mask.index(1), e.rejected_mask.index(1))  # the prompt ends where learning starts
        dpo.append({"prompt_ids": e.chosen_ids[:n], "chosen_ids": e.chosen_ids[n:], "rejected_ids": e.rejected_ids[n:]})
    return {"sft": sft, "dpo": dpo, "sft_pool": len(sft_sel), "pairs": len(encoded)}


# ------------------------------------------------------------------ agentrft child
def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from agentrft.train import train
    from agentrft.train.config import build_config

    common = {
        "seed": SEED,
        "steps": args.steps,
        "policy": {"name": "smollm2-135m", "finetune": "full", "gradient_checkpointing": True, "precision": "auto"},
        "optimizer": {"lr": LR, "warmup_steps": 0, "schedule": "constant", "grad_clip": 1.0},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "logging": {"tensorboard": False},
        "eval": {"every_steps": 0},
    }
    if args.method == "sft":
        cfg = build_config(
            {
                **common,
                "method": "sft",
                "sft": {"batch_size": SFT_BATCH},
                "data": {"source": args.db, "runs": [args.run], "success_only": True},
            }
        )
    else:
        cfg = build_config(
            {
                **common,
                "method": "dpo",
                "data": {"source": args.db, "runs": [args.run]},
                "dpo": {"margin": 0.1, "pairs_per_task": 8, "pairs_per_step": DPO_BATCH, "beta": 0.1},
            }
        )
    with tempfile.TemporaryDirectory(prefix="vs-trl-offline-ours-") as run_dir:
        result = train(cfg, Path(run_dir))
    return {"steps": [{"step_s": h["time/step_s"], "loss": h["loss"]} for h in result.history]}


# ------------------------------------------------------------------ TRL child (runs under .venv-trl)
def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    rows = json.loads(Path(args.data).read_text())[args.method]
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            steps.append({"step_s": time.perf_counter() - self.t0})

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="vs-trl-offline-trl-"),
        max_steps=args.steps,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        gradient_accumulation_steps=1,
        gradient_checkpointing=True,
        bf16=bool(args.bf16),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=SEED,
        dataloader_num_workers=0,
        max_length=None,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    if args.method == "sft":
        from trl import SFTConfig, SFTTrainer

        class Sequential(SFTTrainer):
            def _get_train_sampler(self, *a: Any, **k: Any) -> Any:  # agentrft's draw order, as given
                return SequentialSampler(self.train_dataset)

        config = SFTConfig(
            per_device_train_batch_size=SFT_BATCH, dataset_kwargs={"skip_prepare_dataset": True}, **common
        )
        trainer: Any = Sequential(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tok)
    else:
        from trl import DPOConfig, DPOTrainer

        class SequentialDPO(DPOTrainer):
            def _get_train_sampler(self, *a: Any, **k: Any) -> Any:
                return SequentialSampler(self.train_dataset)

            def _prepare_dataset(self, dataset: Any, *a: Any, **k: Any) -> Any:  # already token ids
                return dataset

        config = DPOConfig(
            per_device_train_batch_size=DPO_BATCH,
            beta=0.1,
            loss_type=["sigmoid"],
            precompute_ref_log_probs=True,
            **common,
        )
        trainer = SequentialDPO(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.add_callback(StepTimer())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    for s, loss in zip(steps, losses, strict=False):
        s["loss"] = loss
    return {"steps": steps}


# ------------------------------------------------------------------ orchestration
def _child(role: str, python: str, args: argparse.Namespace, method: str, extra: list[str]) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix=f"vs-trl-offline-{role}-", suffix=".json")[1])
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--role",
        role,
        "--method",
        method,
        "--steps",
        str(args.steps),
        "--out",
        str(out),
        *extra,
    ]
    print(f"[{role} {method}] running", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}"}
    res = json.loads(out.read_text())
    out.unlink()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=False, help="an agentrft store with graded finqa-lite groups")
    ap.add_argument("--run", default=None, help="the run to learn from (default: the store's training run)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--methods", nargs="+", choices=["sft", "dpo"], default=["sft", "dpo"])
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--role", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--method", default="sft", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bf16", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role is not None:
        res = run_ours(args) if args.role == "ours" else run_trl(args)
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.out).write_text(json.dumps(res))
        return
    if args.db is None:
        raise SystemExit("pass --db STORE (e.g. the agentrft.db of an `agentrft demo` run dir)")

    from agentrft.precision import bf16_native  # what `policy.precision: auto` picks
    from agentrft.samplers.policies import load_model_and_tokenizer, smollm2_cache_dir

    load_model_and_tokenizer("smollm2-135m")  # the HF model dir exists in the cache
    args.run = _train_run(args.db, args.run)
    data = build_data(args.db, args.run, args.steps)
    dfile = Path(tempfile.mkstemp(prefix="vs-trl-offline-data-", suffix=".json")[1])
    dfile.write_text(json.dumps(data))
    bf16 = int(bf16_native())
    print(
        f"run {args.run}: SFT pool {data['sft_pool']} successes, {SFT_BATCH}/step; DPO {data['pairs']} pairs, "
        f"{DPO_BATCH}/step; {args.steps} steps; bf16={bool(bf16)}",
        flush=True,
    )
    table, runs = [], {}
    for method in args.methods:
        ours = _child("ours", sys.executable, args, method, ["--db", args.db, "--run", args.run])
        trl = (
            _child(
                "trl",
                args.trl_python,
                args,
                method,
                ["--data", str(dfile), "--model-dir", str(smollm2_cache_dir("models")), "--bf16", str(bf16)],
            )
            if Path(args.trl_python).exists()
            else {"error": f"no TRL interpreter at {args.trl_python}: bash benchmarks/setup_trl.sh"}
        )
        runs[f"agentrft {method}"], runs[f"TRL {method}"] = ours, trl
        for name, res in (("agentrft", ours), ("TRL", trl)):
            print(f"\n== {name} / {method}")
            if "error" in res:
                print(f"FAILED: {res['error']}")
                continue
            for i, s in enumerate(res["steps"], 1):
                print(f"  step {i}: " + "  ".join(f"{k}={v:.4f}" for k, v in s.items()))
            print(f"  peak RSS {res['peak_rss_mib']:.0f} MiB")
        if "error" not in ours and "error" not in trl:
            o, t = ours["steps"], trl["steps"]
            row = {
                "method": method,
                "ours_step_s": statistics.median(s["step_s"] for s in o),
                "trl_step_s": statistics.median(s["step_s"] for s in t),
                "ours_rss_mib": ours["peak_rss_mib"],
                "trl_rss_mib": trl["peak_rss_mib"],
                "ours_loss1": o[0]["loss"],
                "trl_loss1": t[0].get("loss", float("nan")),
            }
            table.append(row)
    dfile.unlink()
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "runs": runs}, indent=1))
    print(
        "\n| method | agentrft s/step | TRL s/step | ratio | agentrft peak RSS MiB | TRL peak RSS MiB | ratio |"
        " step-1 loss agentrft | TRL | |diff| |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['method']} | {r['ours_step_s']:.1f} | {r['trl_step_s']:.1f} | {r['ours_step_s'] / r['trl_step_s']:.2f} | "
            f"{r['ours_rss_mib']:.0f} | {r['trl_rss_mib']:.0f} | {r['ours_rss_mib'] / r['trl_rss_mib']:.2f} | "
            f"{r['ours_loss1']:.5f} | {r['trl_loss1']:.5f} | {abs(r['ours_loss1'] - r['trl_loss1']):.1e} |"
        )


if __name__ == "__main__":
    main()

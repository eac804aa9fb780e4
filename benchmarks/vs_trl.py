"""agentrft vs TRL's GRPOTrainer on CPU: same model, prompts, reward and sizes; seconds per step, peak RSS, reward.

    bash benchmarks/setup_trl.sh                     # once: TRL in its own venv, .venv-trl
    .venv/bin/python benchmarks/vs_trl.py [--steps 4] [--finetune full full-bf16 lora] [--json out.json]

``full-bf16`` is agentrft's full fine-tune with ``optimizer.weights: bf16`` (bf16 weights, gradients and
AdamW states with stochastic rounding, `train/core/bf16_adamw.py`; the sampler in bf16 too), set beside TRL's ``full`` run
(TRL runs once per fine-tune kind).

TRL is an optional *benchmark* dependency, never a runtime one. It lives in its own venv
(`setup_trl.sh`: torch==2.13.0 first, then trl 1.16.0 and the versions it was measured
with) so its pins cannot touch agentrft's.

Setup (both systems): SmolLM2-135M-Instruct from agentrft's HF cache dir
(`load_model_and_tokenizer("smollm2-135m")` writes it), the first 4 finqa-lite level-1
training tasks rendered as agentrft renders them (system prompt with the calculator
tool, three worked examples, the question: ~680 tokens), 8 samples each, at most 24
new tokens, temperature 1, no KL / no reference model, lr 5e-5 constant, gradient
checkpointing, bf16 autocast when the CPU supports it, single turn, full fine-tune
and LoRA r=16 / alpha 32 on all linear layers. Reward (`calculator_reward`): 1 if the
completion's ``<calculate>`` expression or its "The answer is X" is within 1% of the
answer, 0.2 for a well-formed calculation that is wrong, else 0. Both see the same 4
prompts every step, so the reward curves are comparable step by step.

Each system runs in its own subprocess (``--role``), one after the other, so peak RSS
(getrusage ru_maxrss of that process) is its own and they never share the CPU. Medians
are over all steps (the first pays one-off costs). Budget the time: a TRL full
fine-tune step took ~290 s on the 2-core machine, so the default 4 steps x 2 settings
run about 40 minutes.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
N_TASKS, GROUP, MAX_NEW, LR = 4, 8, 24, 5e-5

# ------------------------------------------------------------------ reward (shared, stdlib only)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError("not arithmetic")


def calculator_reward(completion: str, answer: float) -> float:
    def close(x: float) -> bool:
        return abs(x - answer) <= 0.01 * max(abs(answer), 1e-9)

    m = re.search(r"<calculate>(.*?)(?:</calculate>|$)", completion, re.S)
    if m:
        try:
            value = _eval(ast.parse(m.group(1).replace(",", "").strip(), mode="eval").body)
        except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
            return 0.0
        return 1.0 if close(value) else 0.2
    a = re.search(r"answer is\s*\$?(-?[\d,]*\.?\d+)", completion)
    return 1.0 if a and close(float(a.group(1).replace(",", ""))) else 0.0


# ------------------------------------------------------------------ prompts (agentrft side)
def build_prompts() -> list[dict[str, Any]]:
    from agentrft.envs.finqa.env import FinqaLiteEnv
    from agentrft.rollout.agent import prompt_messages, to_render
    from agentrft.rollout.formats import make_format
    from agentrft.samplers.policies import smollm2_tokenizer

    env = FinqaLiteEnv(levels=1)
    fmt = make_format("xml", env.tool_schemas())
    tok = smollm2_tokenizer()
    out = []
    for t in env.tasks("train")[:N_TASKS]:
        msgs = [to_render(m, fmt) for m in prompt_messages(env, t, fmt)]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(
            {
                "prompt": text,
                "answer": float(t.data["answer"]),
                "task_id": t.id,
                "prompt_tokens": len(tok(text)["input_ids"]),
            }
        )
    return out


def _portable(cmd: list[str]) -> str:
    """The command as printed into results files: paths relative to the repo, temp files and the cache
    named by their role, not by this machine's absolute paths."""
    home_cache = str(Path.home() / ".cache")
    out = []
    for part in cmd:
        part = part.replace(str(ROOT) + "/", "").replace(home_cache, "~/.cache")
        out.append(re.sub(r"^/tmp/(vs-trl-[a-z]+)-[^/]*\.json$", r"$TMPDIR/\1.json", part))
    return " ".join(out)


# ------------------------------------------------------------------ agentrft child
def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from agentrft.envs.base import EnvLimits
    from agentrft.envs.finqa.env import FinqaLiteEnv
    from agentrft.graders import Grader, Sample, Score
    from agentrft.samplers.policies import load_policy
    from agentrft.train.config import build_config
    from agentrft.train.loop import Components, train

    class BenchEnv(FinqaLiteEnv):
        """finqa-lite level 1, single turn, only the benchmark's tasks."""

        def tasks(self, split: str = "train") -> list[Any]:
            return super().tasks(split)[:N_TASKS]

    env = BenchEnv(
        levels=1, limits=EnvLimits(max_turns=1, max_tokens_per_turn=MAX_NEW, max_total_tokens=4096, max_tool_calls=1)
    )
    sampler = load_policy("smollm2-135m", seed=0)

    class Reward(Grader):
        """The same calculator reward TRL's side gets, on the sampled text."""

        type = "calculator_reward"

        def score(self, sample: Sample, item: dict[str, Any]) -> Score:
            tok = sample.trajectory.tokens if sample.trajectory is not None else None
            assert tok is not None
            text = sampler.decode([i for i, m in zip(tok.ids, tok.loss_mask, strict=True) if m])
            return Score(calculator_reward(text, float(item["answer"])))

    bf16_weights = args.finetune == "full-bf16"
    cfg = build_config(
        {
            "steps": args.steps,
            "seed": 0,
            "policy": {
                "name": "smollm2-135m",
                "finetune": "full" if bf16_weights else args.finetune,
                **({"precision": "bf16", "sampler_precision": "bf16"} if bf16_weights else {}),
                "lora_r": 16,
                "lora_alpha": 32,
                "gradient_checkpointing": True,
                **({} if bf16_weights else {"precision": "auto"}),
            },
            "rollout": {
                "env": "finqa-lite:1",
                "tasks_per_step": N_TASKS,
                "group_size": GROUP,
                "max_tokens": MAX_NEW,
                "temperature": 1.0,
            },
            "algorithm": {"kl_coef": 0.0},
            "optimizer": {
                "lr": LR,
                "shared_prefix": not args.no_shared_prefix,
                "weights": "bf16" if bf16_weights else "fp32",
            },
            "eval": {"every_steps": 0},
            "checkpoint": {"every_steps": 0},
            "logging": {"tensorboard": False},
        }
    )
    with tempfile.TemporaryDirectory(prefix="vs-trl-ours-") as run_dir:  # its checkpoints take ~2 GB
        result = train(cfg, Path(run_dir), components=Components(env, sampler, Reward("calculator_reward")))
    steps = [
        {
            "step_s": h["time/step_s"],
            "sampling_s": h["time/sampling_s"] + h["time/grading_s"],
            "update_s": h["time/training_s"],
            "reward": h["train_reward_mean"],
            "forward_tokens": h["train_forward_tokens"],
            "sequence_tokens": h.get("train_sequence_tokens", 0.0),
        }
        for h in result.history
    ]
    return {"steps": steps}


# ------------------------------------------------------------------ TRL child (runs under .venv-trl)
def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts = json.loads(Path(args.prompts).read_text())
    timing: dict[str, float] = {"generation_s": 0.0, "forward_s": 0.0}

    class TimedGRPO(GRPOTrainer):
        """Splits each step into generation+scoring, loss forward, and the rest (backward + optimizer)."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            timing["generation_s"] += time.perf_counter() - t0
            return out

        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            t0 = time.perf_counter()
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            timing["forward_s"] += time.perf_counter() - t0
            return out

    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()
            timing["generation_s"] = timing["forward_s"] = 0.0

        def on_step_end(self, *a: Any, **k: Any) -> None:
            total = time.perf_counter() - self.t0
            steps.append(
                {
                    "step_s": total,
                    "sampling_s": timing["generation_s"],
                    "forward_s": timing["forward_s"],
                    "backward_s": total - timing["generation_s"] - timing["forward_s"],
                }
            )

    def reward(prompts: list[Any], completions: list[str], answer: list[float], **_: Any) -> list[float]:
        return [calculator_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    bf16 = bool(args.bf16)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="vs-trl-trl-"),
        max_steps=args.steps,
        learning_rate=LR,
        per_device_train_batch_size=N_TASKS * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        gradient_checkpointing=True,
        bf16=bf16,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    peft_config = (
        LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        if args.finetune == "lora"
        else None
    )
    data = Dataset.from_list([{"prompt": p["prompt"], "answer": p["answer"]} for p in prompts])
    trainer = TimedGRPO(
        model=args.model_dir, reward_funcs=reward, args=config, train_dataset=data, peft_config=peft_config
    )
    trainer.add_callback(StepTimer())
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    for s, r in zip(steps, rewards, strict=False):
        s["reward"] = r
    return {"steps": steps, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


# ------------------------------------------------------------------ orchestration
def _child(role: str, python: str, args: argparse.Namespace, finetune: str, extra: list[str]) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix=f"vs-trl-{role}-", suffix=".json")[1])
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--role",
        role,
        "--finetune-one",
        finetune,
        "--steps",
        str(args.steps),
        "--out",
        str(out),
        *extra,
    ]
    print(f"[{role} {finetune}] {_portable(cmd)}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    res = json.loads(out.read_text())
    out.unlink()
    return res


def _summary(res: dict[str, Any]) -> dict[str, float]:
    steps = res["steps"]
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0] if k != "reward"}
    med["peak_rss_mib"] = res["peak_rss_mib"]
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--finetune", nargs="+", choices=["full", "full-bf16", "lora"], default=["full", "lora"])
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--no-shared-prefix", action="store_true", help="agentrft without shared-prefix updates")
    ap.add_argument("--json", default=None, help="also write every step and the summary table here")
    ap.add_argument("--role", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--finetune-one", default="full", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bf16", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.role is not None:
        args.finetune = args.finetune_one
        res = run_ours(args) if args.role == "ours" else run_trl(args)
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.out).write_text(json.dumps(res))
        return

    from agentrft.precision import bf16_native  # what `policy.precision: auto` picks
    from agentrft.samplers.policies import load_model_and_tokenizer, smollm2_cache_dir

    load_model_and_tokenizer("smollm2-135m")  # makes sure the HF model dir exists in the cache
    model_dir = smollm2_cache_dir("models")
    prompts = build_prompts()
    pfile = Path(tempfile.mkstemp(prefix="vs-trl-prompts-", suffix=".json")[1])
    pfile.write_text(json.dumps(prompts))
    bf16 = int(bf16_native())
    print(
        f"prompts: {N_TASKS} x {GROUP} samples, prompt tokens {[p['prompt_tokens'] for p in prompts]}, "
        f"<= {MAX_NEW} new tokens, bf16={bool(bf16)}, steps={args.steps}",
        flush=True,
    )
    trl_ok = Path(args.trl_python).exists()
    table = []
    runs: dict[str, Any] = {}
    trl_runs: dict[str, dict[str, Any]] = {}  # one TRL run per fine-tune kind (full-bf16 sits beside full)
    for ft in args.finetune:
        ours = _child("ours", sys.executable, args, ft, ["--no-shared-prefix"] if args.no_shared_prefix else [])
        kind = ft.removesuffix("-bf16")
        if kind not in trl_runs:
            trl_runs[kind] = (
                _child(
                    "trl",
                    args.trl_python,
                    args,
                    kind,
                    ["--prompts", str(pfile), "--model-dir", str(model_dir), "--bf16", str(bf16)],
                )
                if trl_ok
                else {"error": f"no TRL interpreter at {args.trl_python}: bash benchmarks/setup_trl.sh"}
            )
        trl = trl_runs[kind]
        runs[f"agentrft {ft}"], runs[f"TRL {ft}"] = ours, trl
        for name, res in (("agentrft", ours), ("TRL", trl)):
            print(f"\n== {name} / {ft}")
            if "error" in res:
                print(f"FAILED: {res['error']}")
                continue
            for i, s in enumerate(res["steps"], 1):
                print(f"  step {i}: " + "  ".join(f"{k}={v:.3f}" for k, v in s.items()))
            print("  median: " + "  ".join(f"{k}={v:.2f}" for k, v in _summary(res).items()))
        if "error" not in ours and "error" not in trl:
            so, st = _summary(ours), _summary(trl)
            row = {
                "finetune": ft,
                "ours_step_s": so["step_s"],
                "trl_step_s": st["step_s"],
                "step_ratio": so["step_s"] / st["step_s"],
                "ours_rss_mib": so["peak_rss_mib"],
                "trl_rss_mib": st["peak_rss_mib"],
                "rss_ratio": so["peak_rss_mib"] / st["peak_rss_mib"],
                "ours_reward": [round(s["reward"], 3) for s in ours["steps"]],
                "trl_reward": [round(s.get("reward", float("nan")), 3) for s in trl["steps"]],
            }
            table.append(row)
    curves = {
        f"{name} {r['finetune']}": r[key]
        for r in table
        for name, key in (("agentrft", "ours_reward"), ("TRL", "trl_reward"))
    }
    if curves:
        print("\nreward mean per step (same 4 prompts x 8 samples each step)")
        print("| step | " + " | ".join(curves) + " |")
        print("|---|" + "---|" * len(curves))
        for i in range(max(len(c) for c in curves.values())):
            print(f"| {i + 1} | " + " | ".join(f"{c[i]:.3f}" if i < len(c) else "-" for c in curves.values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "runs": runs}, indent=1))
    print(
        "\n| finetune | agentrft s/step | TRL s/step | ratio | agentrft peak RSS MiB | TRL peak RSS MiB | ratio |"
        " agentrft reward/step | TRL reward/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['finetune']} | {r['ours_step_s']:.1f} | {r['trl_step_s']:.1f} | {r['step_ratio']:.2f} | "
            f"{r['ours_rss_mib']:.0f} | {r['trl_rss_mib']:.0f} | {r['rss_ratio']:.2f} | {r['ours_reward']} | "
            f"{r['trl_reward']} |"
        )


if __name__ == "__main__":
    main()

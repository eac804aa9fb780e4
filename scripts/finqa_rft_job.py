"""Write a hosted-format RFT job built from finqa-lite level 1: rows, a tools module, a multi grader, the job body.

    .venv/bin/python scripts/finqa_rft_job.py OUT_DIR [--train 32] [--valid 32] [--model smollm2-135m]
    agentrft rft create --job OUT_DIR/job.json --jobs-dir runs/rft

Each row is what a team would have uploaded to a hosted RFT job: ``messages`` (the environment's system
prompt, its worked examples as assistant tool calls and tool results, then the question from the user),
``tools`` (the ``calculate`` function schema) and the grading data (``answer``, ``level``, ``template``).
The training rows come from the ``train`` split, the validation rows from ``held-out`` (unseen companies).
``tools.py`` implements ``calculate`` with the environment's calculator, as a user's module would. The
grader is a ``multi``: the numeric answer within 1% (agentrft's ``numeric`` type, weight 0.9) and the
answer sentence the system prompt asks for (``string_check`` ilike, weight 0.1). The hyperparameters
follow the demo's recipe (4 prompts x 8 samples per step, lr 3e-5, T = 0.7, 48 tokens per turn).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrft.envs.finqa.env import FinqaLiteEnv

TOOLS_MODULE = '''"""The calculate tool of the finqa-lite rows (the environment's calculator, as a user's tools module)."""

from agentrft.envs.finqa.tools import DocumentIndex, FinqaToolState

_STATE = FinqaToolState(DocumentIndex([]))


def calculate(expression: str) -> str:
    """Evaluate arithmetic like "(5829 - 5735) / 5735" or a FinQA program like
    "subtract(5829, 5735), divide(#0, 5735)".

    Args:
        expression: the arithmetic expression or FinQA program
    """
    return _STATE.calculate(expression)
'''

GRADER = {
    "type": "multi",
    "graders": {
        "answer": {
            "type": "numeric",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "rel_tol": 0.01,
        },
        "format": {
            "type": "string_check",
            "input": "{{ sample.output_text }}",
            "reference": "the answer is",
            "operation": "ilike",
        },
    },
    "calculate_output": "0.9 * answer + 0.1 * format",
}


def rows(env: FinqaLiteEnv, split: str, n: int) -> list[dict]:
    out = []
    for task in env.tasks(split)[:n]:
        messages = [m.to_openai() for m in env.initial_messages(task)]
        out.append(
            {
                "messages": messages,
                "tools": env.tool_schemas(),
                "id": task.id,
                "answer": task.data["answer"],
                "level": task.data.get("level"),
                "template": task.data.get("template"),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--train", type=int, default=32, help="training rows (train split)")
    ap.add_argument("--valid", type=int, default=32, help="validation rows (held-out split)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    env = FinqaLiteEnv(levels=1)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, split, n in (("train.jsonl", "train", args.train), ("valid.jsonl", "held-out", args.valid)):
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows(env, split, n)))
    (args.out / "tools.py").write_text(TOOLS_MODULE)
    job = {
        "model": args.model,
        "training_file": "train.jsonl",
        "validation_file": "valid.jsonl",
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {
                    "n_epochs": args.epochs,
                    "batch_size": 4,
                    "learning_rate_multiplier": 1.0,
                    "compute_multiplier": 1.0,
                    "eval_interval": 4,
                    "eval_samples": 1,
                },
            },
        },
        "seed": 0,
        "suffix": "finqa-lite-1",
        "agentrft": {"tools_module": "tools.py", "max_tokens": 48, "temperature": 0.7, "gradient_checkpointing": True},
    }
    (args.out / "job.json").write_text(json.dumps(job, indent=2))
    print(f"wrote {args.out}/train.jsonl ({args.train} rows), valid.jsonl ({args.valid} rows), tools.py, job.json")


if __name__ == "__main__":
    main()

"""How likely is the right calculator call? Log-probs of finqa-lite level-1 calls under a policy, per template.

    .venv/bin/python benchmarks/call_logprobs.py [--policy smollm2-135m | hf:RUN_DIR/policy ...] [--split held-out]

For every task of the split, the prompt is rendered as the agent loop renders it (the environment's system
prompt with the xml tool instructions, its worked examples, the question) and three first turns are scored,
each ``<calculate>EXPR</calculate>`` then the end of the turn: the gold call (the worked examples' infix form
of the task's program, e.g. ``(6528 - 5932) / 5932``), the bare division of the question's first two figures
(``6528 / 5932``) and their difference (``6528 - 5932``). Prints, per template and policy, the median summed
log-prob of each call and its probability per sample at temperature 1 and at the demo's 0.7 (the tempered
log-prob is the call's share after renormalising each token's distribution, computed exactly). A call whose
log-prob stays below about -5 is sampled less than once in a GRPO group of 8 per 20 groups, so reward alone
cannot teach it. Asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import statistics
from collections import defaultdict

import torch

from agentrft.envs.finqa.env import FinqaLiteEnv
from agentrft.envs.finqa.program import program_to_infix
from agentrft.rollout.agent import prompt_messages, to_render
from agentrft.rollout.formats import make_format
from agentrft.samplers.chat_template import render_chat
from agentrft.samplers.policies import load_model_and_tokenizer


def call_logprobs(model: torch.nn.Module, prompt: list[int], conts: list[list[int]]) -> list[tuple[float, float]]:
    """(log-prob at T = 1, log-prob at T = 0.7) of each continuation after ``prompt``: the prompt is run once,
    each continuation on a copy of its KV cache."""
    with torch.no_grad():
        first = model(torch.tensor([prompt]), use_cache=True)
        out = []
        for cont in conts:
            logits = first.logits[0, -1:]
            if len(cont) > 1:
                cache = copy.deepcopy(first.past_key_values)
                rest = model(torch.tensor([cont[:-1]], dtype=torch.long), past_key_values=cache, use_cache=True)
                logits = torch.cat([logits, rest.logits[0]])  # predicts cont[0], ..., cont[-1]
            logits = logits.float()
            target = torch.tensor(cont)[:, None]
            lp1 = torch.log_softmax(logits, -1).gather(-1, target).sum().item()
            lp7 = torch.log_softmax(logits / 0.7, -1).gather(-1, target).sum().item()
            out.append((lp1, lp7))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--split", default="held-out")
    args = ap.parse_args()
    env = FinqaLiteEnv(levels=1)
    tasks = env.tasks(args.split)
    fmt = make_format("xml", env.tool_schemas())
    for name in args.policy:
        model, tok = load_model_and_tokenizer(name)
        model.float().eval()  # a checkpoint saved in bf16 scores in fp32 like the base
        rows: dict[str, list[list[tuple[float, float]]]] = defaultdict(list)
        for task in tasks:
            messages = [to_render(m, fmt) for m in prompt_messages(env, task, fmt)]
            prompt = render_chat(tok, messages, env.task_tool_schemas(task), add_generation_prompt=True)
            a, b = re.findall(r"\$([\d,.]*\d)", task.messages[0].text())[:2]
            a, b = a.replace(",", ""), b.replace(",", "")
            gold = program_to_infix(task.data["program"]) or task.data["program"]
            calls = [gold, f"{a} / {b}", f"{a} - {b}"]
            conts = [tok.encode(f"<calculate>{c}</calculate><|im_end|>", add_special_tokens=False) for c in calls]  # type: ignore[attr-defined]
            rows[task.data["template"]].append(call_logprobs(model, prompt, conts))
        print(f"\n## {name}: {len(tasks)} {args.split} tasks; median log-prob (T = 1 / T = 0.7) of the first turn")
        print("| template | tasks | gold call | a / b | a - b | gold call, per sample at T = 0.7 |")
        print("| --- | --- | --- | --- | --- | --- |")
        for template in sorted(rows):
            cols = list(zip(*rows[template], strict=True))
            med = [(statistics.median(x[0] for x in c), statistics.median(x[1] for x in c)) for c in cols]
            cells = " | ".join(f"{t1:.1f} / {t7:.1f}" for t1, t7 in med)
            print(f"| {template} | {len(rows[template])} | {cells} | {math.exp(med[0][1]):.1e} |")


if __name__ == "__main__":
    main()

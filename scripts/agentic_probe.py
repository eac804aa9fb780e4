"""Teacher-forced probe of a policy on finqa-lite (agentrft.recipes.expert_probe): the expert's held-out episodes,
scored turn by turn under the policy, no sampling. Prints JSON: per level, mean log P and P of each expert turn.

    .venv/bin/python scripts/agentic_probe.py hf:RUN/imitation/policy [--levels 3,4] [--tasks 16] [--out RUN/probe.json]

Turn 3 of levels 3 and 4 is the decision after the first report's calculation (level 3 answers, level 4 goes
on to its second report): `turn_p["3"]` is how likely the policy takes the expert's side of it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrft.envs.registry import make_env
from agentrft.recipes.expert_probe import expert_episodes, probe
from agentrft.samplers.distribution import Distribution
from agentrft.samplers.policies import load_model_and_tokenizer


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="an in-process policy: smollm2-135m, tiny, hf:PATH")
    ap.add_argument("--levels", default="3,4")
    ap.add_argument("--tasks", type=int, default=16, help="expert episodes per level (the split's first tasks)")
    ap.add_argument("--split", default="held-out")
    ap.add_argument("--shots", default="0", help="the prompt's worked examples (the recipe trains on 0)")
    ap.add_argument("--temperature", type=float, default=0.7, help="the sampling distribution scored")
    ap.add_argument("--out", type=Path, help="also write the JSON here (e.g. into the run directory)")
    args = ap.parse_args(argv)
    model, tokenizer = load_model_and_tokenizer(args.policy)
    out: dict[str, object] = {"policy": args.policy, "split": args.split, "temperature": args.temperature}
    for level in (int(x) for x in args.levels.split(",")):
        env = make_env(f"finqa-lite:{level}?shots={args.shots}")
        result = probe(model, expert_episodes(env, tokenizer, args.split, args.tasks), Distribution(args.temperature))
        out[str(level)] = {
            "episodes": result.episodes,
            "turn_logp": {k: round(v, 4) for k, v in result.turn_logp.items()},
            "turn_p": {k: round(v, 4) for k, v in result.turn_p.items()},
            "episode_logp": round(result.episode_logp, 3),
        }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return out


if __name__ == "__main__":
    main()

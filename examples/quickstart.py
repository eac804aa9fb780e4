"""The README's Python example: evaluate, train with the demo's GRPO recipe, evaluate again.

python examples/quickstart.py [POLICY STEPS]     # default: smollm2-135m, 10 steps
"""

import sys
from pathlib import Path

from agentrft.envs import make_env
from agentrft.eval.harness import evaluate
from agentrft.samplers.base import SamplingParams
from agentrft.samplers.policies import load_policy
from agentrft.store import Store
from agentrft.train import load_config, train

POLICY, STEPS = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("smollm2-135m", "10")
env, store = make_env("finqa-lite:1"), Store("agentrft.db")
params = SamplingParams(temperature=0.7, max_tokens=48)
held_out = dict(split="held-out", tasks=32, samples=2, store=store, params=params, progress=False)

before = evaluate(env, load_policy(POLICY), run_name="base", **held_out)
cfg = load_config("demo", [f"policy.name={POLICY}", f"steps={STEPS}"])  # the demo's GRPO recipe
result = train(cfg, Path("runs/api"))  # checkpoints, metrics and the trained policy in runs/api
after = evaluate(env, load_policy("hf:runs/api/policy"), run_name="trained", **held_out)
print(f"pass@1 {before.pass_at_k[1]:.3f} -> {after.pass_at_k[1]:.3f} after {result.steps} steps")

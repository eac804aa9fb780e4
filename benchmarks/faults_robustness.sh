#!/usr/bin/env bash
# Does training under tool faults make the policy more robust to them? finqa-lite level 1, the demo recipe
# (seed 0) trained clean (runs/demo-seeds/seed0, from benchmarks/demo_seeds.py) and under error=0.1 faults
# (runs/faulty); each policy evaluated held-out (32 tasks x 2, T = 0.7, sampling seed 0) clean and at fault
# rates 0.1 and 0.3 (`agentrft eval --faults`): pass@1, episodes hit by a fault, recovery rate.
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/agentrft
[ -d runs/demo-seeds/seed0/policy ] || $A demo --seed 0 --run-dir runs/demo-seeds/seed0 --json > /dev/null
[ -d runs/faulty/policy ] || $A demo --seed 0 --set 'rollout.env=finqa-lite:1?faults=error=0.1' \
  --run-dir runs/faulty --json > runs/faulty.json
for name in clean:runs/demo-seeds/seed0 faulty:runs/faulty; do
  $A eval --env finqa-lite:1 --policy "hf:${name#*:}/policy" --split held-out --tasks 32 --samples 2 \
    --temperature 0.7 --seed 0 --precision auto --db runs/faults_robustness.db --name "${name%%:*}" \
    --faults error=0.1 --faults error=0.3 --json > "runs/faults_robustness_${name%%:*}.json"
done
.venv/bin/python - <<'PY'
import json
for name in ("clean", "faulty"):
    rows = json.load(open(f"runs/faults_robustness_{name}.json"))["robustness"]
    for r in rows:
        rate = "-" if r["recovery_rate"] is None else f"{r['recovery_rate']:.3f}"
        print(f"| trained {name} | {r['faults']} | {r['pass_at_1']:.3f} | {r['hit']} of {r['episodes']} | {rate} |")
PY

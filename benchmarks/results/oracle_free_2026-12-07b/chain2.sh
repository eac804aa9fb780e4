#!/usr/bin/env bash
# after fq3's demo process ends: GRPO on level 2 with groups of 16, then level-3 evals (trained first)
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/agentrft
while pgrep -f "run-dir runs/fq3" >/dev/null; do sleep 10; done
date -u +"fq3 done %FT%TZ"
$A demo --env 'finqa-lite:2' --seed 0 --run-dir runs/fq5 --json --set policy.name=hf:runs/fq3/policy --set steps=20 \
  --set rollout.max_tokens=128 --set optimizer.lr=1e-5 --set rollout.group_size=16 > runs/fq5.json
date -u +"fq5 done %FT%TZ"
for p in hf:runs/fq5/policy smollm2-135m hf:runs/fq3/policy; do
  n=$(echo $p | tr ':/' '__')
  $A eval --env 'finqa-lite:3' --policy $p --tasks 32 --samples 2 --temperature 0.7 --seed 0 --db runs/l3.db --name l3-$n --json > runs/l3_$n.json
  date -u +"l3 $n done %FT%TZ"
done

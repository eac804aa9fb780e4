#!/usr/bin/env bash
# Training from branches of recorded episodes (rollout.branch, train/rl/branches.py) on finqa-lite level 1:
# the parents are the demo's own training episodes (seed 0's run "train-seed0", 320 episodes) that failed after
# a tool call; each step continues 4 of them from turn 1 (the answer, after the recorded tool result) with 8
# samples of the current policy, starting from the base policy; held-out eval before and after as the demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/agentrft
[ -f runs/demo-seeds/seed0/agentrft.db ] || $A demo --seed 0 --run-dir runs/demo-seeds/seed0 --json > /dev/null
$A demo --seed 0 --run-dir runs/branch/demo-turn1 --json \
  --set rollout.branch.run=train-seed0 --set rollout.branch.db=runs/demo-seeds/seed0/agentrft.db \
  --set rollout.branch.turn=1

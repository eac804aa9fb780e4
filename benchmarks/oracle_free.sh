#!/usr/bin/env bash
# Learning from rewards alone on benchmarks written by others (issue: BFCL, reasoning-gym, finqa-lite without
# its oracle). Each command starts from the base SmolLM2-135M (finqa-l2 from finqa-ei's policy, which was built
# from it), evaluates held-out tasks (64 episodes per level or category at T=0.7), trains on its own graded
# rollouts only, evaluates again and writes a paired test per level to RUN_DIR/demo.json. Figures and the CPU they ran on: docs/benchmarks.md. Run from the repo root after
# `bash scripts/setup.sh`; each stage is a few minutes to ~50 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/agentrft
which=${1:-all}

# (a) reasoning-gym with a calculator: GRPO with the curriculum over three datasets
if [[ $which == all || $which == rg ]]; then
  $A demo --env 'reasoning-gym:chain_sum,basic_arithmetic,products?tools=calc' --run-dir runs/rg1 --json > runs/rg1.json
fi
# (a') the same with expert iteration first (rejection sampling on its own successes, then GRPO)
if [[ $which == all || $which == rg-ei ]]; then
  $A demo --env 'reasoning-gym:chain_sum,basic_arithmetic,products?tools=calc' --expert-iteration \
    --run-dir runs/rg-ei --json > runs/rg-ei.json
fi
# (b) BFCL: base model on every category (official per-category accuracy), then GRPO on single-turn categories
# with a shaped training reward (the official verdict + 0.3 for calling an offered function; success, and every
# reported figure, is the official verdict alone)
# (measured 2026-12-06, when ?shots=1's example for a single-turn category also carried the call's result and a
# plain reply; it is the call alone since 2026-12-07)
if [[ $which == all || $which == bfcl-base ]]; then
  # the xml format holds one call per turn, so the parallel categories are played in hermes (<tool_call> JSON)
  $A eval --env 'bfcl:simple,multiple,irrelevance?shots=1' --tasks 32 --samples 2 \
    --temperature 0.7 --db runs/bfcl_base.db --name base-single --json > runs/bfcl_base_single.json
  $A eval --env 'bfcl:parallel,parallel_multiple?shots=1' --tasks 32 --samples 2 --tool-format hermes \
    --temperature 0.7 --db runs/bfcl_base.db --name base-parallel --json > runs/bfcl_base_parallel.json
  # multi-turn episodes are thousands of tokens each: 4 tasks x 2 samples per category on 2 cores
  $A eval --env 'bfcl:multi_turn_base,miss_func,miss_param,long_context?shots=1' --tasks 4 --samples 2 \
    --temperature 0.7 --db runs/bfcl_base.db --name base-multi --json > runs/bfcl_base_multi.json
fi
if [[ $which == all || $which == bfcl ]]; then
  G='{"type": "multi", "graders": {"bfcl": {"type": "bfcl"}, "call": {"type": "tool_called", "successful": true}}, "calculate_output": "bfcl + 0.3 * call"}'
  $A demo --env 'bfcl:simple,multiple?shots=1' --set "rollout.grader=$G" --set rollout.max_tokens=128 \
    --run-dir runs/bfcl1 --json > runs/bfcl1.json
fi
# the same in the pythonic format ([f(a=1)], BFCL's own form for prompted models) with three call-only worked
# examples, where the base model writes a call list in most replies (to an offered function in ~8%); the
# training reward is the official verdict with partial credit for how far the package's AST checker got
# (right function 0.1, right parameter names 0.2, right types 0.3); success is the verdict alone
if [[ $which == all || $which == bfcl-py ]]; then
  $A demo --env 'bfcl:simple?shots=3' --set rollout.tool_format=pythonic \
    --set 'rollout.grader={"type": "bfcl", "partial": true}' --set rollout.max_tokens=96 --set steps=25 \
    --set rollout.tasks_per_step=8 --run-dir runs/bfclpy --json > runs/bfclpy.json
fi
# 25 more steps from that policy, the same reward
if [[ $which == all || $which == bfcl-py2 ]]; then
  $A demo --env 'bfcl:simple?shots=3' --set policy.name=hf:runs/bfclpy/policy --set rollout.tool_format=pythonic \
    --set 'rollout.grader={"type": "bfcl", "partial": true}' --set rollout.max_tokens=96 --set steps=25 \
    --set rollout.tasks_per_step=8 --run-dir runs/bfclpy2 --json > runs/bfclpy2.json
fi
# the same from the base with irrelevance mixed into training (its verdict pays for declining), tasks drawn
# from both categories in one seeded shuffle (no curriculum)
if [[ $which == all || $which == bfcl-py-mix ]]; then
  $A demo --env 'bfcl:simple,irrelevance?shots=3' --set rollout.tool_format=pythonic \
    --set 'rollout.grader={"type": "bfcl", "partial": true}' --set rollout.max_tokens=96 --set steps=25 \
    --set rollout.tasks_per_step=8 --set rollout.curriculum.enabled=false --run-dir runs/bfclpy-mix \
    --json > runs/bfclpy-mix.json
fi
# every held-out simple task (91), not the demo's first 32: base and both trained policies, same seed
if [[ $which == all || $which == bfcl-py-all ]]; then
  for policy in smollm2-135m hf:runs/bfclpy/policy hf:runs/bfclpy2/policy; do
    $A eval --env 'bfcl:simple?shots=3' --tool-format pythonic --policy "$policy" --samples 2 --temperature 0.7 \
      --seed 0 --db runs/bfclpy_all.db --name "${policy//[:\/]/_}" --json > "runs/bfclpy_all_${policy//[:\/]/_}.json"
  done
fi
# the other single-turn categories (never trained on), base and trained, in the same prompt and format
if [[ $which == all || $which == bfcl-py-eval ]]; then
  for policy in smollm2-135m hf:runs/bfclpy2/policy; do
    $A eval --env 'bfcl:multiple,parallel,parallel_multiple,irrelevance?shots=3' --tool-format pythonic \
      --policy "$policy" --tasks 32 --samples 2 --temperature 0.7 --seed 0 --db runs/bfclpy_eval.db \
      --name "${policy//[:\/]/_}" --json > "runs/bfclpy_eval_${policy//[:\/]/_}.json"
  done
fi
# (c) finqa-lite levels 1-3 without the oracle: GRPO with the classic curriculum (level 1 first, the next when
# its rolling pass rate reaches 0.5), the answer plus a share of finqa_process's per-turn credit as the reward
# (a grader reading gold data, not demonstrations), per-turn advantages
if [[ $which == all || $which == finqa ]]; then
  G='{"type": "multi", "graders": {"answer": {"type": "numeric", "name": "answer", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "rel_tol": 0.01}, "process": {"type": "finqa_process", "answer_when_done": 1.0}}, "calculate_output": "answer + 0.2 * max(process, 0)"}'
  $A demo --env 'finqa-lite:1,2,3' --run-dir runs/fq1 --json --set steps=20 --set rollout.max_tokens=128 \
    --set "rollout.grader=$G" --set algorithm.turn_level=true --set algorithm.turn_weight=0.5 \
    --set rollout.curriculum.start_unlocked=1 --set rollout.curriculum.weighting=frontier \
    --set rollout.curriculum.promote_at=0.5 --set rollout.curriculum.keep_share=0.3 \
    --set rollout.curriculum.min_episodes=16 > runs/fq1.json
fi
# (c') the same on levels 1-2 with the outcome alone as the reward (no process credit, no per-turn advantages)
if [[ $which == all || $which == finqa-outcome ]]; then
  $A demo --env 'finqa-lite:1,2' --run-dir runs/fq2 --json --set steps=16 --set rollout.max_tokens=128 \
    --set rollout.curriculum.start_unlocked=1 --set rollout.curriculum.weighting=frontier \
    --set rollout.curriculum.promote_at=0.5 --set rollout.curriculum.keep_share=0.3 \
    --set rollout.curriculum.min_episodes=16 > runs/fq2.json
fi
if [[ $which == all || $which == finqa-ei ]]; then
  # expert iteration on levels 1-2 (6 rounds of 32 tasks x 8 of the policy's own episodes, 2 SFT steps each on the
  # best success per task), then GRPO at lr 1e-5 with the curriculum; the reward the numeric answer alone
  $A demo --env 'finqa-lite:1,2' --expert-iteration --run-dir runs/fq3 --json --set steps=12 --set rollout.max_tokens=128 \
    --set optimizer.lr=1e-5 --set ei.rollout.max_tokens=128 --set ei.steps=12 \
    --set rollout.curriculum.start_unlocked=1 --set rollout.curriculum.weighting=frontier \
    --set rollout.curriculum.promote_at=0.5 --set rollout.curriculum.keep_share=0.3 \
    --set rollout.curriculum.min_episodes=16 > runs/fq3.json
fi
# (c'') then GRPO on level 2 alone from finqa-ei's policy: groups of 16 (with 8, most groups had one outcome),
# 20 steps at lr 1e-5, the reward the numeric answer alone
if [[ $which == all || $which == finqa-l2 ]]; then
  $A demo --env 'finqa-lite:2' --seed 0 --run-dir runs/fq5 --json --set policy.name=hf:runs/fq3/policy --set steps=20 \
    --set rollout.max_tokens=128 --set optimizer.lr=1e-5 --set rollout.group_size=16 > runs/fq5.json
fi
# GRPO on finqa-lite level 3 as every level-3 stage below runs it: 4 tasks x 8 a step, 128 tokens a turn,
# per-turn Dr. GRPO advantages, segments layout with the context's gradient stopped, a checkpoint every 2 steps.
# Arguments: run (under runs/), policy, seed, steps, lr, grader spec (JSON), then any further --set arguments.
l3_grpo() {
  $A train self-improve --seed "$3" --run-dir "runs/$1" --json --set rollout.env=finqa-lite:3 \
    --set policy.name="$2" --set steps="$4" --set rollout.max_tokens=128 --set optimizer.lr="$5" \
    --set rollout.tasks_per_step=4 --set rollout.group_size=8 --set "rollout.grader=$6" \
    --set algorithm.advantage=dr_grpo --set algorithm.turn_level=true --set algorithm.turn_weight=0.5 \
    --set optimizer.shared_prefix_layout=segments --set optimizer.shared_prefix_row_tokens=4096 \
    --set optimizer.context_grad=stop --set policy.gradient_checkpointing=false --set checkpoint.every_steps=2 \
    "${@:7}" > "runs/$1.json"
}
# (c''') GRPO on level 3 from finqa-l2's policy, no oracle and no demonstrations: the reward the numeric answer
# plus half of finqa_process's credit, read from gold data along the path (the search that lists the gold report,
# opening it, a calculation on its figures, answering then), per-turn advantages, Dr. GRPO (no division by the
# group's std, so process-only differences stay small); 4 tasks x 8 a step, 8 steps, lr 1e-5 (constant). The
# update runs the context (prompt, search results, pages) forward without autograd (context_grad=stop): a first
# try with the exact gradient and 6 tasks a step took 716 s for its first step (518 s of it the update), stopped.
# The 2026-12-07 run was started with steps=14 and stopped after its step-8 checkpoint for the session's time;
# its weights were exported to runs/fq8/policy-step8 (`agentrft export-policy runs/fq8 --out runs/fq8/policy-step8`
# writes them bit for bit; with a constant learning rate and the same seeded draws, steps=8 is the same run's first
# 8 steps).
# The planned test, written before the run: every held-out level-3 task (60) x 2 at T = 0.7, seed 0, paired
# against the base SmolLM2-135M (finqa-l3-base) and against finqa-l2's policy (on 2026-12-07 that one was not
# rerun here: its 60-task figure is the stopped first try's baseline eval, runs/fq7, sampling seed 7919).
if [[ $which == all || $which == finqa-l3 ]]; then
  G='{"type": "multi", "graders": {"answer": {"type": "numeric", "name": "answer", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "rel_tol": 0.01}, "process": {"type": "finqa_process", "answer_when_done": 1.0}}, "calculate_output": "answer + 0.5 * process"}'
  l3_grpo fq8 hf:runs/fq5/policy 0 8 1e-5 "$G"
  for p in hf:runs/fq8/policy hf:runs/fq5/policy; do
    n=$(echo "$p" | tr ':/' '__')
    $A eval --env 'finqa-lite:3' --policy "$p" --tasks 60 --samples 2 --temperature 0.7 --seed 0 \
      --db runs/l3_60.db --name "l3-60-$n" --json > "runs/l3_60_$n.json"
  done
fi
# (c'''') GRPO on level 3 again, from the step-8 policy above, with the process credit moved onto what failed
# there (the wrong report, the wrong figures): the search's listing is no longer paid (searching the company's
# name lists every year's report), the calculation on the gold figures is worth twice the opening, and the process
# weighs as much as the answer: reward = answer + finqa_process(retrieved 0, opened 1, calculation 2,
# answer_when_done 1). lr 2e-5 (at 1e-5 the policy's entropy fell to 0.1-0.3 while its answers stayed put),
# 4 tasks x 8, 8 steps, seed 1 (other training draws than the run above). Planned test, written before the run:
# the final policy on every held-out level-3 task (60) x 2 at T = 0.7, seed 0, paired against the base's episodes
# in runs/l3_60.db.
if [[ $which == all || $which == finqa-l3b ]]; then
  G='{"type": "multi", "graders": {"answer": {"type": "numeric", "name": "answer", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "rel_tol": 0.01}, "process": {"type": "finqa_process", "retrieved": 0.0, "opened": 1.0, "calculation": 2.0, "answer_when_done": 1.0}}, "calculate_output": "answer + process"}'
  l3_grpo fq9 hf:runs/fq8/policy-step8 1 8 2e-5 "$G"
  $A eval --env 'finqa-lite:3' --policy hf:runs/fq9/policy --tasks 60 --samples 2 --temperature 0.7 --seed 0 \
    --db runs/l3_60.db --name l3-60-fq9 --json > runs/l3_60_fq9.json
fi
# (c''''') 6 more GRPO steps on level 3, from (c'''')'s policy, with the loophole (c'''') found closed: its policy
# learned to write the gold figures in half a program (subtract(a, b) for a percentage change), which reached every
# finqa_process milestone and was paid answer_when_done for answering the wrong number; done_needs_result pays that
# only once a calculation's result is the gold answer. pass_threshold 1.5: a training episode's success is the
# answer's (answer + process reaches 1.0 on process alone). lr 2e-5, 4 tasks x 8, seed 2. Planned test, written
# before the run: the final policy on every held-out level-3 task (60) x 2 at T = 0.7, seed 0, paired against the
# base's episodes in runs/l3_60.db.
if [[ $which == all || $which == finqa-l3c ]]; then
  G='{"type": "multi", "pass_threshold": 1.5, "graders": {"answer": {"type": "numeric", "name": "answer", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "rel_tol": 0.01}, "process": {"type": "finqa_process", "retrieved": 0.0, "opened": 1.0, "calculation": 2.0, "answer_when_done": 1.0, "done_needs_result": true}}, "calculate_output": "answer + process"}'
  l3_grpo fq10 hf:runs/fq9/policy 2 6 2e-5 "$G"
  $A eval --env 'finqa-lite:3' --policy hf:runs/fq10/policy --tasks 60 --samples 2 --temperature 0.7 --seed 0 \
    --db runs/l3_60.db --name l3-60-fq10 --json > runs/l3_60_fq10.json
fi
# (c'''''') Branched GRPO on level 3 (rollout.branch), from the step-8 policy of (c''') (the last one whose
# calculations were whole programs; (c'''') and (c''''') learned half programs), no oracle: the parents are the
# policies' own level-3 training episodes of (c''')-(c''''') whose first open read the task's own report
# (benchmarks/l3_parents.py: 357 episodes of 61 tasks; one parent a task, 60 of them failed ones), and each group
# continues its parent from the turn after that open (after_tool:open), so the calculation and the answer are what
# is sampled and trained, from the page they need. The fresh-episode runs above reached that page in 48-101 of 120
# held-out episodes but a right answer in 2 of 704 training episodes. Reward answer + 0.5 * finqa_process(retrieved
# 0, opened 1, calculation 2, answer_when_done 1, done_needs_result); 8 parents x 8 a step, 8 steps, lr 2e-5, seed
# 3, no curriculum (the parents choose the tasks). Planned test, written before the run: the final policy from the
# prompt (not from a branch) on every held-out level-3 task (60) x 2 at T = 0.7, seed 0, paired against the base's
# episodes in runs/l3_60.db and against (c''')'s.
if [[ $which == all || $which == finqa-l3d ]]; then
  rm -f runs/l3_parents.db
  .venv/bin/python benchmarks/l3_parents.py runs/l3_parents.db runs/fq8 runs/fq9 runs/fq10
  G='{"type": "multi", "graders": {"answer": {"type": "numeric", "name": "answer", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "rel_tol": 0.01}, "process": {"type": "finqa_process", "retrieved": 0.0, "opened": 1.0, "calculation": 2.0, "answer_when_done": 1.0, "done_needs_result": true}}, "calculate_output": "answer + 0.5 * process"}'
  l3_grpo fq11 hf:runs/fq8/policy-step8 3 8 2e-5 "$G" --set rollout.tasks_per_step=8 \
    --set rollout.curriculum.enabled=false --set rollout.branch.run=l3-parents \
    --set rollout.branch.db=runs/l3_parents.db --set rollout.branch.turn=after_tool:open
  $A eval --env 'finqa-lite:3' --policy hf:runs/fq11/policy --tasks 60 --samples 2 --temperature 0.7 --seed 0 \
    --db runs/l3_60.db --name l3-60-fq11 --json > runs/l3_60_fq11.json
fi
if [[ $which == all || $which == finqa-l3-base ]]; then
  $A eval --env 'finqa-lite:3' --policy smollm2-135m --tasks 60 --samples 2 --temperature 0.7 --seed 0 \
    --db runs/l3_60.db --name l3-60-base --json > runs/l3_60_base.json
fi
# level 3 (search, open, calculate; never trained on) for the trained policies and the base
if [[ $which == all || $which == finqa-l3-eval ]]; then
  for p in hf:runs/fq5/policy smollm2-135m hf:runs/fq3/policy; do
    n=$(echo "$p" | tr ':/' '__')
    $A eval --env 'finqa-lite:3' --policy "$p" --tasks 32 --samples 2 --temperature 0.7 --seed 0 --db runs/l3.db \
      --name "l3-$n" --json > "runs/l3_$n.json"
  done
fi

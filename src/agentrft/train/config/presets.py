"""The named training configs (`agentrft train PRESET`, `load_config("demo")`): plain dicts that
`config.build_config` validates, so a preset is checked exactly as a user's YAML file is."""

from __future__ import annotations

from typing import Any

# The demo's recipe (`agentrft demo` trains with exactly these): SmolLM2-135M, full fine-tune, finqa-lite
# level 1. T=0.7: at T=1 the 135M model almost never completes a task (0/48 measured), greedy ~50%.
_DEMO: dict[str, Any] = {
    "seed": 0,
    "steps": 10,
    "policy": {"name": "smollm2-135m", "finetune": "full", "gradient_checkpointing": True},
    "rollout": {"env": "finqa-lite:1", "tasks_per_step": 4, "group_size": 8, "temperature": 0.7, "max_tokens": 48},
    "algorithm": {"advantage": "grpo", "aggregation": "token_mean", "eps_low": 0.2, "eps_high": 0.28},
    "optimizer": {"lr": 3e-5, "warmup_steps": 1, "schedule": "constant", "grad_clip": 1.0},
    "eval": {"every_steps": 0},
    "checkpoint": {"every_steps": 4, "keep_last": 1},
    "logging": {"tensorboard": True},
}
# Filtered SFT of SmolLM2-135M on recorded successes; `agentrft sft --data SOURCE` starts from it. On the demo's
# 53 distinct successes (demo2 run) these 16 steps (2.4 epochs) took held-out pass@1 from 0.109 to 0.688.
# No gradient checkpointing: a step of 8 trajectories packs to ~1,500 tokens (one shared prompt), 4.9 GiB peak RSS.
_SFT: dict[str, Any] = {
    "method": "sft",
    "seed": 0,
    "steps": 16,
    "policy": {"name": "smollm2-135m", "finetune": "full", "gradient_checkpointing": False},
    "data": {"success_only": True},
    "sft": {"batch_size": 8},
    "rollout": {"env": "finqa-lite:1", "temperature": 0.7, "max_tokens": 48},
    "optimizer": {"lr": 3e-5, "warmup_steps": 2, "schedule": "cosine", "grad_clip": 1.0},
    "eval": {"every_steps": 0},
    "checkpoint": {"every_steps": 10, "keep_last": 1},
    "logging": {"tensorboard": True},
}
# The agentic recipe (`agentrft demo --agentic`, agentic.py) on finqa-lite levels 1-4. Every task is prompted as its
# own level is (FinqaLiteEnv.initial_messages), so the evals of finqa-lite:N measure what was trained.
AGENTIC_ENV = "finqa-lite:1,2,3,4"
# Oracle demonstrations per level (`agentic_settings.AgenticSettings.demo_tasks`), one shuffled pass over all four levels.
# Imitation time goes where the held-out pass rate moves: on the zero-shot prompt a batch of 8 costs ~10 s on
# levels 1-2, ~55 s on level 3 and ~95 s on level 4 (2-core Xeon with AMX). Level 4 shares the pass with the others
# because the expert states its plan ("I need two reports: ...", envs/finqa/expert.py plan_text): before it, a
# policy imitated level 3's pattern or level 4's, never both, whatever the mix or a second pass's replay. These
# counts are runs/s1's (2026-12-03: 32 steps in 32.8 min, held-out levels 2 / 3 / 4 0.844 / 0.562 / 0.250);
# every run behind them is in docs/agentic.md. `recipe.late_levels=[4]` brings back a second pass.
AGENTIC_DEMO_TASKS: dict[int, int] = {1: 16, 2: 48, 3: 128, 4: 64}
AGENTIC_LATE_REPLAY = 64  # first-pass demonstrations of each earlier level replayed in a second pass
AGENTIC_LATE_LEVELS: tuple[int, ...] = ()  # imitated in a second pass (`agentic_settings.AgenticSettings.late_levels`)
_AGENTIC_BATCH = 8


def one_pass(counts: dict[int, int]) -> int:
    """SFT steps of one pass over demonstrations counted per level, in the recipe's batches."""
    return -(-sum(counts.values()) // _AGENTIC_BATCH)


def split_passes(
    counts: dict[int, int], late_levels: tuple[int, ...] | list[int], replay: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Demonstrations per level of the first imitation pass and of the late one (empty: no second pass); the late
    pass also replays the first `replay` of each first-pass level (`agentic_settings.AgenticSettings.late_replay`)."""
    first = {lv: n for lv, n in counts.items() if lv not in late_levels}
    late = {lv: n for lv, n in counts.items() if lv in late_levels}
    if late and replay:
        late |= {lv: min(n, replay) for lv, n in first.items()}
    return first, dict(sorted(late.items()))


_FIRST_COUNTS, _LATE_COUNTS = split_passes(AGENTIC_DEMO_TASKS, AGENTIC_LATE_LEVELS, AGENTIC_LATE_REPLAY)
# the late preset's own steps (at least one: with no late levels it is used only when `late_levels` names some,
# and then `agentic_settings.agentic_configs` sets its steps from those)
_FIRST_STEPS, _LATE_STEPS = one_pass(_FIRST_COUNTS), max(1, one_pass(_LATE_COUNTS))
# Imitation: filtered SFT on the oracle's demonstrations (run "demos" of the recipe's store: data.source).
# One pass over the recipe's demonstrations; a batch is 8 whose prompts open alike (sft.group_by_prompt: on the
# recipe's zero-shot prompt the system prompt with its tools, so levels 1-2 (calculator only) and levels 3-4),
# packed as segments in 8192-token rows, so the shared prompt (~230-300 tokens zero-shot; with the worked example
# 470-2,340) runs once per row instead of once per demonstration. (Rows of 12,288 tokens, which run a level-4
# prompt once per 4 demonstrations instead of 2, were no faster: 208 s against 200 s for the same first batch,
# and 19.6 GiB peak.)
# The first run of the recipe (24 steps over 48 per level, lr 3e-5) fitted its demonstrations (nll 0.43 -> 0.08)
# but mostly picked the wrong formula on held-out questions.
_AGENTIC_IMITATION: dict[str, Any] = {
    **_SFT,
    "steps": _FIRST_STEPS,
    "policy": {**_SFT["policy"], "sampler_precision": "auto"},
    "data": {"success_only": True, "runs": ["demos"]},
    "sft": {"batch_size": _AGENTIC_BATCH, "group_by_prompt": True},
    "rollout": {"env": AGENTIC_ENV, "temperature": 0.7, "max_tokens": 192},
    "optimizer": {
        **_SFT["optimizer"],
        "lr": 1e-4,
        "warmup_steps": 3,
        "shared_prefix_layout": "segments",
        "shared_prefix_row_tokens": 8192,
        "micro_batch_tokens": 8192,
    },
    "checkpoint": {"every_steps": 4, "keep_last": 1},
}
# The second pass: one pass over the late levels' demonstrations (run "demos-late"), from the first pass's weights.
_AGENTIC_IMITATION_LATE: dict[str, Any] = {
    **_AGENTIC_IMITATION,
    "steps": _LATE_STEPS,
    "data": {"success_only": True, "runs": ["demos-late"]},
    "optimizer": {**_AGENTIC_IMITATION["optimizer"], "warmup_steps": 1},
    "checkpoint": {"every_steps": 2, "keep_last": 1},
}
# RL from the imitated weights: GRPO with the curriculum over levels, the outcome plus a share of the process
# credit as the reward (success = the right answer), and the per-turn process rewards as turn-level advantages.
_AGENTIC_RL: dict[str, Any] = {
    **_DEMO,
    "steps": 8,
    # Every level, from the first step: the imitated policy has learned all four, and the steps the reward moves
    # must see both sides of the turn after a report's calculation (level 3 answers there, level 4 looks up the
    # second report). RL on levels 1-3 alone rewarded "answer" there and took level 4 from 0.250 to 0 in 8 steps
    # (runs/s1, docs/agentic.md). The curriculum starts with every level unlocked and weighs each by p(1-p) of its
    # rolling pass rate (the levels whose groups are mixed, where GRPO has signal), keep_share spread over all,
    # and stratified: each step holds every level its share of the 4 tasks. The process grader pays the answer
    # once every milestone is reached (`answer_when_done`), so level 3's side of that turn is credited too.
    # The step is small (lr 3e-6, not the demo's 3e-5) and the advantage Dr. GRPO's (no division by the group's
    # std): Adam moves every weight by about lr in its first steps whatever the gradient's size, and at 3e-5 four
    # steps took level 3's P(answer after the calculation) from 0.75 to 0.0001; at 3e-6 GRPO's std division still
    # blew the process-only differences of all-failing level-4 groups up to full-size advantages (0.94 -> 0.73),
    # Dr. GRPO kept 0.86 (runs/rlA, rlB of 2026-12-06, docs/agentic.md). One expert per group pulled level 3 down
    # further (0.47: its level-4 success in a failing group is the largest advantage of the step).
    "policy": {**_DEMO["policy"], "sampler_precision": "auto"},
    "rollout": {
        "env": AGENTIC_ENV,
        "tasks_per_step": 4,
        "group_size": 8,
        "temperature": 0.7,
        "max_tokens": 192,
        "grader": {
            "type": "multi",
            "graders": {
                "answer": {
                    "type": "numeric",
                    "name": "answer",
                    "input": "{{ sample.output_text }}",
                    "reference": "{{ item.answer }}",
                    "rel_tol": 0.01,
                },
                "process": {"type": "finqa_process", "answer_when_done": 1.0},
            },
            "calculate_output": "answer + 0.2 * max(process, 0)",
        },
        "curriculum": {
            "enabled": True,
            "window": 32,
            "min_episodes": 16,
            "promote_at": 0.6,
            "keep_share": 0.3,
            "start_unlocked": 4,
            "weighting": "learnability",
            "stratified": True,
        },
    },
    "algorithm": {**_DEMO["algorithm"], "advantage": "dr_grpo", "turn_level": True, "turn_weight": 0.5},
    # A level-3 group is 8 episodes of ~2.4k tokens sharing a ~1.5k-token prompt: the tree's 2048-token rows hold
    # one episode each (nothing shared: 58,831 tokens through the model in the recipe's first level-3 step), the
    # segment layout runs each prompt once (16,350 tokens for the same step's trajectories).
    "optimizer": {
        **_DEMO["optimizer"],
        "lr": 3e-6,
        "shared_prefix_layout": "segments",
        "shared_prefix_row_tokens": 4096,
    },
    "checkpoint": {"every_steps": 4, "keep_last": 1},
}
# Rejection-sampling fine-tuning (RFT / expert iteration) of the demo's policy on the demo's tasks:
# each round samples 8 tasks x 8 episodes, keeps the best success of each task, takes 4 SFT steps.
_REJECTION: dict[str, Any] = {
    **_SFT,
    "method": "rejection_sampling",
    "steps": 12,
    "data": {"success_only": True, "best_of_n": 1},
    "rejection_sampling": {"steps_per_round": 4, "tasks_per_round": 8},
    "rollout": {**_DEMO["rollout"]},
    "checkpoint": {"every_steps": 4, "keep_last": 1},
}
PRESETS: dict[str, dict[str, Any]] = {
    "demo": _DEMO,
    "sft": _SFT,
    "agentic-imitation": _AGENTIC_IMITATION,
    "agentic-imitation-late": _AGENTIC_IMITATION_LATE,
    "agentic-rl": _AGENTIC_RL,
    "rejection-sampling": _REJECTION,
    # Learning from rewards alone (`agentrft demo --env SPEC`, demo.py): no demonstrations, no
    # expert; the base policy's own graded rollouts. GRPO as the demo's (lr 3e-5, 4 tasks x 8 samples), with the
    # curriculum over the environment's levels (a reasoning-gym dataset, a BFCL category, a finqa-lite level) all
    # open from the start and weighed by p(1-p) of their rolling pass rates, so the steps go where groups are mixed.
    "self-improve": {
        **_DEMO,
        "steps": 12,
        "rollout": {
            **_DEMO["rollout"],
            "max_tokens": 96,
            "curriculum": {
                "enabled": True,
                "window": 32,
                "min_episodes": 8,
                "keep_share": 0.2,
                "start_unlocked": 99,
                "weighting": "learnability",
                "stratified": True,
            },
        },
    },
    # Expert iteration's first stage (`agentrft demo --env SPEC --expert-iteration`): rejection-sampling fine-tuning
    # on the policy's own successes (the best success of each task), before the GRPO stage above.
    "self-improve-ei": {
        **_REJECTION,
        "steps": 8,
        "rejection_sampling": {"steps_per_round": 2, "tasks_per_round": 32},
        "rollout": {**_DEMO["rollout"], "max_tokens": 96},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
    },
    # Minutes, not hours: a smoke run of the same pipeline.
    "demo-quick": {
        **_DEMO,
        "steps": 2,
        "rollout": {**_DEMO["rollout"], "tasks_per_step": 2, "group_size": 4, "max_tokens": 40},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
    },
}

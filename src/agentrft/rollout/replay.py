"""Branch from any turn: a recorded episode rebuilt token-exactly up to turn T, then K continuations sampled by a
(new) policy from there, graded and stored as one group linked to the parent.

`prefix_of(traj, T)` cuts a stored trajectory where its turn T was about to be sampled: the token record up to
that point exactly as recorded (prompt, the earlier turns' sampled ids, the tool results the policy saw), the
conversation and the events of turns before T. It works for in-process episodes and for episodes stitched from
`agentrft serve` sessions (an agent program's), as long as the prefix is one token sequence (a session whose
client rewrote its history before turn T is refused). `branch` plays the continuations through the agent loop
(the runner's episodes, `run_episode(prefix=...)`): the environment is brought to the prefix's point by running its tool calls again
(the policy sees the recorded results; calls whose result now differs are listed in
``metadata.replayed_calls_differ``), and from turn T on everything is the new policy's and the environment's.
Each branch records ``metadata.branch_of`` (the parent's id) and ``metadata.branch_turn``; the K branches share a
group id, so they are a GRPO group rooted at that turn.
"""

from __future__ import annotations

from typing import Any

from agentrft.envs.base import Environment
from agentrft.graders import Grader
from agentrft.inputs import InputError
from agentrft.rollout.agent import EpisodePrefix
from agentrft.rollout.runner import Runner
from agentrft.samplers.base import SamplingParams, TokenSampler
from agentrft.types import Task, Trajectory


def prefix_of(traj: Trajectory, turn: int) -> EpisodePrefix:
    """``traj`` up to the moment its turn ``turn`` (0-based) was sampled; InputError when it cannot be cut there."""
    tok = traj.tokens
    if tok is None or not tok.ids:
        raise InputError(f"trajectory {traj.id} has no token record (an eval-only endpoint's): nothing to replay")
    sampled_turns = sorted({t for t, m in zip(tok.turn, tok.loss_mask, strict=True) if m})
    if turn not in sampled_turns:
        raise InputError(f"--turn {turn}: trajectory {traj.id} sampled turns {sampled_turns}")
    end = next(i for i, (t, m) in enumerate(zip(tok.turn, tok.loss_mask, strict=True)) if t == turn and m)
    if tok.segment is not None and tok.segment[end] != 0:
        raise InputError(
            f"--turn {turn}: trajectory {traj.id}'s token record starts a new sequence before that turn (its client "
            "rewrote the conversation), so no single recorded prefix leads to it"
        )
    assistants = [i for i, m in enumerate(traj.messages) if m.role == "assistant" and i >= traj.n_prompt_messages]
    cut = assistants[turn] if turn < len(assistants) else len(traj.messages)
    return EpisodePrefix(
        turn=turn,
        messages=[m.model_copy(deep=True) for m in traj.messages[:cut]],
        n_prompt_messages=traj.n_prompt_messages,
        events=[e for e in traj.events if getattr(e, "turn", 0) < turn and e.type in ("model_call", "tool_call")],
        ids=tok.ids[:end],
        loss_mask=tok.loss_mask[:end],
        logprobs=tok.logprobs[:end],
        turns=tok.turn[:end],
        parent=traj.id,
    )


async def branch(
    env: Environment,
    sampler: TokenSampler,
    parent: Trajectory,
    task: Task,
    turn: int,
    samples: int,
    *,
    params: SamplingParams,
    tool_format: str = "xml",
    grader: Grader | None = None,
    store: Any = None,
    run_id: str = "",
) -> list[Trajectory]:
    """``samples`` continuations of ``parent`` from its turn ``turn``, graded and stored (see the module
    docstring): the runner's episodes, in lockstep, each starting from the prefix."""
    if samples < 1:
        raise InputError(f"--samples must be at least 1, got {samples}")
    runner = Runner(
        env,
        sampler,
        store=store,
        grader=grader,
        tool_format=tool_format,
        params=params,
        progress=False,
        prefixes={task.id: prefix_of(parent, turn)},
    )
    return await runner.run([task], samples, run_id=run_id)

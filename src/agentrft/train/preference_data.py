"""Preference pairs as token sequences, for DPO (and the reward model): where pairs come from,
the checks they pass before any model loads, and the two sequences of each pair.

Sources, exactly one: a TRL pairs file (``dpo.pairs``, read by `agentrft.pairs.read_pairs`),
or recorded trajectories (``data``: `train.data.select_trajectories`) paired by the one rule
of `agentrft.pairs.build_pairs`. An empty selection, no pair passing the margin, a bad pairs
line or a token record that disagrees with its messages is an `InputError` naming what and
where (``FILE:LINE: field ...`` or ``SOURCE: trajectory ID: field 'tokens...'``).

Sequences. When both trajectories of a pair carry token records, their tokens are used as
recorded (never re-tokenised): ``loss_mask`` 1 exactly on the sampled tokens of every turn.
Otherwise (a pairs file, an imported chat log) both sides are rendered through the policy's
chat template, tool calls written in ``rollout.tool_format``: the prompt with the generation
prompt, then each message appended; an assistant message's new tokens are loss tokens up to
and including its first end-of-sequence id (what a sampler stops at; the template's newline
after it is not), tool messages and generation prompts are not. A template that does not
render by appending (it rewrites earlier turns) is refused for that pair. The count of
rendered pairs is reported (``data/pairs_rendered``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrft.inputs import InputError
from agentrft.pairs import Pair, build_pairs, read_pairs, require_pairs
from agentrft.types import Message, Trajectory

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], list[int]]


@dataclass(frozen=True)
class PairTokens:
    """Token ids and loss masks of a pair's two sequences (each list of length T_c or T_r)."""

    pair_id: str
    chosen_ids: list[int]
    chosen_mask: list[int]
    rejected_ids: list[int]
    rejected_mask: list[int]
    rendered: bool  # True: through the chat template; False: the recorded token records


def load_pairs(
    pairs_file: str | None, data: Any, *, margin: float, per_task: int
) -> tuple[list[Pair], dict[str, float]]:
    """The pairs to train on and counts for the metrics; every refusal is an `InputError`.
    ``data`` is a `train.data.DataConfig`."""
    from agentrft.train.data import select_trajectories

    if (pairs_file is None) == (data.source is None):
        raise InputError(
            "dpo.pairs / data.source: name exactly one source of pairs: a TRL pairs file (dpo.pairs, --pairs) "
            "or recorded trajectories to pair (data.source, --db)"
        )
    if pairs_file is not None:
        pairs = read_pairs(pairs_file)
        return pairs, {"data/pairs": float(len(pairs))}
    trajs, _ = select_trajectories(data)
    pairs, stats = build_pairs(trajs, margin=margin, per_task=per_task)
    require_pairs(pairs, stats, source=f"data.source {data.source}", margin=margin)
    for pair in pairs:
        check_pair_tokens(pair, data.source)
    return pairs, {
        "data/trajectories": float(len(trajs)),
        "data/tasks_with_pairs": float(stats.tasks_with_pairs),
        "data/pairs": float(len(pairs)),
    }


def _sampled_spans(traj: Trajectory) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of sampled tokens."""
    assert traj.tokens is not None
    spans: list[tuple[int, int]] = []
    mask = traj.tokens.loss_mask
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            spans.append((i, i))
        if m:
            spans[-1] = (spans[-1][0], i + 1)
    return spans


def check_token_record(traj: Trajectory, where: str) -> None:
    """The token record agrees with the messages: one run of sampled tokens per assistant turn after the
    prompt, in turn order (``tokens.turn``), and the first token is not sampled."""
    tok = traj.tokens
    assert tok is not None
    at = f"{where}: trajectory {traj.id}"
    spans = _sampled_spans(traj)
    if not spans:
        raise InputError(f"{at}: field 'tokens.loss_mask': no sampled token to learn from")
    if tok.loss_mask[0]:
        raise InputError(f"{at}: field 'tokens.loss_mask': the first token is marked sampled (it has no context)")
    turns = [sorted(set(tok.turn[a:b])) for a, b in spans]
    if len(spans) != traj.num_turns or turns != [[k] for k in range(traj.num_turns)]:
        raise InputError(
            f"{at}: field 'tokens': the token record disagrees with the messages: {len(spans)} runs of sampled "
            f"tokens (turns {turns}) for {traj.num_turns} assistant turns after the prompt"
        )


def check_pair_tokens(pair: Pair, source: str) -> None:
    """Token records of a pair built from trajectories: each agrees with its messages, and both start with
    the same prompt tokens (they share the prompt messages)."""
    c, r = pair.chosen_trajectory, pair.rejected_trajectory
    if c is None or r is None or c.tokens is None or r.tokens is None:
        return
    for traj in (c, r):
        check_token_record(traj, source)
    a, b = c.tokens.ids[: c.tokens.loss_mask.index(1)], r.tokens.ids[: r.tokens.loss_mask.index(1)]
    if a != b:
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise InputError(
            f"{source}: {pair.where}: field 'tokens.ids': same prompt messages but different prompt tokens (from "
            f"token {k}); sampled with different tokenizers or templates?"
        )


def _extend(
    ids: list[int], mask: list[int], full: list[int], loss: bool, eos_ids: frozenset[int], where: str
) -> tuple[list[int], list[int]]:
    if full[: len(ids)] != ids:
        raise InputError(
            f"{where}: the policy's chat template does not render this conversation by appending (a later message "
            "changes earlier tokens), so its loss tokens cannot be told apart"
        )
    new = full[len(ids) :]
    new_mask = [0] * len(new)
    if loss:
        end = next((i + 1 for i, t in enumerate(new) if t in eos_ids), len(new))
        new_mask[:end] = [1] * end
    return full, mask + new_mask


def render_conversation(
    prompt: Sequence[Message],
    continuation: Sequence[Message],
    render: Render,
    to_render: Callable[[Message], dict[str, Any]],
    eos_ids: frozenset[int],
    where: str,
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of ``prompt + continuation`` through the chat template (see the module docstring)."""
    msgs = [to_render(m) for m in prompt]
    ids = list(render(msgs, None, True))
    mask = [0] * len(ids)
    for j, m in enumerate(continuation):
        msgs.append(to_render(m))
        nxt = continuation[j + 1] if j + 1 < len(continuation) else None
        if m.role == "assistant":
            ids, mask = _extend(ids, mask, list(render(msgs, None, False)), True, eos_ids, where)
        if nxt is not None and nxt.role == "assistant":
            ids, mask = _extend(ids, mask, list(render(msgs, None, True)), False, eos_ids, where)
        elif nxt is None and m.role != "assistant":
            ids, mask = _extend(ids, mask, list(render(msgs, None, False)), False, eos_ids, where)
    if not any(mask):
        raise InputError(f"{where}: renders to no assistant token to learn from")
    return ids, mask


def encode_pair(
    pair: Pair, render: Render, to_render: Callable[[Message], dict[str, Any]], eos_ids: frozenset[int]
) -> PairTokens:
    """The pair's two sequences: its token records when both trajectories have one, else the chat template."""
    c, r = pair.chosen_trajectory, pair.rejected_trajectory
    if c is not None and r is not None and c.tokens is not None and r.tokens is not None:
        return PairTokens(
            pair.id, list(c.tokens.ids), list(c.tokens.loss_mask), list(r.tokens.ids), list(r.tokens.loss_mask), False
        )
    ci, cm = render_conversation(pair.prompt, pair.chosen, render, to_render, eos_ids, f"{pair.where}: chosen")
    ri, rm = render_conversation(pair.prompt, pair.rejected, render, to_render, eos_ids, f"{pair.where}: rejected")
    return PairTokens(pair.id, ci, cm, ri, rm, True)


def check_vocab(encoded: Sequence[PairTokens], pairs: Sequence[Pair], vocab: int) -> None:
    """Every token id fits the policy's vocabulary (a token record from another tokenizer does not)."""
    for enc, pair in zip(encoded, pairs, strict=True):
        top = max(max(enc.chosen_ids), max(enc.rejected_ids))
        if top >= vocab:
            raise InputError(
                f"{pair.where}: field 'tokens.ids': token id {top} is outside the policy's vocabulary of {vocab} "
                "(recorded with another tokenizer?)"
            )


def fingerprint(encoded: Sequence[PairTokens]) -> str:
    """A hash of every pair's id, tokens and loss masks, in order: what the reference cache is valid for."""
    h = hashlib.sha256()
    for e in encoded:
        for part in (e.pair_id, e.chosen_ids, e.chosen_mask, e.rejected_ids, e.rejected_mask):
            h.update(repr(part).encode())
    return h.hexdigest()

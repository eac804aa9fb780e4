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
chat template by `records.render_token_record`, the renderer SFT uses too (tool calls written
in ``rollout.tool_format``; each assistant turn's tokens through its turn end are loss tokens;
a template that rewrites earlier turns is refused for that pair). The count of
rendered pairs is reported (``data/pairs_rendered``).

Packing (`pack_pairs`, `pair_sides`): each pair is one prefix-tree unit (`shared_prefix`), so both
sides share a micro-batch and their prompt runs once; DPO and the reward model pack alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrft.inputs import InputError
from agentrft.pairs import Pair, build_pairs, read_pairs, require_pairs
from agentrft.samplers.base import ChatRenderer
from agentrft.train.config import TrainConfig
from agentrft.train.core.packing import MicroBatch, PackedSequence
from agentrft.train.core.shared_prefix import shared_prefix_micro_batches
from agentrft.train.data.records import render_token_record, token_record_problem
from agentrft.types import Message, TokenRecord, Trajectory


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
    pairs_file: str | None,
    data: Any,
    *,
    margin: float,
    per_task: int,
    pairs_key: str = "dpo.pairs",
    cli_flags: tuple[str, str] | None = ("--pairs", "--db"),
) -> tuple[list[Pair], dict[str, float]]:
    """The pairs to train on and counts for the metrics; every refusal is an `InputError`.
    ``data`` is a `train.data.DataConfig`; ``pairs_key`` the config key of ``pairs_file`` and ``cli_flags`` the
    command's flags for the two sources, named when neither or both are given."""
    from agentrft.train.data import select_trajectories

    if (pairs_file is None) == (data.source is None):
        pf, df = (f", {cli_flags[0]}", f", {cli_flags[1]}") if cli_flags else ("", "")
        raise InputError(
            f"{pairs_key} / data.source: name exactly one source of pairs: a TRL pairs file ({pairs_key}{pf}) "
            f"or recorded trajectories to pair (data.source{df})"
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


def check_token_record(traj: Trajectory, where: str) -> None:
    """The token record agrees with the messages (`records.token_record_problem`: the one check every method
    that learns from recorded trajectories uses)."""
    problem = token_record_problem(traj)
    if problem is not None:
        raise InputError(f"{where}: trajectory {traj.id}: field 'tokens': {problem}")


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


def encode_pair(pair: Pair, renderer: ChatRenderer, tool_format: str, tool_schemas: list[dict[str, Any]]) -> PairTokens:
    """The pair's two sequences: its token records when both trajectories have one, else both sides rendered
    through the chat template by `records.render_token_record` (the one renderer of recorded conversations)."""
    c, r = pair.chosen_trajectory, pair.rejected_trajectory
    if c is not None and r is not None and c.tokens is not None and r.tokens is not None:
        return PairTokens(
            pair.id, list(c.tokens.ids), list(c.tokens.loss_mask), list(r.tokens.ids), list(r.tokens.loss_mask), False
        )

    def render(side: str, continuation: Sequence[Message]) -> TokenRecord:
        conversation = Trajectory(id=f"{pair.id}:{side}", messages=[*pair.prompt, *continuation],
                                  n_prompt_messages=len(pair.prompt))  # fmt: skip
        try:
            return render_token_record(conversation, renderer, tool_format, tool_schemas)
        except InputError as exc:
            raise InputError(f"{pair.where}: {side}: {exc}") from None

    chosen, rejected = render("chosen", pair.chosen), render("rejected", pair.rejected)
    return PairTokens(pair.id, chosen.ids, chosen.loss_mask, rejected.ids, rejected.loss_mask, True)


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


def pack_pairs(pairs: Sequence[PairTokens], cfg: TrainConfig, pad_id: int) -> list[MicroBatch]:
    """Micro-batches of ``pairs``: sequence ``2k`` is pair k's chosen, ``2k + 1`` its rejected (``seq_index``);
    each pair one prefix-tree unit, so both sides share a micro-batch and their prompt runs once."""
    seqs: list[PackedSequence] = []
    for k, p in enumerate(pairs):
        for j, (ids, mask) in enumerate(((p.chosen_ids, p.chosen_mask), (p.rejected_ids, p.rejected_mask))):
            zeros = [0.0] * len(ids)
            seqs.append(PackedSequence(2 * k + j, ids, mask, zeros, zeros))
    units = [[2 * k, 2 * k + 1] for k in range(len(pairs))]
    o = cfg.optimizer
    return shared_prefix_micro_batches(seqs, o.micro_batch_tokens, o.shared_prefix_row_tokens, pad_id, units=units)


def pair_sides(mb: MicroBatch) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """A micro-batch of `pack_pairs`: its pairs (indices k into the packed list) and the rows of their chosen and
    rejected sequences."""
    row = {s: r for r, s in enumerate(mb.seq_index)}
    ks = sorted({s // 2 for s in mb.seq_index})
    return ks, torch.tensor([row[2 * k] for k in ks]), torch.tensor([row[2 * k + 1] for k in ks])

"""From graded trajectories to training tensors, in length-bucketed micro-batches.

Each trajectory becomes one sequence (one per segment of a stitched session, `to_sequences`):
its exact token record (never re-tokenised),
the loss mask, the sampler's log-probs, and a per-token advantage. Micro-batches
are formed by sorting sequences by length and filling each up to a token budget
(``rows x longest row <= max_tokens``), so a micro-batch pads only to its own
longest row, never to the longest of the whole step. Deterministic: ties in length
are broken by the original order. With ``optimizer.shared_prefix`` the trainer packs
through `shared_prefix.shared_prefix_micro_batches` instead, which keeps these per-sequence
tensors for the loss and adds a prefix-tree packing for the model's forward.

Shape legend: T_i = tokens of sequence i; B = rows of a micro-batch, T = its longest row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from agentrft.types import Trajectory

if TYPE_CHECKING:
    from agentrft.train.core.shared_prefix import PrefixTreeRows


@dataclass(frozen=True)
class PackedSequence:
    """One trajectory's training data; every list has length T_i."""

    index: int  # position in the step's list of sequences
    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantages: list[float]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class MicroBatch:
    """Right-padded tensors (B, T); ``seq_index`` (B,) maps rows back to sequences."""

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    sampler_logprobs: Tensor
    advantages: Tensor
    seq_index: list[int]
    old_logprobs: Tensor | None = None  # filled by the trainer when updates_per_batch > 1
    shared: PrefixTreeRows | None = None  # prefix-tree packing of the same sequences (see shared_prefix.py)

    @property
    def num_forward_tokens(self) -> int:
        """Tokens the model actually runs: the packed prefix tree if any, else every sequence's tokens."""
        return self.shared.num_tokens if self.shared is not None else int(self.attention_mask.sum())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


def to_sequence(index: int, traj: Trajectory, token_advantages: Sequence[float]) -> PackedSequence:
    """A `PackedSequence` from a trajectory with a token record; the first token is never trained on, nor a
    branch's turns before ``metadata.branch_turn`` (its parent's samples, not this policy's: train/rl/branches.py)."""
    tok = traj.tokens
    if tok is None:
        raise ValueError(f"trajectory {traj.id} has no token record (eval-only sampler); it cannot be trained on")
    if len(token_advantages) != len(tok.ids):
        raise ValueError(f"trajectory {traj.id}: {len(token_advantages)} advantages for {len(tok.ids)} tokens")
    mask = list(tok.loss_mask)
    branch_turn = traj.metadata.get("branch_turn")
    if isinstance(branch_turn, int):  # a branch (rollout/replay.py): its turns before that one are its parent's
        mask = [m if t >= branch_turn else 0 for m, t in zip(mask, tok.turn, strict=True)]
    if mask and mask[0]:
        raise ValueError(f"trajectory {traj.id}: first token is marked sampled; a sequence must start with a prompt")
    return PackedSequence(index, list(tok.ids), mask, list(tok.logprobs), list(token_advantages))


def to_sequences(first_index: int, traj: Trajectory, token_advantages: Sequence[float]) -> list[PackedSequence]:
    """One `PackedSequence` per segment of the trajectory's token record (`TokenRecord.segment`: a session
    whose client rewrote its history), numbered from ``first_index``; a segment with nothing sampled is left
    out. Every segment carries the episode's per-token advantages, so all share its reward."""
    whole = to_sequence(first_index, traj, token_advantages)
    tok = traj.tokens
    assert tok is not None
    if tok.num_segments == 1:
        return [whole] if whole.num_loss_tokens else []
    out: list[PackedSequence] = []
    for start, end in tok.segment_spans():
        if not any(whole.loss_mask[start:end]):
            continue
        if whole.loss_mask[start]:
            raise ValueError(f"trajectory {traj.id}: segment at token {start} starts with a sampled token")
        out.append(
            PackedSequence(
                first_index + len(out),
                whole.input_ids[start:end],
                whole.loss_mask[start:end],
                whole.sampler_logprobs[start:end],
                whole.advantages[start:end],
            )
        )
    return out


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Groups of sequence indices: sorted by length (longest first), each group's rows x max length <= max_tokens.

    A sequence longer than the budget gets a micro-batch of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # sorted: first is longest
        if current and (len(current) + 1) * longest > max_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def collate(seqs: Sequence[PackedSequence], pad_id: int = 0) -> MicroBatch:
    """Right-pad sequences into one micro-batch (padding has attention 0 and loss mask 0)."""
    width = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    slp = torch.zeros((n, width), dtype=torch.float32)
    adv = torch.zeros((n, width), dtype=torch.float32)
    for row, s in enumerate(seqs):
        t = len(s)
        ids[row, :t] = torch.tensor(s.input_ids, dtype=torch.long)
        attn[row, :t] = 1
        mask[row, :t] = torch.tensor(s.loss_mask, dtype=torch.long)
        slp[row, :t] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
        adv[row, :t] = torch.tensor(s.advantages, dtype=torch.float32)
    return MicroBatch(ids, attn, mask, slp, adv, [s.index for s in seqs])


def micro_batches(seqs: Sequence[PackedSequence], max_tokens: int, pad_id: int = 0) -> list[MicroBatch]:
    """Length-bucketed micro-batches of ``seqs`` under a token budget (see `plan_micro_batches`)."""
    plan = plan_micro_batches([len(s) for s in seqs], max_tokens)
    return [collate([seqs[i] for i in group], pad_id) for group in plan]

"""Shared-prefix updates: every common token prefix of a micro-batch runs through the model once.

Follows the idea of Prefix Grouper (arXiv 2506.05433): the G samples of a GRPO group
share a long prompt (system prompt, few-shot examples, question) and differ only in
the tokens after it, so recomputing that prompt G times in the forward *and* the
backward is waste. Where we depart from the paper: instead of splitting attention
into a prefix part and a suffix part, sequences are packed as a *prefix tree* (a
trie) in one row, and a 4D attention mask lets each token attend exactly to the
tokens of its own sequence before it. That is more general than one shared prefix
per group: multi-turn samples that agree on their first turns share those too, and
groups share the system prompt with each other when they fall in the same row.

Exactness: a token's hidden state depends only on the tokens it attends to and on
its position id, and both are the same as in the sequence's own forward pass, so
log-probs, losses and gradients equal the per-sample computation up to float
summation order (tests/train/test_train_shared_prefix.py checks fp64 to 1e-10 and
fp32 to 1e-5). The gradient of a shared token is the sum of what every sequence
through it sends back, which autograd does by itself.

Layout: the sequences of a row are sorted; in sorted order a sequence adds only the
tokens after its longest common prefix with the previous one (the trie size is
``sum_i len(s_i) - lcp(s_i, s_{i-1})``). Rows are cut greedily so that a packed row
holds at most ``row_tokens`` tokens; a group that does not fit in one row is split,
and each part recomputes its prefix - still exact (gradients add), only slower.
Rows are then bucketed into micro-batches by the usual ``rows x longest <= budget``.

Shape legend: B = sequences of a micro-batch, T = their longest length,
R = packed rows, L = longest packed row, H = hidden size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from agentrft.samplers.distribution import Distribution
from agentrft.train.core.context_grad import gradient_columns, stop_context_hidden
from agentrft.train.core.logprobs import LOGPROB_CHUNK, _body_and_head, head_logprobs
from agentrft.train.core.packing import MicroBatch, PackedSequence, collate, plan_micro_batches
from agentrft.train.core.segment_attention import NAME as SEGMENT_ATTENTION
from agentrft.train.core.segment_attention import Segments, segment_forward


@dataclass
class PrefixTreeRows:
    """Packed prefix-tree rows of one micro-batch and where each sequence's tokens sit in them."""

    input_ids: Tensor  # (R, L)
    position_ids: Tensor  # (R, L): a token's index in its own sequence
    tree_mask: Tensor | None  # (R, 1, L, L) bool, True where query column may attend to key column (tree layout)
    seq_row: Tensor  # (B,) packed row of each sequence
    seq_cols: Tensor  # (B, T) column of token t of sequence b in its row (0 past the sequence's end)
    num_tokens: int  # real (non-padding) packed tokens: what the model actually runs
    segments: Segments | None = None  # the segment layout instead of a tree mask (`segment_attention`)
    stop_context: bool = False  # gradients skip the context's keys and values (`context_grad`; segments only)

    def attention_mask_for(self, model: Any, dtype: torch.dtype) -> Tensor:
        """The 4D mask as the model's attention wants it: bool for SDPA, additive float for eager."""
        assert self.tree_mask is not None, "a segment layout has no tree mask"
        impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
        if impl in ("sdpa", SEGMENT_ATTENTION):
            return self.tree_mask
        return torch.zeros(self.tree_mask.shape, dtype=dtype).masked_fill(~self.tree_mask, torch.finfo(dtype).min)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _row_tensors(row_ids: list[list[int]], row_pos: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(R, L) token ids (right-padded with ``pad_id``) and position ids of packed rows."""
    length = max(len(ids) for ids in row_ids)
    input_ids = torch.full((len(row_ids), length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(row_ids), length), dtype=torch.long)
    for r, (ids, pos) in enumerate(zip(row_ids, row_pos, strict=True)):
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        position_ids[r, : len(pos)] = torch.tensor(pos, dtype=torch.long)
    return input_ids, position_ids


def pack_prefix_tree(seqs: Sequence[Sequence[int]], rows: Sequence[Sequence[int]], pad_id: int = 0) -> PrefixTreeRows:
    """Pack ``seqs`` (token lists, in micro-batch order) into ``rows`` (indices into ``seqs``, each row sorted)."""
    n_seq = len(seqs)
    width = max(len(s) for s in seqs)
    seq_row = torch.zeros(n_seq, dtype=torch.long)
    seq_cols = torch.zeros((n_seq, width), dtype=torch.long)
    row_ids: list[list[int]] = []
    row_pos: list[list[int]] = []
    cols_of: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        ids: list[int] = []
        pos: list[int] = []
        prev: Sequence[int] = ()
        prev_cols: list[int] = []
        for j in row:
            s = seqs[j]
            shared = common_prefix_len(prev, s)
            cols = prev_cols[:shared] + list(range(len(ids), len(ids) + len(s) - shared))
            ids += s[shared:]
            pos += range(shared, len(s))
            seq_row[j] = r
            seq_cols[j, : len(s)] = torch.tensor(cols, dtype=torch.long)
            cols_of[j] = cols
            prev, prev_cols = s, cols
        row_ids.append(ids)
        row_pos.append(pos)
    input_ids, position_ids = _row_tensors(row_ids, row_pos, pad_id)
    length = input_ids.shape[1]
    mask = torch.zeros((len(rows), 1, length, length), dtype=torch.bool)
    for r, ids in enumerate(row_ids):
        # padding columns attend to themselves only: a query that sees no key would make SDPA emit NaN,
        # and 0 * NaN in the backward poisons weight gradients even though no loss reads those columns
        pad = torch.arange(len(ids), length)
        mask[r, 0, pad, pad] = True
    for j, cols in cols_of.items():
        c = torch.tensor(cols, dtype=torch.long)
        causal = torch.ones(len(cols), len(cols), dtype=torch.bool).tril()
        # a shared column is written by every sequence through it, always with the same ancestors (trie property)
        mask[int(seq_row[j]), 0, c[:, None], c[None, :]] |= causal
    return PrefixTreeRows(input_ids, position_ids, mask, seq_row, seq_cols, sum(len(ids) for ids in row_ids))


def pack_segment_rows(seqs: Sequence[Sequence[int]], rows: Sequence[Sequence[int]], pad_id: int = 0) -> PrefixTreeRows:
    """Pack ``seqs`` into ``rows`` (indices into ``seqs``) as ``[common prefix | suffix | suffix ...]``: the row's
    longest common prefix once, then each sequence's remaining tokens (the layout `segment_attention` computes)."""
    n_seq = len(seqs)
    width = max(len(s) for s in seqs)
    seq_row = torch.zeros(n_seq, dtype=torch.long)
    seq_cols = torch.zeros((n_seq, width), dtype=torch.long)
    row_ids: list[list[int]] = []
    row_pos: list[list[int]] = []
    segments: Segments = []
    for r, row in enumerate(rows):
        p = segment_prefix_len(seqs, row)
        ids, pos = list(seqs[row[0]][:p]), list(range(p))
        spans: list[tuple[int, int]] = []
        for j in row:
            s = seqs[j]
            start = len(ids)
            ids += s[p:]
            pos += range(p, len(s))
            spans.append((start, len(ids)))
            seq_row[j] = r
            seq_cols[j, : len(s)] = torch.tensor(list(range(p)) + list(range(start, len(ids))), dtype=torch.long)
        row_ids.append(ids)
        row_pos.append(pos)
        segments.append((p, spans))
    input_ids, position_ids = _row_tensors(row_ids, row_pos, pad_id)
    return PrefixTreeRows(
        input_ids, position_ids, None, seq_row, seq_cols, sum(len(ids) for ids in row_ids), segments=segments
    )


def segment_prefix_len(token_lists: Sequence[Sequence[int]], row: Sequence[int]) -> int:
    """The longest prefix every sequence of ``row`` shares."""
    first = token_lists[row[0]]
    return min((common_prefix_len(first, token_lists[j]) for j in row[1:]), default=len(first))


def segment_row_len(token_lists: Sequence[Sequence[int]], row: Sequence[int]) -> int:
    """Packed length of ``row`` in the segment layout: its common prefix once, then every sequence's rest."""
    p = segment_prefix_len(token_lists, row)
    return p + sum(len(token_lists[j]) - p for j in row)


def plan_segment_rows(token_lists: Sequence[Sequence[int]], row_tokens: int) -> list[list[int]]:
    """Rows of sequence indices for the segment layout: sequences sorted by content (those sharing a prompt side
    by side), each joining the current row when that costs fewer packed tokens than a row of its own (joining
    shortens the row's common prefix to what it shares with the newcomer) and keeps the row within ``row_tokens``."""
    if row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1, got {row_tokens}")
    order = sorted(range(len(token_lists)), key=lambda i: (list(token_lists[i]), i))
    rows: list[list[int]] = []
    for i in order:
        joined = segment_row_len(token_lists, [*rows[-1], i]) if rows else 0
        if rows and joined <= row_tokens and joined - segment_row_len(token_lists, rows[-1]) < len(token_lists[i]):
            rows[-1].append(i)
        else:
            rows.append([i])
    return rows


def plan_rows(
    token_lists: Sequence[Sequence[int]], row_tokens: int, units: Sequence[Sequence[int]] | None = None
) -> list[list[int]]:
    """Rows of sequence indices: all sequences sorted by content, cut greedily at ``row_tokens`` packed tokens.

    ``units`` (lists of indices covering every sequence once; default: each sequence alone) are never
    split: a unit's sequences share a row, even one longer than ``row_tokens`` (DPO keeps a pair together
    so that its prompt runs once). Units are ordered by their first sequence's content."""
    if row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1, got {row_tokens}")
    groups = [[i] for i in range(len(token_lists))] if units is None else [list(u) for u in units]
    groups = [sorted(u, key=lambda i: (list(token_lists[i]), i)) for u in groups if u]
    groups.sort(key=lambda u: (list(token_lists[u[0]]), u[0]))
    rows: list[list[int]] = []
    current: list[int] = []
    used = 0
    for unit in groups:
        add = packed_row_len(token_lists, [*current[-1:], *unit]) - (len(token_lists[current[-1]]) if current else 0)
        if current and used + add > row_tokens:
            rows.append(current)
            current, used, add = [], 0, packed_row_len(token_lists, unit)
        current += unit
        used += add
    if current:
        rows.append(current)
    return rows


def packed_row_len(token_lists: Sequence[Sequence[int]], row: Sequence[int]) -> int:
    return sum(
        len(token_lists[j]) - (common_prefix_len(token_lists[row[k - 1]], token_lists[j]) if k else 0)
        for k, j in enumerate(row)
    )


def shared_prefix_micro_batches(
    seqs: Sequence[PackedSequence],
    max_tokens: int,
    row_tokens: int,
    pad_id: int = 0,
    units: Sequence[Sequence[int]] | None = None,
    layout: Literal["tree", "segments"] = "tree",
    context_grad: Literal["full", "stop"] = "full",
) -> list[MicroBatch]:
    """Micro-batches whose ``.shared`` holds the packing; rows x longest packed row <= ``max_tokens``.
    ``units``: indices into ``seqs`` kept in one row, hence one micro-batch (see `plan_rows`; tree layout only).
    ``layout``: ``tree`` (prefix tree, dense mask) or ``segments`` (common prefix + suffixes, `segment_attention`).
    ``context_grad``: ``stop`` packs every micro-batch as segments (rows of one sequence too) whose update holds
    the untrained tokens' keys and values constant (`context_grad`)."""
    if context_grad not in ("full", "stop"):
        raise ValueError(f"unknown context_grad {context_grad!r}; valid: full, stop")
    if context_grad == "stop" and layout != "segments":
        raise ValueError("context_grad stop needs the segments layout")
    tokens = [s.input_ids for s in seqs]
    if layout == "segments":
        if units is not None:
            raise ValueError("units (sequences kept in one row) need the tree layout")
        rows = plan_segment_rows(tokens, min(row_tokens, max_tokens))
        row_len = segment_row_len
    elif layout == "tree":
        rows = plan_rows(tokens, min(row_tokens, max_tokens), units)
        row_len = packed_row_len
    else:
        raise ValueError(f"unknown shared-prefix layout {layout!r}; valid: tree, segments")
    plan = plan_micro_batches([row_len(tokens, row) for row in rows], max_tokens)
    out: list[MicroBatch] = []
    for group in plan:
        members = [seqs[j] for r in group for j in rows[r]]
        mb = collate(members, pad_id)
        if context_grad == "full" and all(len(rows[r]) == 1 for r in group):
            # nothing shared: the plain causal layout computes the same and attends without a dense tree mask
            # (SDPA's causal kernel skips the masked half; an explicit L x L mask does not)
            out.append(mb)
            continue
        local_rows: list[list[int]] = []
        k = 0
        for r in group:
            local_rows.append(list(range(k, k + len(rows[r]))))
            k += len(rows[r])
        pack = pack_segment_rows if layout == "segments" else pack_prefix_tree
        mb.shared = pack([m.input_ids for m in members], local_rows, pad_id)
        mb.shared.stop_context = context_grad == "stop"
        out.append(mb)
    return out


def packed_hidden(body: Any, rows: PrefixTreeRows) -> Tensor:
    """(R, L, H) hidden states of the decoder ``body`` over packed ``rows``, in either layout."""
    if rows.segments is not None:
        return segment_forward(body, rows.input_ids, rows.position_ids, rows.segments)
    dtype = next(body.parameters()).dtype
    return body(
        input_ids=rows.input_ids, attention_mask=rows.attention_mask_for(body, dtype), position_ids=rows.position_ids
    ).last_hidden_state


def shared_prefix_logprobs(
    model: Any,
    rows: PrefixTreeRows,
    input_ids: Tensor,
    loss_mask: Tensor,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    with_entropy: bool = True,
    use_checkpoint: bool = True,
    dist: Distribution = Distribution(),
) -> tuple[Tensor, Tensor]:
    """Same contract as `logprobs.sampled_logprobs` ((B, T) outputs aligned with ``input_ids``), computed on the
    packed rows: token t+1 of sequence b is predicted from the hidden state at column ``seq_cols[b, t]``."""
    if input_ids.shape != loss_mask.shape:
        raise ValueError("input_ids and loss_mask must have the same shape (B, T)")
    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no context to be sampled from")
    body, head = _body_and_head(model)
    b_idx, t_idx = loss_mask[:, 1:].nonzero(as_tuple=True)
    row, col = rows.seq_row[b_idx], rows.seq_cols[b_idx, t_idx]
    if rows.stop_context and torch.is_grad_enabled():
        assert rows.segments is not None, "a stop-gradient context needs the segment layout"
        cols = gradient_columns(rows.seq_row, rows.seq_cols, loss_mask, rows.input_ids.shape[0])
        hidden, compact = stop_context_hidden(body, rows.input_ids, rows.position_ids, rows.segments, cols)
        h = hidden[row, compact[row, col]]  # (M, H)
    else:
        h = packed_hidden(body, rows)[row, col]  # (M, H)
    return head_logprobs(
        head,
        h,
        input_ids,
        b_idx,
        t_idx,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        use_checkpoint=use_checkpoint,
        dist=dist,
    )

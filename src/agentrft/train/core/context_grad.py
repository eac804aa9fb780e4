"""Stop-gradient context: the tokens no loss reads run forward only; the trained tokens attend to them as constants.

A level-3 finqa-lite demonstration is ~1,100 tokens after the shared prompt (a search listing, an opened page,
the calls) for ~90 trained tokens, and the exact update runs every one of them forward *and* backward. With
``optimizer.context_grad: stop`` an update runs two passes per micro-batch of segment-layout rows
(`segment_attention`):

1. **context pass**, no autograd: the whole packed row, as in the exact update, recording every layer's keys and
   values (after the rotary embedding: what attention reads);
2. **gradient pass**: only the *gradient columns* (a trained token, or the token that predicts one), gathered into
   short rows at their own position ids. At each layer their own keys and values are written over the recorded
   ones at their columns, and their queries attend to the full row under the segment layout's visibility (a
   prefix column sees the prefix before it; a suffix column the whole prefix and its own suffix before it).

Every column's keys and values are the exact update's (same weights, same inputs), so the gradient pass's hidden
states, log-probs and loss equal the exact update's up to float summation order. The gradient is the exact
gradient *with the context's keys and values held constant*: it reaches the weights through the gradient
columns' own computation (their queries, keys, values and MLPs at every layer), never through how the prompt and
the tool outputs are encoded. That is an approximation of the gradient, not of the loss, and
on finqa-lite it costs the skill that matters: after the agentic recipe's first imitation pass held-out pass@1 was
0.30 on level 2 and 0.03 on level 3 (the exact pass: 0.78 and 0.44), the episodes searching and opening the right
page and then calculating with the worked example's figures (learning to read a cell needs the gradient into the
page's encoding). So no preset uses it. `tests/train/test_train_context_grad.py` checks the gradient against an
independent construction (the plain model with every context token's key and value projections detached).

Cost: one forward over the row (no activations kept), plus forward and backward over the gradient columns.
Memory: the recorded keys and values, ``2 x layers x kv heads x head dim`` per column.

Shape legend: R rows, L row length, G longest row of gradient columns, H query heads, K kv heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrft.train.core.segment_attention import Segments, segment_forward, segmented_attention


@dataclass
class ContextPass:
    """What the attention function needs for either pass (it travels in the forward's
    `segment_attention.SegmentLayout`)."""

    recorded: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # id(attention module) -> (k, v)
    cols: Tensor | None = None  # (R, G) gradient pass: each gradient token's column, L for padding
    visible: Tensor | None = None  # (R, 1, G, L + 1) bool: the keys each gradient token's query sees

    def attend(self, module: Any, q: Tensor, k: Tensor, v: Tensor, segments: Segments, scale: float | None) -> Tensor:
        """Attention output (R, rows' tokens, H, D) of this pass at the layer of ``module``."""
        if self.cols is None:
            self.recorded[id(module)] = (k.detach(), v.detach())
            return segmented_attention(q, k, v, segments, scale)
        assert self.visible is not None
        k0, v0 = self.recorded[id(module)]
        rows, heads, width, dim = k.shape
        idx = self.cols[:, None, :, None].expand(rows, heads, width, dim)
        # column L is a dummy that only padding queries see (a query seeing no key makes SDPA emit NaN)
        kf = _with_dummy(k0).scatter(2, idx, k)
        vf = _with_dummy(v0).scatter(2, idx, v)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, kf, vf, attn_mask=self.visible, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
        return out.transpose(1, 2).contiguous()


def _with_dummy(t: Tensor) -> Tensor:
    return torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], 1, t.shape[3])], dim=2)


def gradient_columns(seq_row: Tensor, seq_cols: Tensor, loss_mask: Tensor, rows: int) -> list[Tensor]:
    """Per packed row, the sorted columns whose hidden state the loss reads or whose token it trains: token t of
    sequence b when ``loss_mask[b, t]`` or ``loss_mask[b, t + 1]``."""
    need = loss_mask.bool().clone()
    need[:, :-1] |= loss_mask[:, 1:].bool()
    b_idx, t_idx = need.nonzero(as_tuple=True)
    r = seq_row[b_idx]
    c = seq_cols[b_idx, t_idx]
    return [torch.unique(c[r == i]) for i in range(rows)]


def visibility(cols: list[Tensor], segments: Segments, length: int) -> Tensor:
    """(R, 1, G, L + 1) bool: query ``cols[r][g]`` may attend to key column c of row r under the segment layout;
    padding queries (past a row's gradient columns) see only the dummy column L."""
    width = max((len(c) for c in cols), default=0)
    out = torch.zeros(len(cols), 1, max(width, 1), length + 1, dtype=torch.bool)
    keys = torch.arange(length)
    for r, (c, (p, spans)) in enumerate(zip(cols, segments, strict=True)):
        start = torch.zeros(length, dtype=torch.long)  # first column of each column's own segment (0: the prefix)
        for s, e in spans:
            start[s:e] = s
        a = c[:, None]
        out[r, 0, : len(c), :length] = (keys[None, :] <= a) & (
            (keys[None, :] < p) | (keys[None, :] >= start[c][:, None])
        )
        out[r, 0, len(c) :, length] = True
    return out


def stop_context_hidden(
    body: Any, input_ids: Tensor, position_ids: Tensor, segments: Segments, cols: list[Tensor]
) -> tuple[Tensor, Tensor]:
    """Hidden states (R, G, H) of the gradient columns ``cols`` and the (R, L + 1) index of each column in them
    (-1: not a gradient column): the decoder ``body`` runs over the rows without autograd, then over the columns."""
    rows, length = input_ids.shape
    context = ContextPass()
    with torch.no_grad():
        segment_forward(body, input_ids, position_ids, segments, context)
    width = max(max((len(c) for c in cols), default=0), 1)
    padded = torch.full((rows, width), length, dtype=torch.long)
    compact = torch.full((rows, length + 1), -1, dtype=torch.long)
    for r, c in enumerate(cols):
        padded[r, : len(c)] = c
        compact[r, c] = torch.arange(len(c))
    context.cols = padded
    context.visible = visibility(cols, segments, length)
    gather = padded.clamp(max=length - 1)
    ids = torch.gather(input_ids, 1, gather)
    pos = torch.gather(position_ids, 1, gather).masked_fill(padded == length, 0)
    return segment_forward(body, ids, pos, segments, context), compact

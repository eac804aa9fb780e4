"""Shared-prefix attention without a dense mask: one prefix per packed row, then each sequence's own suffix.

The prefix-tree packing (`shared_prefix.py`) runs every shared token once, but tells the attention who sees
whom with an L x L mask, and SDPA with an explicit mask visits every block of it: a 5,600-token row of four
level-3 episodes took longer than the four episodes one by one (measured, `benchmarks/results`). Here a row
is laid out as ``[prefix | suffix_1 | suffix_2 | ...]``, the prefix being the longest common prefix of the
row's sequences (system prompt, worked examples, a group's question), and attention runs per segment:

* prefix queries attend causally within the prefix (SDPA's causal kernel, which skips the masked half);
* the queries of suffix i attend to the prefix's keys and causally to suffix i's own keys: one SDPA call
  for all of a row's suffixes, each a batch entry whose keys are ``[prefix keys | its own keys]``; under a
  mask, or (`suffix_path`, where it computes fewer pairs: a short prefix) with the prefix's queries in front
  of each suffix's under ``is_causal``, whose kernel skips the blocks past the diagonal.

Every token sees exactly the tokens it sees in its own sequence, at its own position id, so log-probs and
gradients equal per-sequence runs up to float summation order (tests/train/test_train_segment_attention.py);
the prefix's gradient is the sum of what each suffix sends back through its keys and values. Deeper sharing
(samples that agree on a first turn past the common prefix) is not exploited: each suffix starts where the
row's common prefix ends.

The model runs with the attention implementation ``agentrft_sdpa`` (`samplers/attention.py`, switched once, when
the trainer is set up): SDPA unless the forward call carries a `SegmentLayout` (then the layout above; the 4D
``attention_mask`` is a NaN placeholder, so attention that ignored the layout would produce NaN, not a silently
wrong result). The layout travels as a forward keyword argument, so gradient checkpointing's recompute
sees it too. Tuned for CPU, where SDPA with a boolean mask and grouped-query heads keeps its flash kernel; on CUDA
that combination falls back to the math kernel.

Shape legend: R rows, H query heads, K kv heads, L row length, D head dim, N suffixes of a row, S longest suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from agentrft.samplers.attention import LAYOUT_KWARG, NAME, use_agentrft_attention, uses_agentrft_attention

# Per row: (prefix length P, [(start, end) columns of each sequence's suffix]).
Segments = list[tuple[int, list[tuple[int, int]]]]
use_segment_attention = use_agentrft_attention  # the trainer switches its policy once, at set-up


@dataclass(frozen=True)
class SegmentLayout:
    """A forward's segment layout, the `agentrft_sdpa` attention's ``agentrft_layout``: every layer's attention
    runs `segmented_attention` (or, with ``context``, a `context_grad.ContextPass`'s two passes)."""

    segments: Segments
    context: Any = None

    def attend(self, module: Any, query: Tensor, key: Tensor, value: Tensor, scaling: float | None) -> Tensor:
        if self.context is not None:
            return self.context.attend(module, query, key, value, self.segments, scaling)
        return segmented_attention(query, key, value, self.segments, scaling)


def check_segment_attention(model: Any) -> None:
    """Refuse to run the segment layout on a model that was not switched (`use_segment_attention`): plain SDPA
    would ignore the layout."""
    if not uses_agentrft_attention(model):
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(
            f"the segment layout needs the model on the {NAME} attention implementation (use_segment_attention), "
            f"not {impl!r}"
        )


# SDPA's CPU flash kernel under `is_causal` computes whole key blocks up to each query block's diagonal (blocks of
# 256 queries and 512 keys for long rows): about this many keys per query past the causal half
CAUSAL_BLOCK_KEYS = 256
SuffixPath = Literal["auto", "masked", "causal"]


def suffix_path(p: int, n: int, s: int) -> Literal["masked", "causal"]:
    """How a row's ``n`` suffixes (longest ``s``) after a prefix of ``p`` attend; both give the same result.

    ``masked``: one causal prefix call (p^2/2 pairs), then each suffix's queries against [prefix | suffix] under
    a boolean mask, which the kernel computes whole, masked half included (n s (p + s) pairs). ``causal``: each
    suffix as the queries and keys [prefix | suffix] under ``is_causal``, whose blocks past the diagonal are
    skipped (n (p + s) ((p + s) / 2 + CAUSAL_BLOCK_KEYS) pairs; the first entry's prefix rows are the prefix's own
    outputs). A short prefix (a zero-shot prompt) makes ``causal`` cheaper, a long shared one ``masked``.
    One layer forward and backward in bf16 (9/3 heads of 64; `benchmarks/segment_attention.py`, 2-core Xeon with
    AMX): level-3 rows after a zero-shot prompt 0.82 s masked against 0.64 s causal, level-4 rows 0.86 against
    0.52, level-3 rows after the worked example 1.11 against 1.26."""
    masked = p * p / 2 + n * s * (p + s)
    causal = n * (p + s) * ((p + s) / 2 + CAUSAL_BLOCK_KEYS)
    return "causal" if causal < masked else "masked"


def _gather(t: Tensor, idx: Tensor) -> Tensor:
    """(H', L, D) columns ``idx`` (N, S) of one row -> (N, H', S, D)."""
    return t.index_select(1, idx.reshape(-1)).view(t.shape[0], *idx.shape, t.shape[-1]).transpose(0, 1)


def segmented_attention(
    q: Tensor, k: Tensor, v: Tensor, segments: Segments, scale: float | None, path: SuffixPath = "auto"
) -> Tensor:
    """Attention of packed rows laid out as ``segments`` says: q (R, H, L, D), k and v (R, K, L, D) ->
    (R, L, H, D), the layout transformers' attention functions return. Columns outside every segment (row
    padding) come out as zeros. ``path``: how suffixes attend (`suffix_path`; ``auto`` picks the cheaper)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    _, heads, length, dim = q.shape
    gqa = k.shape[1] != heads
    out_rows = []
    for r, (p, all_spans) in enumerate(segments):
        cols: list[Tensor] = []
        vals: list[Tensor] = []
        spans = [(s, e) for s, e in all_spans if e > s]
        n, s_max = len(spans), max((e - s for s, e in spans), default=0)
        chosen = (path if path != "auto" else suffix_path(p, n, s_max)) if spans else "masked"
        if p and chosen == "masked":
            qp, kp, vp = q[r : r + 1, :, :p], k[r : r + 1, :, :p], v[r : r + 1, :, :p]
            o = sdpa(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=gqa)  # (1, H, P, D)
            cols.append(torch.arange(p, device=q.device))
            vals.append(o[0])
        if spans:
            lens = torch.tensor([e - s for s, e in spans], device=q.device)
            j = torch.arange(s_max, device=q.device)
            starts = torch.tensor([s for s, _ in spans], device=q.device)
            # (N, S) column of each suffix position; past a suffix's end it repeats its last column (discarded below).
            # gathered by index_select, not advanced indexing: its backward is an index_add, not an accumulating
            # index_put (1.8 s of a 56 s level-3 imitation step)
            idx = starts[:, None] + torch.minimum(j[None, :], lens[:, None] - 1)
            qs = _gather(q[r], idx)
            ks = torch.cat([k[r : r + 1, :, :p].expand(n, -1, -1, -1), _gather(k[r], idx)], dim=2)
            vs = torch.cat([v[r : r + 1, :, :p].expand(n, -1, -1, -1), _gather(v[r], idx)], dim=2)
            if chosen == "causal":
                # query j of an entry sees keys <= j: the prefix causally, then its own suffix up to itself
                qs = torch.cat([q[r : r + 1, :, :p].expand(n, -1, -1, -1), qs], dim=2)
                o = sdpa(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)  # (N, H, P + S, D)
                if p:
                    cols.append(torch.arange(p, device=q.device))
                    vals.append(o[0, :, :p])
                o = o[:, :, p:]
            else:
                # a suffix query sees the whole prefix and its own suffix up to itself (never a sibling's keys:
                # each suffix is its own batch entry); one lower-right causal mask serves every suffix, since a
                # real query never reaches the padding keys after its suffix's end (padding queries are dropped)
                mask = torch.ones(s_max, p + s_max, dtype=torch.bool, device=q.device).tril(p)  # (S, P + S)
                o = sdpa(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)  # (N, H, S, D)
            real = j[None, :] < lens[:, None]  # (N, S)
            cols.append(idx[real])
            vals.append(o.transpose(0, 1)[:, real])  # (H, sum of suffix lengths, D)
        dtype = vals[0].dtype if vals else q.dtype  # SDPA's output dtype (bf16 under autocast)
        row = q.new_zeros(heads, length, dim, dtype=dtype)
        out_rows.append(row.index_copy(1, torch.cat(cols), torch.cat(vals, dim=1)) if cols else row)
    return torch.stack(out_rows).transpose(1, 2).contiguous()


def segment_forward(
    body: Any, input_ids: Tensor, position_ids: Tensor, segments: Segments, context: Any = None
) -> Tensor:
    """(R, L, H) hidden states of the decoder ``body`` over rows in the ``segments`` layout; ``context``: a
    `context_grad.ContextPass` that the attention hands each layer to."""
    check_segment_attention(body)
    # 4D, so transformers passes it through as is; NaN, so attention that ignored the layout would say so
    placeholder = torch.full((input_ids.shape[0], 1, 1, 1), float("nan"), dtype=next(body.parameters()).dtype)
    layout = {LAYOUT_KWARG: SegmentLayout(segments, context)}
    return body(input_ids=input_ids, attention_mask=placeholder, position_ids=position_ids, **layout).last_hidden_state

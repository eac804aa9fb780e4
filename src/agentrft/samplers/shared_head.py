"""The shared head of a `hf_decode.RunningBatch`: the prompt prefix all its cache rows share, stored once.

An agent's episodes of one task family begin alike (system prompt, tool schemas, worked examples: 1.5-2.3k
tokens at finqa-lite level 3), and a batch's cache row per distinct prompt would hold that prefix once per row.
With a head, the batch keeps the keys and values of its rows' longest common prefix once, ``(1, K, P, D)`` per
layer, and each cache row only the columns after it; a decode step hands the head to the attention
(`attention.shared_head_attention`, keyword ``agentrft_head``), which lets every query see it before its row's
own columns. Positions are absolute (the rows' next positions count the head), so RoPE and the results are
those of rows that hold the head themselves.

The head is the longest common prefix of the prompts in the batch, one position short of the shortest (each
row keeps at least its last prompt position). Admitting prompts that share less shrinks it: the positions it
gives up are written back into the old rows' columns, as admission rebuilds the cache anyway. Prompts admitted
after a weight update (the batch's `weights_epoch` moved) share none of a head built before it. A batch that
empties starts over; one whose rows share no head keeps none until then. Heads shorter than `MIN_HEAD` positions are not kept (not worth a separate attention).

Shape legend: K kv heads, P head positions, D head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrft.samplers.prefix_cache import as_tokens, common_prefix_len

MIN_HEAD = 16


@dataclass
class SharedHead:
    tokens: list[int]
    layers: list[tuple[Tensor, Tensor]]  # per layer (keys, values), each (1, K, P, D)

    def __len__(self) -> int:
        return len(self.tokens)

    def in_front(self, row: list[tuple[Tensor, Tensor]], start: int) -> list[tuple[Tensor, Tensor]]:
        """A row's KV (per layer (keys, values), each (1, K, T, D)) with the head's positions from `start` on in
        front of it: the row's sequence as if it held the head itself."""
        return [
            (torch.cat([hk[:, :, start:], k], dim=2), torch.cat([hv[:, :, start:], v], dim=2))
            for (hk, hv), (k, v) in zip(self.layers, row, strict=True)
        ]


def head_length(head: SharedHead | None, has_rows: bool, prompts: Sequence[Sequence[int]]) -> int:
    """The head's length once `prompts` join the batch: the longest prefix the head (or, in an empty batch, the
    first prompt) shares with every prompt, at most each prompt's length less one; 0 below `MIN_HEAD`. A batch
    with rows but no head keeps none."""
    if has_rows and head is None:
        return 0
    base = as_tokens(head.tokens if has_rows and head is not None else prompts[0])
    n = len(base)
    for p in prompts:
        n = min(n, len(p) - 1, common_prefix_len(base[:n], as_tokens(p)))
    return n if n >= MIN_HEAD else 0

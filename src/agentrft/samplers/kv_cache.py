"""KV cache layers for `hf_decode.RunningBatch`: buffers with room to append in place.

Shape legend: C cache rows, H kv heads, L positions, D head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class RoomyLayer(DynamicLayer):
    """A cache layer whose keys and values are views of the first n positions of buffers with room for
    more: `update` writes the new columns in place. A plain `DynamicLayer` `torch.cat`s, copying the
    whole cache every step, and its ever slightly larger allocations fragment the heap (the resident
    set grew to several times the live cache in long multi-turn rollouts)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._bufs, self._n = (keys, values), n
        self._views()

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Point keys / values at the first n positions of the buffers; returns them (never None here)."""
        keys, values = (b[:, :, : self._n] for b in self._bufs)
        self.keys, self.values = keys, values
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, w = self._n, key_states.shape[-2]
        if n + w > self._bufs[0].shape[2]:  # out of room: grow by half
            self._move(torch.arange(self._bufs[0].shape[0], device=self.device), (n + w) * 3 // 2)
        self._bufs[0][:, :, n : n + w] = key_states
        self._bufs[1][:, :, n : n + w] = value_states
        self._n = n + w
        return self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._move(indices, self._bufs[0].shape[2])

    def _move(self, rows: torch.Tensor, capacity: int) -> None:
        """New buffers of `capacity` positions holding `rows`; only the written part is copied (and touched)."""
        moved = []
        for b in self._bufs:
            nb = b.new_empty(len(rows), b.shape[1], capacity, b.shape[3])
            for j, i in enumerate(rows.tolist()):
                nb[j, :, : self._n] = b[i, :, : self._n]
            moved.append(nb)
        self._bufs = (moved[0], moved[1])
        self._views()


def position_bytes(config: Any, element_size: int) -> int:
    """Bytes one KV cache position of a model holds: keys and values of every layer, `element_size` bytes each."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return int(cfg.num_hidden_layers * 2 * kv_heads * head_dim * element_size)


def cache_of(layers: Sequence[DynamicLayer]) -> Any:
    """A `DynamicCache` over these layers."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = list(layers)
    return cache

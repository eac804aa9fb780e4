"""Prefill for `hf_decode.RunningBatch`: distinct prompts in length-bucketed chunks, each shared or cached
token prefix run through the model once (on top of `PrefixCache` entries), last-position logits only.

Shape legend: U distinct prompts, V vocabulary, H kv heads, P prompt length, D head dim.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from agentrft.samplers.kv_cache import cache_of
from agentrft.samplers.prefix_cache import (
    KV,
    PrefixCache,
    PrefixKV,
    SharedPrefix,
    as_prefix,
    as_tokens,
    owned,
    shared_prefixes,
)

Base = tuple[KV | PrefixKV | None, int]  # a prompt's computed first m positions (plain KV or the cache's parts), m


def cache_kw(model: Any) -> str:
    """Later transformers 5.x releases name the KV-cache argument `cache`; earlier ones (5.18 among them)
    `past_key_values`: both occur within the supported range."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def out_cache(out: Any) -> Any:
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _prefill_chunks(lengths: list[int], max_tokens: int = 16384, max_waste: float = 0.2) -> list[list[int]]:
    """Group prompt indices for batched prefill: longest first, a new chunk whenever
    left padding would exceed `max_waste` of the chunk or its padded size `max_tokens`."""
    order = sorted(range(len(lengths)), key=lambda u: -lengths[u])
    chunks: list[list[int]] = []
    for u in order:
        if chunks:
            c = chunks[-1]
            longest = lengths[c[0]]
            area = longest * (len(c) + 1)
            real = sum(lengths[i] for i in c) + lengths[u]
            if area <= max_tokens and area - real <= max_waste * area:
                c.append(u)
                continue
        chunks.append([u])
    return chunks


class _PastOnceLayer(DynamicLayer):
    """A prefill chunk's cache layer over a past that `past()` builds only when the layer runs: the past and the
    new columns are joined for this layer's attention alone, and the layer keeps only the new columns. A plain
    `DynamicLayer` built from the chunk's past holds every layer's past and its concatenation with the new
    columns at once until the chunk is done (16 level-3 prompts on one 2.1k-token prefix: 1.5 GB of copies in
    fp32, where the shared prefix itself is an expanded view)."""

    def __init__(self, past: Callable[[], tuple[torch.Tensor, torch.Tensor]], past_len: int) -> None:
        super().__init__()
        self._past: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = past
        self._past_len = past_len

    def get_seq_length(self) -> int:
        return self._past_len + (int(self.keys.shape[-2]) if self.keys is not None and self.is_initialized else 0)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._past is None:
            raise RuntimeError("a prefill chunk's layer runs once")
        past_k, past_v = self._past()
        self._past = None
        self.device, self.is_initialized = key_states.device, True
        self.keys, self.values = key_states, value_states
        return torch.cat([past_k, key_states], dim=2), torch.cat([past_v, value_states], dim=2)


def _prefill(
    model: Any,
    prompts: list[list[int]],
    device: torch.device,
    bases: list[Base] | None = None,
    kv_dtype: torch.dtype | None = None,
    starts: list[int] | None = None,
) -> tuple[list[KV], torch.Tensor]:
    """Prefill the prompts in length-bucketed, left-padded chunks.

    `bases[u]` = (kv, m): the KV [1,H,m,D] per layer of prompt u's first m tokens (or a cached
    `PrefixKV` of them), already computed (a shared or cached prefix); then only `prompts[u][m:]` runs
    through the model. Returns per-prompt per-layer (k, v) of the positions from `starts[u]` on (default 0),
    shape [1,H,P-start,D] (padding cut off), in `kv_dtype` (None: as the layers made them; under bf16
    autocast the rotated keys come out fp32), and the last-position logits [U, V]. A prompt's positions past
    its base are views of its chunk's columns (the chunk's suffixes, at most `_prefill_chunks`' padding: a
    caller that keeps them copies them, as the batch and the prefix cache do); one that starts inside its
    base is a copy. A chunk's past (its bases, expanded or left-padded per row) is built one layer at a time
    as the forward reaches it (`_PastOnceLayer`).
    """
    bases = bases or [(None, 0)] * len(prompts)
    starts = starts or [0] * len(prompts)
    base_lens = [m for _, m in bases]
    prefixes = [None if kv is None else as_prefix(kv) for kv, _ in bases]
    lengths = [len(p) - m for p, m in zip(prompts, base_lens, strict=True)]  # what each prompt still prefills
    caches: list[Any] = [None] * len(prompts)
    last: list[Any] = [None] * len(prompts)
    for chunk in _prefill_chunks(lengths):
        s_max = lengths[chunk[0]]
        m_max = max(base_lens[u] for u in chunk)
        ids = torch.zeros(len(chunk), s_max, dtype=torch.long, device=device)
        mask = torch.zeros(len(chunk), m_max + s_max, dtype=torch.long, device=device)
        pos = torch.zeros(len(chunk), s_max, dtype=torch.long, device=device)
        for j, u in enumerate(chunk):
            m, n = base_lens[u], lengths[u]
            ids[j, s_max - n :] = torch.tensor(prompts[u][m:], device=device)
            mask[j, m_max - m : m_max] = 1
            mask[j, m_max + s_max - n :] = 1
            pos[j, s_max - n :] = torch.arange(m, m + n, device=device)
        kwargs: dict[str, Any] = {}
        if not bool(mask.all()):  # no padding (e.g. a prompt alone): no mask, the fast causal path
            kwargs["attention_mask"] = mask
        if m_max:
            # Prefixes sit right-aligned before the suffixes: [pad | base | pad | suffix]; the mask
            # hides both pads. A chunk sharing one base (a group's prefix) expands it, no copy.
            rows = [prefixes[u] for u in chunk]
            like = next(r for r in rows if r is not None)
            one = all(bases[u][0] is bases[chunk[0]][0] for u in chunk)  # one base object for the whole chunk
            kwargs[cache_kw(model)] = cache_of(
                [
                    _PastOnceLayer(functools.partial(_chunk_past, rows, one, like, layer, m_max), m_max)
                    for layer in range(len(like.parts[0]))
                ]
            )
        out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        layers = out_cache(out).layers
        for j, u in enumerate(chunk):
            m, n, start = base_lens[u], lengths[u], starts[u]
            caches[u] = [
                (
                    _in(_from(la.keys, prefixes[u], layer, 0, j, m, s_max - n, start), kv_dtype),
                    _in(_from(la.values, prefixes[u], layer, 1, j, m, s_max - n, start), kv_dtype),
                )
                for layer, la in enumerate(layers)
            ]
            last[u] = out.logits[j, -1]
    return caches, torch.stack(last)


def _chunk_past(
    rows: list[PrefixKV | None], one: bool, like: PrefixKV, layer: int, m_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's past keys and values of a prefill chunk, [rows, H, m_max, D]: `one` base shared by every row
    (`like`) expanded, else each row's base left-padded to m_max."""
    if one:
        k, v = like.joined(layer, 0), like.joined(layer, 1)
        return k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)
    return (
        torch.cat([_left_pad_base(r, like, layer, 0, m_max) for r in rows]),
        torch.cat([_left_pad_base(r, like, layer, 1, m_max) for r in rows]),
    )


def _from(
    new: torch.Tensor, base: PrefixKV | None, layer: int, which: int, j: int, m: int, pad: int, start: int
) -> torch.Tensor:
    """Row j's positions from `start` on: its base's first m (from `base`) then its suffix (the chunk's new
    columns `new` after `pad` left padding), [1, H, m + n - start, D]; a view when it starts past the base."""
    suffix = new[j : j + 1, :, pad + max(start - m, 0) :]
    if start >= m:
        return suffix
    assert base is not None  # m > 0
    return torch.cat([*base.segments(layer, which, start), suffix], dim=2)


def _in(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` in `dtype` (None: as it is): a view stays a view unless it is cast (`owned`)."""
    return t if dtype is None or t.dtype == dtype else owned(t, dtype)


def _by_depth(tree: list[SharedPrefix]) -> list[list[int]]:
    """Indices of the shared-prefix tree's nodes, grouped by depth (roots first)."""
    depth: list[int] = []
    for node in tree:
        depth.append(0 if node.parent is None else depth[node.parent] + 1)
    return [[i for i, d in enumerate(depth) if d == level] for level in range(max(depth, default=-1) + 1)]


def _kept_ancestor(tree: list[SharedPrefix], i: int, heads: dict[int, tuple[KV, int]]) -> Base:
    """The KV of node i's nearest ancestor that was prefilled this round, if any."""
    parent = tree[i].parent
    while parent is not None and parent not in heads:
        parent = tree[parent].parent
    return heads[parent] if parent is not None else (None, 0)


def _best(a: Base, b: Base) -> Base:
    return a if a[1] >= b[1] else b


def _left_pad_base(base: PrefixKV | None, like: PrefixKV, layer: int, which: int, length: int) -> torch.Tensor:
    """A base's layer keys (which=0) or values (1), left-padded with zeros to `length` positions (one copy
    of its parts); all zeros for a row without a base (`like` gives the shape)."""
    ref = like.parts[0][layer][which]
    if base is None:
        return ref.new_zeros(1, ref.shape[1], length, ref.shape[3])
    parts = base.segments(layer, which)
    pad = length - base.length
    return torch.cat([ref.new_zeros(1, ref.shape[1], pad, ref.shape[3]), *parts] if pad else parts, dim=2)


def prefill_prompts(
    model: Any,
    prompts: list[list[int]],
    device: torch.device,
    prefix_cache: PrefixCache | None,
    kv_dtype: torch.dtype | None = None,
    starts: list[int] | None = None,
) -> tuple[list[KV], torch.Tensor, int, int]:
    """Prefill distinct prompts, running each shared or cached prefix through the model once. Returns each
    prompt's KV per layer from position `starts[u]` on (default 0; in `kv_dtype`, see `_prefill`), the
    last-position logits [U, V], and how many prompt positions ran through the model and how many were taken
    from a shared or cached prefix."""
    pc = prefix_cache
    if pc is None or not pc.enabled:
        caches, last = _prefill(model, prompts, device, kv_dtype=kv_dtype, starts=starts)
        return caches, last, sum(map(len, prompts)), 0
    computed = reused = 0
    arrs = [as_tokens(p) for p in prompts]
    bases: list[Base] = [pc.lookup(a, len(a) - 1) for a in arrs]
    # Prefixes shared within this round that reach beyond what the cache gives: prefill each
    # once, on top of its parent's or a cached prefix, remember it, and use it for its members.
    # Prefixes are visited parents first; each prompt ends with the deepest one it belongs to.
    heads: dict[int, tuple[KV, int]] = {}
    tree = shared_prefixes(arrs, pc.min_tokens)
    for depth_nodes in _by_depth(tree):
        todo = [i for i in depth_nodes if sum(bases[u][1] < tree[i].length for u in tree[i].members) >= 2]
        if not todo:
            continue
        texts = [prompts[tree[i].members[0]][: tree[i].length] for i in todo]
        head_bases = [
            _best(pc.lookup(as_tokens(h), len(h) - 1), _kept_ancestor(tree, i, heads))
            for i, h in zip(todo, texts, strict=True)
        ]
        kvs, _ = _prefill(model, texts, device, head_bases, kv_dtype)
        computed += sum(len(h) - m for h, (_, m) in zip(texts, head_bases, strict=True))
        reused += sum(m for _, m in head_bases)
        for i, h, kv in zip(todo, texts, kvs, strict=True):
            heads[i] = (kv, tree[i].length)
            pc.add(as_tokens(h), kv)
            for u in tree[i].members:
                if bases[u][1] < tree[i].length:
                    bases[u] = heads[i]
    computed += sum(len(p) - m for p, (_, m) in zip(prompts, bases, strict=True))
    reused += sum(m for _, m in bases)
    caches, last = _prefill(model, prompts, device, bases, kv_dtype, starts)
    return caches, last, computed, reused

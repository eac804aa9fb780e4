"""Prefill for `hf_decode.RunningBatch`: distinct prompts in length-bucketed chunks, each shared or cached
token prefix run through the model once (on top of `PrefixCache` entries), last-position logits only.

Shape legend: U distinct prompts, V vocabulary, H kv heads, P prompt length, D head dim.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

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


def _prefill(
    model: Any,
    prompts: list[list[int]],
    device: torch.device,
    bases: list[Base] | None = None,
    kv_dtype: torch.dtype | None = None,
) -> tuple[list[KV], torch.Tensor]:
    """Prefill the prompts in length-bucketed, left-padded chunks.

    `bases[u]` = (kv, m): the KV [1,H,m,D] per layer of prompt u's first m tokens (or a cached
    `PrefixKV` of them), already computed (a shared or cached prefix); then only `prompts[u][m:]` runs
    through the model. Returns per-prompt per-layer (k, v) of shape [1,H,P,D]
    (padding cut off), each in its own storage and in `kv_dtype` (None: as the layers
    made them; under bf16 autocast the rotated keys come out fp32), and the
    last-position logits [U, V]. A chunk's cache (its padding, the shared base
    expanded to every row) is freed when the chunk is done.
    """
    from transformers import DynamicCache

    bases = bases or [(None, 0)] * len(prompts)
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
            first = bases[chunk[0]][0]
            shared = prefixes[chunk[0]]
            if shared is not None and all(bases[u][0] is first for u in chunk):
                past = [
                    (k.expand(len(chunk), -1, -1, -1), v.expand(len(chunk), -1, -1, -1))
                    for k, v in shared.materialize()
                ]
            else:
                rows = [prefixes[u] for u in chunk]
                like = next(r for r in rows if r is not None)
                past = [
                    (
                        torch.cat([_left_pad_base(r, like, layer, 0, m_max) for r in rows]),
                        torch.cat([_left_pad_base(r, like, layer, 1, m_max) for r in rows]),
                    )
                    for layer in range(len(like.parts[0]))
                ]
            kwargs[cache_kw(model)] = DynamicCache(ddp_cache_data=past)
        out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        layers = out_cache(out).layers
        for j, u in enumerate(chunk):
            m, n = base_lens[u], lengths[u]
            caches[u] = [
                (
                    owned(_real(la.keys, j, m_max, m, s_max, n), kv_dtype),
                    owned(_real(la.values, j, m_max, m, s_max, n), kv_dtype),
                )
                for la in layers
            ]
            last[u] = out.logits[j, -1]
    return caches, torch.stack(last)


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


def _real(t: torch.Tensor, j: int, m_max: int, m: int, s_max: int, n: int) -> torch.Tensor:
    """Row j's real positions of a [pad | base(m) | pad | suffix(n)] cache: [1,H,m+n,D]."""
    if m == 0 or n == s_max:  # one contiguous run: a view
        return t[j : j + 1, :, m_max + s_max - n - m :] if n == s_max else t[j : j + 1, :, m_max + s_max - n :]
    return torch.cat([t[j : j + 1, :, m_max - m : m_max], t[j : j + 1, :, m_max + s_max - n :]], dim=2)


def prefill_prompts(
    model: Any,
    prompts: list[list[int]],
    device: torch.device,
    prefix_cache: PrefixCache | None,
    kv_dtype: torch.dtype | None = None,
) -> tuple[list[KV], torch.Tensor, int, int]:
    """Prefill distinct prompts, running each shared or cached prefix through the model once. Returns each
    prompt's KV [1,H,P,D] per layer (in `kv_dtype`, see `_prefill`), the last-position logits [U, V], and how
    many prompt positions ran through the model and how many were taken from a shared or cached prefix."""
    pc = prefix_cache
    if pc is None or not pc.enabled:
        caches, last = _prefill(model, prompts, device, kv_dtype=kv_dtype)
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
    caches, last = _prefill(model, prompts, device, bases, kv_dtype)
    return caches, last, computed, reused

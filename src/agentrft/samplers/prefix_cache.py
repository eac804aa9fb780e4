"""Cross-request prefix KV cache for `HFSampler` (used by `hf_decode.RunningBatch.admit`).

Agent prompts share long token prefixes: every prompt of an environment starts
with the same system prompt, tool instructions and worked examples, the
episodes of one GRPO group share their task question, and turn k+1 of an
episode starts with turn k's prompt. Prefill of those prefixes dominates
sampling on a CPU. `PrefixCache` keeps the key/value tensors of recently used
shared prefixes, and (``remember_turns``) of each finished request's prompt and
reply, so that a later prompt only prefills what follows the longest cached
match: the next turn of an episode prefills its tool result, not the whole
conversation again.

An entry serves any prompt whose *longest common prefix* with it is at least
`min_tokens` long: its KV is sliced to that length (KV at position i depends
only on tokens 0..i), so one entry "system + examples + question A" also serves
"system + examples + question B".

Staleness: KV is a function of the weights. The cache remembers the `key` it
was filled under (the sampler's weights epoch, which `weights_updated` bumps)
and empties itself whenever `validate` sees a different one. Memory is bounded by `max_tokens` cached positions in total,
evicting least recently used entries first.

Shape legend: H kv heads, T entry length, D head dim.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [rows, H, T, D]


@dataclass
class CacheEntry:
    tokens: np.ndarray  # [T] int64
    kv: KV

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


def owned(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` in `dtype` (None: its own) in storage of exactly its size. A slice of a batch's cache (one prompt's
    rows of a prefill chunk) is a view that keeps the whole batch tensor alive, and `contiguous()` alone does
    not copy a contiguous slice; whatever outlives the batch (the prompts' KV, the prefix cache's entries)
    owns its memory instead."""
    if dtype is not None and t.dtype != dtype:
        return t.to(dtype, memory_format=torch.contiguous_format)  # a new tensor of exactly its size
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    eq = a[:n] == b[:n]
    return n if bool(eq.all()) else int(np.argmin(eq))


def as_tokens(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64)


class PrefixCache:
    """LRU of prefix KV caches, bounded by total cached positions; see the module docstring."""

    def __init__(
        self,
        max_tokens: int = 4096,
        min_tokens: int = 64,
        remember_turns: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        if max_tokens < 0 or min_tokens < 1:
            raise ValueError(f"PrefixCache needs max_tokens >= 0 and min_tokens >= 1, got {max_tokens}, {min_tokens}")
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.remember_turns = remember_turns  # also keep each finished request's KV (the engine's next turns)
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # oldest use first
        self._next_id = 0
        self._key: Hashable = None
        self.dtype = dtype  # entries are stored in this dtype (None: as given)
        self.stats = {"hits": 0, "hit_tokens": 0, "stored": 0, "evicted": 0, "cleared": 0}

    @property
    def enabled(self) -> bool:
        return self.max_tokens >= self.min_tokens

    @property
    def tokens(self) -> int:
        """Cached positions in total (what `max_tokens` bounds)."""
        return sum(len(e) for e in self._entries.values())

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        if self._entries:
            self.stats["cleared"] += 1
        self._entries.clear()

    def validate(self, key: Hashable) -> None:
        """Empty the cache unless it was filled under this same `key` (weights unchanged)."""
        if key != self._key:
            self.clear()
            self._key = key

    def lookup(self, tokens: np.ndarray, limit: int) -> tuple[KV | None, int]:
        """The KV of the longest cached prefix of `tokens[:limit]` (at least `min_tokens` long), and its
        length; (None, 0) if none. The returned tensors are views: read them, never write."""
        best_id, best = None, 0
        for eid, entry in self._entries.items():
            m = common_prefix_len(entry.tokens, tokens[:limit])
            if m > best:
                best_id, best = eid, m
        if best_id is None or best < self.min_tokens:
            return None, 0
        entry = self._entries[best_id]
        self._entries.move_to_end(best_id)
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += best
        return [(k[:, :, :best], v[:, :, :best]) for k, v in entry.kv], best

    def add(self, tokens: np.ndarray, kv: KV | Callable[[], KV]) -> bool:
        """Remember `kv` as the cache of `tokens`; returns whether it was stored.

        An entry that already covers `tokens` is refreshed instead; entries that are
        prefixes of `tokens` are dropped (the new one serves all their prompts). `kv` may
        be a function that gathers it: called only when the entry is stored."""
        n = int(tokens.shape[0])
        if not self.enabled or n < self.min_tokens or n > self.max_tokens:
            return False
        for eid, entry in list(self._entries.items()):
            m = common_prefix_len(entry.tokens, tokens)
            if m == n:  # already covered
                self._entries.move_to_end(eid)
                return False
            if m == len(entry):  # the old entry is a prefix of the new one
                del self._entries[eid]
        if callable(kv):
            kv = kv()
        # Own, compact storage: the inputs may be views into a whole batch's cache.
        kv = [(owned(k, self.dtype), owned(v, self.dtype)) for k, v in kv]
        self._entries[self._next_id] = CacheEntry(tokens.copy(), kv)
        self._next_id += 1
        self.stats["stored"] += 1
        total = self.tokens
        while total > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            total -= len(old)
            self.stats["evicted"] += 1
        return True


@dataclass
class SharedPrefix:
    """A prefix of `length` tokens shared by the prompts `members` (indices); `parent`: the index of
    the enclosing shorter shared prefix in the list `shared_prefixes` returns, if any."""

    length: int
    members: list[int]
    parent: int | None


def shared_prefixes(prompts: list[np.ndarray], min_tokens: int) -> list[SharedPrefix]:
    """The tree of prefixes of at least `min_tokens` tokens shared by two or more prompts.

    Sorting the prompts lexicographically puts prompts with long common prefixes
    next to each other, and the LCP of a run of sorted prompts is the smallest
    LCP of neighbours in it. A run whose neighbours all share `min_tokens` is a
    node; splitting it where that smallest LCP occurs gives its children (say
    every prompt shares the system prompt, and the prompts of one GRPO group
    also share their question and first turn). A child must extend its parent by
    `min_tokens // 4` tokens to be worth its own prefill. Prefixes stop at least
    one token short of every member, so each member keeps a suffix whose last
    position yields its next-token logits. Parents come before their children."""
    order = sorted(range(len(prompts)), key=lambda u: prompts[u].tolist())
    adj = [common_prefix_len(prompts[a], prompts[b]) for a, b in itertools.pairwise(order)]
    out: list[SharedPrefix] = []

    def split(lo: int, hi: int, above: int) -> list[tuple[int, int]]:
        """Maximal runs within sorted positions lo..hi whose neighbour LCPs exceed `above`."""
        runs, start = [], lo
        for i in range(lo, hi):
            if adj[i] <= above:
                if i > start:
                    runs.append((start, i))
                start = i + 1
        if hi > start:
            runs.append((start, hi))
        return runs

    def visit(lo: int, hi: int, parent: int | None, parent_len: int) -> None:
        raw = min(adj[lo:hi])
        members = [order[i] for i in range(lo, hi + 1)]
        g = min(raw, min(prompts[u].shape[0] for u in members) - 1)
        if g >= min_tokens and g >= parent_len + max(1, min_tokens // 4):
            out.append(SharedPrefix(g, sorted(members), parent))
            parent, parent_len = len(out) - 1, g
        for a, b in split(lo, hi, raw):
            visit(a, b, parent, parent_len)

    for a, b in split(0, len(order) - 1, min_tokens - 1):
        visit(a, b, None, 0)
    return out

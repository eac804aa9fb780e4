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

The cache is a radix tree (SGLang's RadixAttention idea): each node holds the KV
of a run of positions that every sequence through it shares, so the system
prompt and worked examples that start all of an environment's prompts are stored
once, not once per cached turn (64 level-3 episodes of finqa-lite: the flat
cache of one sequence per entry held 32,374 positions of which 8,771 were
distinct). A lookup walks the tree as far as the prompt matches and returns the
KV of that many positions as one view per node on the path (`PrefixKV`): KV at
position i depends only on tokens 0..i, so the path "system + examples +
question A" also serves "system + examples + question B" up to where they part.
A sequence that leaves a node part way splits it there.

Staleness: KV is a function of the weights. The cache remembers the `key` it
was filled under (the sampler's weights epoch, which `weights_updated` bumps)
and empties itself whenever `validate` sees a different one. Memory is bounded
by `max_tokens` distinct cached positions, evicting the least recently used
leaf first (a node whose children are gone becomes a leaf in turn).

Shape legend: H kv heads, t a node's length, D head dim.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [rows, H, T, D]


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


@dataclass
class PrefixKV:
    """The KV of a prompt's first `length` positions as consecutive parts (one per node of the cache's tree on
    the prompt's path, or one plain KV): each part per layer (keys, values) [1, H, t_i, D], the t_i summing to
    `length`. Parts are views of the cache's tensors: read them, never write."""

    parts: list[KV]

    @property
    def length(self) -> int:
        return sum(int(part[0][0].shape[2]) for part in self.parts)

    def segments(self, layer: int, which: int, start: int = 0) -> list[torch.Tensor]:
        """Layer `layer`'s keys (which=0) or values (1) from position `start` on, part by part (views)."""
        out, at = [], 0
        for part in self.parts:
            seg = part[layer][which]
            t = int(seg.shape[2])
            if at + t > start:
                out.append(seg if at >= start else seg[:, :, start - at :])
            at += t
        return out

    def joined(self, layer: int, which: int) -> torch.Tensor:
        """Layer `layer`'s keys (which=0) or values (1) as one tensor: the view itself for one part, else the
        parts' concatenation (a copy)."""
        segs = self.segments(layer, which)
        return segs[0] if len(segs) == 1 else torch.cat(segs, dim=2)

    def materialize(self) -> KV:
        """One (keys, values) per layer (`joined`)."""
        return [(self.joined(i, 0), self.joined(i, 1)) for i in range(len(self.parts[0]))]


def as_prefix(kv: KV | PrefixKV) -> PrefixKV:
    """A plain KV (one tensor per layer and kind) as a one-part `PrefixKV`; a `PrefixKV` as it is."""
    return kv if isinstance(kv, PrefixKV) else PrefixKV([kv])


@dataclass(eq=False)
class _Node:
    """A node of the cache's tree: the KV of the positions of `tokens` in every cached sequence whose path runs
    through it (its tokens follow its ancestors')."""

    tokens: np.ndarray  # [t] int64
    kv: KV  # per layer [1, H, t, D], owned storage
    parent: _Node | None
    used: int = 0  # LRU clock of its last use
    children: dict[int, _Node] = field(default_factory=dict)  # by first token

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


class PrefixCache:
    """A radix tree of prefix KV, bounded by distinct cached positions; see the module docstring."""

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
        self._root = _Node(as_tokens([]), [], None)
        self._size = 0  # distinct cached positions
        self._clock = 0
        self._key: Hashable = None
        self.dtype = dtype  # entries are stored in this dtype (None: as given)
        self.stats = {"hits": 0, "hit_tokens": 0, "stored": 0, "evicted": 0, "cleared": 0, "split": 0}

    @property
    def enabled(self) -> bool:
        return self.max_tokens >= self.min_tokens

    @property
    def tokens(self) -> int:
        """Distinct cached positions (what `max_tokens` bounds): a prefix shared by many sequences counts once."""
        return self._size

    def _nodes(self) -> Iterator[_Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    @property
    def nbytes(self) -> int:
        return sum(n.nbytes for n in self._nodes())

    def __len__(self) -> int:
        """Cached sequences: the tree's leaves."""
        return sum(not n.children for n in self._nodes())

    def sequences(self) -> list[np.ndarray]:
        """The token ids of every cached sequence (root to leaf)."""
        out = []
        for node in self._nodes():
            if not node.children:
                chain = []
                at: _Node | None = node
                while at is not None and at is not self._root:
                    chain.append(at.tokens)
                    at = at.parent
                out.append(np.concatenate(chain[::-1]))
        return out

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every cached key and value tensor (one per node, layer and kind)."""
        for node in self._nodes():
            for k, v in node.kv:
                yield k
                yield v

    def clear(self) -> None:
        if self._root.children:
            self.stats["cleared"] += 1
        self._root.children = {}
        self._size = 0

    def validate(self, key: Hashable) -> None:
        """Empty the cache unless it was filled under this same `key` (weights unchanged)."""
        if key != self._key:
            self.clear()
            self._key = key

    def _walk(self, tokens: np.ndarray) -> list[tuple[_Node, int]]:
        """The nodes on `tokens`' path from the root, each with how many of its tokens match (all but maybe the
        last's); marks them used."""
        self._clock += 1
        path: list[tuple[_Node, int]] = []
        node, pos = self._root, 0
        while pos < tokens.shape[0] and (child := node.children.get(int(tokens[pos]))) is not None:
            m = common_prefix_len(child.tokens, tokens[pos:])
            child.used = self._clock
            path.append((child, m))
            pos += m
            if m < child.tokens.shape[0]:
                break
            node = child
        return path

    def lookup(self, tokens: np.ndarray, limit: int) -> tuple[PrefixKV | None, int]:
        """The KV of the longest cached prefix of `tokens[:limit]` (at least `min_tokens` long), and its
        length; (None, 0) if none."""
        path = self._walk(tokens[:limit])
        best = sum(m for _, m in path)
        if best < self.min_tokens:
            return None, 0
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += best
        parts = [[(k[:, :, :m], v[:, :, :m]) for k, v in node.kv] for node, m in path]
        return PrefixKV(parts), best

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut `node` after its first `m` tokens: a new node holds those (and becomes the parent of the rest)."""
        assert node.parent is not None and 0 < m < node.tokens.shape[0]
        upper = _Node(
            node.tokens[:m].copy(),
            [(owned(k[:, :, :m]), owned(v[:, :, :m])) for k, v in node.kv],
            node.parent,
            node.used,
        )
        node.kv = [(owned(k[:, :, m:]), owned(v[:, :, m:])) for k, v in node.kv]
        node.tokens, node.parent = node.tokens[m:].copy(), upper
        upper.children[int(node.tokens[0])] = node
        upper.parent.children[int(upper.tokens[0])] = upper  # type: ignore[union-attr]
        self.stats["split"] += 1
        return upper

    def add(self, tokens: np.ndarray, kv: KV | Callable[[int], KV]) -> bool:
        """Remember `kv` (per layer [1, H, len(tokens), D]) as the cache of `tokens`; returns whether anything
        was stored. Only the positions past the longest cached prefix are stored (a node splits where the new
        sequence leaves it); nothing if `tokens` is already covered. `kv` may be a function of the first
        position to store that gathers the KV from there on: called only when something is stored."""
        n = int(tokens.shape[0])
        if not self.enabled or n < self.min_tokens or n > self.max_tokens:
            return False
        path = self._walk(tokens)
        pos = sum(m for _, m in path)
        if pos == n:  # already covered
            return False
        parent = self._root
        if path:
            last, m = path[-1]
            parent = self._split(last, m) if m < last.tokens.shape[0] else last
        got = kv(pos) if callable(kv) else [(k[:, :, pos:], v[:, :, pos:]) for k, v in kv]
        # Own, compact storage: the inputs may be views into a whole batch's cache.
        stored = [(owned(k, self.dtype), owned(v, self.dtype)) for k, v in got]
        self._clock += 1  # newer than the rest of its path: a sibling split off just now is evicted first
        leaf = _Node(tokens[pos:].copy(), stored, parent, self._clock)
        parent.children[int(tokens[pos])] = leaf
        self._size += n - pos
        self.stats["stored"] += 1
        while self._size > self.max_tokens:
            self._evict()
        return True

    def _evict(self) -> None:
        """Drop the least recently used leaf (its parent may become a leaf in turn)."""
        victim = min((n for n in self._nodes() if not n.children), key=lambda n: n.used)
        assert victim.parent is not None
        del victim.parent.children[int(victim.tokens[0])]
        self._size -= victim.tokens.shape[0]
        self.stats["evicted"] += 1


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

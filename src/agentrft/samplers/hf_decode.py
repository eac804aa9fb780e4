"""The batched decode engine behind `HFSampler` (synchronous; runs in a worker thread).

A `RunningBatch` holds the rows being decoded and their KV cache:

* `admit(requests)` **prefills** each *distinct* prompt once, in chunks of
  similar length (left padded, at most 20% padding, so prompt lengths that
  differ a lot, as they do across agent turns, waste little compute). With a
  `PrefixCache`, prompts sharing a long prefix with each other or with a cached
  entry prefill only their suffix on top of that prefix's KV (the prefix itself
  prefilled once per round, then cached). `logits_to_keep=1` skips the
  vocabulary projection for all but the last prompt position. Rows can join
  between any two steps (continuous batching).
* `step()` picks one token for every row and returns the rows that finished
  (EOS, stop string, own `max_tokens`); they leave at once, then one forward
  pass runs for the rest.

Layout: the cache has one *cache row* per distinct prompt, not one per request.
The G samples of a GRPO group are G *slots* of their prompt's cache row: the
prompt's keys and values are stored once ([C, H, L, D] per layer, C cache rows),
and each decode step feeds a [C, W] block of tokens (W slots per row), appending
W columns to every cache row, one per slot. A [C, W, L] visibility map says which
columns each slot may attend to (its row's prompt and its own earlier tokens)
and becomes the 4D attention mask, so a sample never sees its siblings' tokens:
the result is that of decoding it alone. Slots without a request (a row with
fewer live samples than W) decode a dummy token that sees only its own column and
that nobody sees. Against one cache row per sample this stores a group's prompt
once instead of G times (with 4 groups x 8 samples of a 680-token prompt, the
cache is 4 x 870 positions instead of 32 x 704) and reads it once per step. How
many slots a new prompt's requests get (`_slot_width`) weighs dummy slots against
copies of the prompt: prompts that share a row width fill it, a lone prompt among
wide rows takes one slot of its own row. A finished row frees its slot at once
(slots are renumbered by regathering the visibility map, no KV moves); cache rows
without live slots leave, which copies the cache, when they pass
`compact_fraction` of the rows or at the next admission.

Log-probs: each returned log-prob is `log_softmax(logits)[token]` of the raw
model at temperature 1, before temperature, top-k or top-p. That is the number
the trainer recomputes for importance ratios (`logp_new - logp_old`), so the
two are comparable whatever sampling settings produced the token. It is *not*
the probability of the sampling distribution when temperature != 1 or top-k/p
truncate it.

Shape legend: U distinct prompts, A live rows (requests), C cache rows, W slots
per cache row, V vocabulary, H kv heads, P prompt length, L cache length, D head dim.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from agentrft.samplers.base import FinishReason, SampleRequest, SamplingParams
from agentrft.samplers.prefix_cache import KV, PrefixCache, SharedPrefix, as_tokens, shared_prefixes


@dataclass
class RowState:
    """Decoding state of one request."""

    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    owner: Any = None  # the caller's handle (HFSampler: the request and its future)
    retired: bool = False  # finished or abandoned: decoded no more, its cache rows await compaction


def make_generator(params: SamplingParams, device: torch.device, seed: int) -> torch.Generator | None:
    """A per-request generator, so that a request's samples depend on its seed alone,
    not on what else shares its batch. Greedy needs none."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def choose_tokens(logits: torch.Tensor, rows: list[RowState]) -> tuple[list[int], list[float]]:
    """Pick one token per live row. `logits` is [A, V]; returns ids and raw log-probs."""
    logits = logits.float()
    raw_logp = torch.log_softmax(logits, dim=-1)
    chosen = torch.argmax(logits, dim=-1)  # greedy rows keep this
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        idx = torch.tensor(sampled, device=logits.device)
        temps = torch.tensor([rows[i].params.temperature for i in sampled], device=logits.device)
        x = logits.index_select(0, idx) / temps[:, None]
        for j, i in enumerate(sampled):
            k = rows[i].params.top_k
            if k is not None and k < x.shape[-1]:
                kth = torch.topk(x[j], k).values[-1]
                x[j] = x[j].masked_fill(x[j] < kth, float("-inf"))
        top_p = torch.tensor([rows[i].params.top_p for i in sampled], device=logits.device)
        if bool((top_p < 1.0).any()):
            x = _top_p_filter(x, top_p)
        probs = torch.softmax(x, dim=-1)
        for j, i in enumerate(sampled):
            chosen[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
    ids = chosen.tolist()
    lps = raw_logp.gather(1, chosen[:, None])[:, 0].tolist()
    return ids, lps


def _top_p_filter(x: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of tokens whose mass reaches top_p (at least one)."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
    drop_sorted = mass_before >= top_p[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def _cache_kw(model: Any) -> str:
    """transformers 5 names the KV-cache argument `cache`; 4.x named it `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _out_cache(out: Any) -> Any:
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


def _prefill(model: Any, prompts: list[list[int]], device: torch.device,
             bases: list[tuple[KV | None, int]] | None = None) -> tuple[list[KV], torch.Tensor]:
    """Prefill the prompts in length-bucketed, left-padded chunks.

    `bases[u]` = (kv, m): the KV [1,H,m,D] per layer of prompt u's first m tokens,
    already computed (a shared or cached prefix); then only `prompts[u][m:]` runs
    through the model. Returns per-prompt per-layer (k, v) of shape [1,H,P,D]
    (padding cut off) and the last-position logits [U, V].
    """
    from transformers import DynamicCache

    bases = bases or [(None, 0)] * len(prompts)
    base_lens = [m for _, m in bases]
    lengths = [len(p) - m for p, m in zip(prompts, base_lens)]  # what each prompt still prefills
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
            ids[j, s_max - n:] = torch.tensor(prompts[u][m:], device=device)
            mask[j, m_max - m:m_max] = 1
            mask[j, m_max + s_max - n:] = 1
            pos[j, s_max - n:] = torch.arange(m, m + n, device=device)
        kwargs: dict[str, Any] = {}
        if not bool(mask.all()):  # no padding (e.g. a prompt alone): no mask, the fast causal path
            kwargs["attention_mask"] = mask
        if m_max:
            # Prefixes sit right-aligned before the suffixes: [pad | base | pad | suffix]; the mask
            # hides both pads. A chunk sharing one base (a group's prefix) expands it, no copy.
            first = bases[chunk[0]][0]
            if first is not None and all(bases[u][0] is first for u in chunk):
                past = [(k.expand(len(chunk), -1, -1, -1), v.expand(len(chunk), -1, -1, -1)) for k, v in first]
            else:
                like = next(kv for kv, _ in (bases[u] for u in chunk) if kv is not None)
                past = [tuple(torch.cat([_left_pad_base(bases[u][0], like, layer, which, m_max) for u in chunk])
                              for which in (0, 1)) for layer in range(len(like))]
            kwargs[_cache_kw(model)] = DynamicCache(ddp_cache_data=past)
        out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        layers = _out_cache(out).layers
        for j, u in enumerate(chunk):
            m, n = base_lens[u], lengths[u]
            caches[u] = [(_real(la.keys, j, m_max, m, s_max, n), _real(la.values, j, m_max, m, s_max, n))
                         for la in layers]
            last[u] = out.logits[j, -1]
    return caches, torch.stack(last)


def _by_depth(tree: list[SharedPrefix]) -> list[list[int]]:
    """Indices of the shared-prefix tree's nodes, grouped by depth (roots first)."""
    depth: list[int] = []
    for node in tree:
        depth.append(0 if node.parent is None else depth[node.parent] + 1)
    return [[i for i, d in enumerate(depth) if d == level] for level in range(max(depth, default=-1) + 1)]


def _kept_ancestor(tree: list[SharedPrefix], i: int, heads: dict[int, tuple[KV, int]]) -> tuple[KV | None, int]:
    """The KV of node i's nearest ancestor that was prefilled this round, if any."""
    parent = tree[i].parent
    while parent is not None and parent not in heads:
        parent = tree[parent].parent
    return heads[parent] if parent is not None else (None, 0)


def _best(a: tuple[KV | None, int], b: tuple[KV | None, int]) -> tuple[KV | None, int]:
    return a if a[1] >= b[1] else b


def _left_pad_base(kv: KV | None, like: KV, layer: int, which: int, length: int) -> torch.Tensor:
    """A base's layer keys (which=0) or values (1), left-padded with zeros to `length` positions;
    all zeros for a row without a base (`like` gives the shape)."""
    if kv is None:
        ref = like[layer][which]
        return ref.new_zeros(1, ref.shape[1], length, ref.shape[3])
    t = kv[layer][which]
    return torch.nn.functional.pad(t, (0, 0, length - t.shape[2], 0))


def _real(t: torch.Tensor, j: int, m_max: int, m: int, s_max: int, n: int) -> torch.Tensor:
    """Row j's real positions of a [pad | base(m) | pad | suffix(n)] cache: [1,H,m+n,D]."""
    if m == 0 or n == s_max:  # one contiguous run: a view
        return t[j:j + 1, :, m_max + s_max - n - m:] if n == s_max else t[j:j + 1, :, m_max + s_max - n:]
    return torch.cat([t[j:j + 1, :, m_max - m:m_max], t[j:j + 1, :, m_max + s_max - n:]], dim=2)


def _slot_width(counts: list[int], length: int, rows0: int, width0: int, token_cost: float = 3000.0) -> int:
    """Slots per cache row for newly admitted prompts (see "Layout" in the module docstring).

    `counts[u]` requests share prompt u; `rows0` cache rows `width0` slots wide are running;
    `length` is the cache length after admission. A decode step costs about
    rows x width x (token_cost + length) in units of attending to one key (every slot is a
    token through the whole model, dummies too: ~12 h^2 multiply-adds per layer against 2 h
    per key, so token_cost ~ 6 h for hidden size h), plus 8 x rows x length for reading
    each cache row's KV. Splitting a prompt over more rows trades dummy slots for KV copies."""
    def cost(w: int) -> float:
        rows = rows0 + sum(-(-n // w) for n in counts)
        return rows * max(width0, w) * (token_cost + length) + 8 * rows * length

    return min(range(max(counts), 0, -1), key=cost)  # ties: the widest (fewest copies)


def _attention_mask(model: Any, visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The [C, 1, W, L] mask as the attention wants it: bool for SDPA, additive float for eager."""
    mask = visible[:, None]
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def _pad_to(t: torch.Tensor, dim: int, size: int, left: bool) -> torch.Tensor:
    """Zero-pad dimension `dim` of `t` to `size` (on the left or the right)."""
    extra = size - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + ([extra, 0] if left else [0, extra])
    return torch.nn.functional.pad(t, pad)


class _RoomyLayer(DynamicLayer):
    """A cache layer whose keys and values are views of the first n positions of buffers with room for
    more: `update` writes the new columns in place. A plain `DynamicLayer` `torch.cat`s, copying the
    whole cache every step, and its ever slightly larger allocations fragment the heap (the resident
    set grew to several times the live cache in long multi-turn rollouts)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._bufs, self._n = (keys, values), n
        self._views()

    def _views(self) -> None:
        self.keys, self.values = (b[:, :, :self._n] for b in self._bufs)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n, w = self._n, key_states.shape[-2]
        if n + w > self._bufs[0].shape[2]:  # out of room: grow by half
            self._move(torch.arange(self._bufs[0].shape[0], device=self.device), (n + w) * 3 // 2)
        self._bufs[0][:, :, n:n + w] = key_states
        self._bufs[1][:, :, n:n + w] = value_states
        self._n = n + w
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._move(indices, self._bufs[0].shape[2])

    def _move(self, rows: torch.Tensor, capacity: int) -> None:
        """New buffers of `capacity` positions holding `rows`; only the written part is copied (and touched)."""
        moved = []
        for b in self._bufs:
            nb = b.new_empty(len(rows), b.shape[1], capacity, b.shape[3])
            for j, i in enumerate(rows.tolist()):
                nb[j, :, :self._n] = b[i, :, :self._n]
            moved.append(nb)
        self._bufs = (moved[0], moved[1])
        self._views()


def _cache_of(layers: list[DynamicLayer]) -> Any:
    """A `DynamicCache` over these layers."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = list(layers)
    return cache


@dataclass
class DecodeSpec:
    """What the engine needs to know about the tokenizer and model limits."""

    eos_ids: frozenset[int]
    max_positions: int
    decode: Any  # callable: list[int] -> str


class RunningBatch:
    """Rows being decoded together; see the module docstring."""

    def __init__(self, model: Any, spec: DecodeSpec, device: torch.device,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.model, self.spec, self.device = model, spec, device
        self.prefix_cache = prefix_cache  # the caller keeps it valid for the current weights
        self.prefill_tokens = 0  # prompt positions run through the model
        self.reused_tokens = 0  # prompt positions taken from the prefix cache or a shared prefix
        self.cache_kw = _cache_kw(model)
        self.rows: list[RowState] = []  # live rows only: a finished or abandoned row leaves at once
        self.slot: list[tuple[int, int]] = []  # (cache row, slot) of each row
        self.cache: Any = None  # DynamicCache, [C, H, L, D] per layer
        self.visible = torch.zeros(0, 0, 0, dtype=torch.bool, device=device)  # [C, W, L]
        self.next_pos = torch.zeros(0, dtype=torch.long, device=device)  # [A] position of the next token
        self.logits: torch.Tensor | None = None  # [A, V] for the token each row picks next
        self.prefills = 0
        # Removing a cache row copies the whole cache, so cache rows whose slots all finished stay
        # (decoding dummies) until they are more than this fraction of the cache rows or new rows are
        # admitted (which copies anyway). Freeing a slot costs nothing: slots are renumbered in place.
        self.compact_fraction = 0.25
        self.token_cost = 6.0 * float(getattr(model.config, "hidden_size", 500))  # see _slot_width

    @property
    def n_alive(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(cache rows C, slots per row W, cache length L)."""
        c, w, n = self.visible.shape
        return int(c), int(w), int(n)

    def retire(self, indices: list[int]) -> None:
        """Stop decoding the rows at `indices` (their callers gave up)."""
        for a in indices:
            self.rows[a].retired = True
        self._keep([a for a, r in enumerate(self.rows) if not r.retired])

    def admit(self, requests: list[SampleRequest], rows: list[RowState]) -> None:
        """Prefill `requests` and add them (with their `rows`) to the running batch."""
        self._compact(force=True)
        distinct: dict[tuple[int, ...], int] = {}
        src = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in requests]
        prompts = [list(p) for p in distinct]
        lengths = [len(p) for p in prompts]
        caches, last = self._prefill_prompts(prompts)
        self.prefills += len(prompts)
        rows0, width0, len0 = self.shape if self.cache is not None else (0, 0, 0)
        members: list[list[int]] = [[] for _ in prompts]
        for i, u in enumerate(src):
            members[u].append(i)
        width = _slot_width([len(m) for m in members], max(len0, *lengths), rows0, width0, self.token_cost)
        # New cache rows: each prompt's requests, `width` at a time; a prompt's KV is copied per row.
        row_prompt: list[int] = []
        placed: list[tuple[int, int]] = [(0, 0)] * len(requests)  # request -> (new cache row, slot)
        for u, idx in enumerate(members):
            for start in range(0, len(idx), width):
                for s, i in enumerate(idx[start:start + width]):
                    placed[i] = (rows0 + len(row_prompt), s)
                row_prompt.append(u)
        p_max = max(lengths)
        w_all = max(width0, width)
        length = max(len0, p_max)
        vis = torch.zeros(len(row_prompt), w_all, length, dtype=torch.bool, device=self.device)
        for (c, s), i in zip(placed, range(len(requests))):
            vis[c - rows0, s, length - lengths[src[i]]:] = True
        # Room for every column the batch can still append (W per step until its longest row is done),
        # so decode steps write in place; pages past the written part are never touched, so they cost no memory.
        left = max(r.params.max_tokens - len(r.token_ids) for r in [*self.rows, *rows])
        capacity = length + w_all * min(left, 2048) + 1  # past that, `_RoomyLayer` grows by half
        old = [(la.keys, la.values) for la in self.cache.layers] if self.cache is not None else []
        layers = []
        for layer in range(len(caches[0])):
            like = caches[0][layer][0]
            bufs = []
            for which in (0, 1):
                buf = like.new_empty(rows0 + len(row_prompt), like.shape[1], capacity, like.shape[3])
                buf[:, :, :length].zero_()  # padding must be finite: masked weights are 0, and 0 * NaN is NaN
                if old:
                    buf[:rows0, :, length - len0:length] = old[layer][which]
                for c, u in enumerate(row_prompt):
                    buf[rows0 + c, :, length - lengths[u]:length] = caches[u][layer][which][0]
                bufs.append(buf)
            layers.append(_RoomyLayer(bufs[0], bufs[1], length))
        del caches, old
        self.cache = _cache_of(layers)
        new_pos = torch.tensor([lengths[u] for u in src], device=self.device)
        new_logits = last.index_select(0, torch.tensor(src, device=self.device))
        if rows0 == 0:
            self.visible, self.logits, self.next_pos = vis, new_logits, new_pos
        else:
            assert self.logits is not None
            self.visible = torch.cat([_pad_to(_pad_to(self.visible, 2, length, left=True), 1, w_all, left=False),
                                      vis])
            self.logits = torch.cat([self.logits, new_logits])
            self.next_pos = torch.cat([self.next_pos, new_pos])
        self.rows.extend(rows)
        self.slot.extend(placed)

    def _prefill_prompts(self, prompts: list[list[int]]) -> tuple[list[KV], torch.Tensor]:
        """Prefill distinct prompts, running each shared or cached prefix through the model once."""
        pc = self.prefix_cache
        if pc is None or not pc.enabled:
            self.prefill_tokens += sum(map(len, prompts))
            return _prefill(self.model, prompts, self.device)
        arrs = [as_tokens(p) for p in prompts]
        bases = [pc.lookup(a, len(a) - 1) for a in arrs]
        # Prefixes shared within this round that reach beyond what the cache gives: prefill each
        # once, on top of its parent's or a cached prefix, remember it, and use it for its members.
        # Prefixes are visited parents first; each prompt ends with the deepest one it belongs to.
        heads: dict[int, tuple[KV, int]] = {}
        tree = shared_prefixes(arrs, pc.min_tokens)
        for depth_nodes in _by_depth(tree):
            todo = [i for i in depth_nodes if sum(bases[u][1] < tree[i].length for u in tree[i].members) >= 2]
            if not todo:
                continue
            texts = [prompts[tree[i].members[0]][:tree[i].length] for i in todo]
            head_bases = [_best(pc.lookup(as_tokens(h), len(h) - 1), _kept_ancestor(tree, i, heads))
                          for i, h in zip(todo, texts)]
            kvs, _ = _prefill(self.model, texts, self.device, head_bases)
            self.prefill_tokens += sum(len(h) - m for h, (_, m) in zip(texts, head_bases))
            self.reused_tokens += sum(m for _, m in head_bases)
            for i, h, kv in zip(todo, texts, kvs):
                heads[i] = (kv, tree[i].length)
                pc.add(as_tokens(h), kv)
                for u in tree[i].members:
                    if bases[u][1] < tree[i].length:
                        bases[u] = heads[i]
        self.prefill_tokens += sum(len(p) - m for p, (_, m) in zip(prompts, bases))
        self.reused_tokens += sum(m for _, m in bases)
        return _prefill(self.model, prompts, self.device, bases)

    def _keep(self, keep: list[int]) -> None:
        """Keep only the rows at positions `keep`; free the others' slots."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.slot, self.cache, self.logits = [], [], None, None
            self.visible = self.visible[:0, :0, :0]
            self.next_pos = self.next_pos[:0]
            return
        sel = torch.tensor(keep, dtype=torch.long, device=self.device)
        assert self.logits is not None
        self.next_pos, self.logits = self.next_pos.index_select(0, sel), self.logits.index_select(0, sel)
        self.rows = [self.rows[a] for a in keep]
        self.slot = [self.slot[a] for a in keep]
        self._compact(force=False)

    def _compact(self, force: bool) -> None:
        """Renumber slots so each cache row's live slots come first and the width is the fullest row's;
        drop cache rows without live slots when they are over `compact_fraction` of the rows (`force`: any)."""
        if self.cache is None:
            return
        n_rows, width, _ = self.shape
        live = [0] * n_rows
        for c, _ in self.slot:
            live[c] += 1
        kept = [c for c in range(n_rows) if live[c]]
        if len(kept) < n_rows and (force or n_rows - len(kept) > self.compact_fraction * n_rows):
            new_c = {c: j for j, c in enumerate(kept)}
            self.cache.batch_select_indices(torch.tensor(kept, dtype=torch.long, device=self.device))
            self.visible = self.visible[kept]
            self.slot = [(new_c[c], s) for c, s in self.slot]
            live = [live[c] for c in kept]
            n_rows = len(kept)
        new_width = max(live)
        if new_width == width and all(s < live[c] for c, s in self.slot):
            return
        # slot order within a cache row is free: a slot's own columns are in its visibility row
        order = [[-1] * new_width for _ in range(n_rows)]
        fill = [0] * n_rows
        renumbered = []
        for c, s in self.slot:
            order[c][fill[c]] = s
            renumbered.append((c, fill[c]))
            fill[c] += 1
        src = torch.tensor([[s if s >= 0 else width for s in row] for row in order], device=self.device)
        padded = torch.cat([self.visible, torch.zeros_like(self.visible[:, :1])], dim=1)  # index `width`: a dummy
        self.visible = padded.gather(1, src[:, :, None].expand(-1, -1, padded.shape[2]))
        self.slot = renumbered

    def step(self) -> list[RowState]:
        """Pick a token for every row; returns the rows that finished (already removed)."""
        if not self.rows:
            return []
        assert self.logits is not None and self.cache is not None
        ids, lps = choose_tokens(self.logits, self.rows)
        done_rows: list[RowState] = []
        for row, tok, lp, pos in zip(self.rows, ids, lps, self.next_pos.tolist()):
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            row.finish_reason = _finished(row, tok, pos + 1, self.spec)
            if row.finish_reason is not None:
                row.retired = True
                done_rows.append(row)
        if done_rows:
            alive = [a for a, r in enumerate(self.rows) if not r.retired]
            ids = [ids[a] for a in alive]
            self._keep(alive)
            if not alive:
                return done_rows
        n_rows, width, _ = self.shape
        where = torch.tensor(self.slot, dtype=torch.long, device=self.device)  # [A, 2]
        flat = where[:, 0] * width + where[:, 1]
        tokens = torch.zeros(n_rows * width, dtype=torch.long, device=self.device)
        tokens[flat] = torch.tensor(ids, device=self.device)
        positions = torch.zeros(n_rows * width, dtype=torch.long, device=self.device)
        positions[flat] = self.next_pos
        # each slot (dummies too: a query must see some key) sees its own new column
        own = torch.eye(width, dtype=torch.bool, device=self.device).expand(n_rows, -1, -1)
        self.visible = torch.cat([self.visible, own], dim=2)
        dtype = next(self.model.parameters()).dtype
        out = self.model(input_ids=tokens.view(n_rows, width), position_ids=positions.view(n_rows, width),
                         attention_mask=_attention_mask(self.model, self.visible, dtype), use_cache=True,
                         **{self.cache_kw: self.cache})
        self.cache = _out_cache(out)
        self.logits = out.logits.reshape(n_rows * width, -1).index_select(0, flat)
        self.next_pos = self.next_pos + 1
        return done_rows


def generate_batch(model: Any, requests: list[SampleRequest], rows: list[RowState], spec: DecodeSpec,
                   device: torch.device) -> None:
    """Decode `requests` together to completion, filling `rows` in place (caller holds the model)."""
    batch = RunningBatch(model, spec, device)
    batch.admit(requests, rows)
    while batch.rows:
        batch.step()


def _finished(row: RowState, tok: int, total_len: int, spec: DecodeSpec) -> FinishReason | None:
    if tok in spec.eos_ids:
        return "stop"
    stops = row.params.stop
    if stops:
        text = spec.decode(row.token_ids)
        if any(s and s in text for s in stops):
            return "stop_string"
    if len(row.token_ids) >= row.params.max_tokens or total_len >= spec.max_positions:
        return "length"
    return None

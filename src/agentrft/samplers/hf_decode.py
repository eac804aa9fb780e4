"""The batched decode engine behind `HFSampler` (synchronous; runs in a worker thread).

A `RunningBatch` holds the rows being decoded and their KV cache (prefill is in
`hf_prefill`, the cache layers that append in place in `kv_cache`):

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

Log-probs and the choice of each token: `decode_rows`.

Shape legend: U distinct prompts, A live rows (requests), C cache rows, W slots
per cache row, V vocabulary, H kv heads, P prompt length, L cache length, D head dim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from agentrft.samplers.attention import HEAD_KWARG, uses_agentrft_attention
from agentrft.samplers.base import FinishReason, SampleRequest
from agentrft.samplers.decode_rows import RowState, choose_tokens
from agentrft.samplers.hf_prefill import cache_kw, out_cache, prefill_prompts
from agentrft.samplers.kv_cache import RoomyLayer, cache_of
from agentrft.samplers.prefix_cache import KV, PrefixCache, as_tokens
from agentrft.samplers.shared_head import SharedHead, head_length


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


def _attention_mask(model: Any, visible: torch.Tensor) -> torch.Tensor:
    """The [C, 1, W, L] mask as the attention wants it: bool for SDPA, additive float for eager."""
    mask = visible[:, None]
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def pad_to(t: torch.Tensor, dim: int, size: int, left: bool) -> torch.Tensor:
    """Zero-pad dimension `dim` of `t` to `size` (on the left or the right)."""
    extra = size - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + ([extra, 0] if left else [0, extra])
    return torch.nn.functional.pad(t, pad)


@dataclass
class DecodeSpec:
    """What the engine needs to know about the tokenizer and model limits."""

    eos_ids: frozenset[int]
    max_positions: int
    decode: Any  # callable: list[int] -> str


class RunningBatch:
    """Rows being decoded together; see the module docstring."""

    def __init__(
        self,
        model: Any,
        spec: DecodeSpec,
        device: torch.device,
        prefix_cache: PrefixCache | None = None,
        kv_dtype: torch.dtype | None = None,
        share_head: bool = True,
    ) -> None:
        self.model, self.spec, self.device = model, spec, device
        # the rows' common prompt prefix stored once (`shared_head`); the attention that reads it is agentrft_sdpa's
        self.share_head = share_head and uses_agentrft_attention(model)
        self.head: SharedHead | None = None
        # the caller's weights epoch (HFSampler sets it before each admission): a head built under older weights
        # is no prefix for new prompts, which then share none of it (the old rows take it back)
        self.weights_epoch = 0
        self._head_epoch = 0
        self.kv_dtype = kv_dtype  # the cache's dtype (None: what the model's layers produce)
        self.prefix_cache = prefix_cache  # the caller keeps it valid for the current weights
        self.prefill_tokens = 0  # prompt positions run through the model
        self.reused_tokens = 0  # prompt positions taken from the prefix cache or a shared prefix
        self.cache_kw = cache_kw(model)
        self.rows: list[RowState] = []  # live rows only: a finished or abandoned row leaves at once
        self.slot: list[tuple[int, int]] = []  # (cache row, slot) of each row
        self.cache: Any = None  # DynamicCache, [C, H, L, D] per layer
        self.visible = torch.zeros(0, 0, 0, dtype=torch.bool, device=device)  # [C, W, L]
        self.next_pos = torch.zeros(0, dtype=torch.long, device=device)  # [A] position of the next token
        self.logits: torch.Tensor | None = None  # [A, V] for the token each row picks next
        self.prefills = 0
        # KV positions allocated (cache rows x length) and those some slot attends to, summed at each
        # admission: their difference is the left padding that rows of very different lengths cost
        self.kv_positions = 0
        self.kv_used_positions = 0
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
        """(cache rows C, slots per row W, cache length L: the columns each row holds after the shared head)."""
        c, w, n = self.visible.shape
        return int(c), int(w), int(n)

    @property
    def head_len(self) -> int:
        return len(self.head) if self.head is not None else 0

    @property
    def cache_positions(self) -> int:
        """KV positions the batch holds: every cache row's columns, and the shared head once."""
        c, _, n = self.shape
        return c * n + self.head_len

    def positions_with(self, requests: list[SampleRequest]) -> int:
        """Cache positions (cache rows x length, and the shared head once, as `cache_positions` counts) the batch
        would reach with `requests` admitted, before any row leaves: the live cache rows plus the rows `admit` gives
        the new prompts (`_slot_width`: a prompt with more requests than slots takes several), all as long as the
        longest prompt, grown by one column per slot for every token the longest reply may still sample. For
        bounding admissions, not an allocation."""
        live_rows = len({c for c, _ in self.slot})
        _, width0, length = self.shape if self.cache is not None else (0, 0, 0)
        counts: dict[tuple[int, ...], int] = {}
        for r in requests:
            key = tuple(r.prompt_ids)
            counts[key] = counts.get(key, 0) + 1
        head = self._head_length(list(counts)) if counts else self.head_len
        length = max([length + self.head_len - head if self.cache is not None else 0, *(len(k) - head for k in counts)])
        rows, width = live_rows, width0
        if counts:
            w = _slot_width(list(counts.values()), length, live_rows, width0, self.token_cost)
            rows += sum(-(-n // w) for n in counts.values())
            width = max(width0, w)
        left = max(
            [0, *(r.params.max_tokens - len(r.token_ids) for r in self.rows), *(r.params.max_tokens for r in requests)]
        )
        grow = min(left, 2048, max(self.spec.max_positions - length - head, 0))  # a row stops at the model's positions
        # the head counted once, as it is stored: the bound is on the KV the batch holds, so the head's saving
        # becomes more rows per decode step
        return head + rows * (length + width * grow)

    def _head_length(self, prompts: list[Any]) -> int:
        if not self.share_head or (self.head is not None and self._head_epoch != self.weights_epoch):
            return 0
        return head_length(self.head, self.cache is not None, prompts)

    def retire(self, indices: list[int]) -> None:
        """Stop decoding the rows at `indices` (their callers gave up)."""
        gone = set(indices)
        self._keep([a for a in range(len(self.rows)) if a not in gone])

    def admit(self, requests: list[SampleRequest], rows: list[RowState]) -> None:
        """Prefill `requests` and add them (with their `rows`) to the running batch.

        Long on purpose: the shared head, the old rows' KV and the new prompts' columns are rebuilt together,
        one layer at a time, so no second copy of the cache exists at any point (see the module docstring)."""
        kept = self._compact(force=True, move_kv=False)  # dead cache rows are left out of the copy below
        distinct: dict[tuple[int, ...], int] = {}
        src = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in requests]
        prompts = [list(p) for p in distinct]
        lengths = [len(p) for p in prompts]
        rows0, width0, len0 = self.shape if self.cache is not None else (0, 0, 0)
        # the shared head after this admission (h positions) and what the old rows take back from it (grow)
        h, h0 = self._head_length(prompts), self.head_len
        grow = h0 - h if self.cache is not None else 0
        new_head = grow > 0 or rows0 == 0  # else the head stays as it is
        # each prompt's KV from the head on: its rows hold only that (the first whole, when it gives an empty
        # batch its head), so no prompt's copy of the head is made at all
        starts = [0 if u == 0 and self.cache is None else h for u in range(len(prompts))]
        caches, last = self._prefill_prompts(prompts, starts)
        self.prefills += len(prompts)
        cols = [n - h for n in lengths]  # the columns a new prompt's rows hold
        members: list[list[int]] = [[] for _ in prompts]
        for i, u in enumerate(src):
            members[u].append(i)
        width = _slot_width([len(m) for m in members], max(len0 + grow, *cols), rows0, width0, self.token_cost)
        # New cache rows: each prompt's requests, `width` at a time; a prompt's KV is copied per row.
        row_prompt: list[int] = []
        placed: list[tuple[int, int]] = [(0, 0)] * len(requests)  # request -> (new cache row, slot)
        for u, idx in enumerate(members):
            for start in range(0, len(idx), width):
                for s, i in enumerate(idx[start : start + width]):
                    placed[i] = (rows0 + len(row_prompt), s)
                row_prompt.append(u)
        w_all = max(width0, width)
        length = max(len0 + grow, *cols)
        vis = torch.zeros(len(row_prompt), w_all, length, dtype=torch.bool, device=self.device)
        for i, (c, s) in enumerate(placed):
            vis[c - rows0, s, length - cols[src[i]] :] = True
        # Room for every column the batch can still append (W per step until its longest row is done),
        # so decode steps write in place; pages past the written part are never touched, so they cost no memory.
        left = max(r.params.max_tokens - len(r.token_ids) for r in [*self.rows, *rows])
        capacity = length + w_all * min(left, 2048) + 1  # past that, `kv_cache.RoomyLayer` grows by half
        old_rows = kept if kept is not None else range(rows0)  # the live cache rows, in their new order
        # Layer by layer, each old layer and each prompt's layer KV is dropped once copied, so the copy costs one
        # layer's worth of memory on top of the cache, not a second cache (a failed admission fails the batch).
        old: list[Any] = self.cache.layers if self.cache is not None else []
        old_head = list(self.head.layers) if self.head is not None and self.cache is not None else []  # popped below
        self.cache = None
        prompt_kv = [[kv[layer] for kv in caches] for layer in range(len(caches[0]))]  # [layer][prompt] (k, v)
        del caches
        layers, head_layers = [], []
        while prompt_kv:
            kv_u, old_layer = prompt_kv.pop(0), old.pop(0) if old else None
            head_kv = old_head.pop(0) if old_head else None
            like = kv_u[0][0]
            bufs = []
            for which in (0, 1):
                shape = (rows0 + len(row_prompt), like.shape[1], capacity, like.shape[3])
                buf = like.new_empty(shape, dtype=self.kv_dtype or like.dtype)
                buf[:, :, :length].zero_()  # padding must be finite: masked weights are 0, and 0 * NaN is NaN
                if old_layer is not None:
                    for j, c in enumerate(old_rows):  # row by row: no temporary copy of the cache
                        buf[j, :, length - len0 : length] = (old_layer.values if which else old_layer.keys)[c]
                    if grow:  # the positions the head gives up, in front of every old row's columns
                        assert head_kv is not None
                        buf[: len(old_rows), :, length - len0 - grow : length - len0] = head_kv[which][:, :, h:h0]
                for c, u in enumerate(row_prompt):
                    buf[rows0 + c, :, length - cols[u] : length] = kv_u[u][which][0][:, h - starts[u] :]
                bufs.append(buf)
            if new_head and h:  # its first h positions: the old head's, or the first new prompt's in an empty batch
                k, v = head_kv if head_kv is not None else kv_u[0]
                head_layers.append((k[:, :, :h].to(bufs[0].dtype, copy=True), v[:, :, :h].to(bufs[1].dtype, copy=True)))
            del kv_u, old_layer, like, head_kv
            layers.append(RoomyLayer(bufs[0], bufs[1], length))
        self.cache = cache_of(layers)
        if new_head:
            self.head = SharedHead(list(prompts[0][:h]), head_layers) if h else None
            self._head_epoch = self.weights_epoch
        if grow and rows0:  # every old slot sees the columns given back (a dummy's extra keys are never read)
            self.visible = pad_to(self.visible, 2, len0 + grow, left=True)
            self.visible[:, :, :grow] = True
        new_pos = torch.tensor([lengths[u] for u in src], device=self.device)
        new_logits = last.index_select(0, torch.tensor(src, device=self.device))
        if rows0 == 0:
            self.visible, self.logits, self.next_pos = vis, new_logits, new_pos
        else:
            assert self.logits is not None
            self.visible = torch.cat([pad_to(pad_to(self.visible, 2, length, left=True), 1, w_all, left=False), vis])
            self.logits = torch.cat([self.logits, new_logits])
            self.next_pos = torch.cat([self.next_pos, new_pos])
        for row, req in zip(rows, requests, strict=True):
            row.prompt_ids = list(req.prompt_ids)
        self.rows.extend(rows)
        self.slot.extend(placed)
        self.kv_positions += self.cache_positions
        self.kv_used_positions += int(self.visible.any(dim=1).sum()) + self.head_len

    def _prefill_prompts(self, prompts: list[list[int]], starts: list[int]) -> tuple[list[KV], torch.Tensor]:
        """Prefill distinct prompts, running each shared or cached prefix through the model once; each prompt's KV
        from `starts[u]` on."""
        caches, last, computed, reused = prefill_prompts(
            self.model, prompts, self.device, self.prefix_cache, self.kv_dtype, starts
        )
        self.prefill_tokens += computed
        self.reused_tokens += reused
        return caches, last

    def _remember_turns(self, finished: list[int]) -> None:
        """Put each finished row's KV (its prompt and every sampled token but the last, which was never fed)
        in the prefix cache: an agent's next turn starts with this turn's prompt and reply, so it prefills only
        the tool result and what follows instead of the whole conversation again. A row's columns are those its
        visibility row shows (its prompt's, then its own tokens'), gathered from its cache row."""
        pc = self.prefix_cache
        if pc is None or not pc.enabled or not pc.remember_turns or self.cache is None:
            return
        for a in finished:
            row = self.rows[a]
            tokens = row.prompt_ids + row.token_ids[:-1]
            c, s = self.slot[a]
            cols = self.visible[c, s].nonzero()[:, 0]
            if cols.numel() + self.head_len != len(tokens):  # never expected: a row sees its prompt and fed tokens
                continue
            pc.add(as_tokens(tokens), functools.partial(self._row_kv, c, cols))  # gathered only if stored

    def _row_kv(self, c: int, cols: torch.Tensor, start: int = 0) -> KV:
        """The KV of cache row c's sequence (the shared head, then the row's columns `cols`) from position `start`
        on (the positions the prefix cache does not hold yet), per layer [1, H, head + len(cols) - start, D]
        (a copy)."""
        at = cols[max(start - self.head_len, 0) :]
        row = [(la.keys[c : c + 1, :, at], la.values[c : c + 1, :, at]) for la in self.cache.layers]
        return self.head.in_front(row, start) if self.head is not None and start < len(self.head) else row

    def _keep(self, keep: list[int]) -> None:
        """Keep only the rows at positions `keep`; free the others' slots."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.slot, self.cache, self.logits, self.head = [], [], None, None, None
            self.visible = self.visible[:0, :0, :0]
            self.next_pos = self.next_pos[:0]
            return
        sel = torch.tensor(keep, dtype=torch.long, device=self.device)
        assert self.logits is not None
        self.next_pos, self.logits = self.next_pos.index_select(0, sel), self.logits.index_select(0, sel)
        self.rows = [self.rows[a] for a in keep]
        self.slot = [self.slot[a] for a in keep]
        self._compact(force=False)

    def _compact(self, force: bool, move_kv: bool = True) -> list[int] | None:
        """Renumber slots so each cache row's live slots come first and the width is the fullest row's;
        drop cache rows without live slots when they are over `compact_fraction` of the rows (`force`: any).
        Returns the kept cache rows' old indices when rows were dropped; with `move_kv` False the KV is
        left as it was, for a caller that copies those rows itself."""
        if self.cache is None:
            return None
        dropped: list[int] | None = None
        n_rows, width, _ = self.shape
        live = [0] * n_rows
        for c, _ in self.slot:
            live[c] += 1
        kept = [c for c in range(n_rows) if live[c]]
        if len(kept) < n_rows and (force or n_rows - len(kept) > self.compact_fraction * n_rows):
            new_c = {c: j for j, c in enumerate(kept)}
            if move_kv:
                self.cache.batch_select_indices(torch.tensor(kept, dtype=torch.long, device=self.device))
            dropped = kept
            self.visible = self.visible[kept]
            self.slot = [(new_c[c], s) for c, s in self.slot]
            live = [live[c] for c in kept]
            n_rows = len(kept)
        new_width = max(live)
        if new_width == width and all(s < live[c] for c, s in self.slot):
            return dropped
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
        return dropped

    def step(self) -> list[RowState]:
        """Pick a token for every row; returns the rows that finished (already removed)."""
        if not self.rows:
            return []
        assert self.logits is not None and self.cache is not None
        ids, lps = choose_tokens(self.logits, self.rows)
        done_rows: list[RowState] = []
        for row, tok, lp, pos in zip(self.rows, ids, lps, self.next_pos.tolist(), strict=True):
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            row.finish_reason = _finished(row, tok, pos + 1, self.spec)
            if row.finish_reason is not None:
                done_rows.append(row)
        if done_rows:
            self._remember_turns([a for a, r in enumerate(self.rows) if r.finish_reason is not None])
            alive = [a for a, r in enumerate(self.rows) if r.finish_reason is None]
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
        out = self.model(
            input_ids=tokens.view(n_rows, width),
            position_ids=positions.view(n_rows, width),
            attention_mask=_attention_mask(self.model, self.visible),
            use_cache=True,
            **{self.cache_kw: self.cache},
            **({HEAD_KWARG: self.head} if self.head is not None else {}),
        )
        self.cache = out_cache(out)
        self.logits = out.logits.reshape(n_rows * width, -1).index_select(0, flat)
        self.next_pos = self.next_pos + 1
        return done_rows


def generate_batch(
    model: Any,
    requests: list[SampleRequest],
    rows: list[RowState],
    spec: DecodeSpec,
    device: torch.device,
    share_head: bool = True,
) -> None:
    """Decode `requests` together to completion, filling `rows` in place (caller holds the model)."""
    batch = RunningBatch(model, spec, device, share_head=share_head)
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

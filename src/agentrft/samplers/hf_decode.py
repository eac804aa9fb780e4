"""The batched decode engine behind `HFSampler` (synchronous; runs in a worker thread).

One call decodes one batch of requests:

1. **Prefill** each *distinct* prompt once, in chunks of similar length (left
   padded, at most 20% padding, so prompt lengths that differ a lot — as they
   do across agent turns — waste little compute). Requests with an
   identical prompt — a GRPO group asking for G samples of one task — share
   that prefill: its KV cache is copied to each row. `logits_to_keep=1` skips
   the vocabulary projection for all but the last prompt position.
2. **Assemble** the per-prompt caches into one left-padded batch cache with an
   attention mask that hides the padding, and explicit position ids so each
   row's positions count only its real tokens.
3. **Decode** one token per live row per step. A row that finishes (EOS, stop
   string, its own `max_tokens`) is dropped from the cache and the mask, so it
   stops costing compute.

Log-probs: each returned log-prob is `log_softmax(logits)[token]` of the raw
model at temperature 1, before temperature, top-k or top-p. That is the number
the trainer recomputes for importance ratios (`logp_new - logp_old`), so the
two are comparable whatever sampling settings produced the token. It is *not*
the probability of the sampling distribution when temperature ≠ 1 or top-k/p
truncate it.

Shape legend: U distinct prompts, B rows (requests), A live rows, V vocabulary,
L layers, H kv heads, P prompt length, D head dim.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrft.samplers.base import FinishReason, SampleRequest, SamplingParams


@dataclass
class RowState:
    """Decoding state of one request."""

    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None


def make_generator(params: SamplingParams, device: torch.device, rng: random.Random) -> torch.Generator | None:
    """A per-request generator: a seed makes the request reproducible on its own,
    independent of what else shares its batch. Greedy needs none."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else rng.getrandbits(63))
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


def _prefill(model: Any, prompts: list[list[int]], device: torch.device, cache_kw: str) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor]:
    """Prefill the prompts in length-bucketed, left-padded chunks.

    Returns per-prompt per-layer (k, v) of shape [1,H,P,D] (padding cut off) and
    the last-position logits [U, V].
    """
    del cache_kw  # prefill starts without a cache
    lengths = [len(p) for p in prompts]
    caches: list[Any] = [None] * len(prompts)
    last: list[Any] = [None] * len(prompts)
    for chunk in _prefill_chunks(lengths):
        p_max = lengths[chunk[0]]
        ids = torch.zeros(len(chunk), p_max, dtype=torch.long, device=device)
        mask = torch.zeros(len(chunk), p_max, dtype=torch.long, device=device)
        for j, u in enumerate(chunk):
            ids[j, p_max - lengths[u]:] = torch.tensor(prompts[u], device=device)
            mask[j, p_max - lengths[u]:] = 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        kwargs = {} if len(chunk) == 1 else {"attention_mask": mask}  # alone: no padding, no mask
        out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        layers = _out_cache(out).layers
        for j, u in enumerate(chunk):
            start = p_max - lengths[u]
            caches[u] = [(layer.keys[j:j + 1, :, start:], layer.values[j:j + 1, :, start:]) for layer in layers]
            last[u] = out.logits[j, -1]
    return caches, torch.stack(last)


def _assemble(caches: list[list[tuple[torch.Tensor, torch.Tensor]]], lengths: list[int], row_src: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Left-pad U prompt caches to one [B,H,Pmax,D] cache per layer; mask [B, Pmax] keeps real tokens."""
    from transformers import DynamicCache

    p_max = max(lengths)
    layers = []
    for layer in range(len(caches[0])):
        ks, vs = [], []
        for c, n in zip(caches, lengths):
            k, v = c[layer]
            pad = p_max - n
            ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)) if pad else k)
            vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)) if pad else v)
        layers.append((torch.cat(ks).index_select(0, row_src), torch.cat(vs).index_select(0, row_src)))
    mask = torch.zeros(len(lengths), p_max, dtype=torch.long, device=row_src.device)
    for u, n in enumerate(lengths):
        mask[u, p_max - n:] = 1
    return DynamicCache(ddp_cache_data=layers), mask.index_select(0, row_src)


@dataclass
class DecodeSpec:
    """What the engine needs to know about the tokenizer and model limits."""

    eos_ids: frozenset[int]
    max_positions: int
    decode: Any  # callable: list[int] -> str


def generate_batch(model: Any, requests: list[SampleRequest], rows: list[RowState], spec: DecodeSpec,
                   device: torch.device) -> None:
    """Decode every request to completion, filling `rows` in place (the caller holds the model)."""
    cache_kw = _cache_kw(model)
    distinct: dict[tuple[int, ...], int] = {}
    src = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in requests]
    prompts = [list(p) for p in distinct]
    lengths = [len(p) for p in prompts]
    row_src = torch.tensor(src, device=device)
    caches, last_logits = _prefill(model, prompts, device, cache_kw)
    cache, mask = _assemble(caches, lengths, row_src)
    del caches
    logits = last_logits.index_select(0, row_src)
    next_pos = torch.tensor([lengths[u] for u in src], device=device)
    live = list(range(len(requests)))  # live[a] = index into rows of live row a
    while live:
        ids, lps = choose_tokens(logits, [rows[i] for i in live])
        keep: list[int] = []
        for a, (i, tok, lp) in enumerate(zip(live, ids, lps)):
            row = rows[i]
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            row.finish_reason = _finished(row, tok, int(next_pos[a]) + 1, spec)
            if row.finish_reason is None:
                keep.append(a)
        if not keep:
            break
        tokens = torch.tensor([[ids[a]] for a in keep], device=device)
        if len(keep) < len(live):
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            mask, next_pos = mask.index_select(0, sel), next_pos.index_select(0, sel)
            live = [live[a] for a in keep]
        mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype, device=device)], dim=1)
        out = model(input_ids=tokens, attention_mask=mask, position_ids=next_pos[:, None],
                    use_cache=True, **{cache_kw: cache})
        cache, logits = _out_cache(out), out.logits[:, -1]
        next_pos = next_pos + 1


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

"""In-process Hugging Face sampler: token-in-token-out, continuously batched across episodes.

Many episodes run concurrently on one event loop and each awaits `sample()`.
One engine thread owns the model: when idle it waits for a request, gathers
whatever else arrives within `batch_wait_s` (up to `max_batch_size`), and
decodes them together. While decoding it admits newly arrived requests between
steps and hands each finished request back the moment it finishes, so a short
reply never waits for a long one and the event loop stays free for tool calls.

The sampler samples from the very `model` object the trainer updates (no weight
copy). The engine holds `model_lock` (and keeps the model in eval mode) while
any request is in flight. A trainer running concurrently wraps each weight
update in `with sampler.exclusive():` — new requests are held back, in-flight
ones finish, then the caller has the model alone — and sets `policy_version`.
See `hf_decode` for the decode algorithm and what the returned log-probs mean.

Result conventions: `token_ids` are exactly the sampled ids, the EOS token
included (finish "stop"); `text` is their decoding without that EOS. A stop
string ends the reply at the token that completes it (finish "stop_string");
the string stays in ids and text, together with any characters that same token
carries after it. Identical prompts in flight together are prefilled once,
whatever their `group_key`, and decode from one stored copy of their KV (see
`hf_decode`, "Layout"); prompts admitted together that share a long token
prefix (the environment's system prompt and examples, a group's question) have
that prefix prefilled once, and it stays in a small LRU prefix KV cache
(`prefix_cache_tokens` positions; 0 turns it off) that later admissions and
later turns reuse (see `prefix_cache`). The cache empties whenever the weights
may have changed: `policy_version` changes, `exclusive()` or `model_lock` is
taken by another thread, a parameter is updated in place or replaced, or
`invalidate_cache()` is called (a foreign `model_lock` also frees its memory at
once, for the trainer). Unseeded requests get a seed derived from
`reseed()`'s seed and the prompt, so reruns match whatever the arrival order.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import queue
import random
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentrft.samplers.base import SampleRequest, SampleResult


_LIVE: weakref.WeakSet[HFSampler] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # An engine thread still inside a torch op when the interpreter finalises aborts the process.
    for sampler in list(_LIVE):
        sampler.close()


@dataclass
class _Pending:
    request: SampleRequest
    future: asyncio.Future[SampleResult]
    loop: asyncio.AbstractEventLoop
    t0: float
    seed: int


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template reads a `tools` variable. SmolLM2's does not: tool
    schemas are then left to the agent loop's tool-call format (system prompt)."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template (tools passed where supported)."""
    # Templates concatenate `content` as a string; an assistant turn that only
    # calls tools has content None in OpenAI format. Copy, never mutate the input.
    msgs = [{**m, "content": m.get("content") or ""} for m in messages]
    kwargs: dict[str, Any] = {}
    if tools and template_supports_tools(tokenizer):
        kwargs["tools"] = tools
    out = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=add_generation_prompt,
                                        return_dict=False, **kwargs)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


class HFSampler:
    """`TokenSampler` over a Hugging Face causal LM and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any, policy: str, *, max_batch_size: int = 32,
                 device: str = "cpu", dtype: Any = None, batch_wait_s: float = 0.005,
                 admit_fraction: float = 0.25, admit_max_wait_s: float = 0.5,
                 policy_version: int = 0, prefix_cache_tokens: int = 4096, prefix_min_tokens: int = 64) -> None:
        import torch

        from agentrft.samplers.hf_decode import DecodeSpec
        from agentrft.samplers.prefix_cache import PrefixCache

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.tokenizer = tokenizer
        self.policy = policy
        self.policy_version = policy_version
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.admit_fraction = admit_fraction
        self.admit_max_wait_s = admit_max_wait_s
        # Prefix KV cache (engine thread only). Anyone else taking model_lock may change the
        # weights: that, exclusive() and invalidate_cache() bump the epoch, which empties it.
        self.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens, min_tokens=prefix_min_tokens)
        self._cache_epoch = 0
        self._weights_sample: tuple[float, ...] = ()
        self.model_lock = _ModelLock(self._on_foreign_lock)
        eos = {i for i in (tokenizer.eos_token_id,) if i is not None}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else ({gen_eos} if gen_eos is not None else set())
        self._spec = DecodeSpec(eos_ids=frozenset(eos),
                                max_positions=int(getattr(model.config, "max_position_embeddings", 1 << 30)),
                                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        self._vocab = int(model.get_input_embeddings().weight.shape[0])
        self.template_supports_tools = template_supports_tools(tokenizer)
        self._base_seed = random.SystemRandom().getrandbits(63)
        self._seen: dict[bytes, int] = {}  # prompt digest -> requests so far (see _seed_for)
        self._inbox: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._hold = threading.Event()  # set by exclusive(): admit nothing new
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # admissions: prefill rounds; prefills: distinct prompts prefilled; steps: decode steps
        _LIVE.add(self)
        # prefill_tokens: prompt positions run through the model; reused_tokens: taken from a shared
        # or cached prefix instead
        self.stats = {"admissions": 0, "requests": 0, "prefills": 0, "tokens": 0, "steps": 0,
                      "prefill_tokens": 0, "reused_tokens": 0}

    # --- TokenSampler -------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the conversation through the tokenizer's chat template."""
        return render_chat(self.tokenizer, messages, tools, add_generation_prompt)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included (the exact inverse view of `render`)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    async def sample(self, request: SampleRequest) -> SampleResult:
        self._validate(request)
        if self._closed.is_set():
            raise RuntimeError("HFSampler is closed")
        self._ensure_engine()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SampleResult] = loop.create_future()
        self._inbox.put(_Pending(request, fut, loop, time.perf_counter(), self._seed_for(request)))
        return await fut

    def reseed(self, seed: int) -> None:
        """Make unseeded sampling reproducible from here on (the trainer calls this per step)."""
        self._base_seed = seed
        self._seen.clear()

    def _seed_for(self, request: SampleRequest) -> int:
        """The request's own seed, else one derived from the sampler seed, the prompt, and how many
        requests with this prompt came before. Unlike a shared random stream this does not depend
        on the order in which concurrent episodes happen to reach the sampler, so reruns match."""
        if request.params.seed is not None:
            return request.params.seed
        digest = hashlib.blake2b(array("q", request.prompt_ids).tobytes(), digest_size=16).digest()
        if len(self._seen) > 1_000_000:  # unbounded runs without reseed: forget, stay bounded
            self._seen.clear()
        n = self._seen.get(digest, 0)
        self._seen[digest] = n + 1
        mix = hashlib.blake2b(digest + self._base_seed.to_bytes(8, "little", signed=True) + n.to_bytes(8, "little"),
                              digest_size=8).digest()
        return int.from_bytes(mix, "little") >> 1

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Any]:
        """Hold new requests back, let in-flight ones finish, and give the caller the model alone."""
        self._hold.set()
        try:
            with self.model_lock:  # (a foreign acquisition: invalidates the prefix cache)
                yield self.model
        finally:
            self.invalidate_cache()  # again after the update, in case the engine refilled meanwhile
            self._hold.clear()

    def invalidate_cache(self) -> None:
        """Forget cached prefix KV (call after changing the weights other than under `exclusive()` /
        `model_lock`; changes there, `policy_version` changes and in-place parameter updates are
        detected anyway). Takes effect before the next admission."""
        self._cache_epoch += 1

    def _on_foreign_lock(self) -> None:
        # The caller holds the model lock, so the engine is between batches and not using the cache:
        # free its KV now rather than at the next admission (a trainer wants that memory meanwhile).
        self._cache_epoch += 1
        self.prefix_cache.clear()

    def _weights_key(self, fresh: bool) -> tuple[Any, ...]:
        """What the prefix cache's KV depends on. Parameters' `_version` counters grow with every
        in-place update (optimizer steps, `load_state_dict`) and `data_ptr` changes when a tensor is
        swapped; `.data` writes bypass both, so when the engine (re)takes the model (`fresh`) it also
        samples a few values of every parameter (~2 ms for 135M parameters)."""
        import torch

        params = list(self.model.parameters())
        if fresh:
            with torch.no_grad():
                self._weights_sample = tuple(torch.stack([
                    p.detach().reshape(-1)[::max(1, p.numel() // 7)].double().sum() for p in params]).tolist())
        return (self.policy_version, self._cache_epoch, self._weights_sample,
                tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params))

    def close(self) -> None:
        """Stop the engine thread; requests still queued fail."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- engine ---------------------------------------------------------------------------------
    def _validate(self, request: SampleRequest) -> None:
        ids = request.prompt_ids
        if not ids:
            raise ValueError("SampleRequest.prompt_ids is empty")
        bad = [i for i in ids if not 0 <= int(i) < self._vocab]
        if bad:
            raise ValueError(f"SampleRequest.prompt_ids has ids outside the vocabulary [0, {self._vocab}): {bad[:5]}")
        if len(ids) >= self._spec.max_positions:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's "
                             f"{self._spec.max_positions} positions")

    def _ensure_engine(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._engine, name="agentrft-hf-engine", daemon=True)
                self._thread.start()

    def _gather(self, pending: deque[_Pending], block: bool) -> None:
        """Move requests from the inbox to `pending`; when `block`, wait for one and then `batch_wait_s`."""
        if block and not pending:
            try:
                pending.append(self._inbox.get(timeout=0.2))
            except queue.Empty:
                return
            deadline = time.monotonic() + self.batch_wait_s
            while len(pending) < self.max_batch_size and (left := deadline - time.monotonic()) > 0:
                try:
                    pending.append(self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                pending.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _engine(self) -> None:
        """The engine thread: admit, step, deliver, until closed."""
        import torch

        from agentrft.samplers.hf_decode import RowState, RunningBatch, make_generator

        self.model_lock.engine_ident = threading.get_ident()
        pending: deque[_Pending] = deque()
        batch: RunningBatch | None = None
        fresh = True
        was_training = False
        while not self._closed.is_set():
            self._gather(pending, block=batch is None)
            if batch is None:
                if not pending or self._hold.is_set():
                    time.sleep(0.002 if pending else 0)
                    continue
                self.model_lock.acquire()
                was_training = self.model.training
                self.model.eval()
                batch = RunningBatch(self.model, self._spec, self.device, self.prefix_cache)
                fresh = True
            admit: list[_Pending] = []
            # Joining a running batch copies its whole cache: wait until a quarter of its size is
            # waiting, or the oldest request has waited admit_max_wait_s.
            wait = bool(batch.n_alive and pending) and len(pending) < max(1, self.admit_fraction * batch.n_alive) \
                and time.perf_counter() - pending[0].t0 < self.admit_max_wait_s
            while not wait and pending and not self._hold.is_set() and \
                    batch.n_alive + len(admit) < self.max_batch_size:
                p = pending.popleft()
                if not p.future.done():  # skip callers that gave up
                    admit.append(p)
            done: list[Any] = []
            failed: list[_Pending] = []
            error: Exception | None = None
            try:
                with torch.inference_mode():
                    # Rows whose caller gave up leave before the next step.
                    batch.retire([a for a, r in enumerate(batch.rows) if r.owner.future.done()])
                    if admit:
                        if self.prefix_cache.enabled:
                            self.prefix_cache.validate(self._weights_key(fresh))
                            fresh = False
                        rows = [RowState(p.request.params, make_generator(p.request.params, self.device, p.seed),
                                         owner=p) for p in admit]
                        before = (batch.prefills, batch.prefill_tokens, batch.reused_tokens)
                        batch.admit([p.request for p in admit], rows)
                        self.stats["prefill_tokens"] += batch.prefill_tokens - before[1]
                        self.stats["reused_tokens"] += batch.reused_tokens - before[2]
                        self.stats["admissions"] += 1
                        self.stats["requests"] += len(admit)
                        self.stats["prefills"] += batch.prefills - before[0]
                    done = batch.step()
                    self.stats["steps"] += 1
            except Exception as exc:  # a failed step fails its requests, not the sampler
                error = RuntimeError(f"HF sampler failed: {type(exc).__name__}: {exc}")
                failed = [row.owner for row in batch.rows] + admit
                batch.rows = []
            if self._closed.is_set() and batch.rows:
                error = error or RuntimeError("HFSampler was closed")
                failed += [row.owner for row in batch.rows]
                batch.rows = []
            if not batch.rows:
                # Give the model back before anyone hears their request is done: a
                # caller may train on it as soon as its await returns.
                batch = None
                self.model.train(was_training)
                self.model_lock.release()
            for row in done:
                self._deliver(row)
            for p in failed:
                _resolve(p, exc=error)
        closed = RuntimeError("HFSampler was closed")
        for p in pending:
            _resolve(p, exc=closed)

    def _deliver(self, row: Any) -> None:
        p: _Pending = row.owner
        self.stats["tokens"] += len(row.token_ids)
        # The EOS token stays in token_ids (the policy chose it and must learn to);
        # the text leaves it out, being the message content.
        text_ids = row.token_ids[:-1] if row.finish_reason == "stop" else row.token_ids
        _resolve(p, SampleResult(token_ids=row.token_ids, logprobs=row.logprobs, text=self.decode(text_ids),
                                 finish_reason=row.finish_reason, prompt_tokens=len(p.request.prompt_ids),
                                 completion_tokens=len(row.token_ids), latency_s=time.perf_counter() - p.t0))


class _ModelLock:
    """`threading.Lock` semantics; calls `on_foreign` whenever a thread other than the sampler's
    engine acquires it: whoever takes the model lock may be about to change the weights."""

    def __init__(self, on_foreign: Any) -> None:
        self._lock = threading.Lock()
        self._on_foreign = on_foreign
        self.engine_ident: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got and threading.get_ident() != self.engine_ident:
            self._on_foreign()
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _resolve(p: _Pending, result: SampleResult | None = None, exc: BaseException | None = None) -> None:
    """Complete a caller's future from the engine thread (its loop may be gone)."""
    def settle() -> None:
        if not p.future.done():
            if exc is not None:
                p.future.set_exception(exc)
            else:
                p.future.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # event loop already closed: nobody is waiting
        p.loop.call_soon_threadsafe(settle)

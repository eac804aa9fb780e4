"""In-process Hugging Face sampler: token-in-token-out, continuously batched across episodes.

Many episodes run concurrently on one event loop and each awaits `sample()`.
One engine thread owns the model: when idle it waits for a request, gathers
whatever else arrives within `batch_wait_s` (up to `max_batch_size`), and
decodes them together. While decoding it admits newly arrived requests between
steps and hands each finished request back the moment it finishes, so a short
reply never waits for a long one and the event loop stays free for tool calls.
Admissions are bounded by `max_kv_positions` (the batch cache's rows x length,
left padding included, as it will stand once the longest reply is sampled, and
the shared head once; by default the positions `KV_BUDGET_MIB` holds): a
request that would outgrow it waits, in arrival order, until rows finish, so
long episodes (levels 3-4 of finqa-lite: 3-8k tokens each) run a few at a time
instead of 32 rows padded to the longest.

The sampler samples from the very `model` object the trainer updates (no weight
copy): it is a `TrainablePolicy`. The engine holds the model (in eval mode)
while any request is in flight. A trainer wraps each weight update in
`with sampler.paused():` — new requests are held back, in-flight ones finish,
then the caller has the model alone — and ends it with
`weights_updated(version)`. See `hf_decode` for the decode algorithm; the
returned log-probs are those of the distribution sampled from
(`samplers.distribution`).

Result conventions: `token_ids` are exactly the sampled ids, the EOS token
included (finish "stop"); `text` is their decoding without that EOS. A stop
string ends the reply at the token that completes it (finish "stop_string");
the string stays in ids and text, together with any characters that same token
carries after it. Identical prompts in flight together are prefilled once,
whatever their `group_key`, and decode from one stored copy of their KV (see
`hf_decode`, "Layout"); prompts admitted together that share a long token
prefix (the environment's system prompt and examples, a group's question) have
that prefix prefilled once, and it stays in an LRU prefix KV cache (a radix tree:
each shared position stored once)
(`prefix_cache_tokens` positions, by default what `KV_BUDGET_MIB` holds; 0 turns it off) that later admissions and
later turns reuse; a finished request's prompt and reply go there too, so an
episode's next turn prefills only what was appended (see `prefix_cache`). The cache holds KV of the current weights only: `weights_updated`
is the one signal that they changed, and `paused()` frees the cache's memory for
the trainer at once. Whoever changes the weights another way must call
`weights_updated`. Unseeded requests get a seed derived from
`reseed()`'s seed and the prompt, so reruns match whatever the arrival order.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from agentrft.samplers.base import SampleRequest, SampleResult
from agentrft.samplers.inprocess import InProcessPolicy

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
    together: bool = False  # one of a wave (`sample_together`): admitted as soon as it fits, never timed


# The default ("auto") size of each of the engine's two KV stores, the batch cache and the prefix cache, in memory:
# 32,768 positions of SmolLM2-135M's KV in bf16 (22.5 KiB a position), 16,384 in fp32, so an engine that computes
# in fp32 (a CPU without native bf16) holds no more than one in bf16. 64 level-3 episodes on the 2-core Zen 2 in
# fp32: 4.9 GiB peak RSS at 32,768 positions each, 2.5-2.9 GiB at 16,384 (benchmarks/long_episodes.py).
KV_BUDGET_MIB = 720


class HFSampler(InProcessPolicy):
    """`TrainablePolicy` over a Hugging Face causal LM and its tokenizer: the continuous-batching engine."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        policy: str,
        *,
        max_batch_size: int = 32,
        max_kv_positions: int | Literal["auto"] | None = "auto",
        device: str = "cpu",
        dtype: Any = None,
        batch_wait_s: float = 0.005,
        admit_fraction: float = 0.25,
        admit_max_wait_s: float = 0.5,
        policy_version: int = 0,
        prefix_cache_tokens: int | Literal["auto"] = "auto",
        prefix_min_tokens: int = 64,
        remember_turns: bool = True,
        precision: str = "fp32",
        frozen: bool = False,
        share_head: bool = True,
    ) -> None:
        import torch

        from agentrft.samplers.kv_cache import position_bytes
        from agentrft.samplers.prefix_cache import PrefixCache

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
        if max_kv_positions is not None and max_kv_positions != "auto" and max_kv_positions < 1:
            raise ValueError(f"max_kv_positions must be >= 1, auto or None (unbounded), got {max_kv_positions}")
        enable_sdpa_gqa()
        super().__init__(model, tokenizer, policy, device=device, dtype=dtype, policy_version=policy_version)
        # bytes of one KV position in the engine's KV dtype (bf16 under bf16 compute, else the model's)
        element = 2 if precision == "bf16" else next(self.model.parameters()).element_size()
        self.position_bytes = position_bytes(self.model.config, element)
        auto = max(1, KV_BUDGET_MIB * 2**20 // self.position_bytes)
        max_kv_positions = auto if max_kv_positions == "auto" else max_kv_positions
        prefix_cache_tokens = auto if prefix_cache_tokens == "auto" else prefix_cache_tokens
        # decode steps fold grouped-query heads into query rows (`samplers/attention.py`); a LoRA wrapper's base
        # model is the one switched; a model that cannot switch samples on plain SDPA
        from agentrft.samplers.attention import use_agentrft_attention

        use_agentrft_attention(model.get_base_model() if hasattr(model, "get_base_model") else model, required=False)
        # an eval-only sampler (`agentrft eval`): under bf16 the linear weights are stored in bf16, no fp32 masters
        self.frozen = frozen
        if frozen and precision == "bf16":
            from agentrft.samplers.frozen import store_in_compute_dtype

            store_in_compute_dtype(self.model, torch.bfloat16)
        self.max_batch_size = max_batch_size
        self.share_head = share_head  # the batch's common prompt prefix stored once (`samplers/shared_head.py`)
        # Bound on the batch's KV cache (cache rows x their length, padding included, and the shared head once;
        # see RunningBatch.positions_with):
        # long episodes admitted together all pad to the longest, and 32 rows of 8k positions are 12 GB in fp32.
        self.max_kv_positions = max_kv_positions
        self.batch_wait_s = batch_wait_s
        self.admit_fraction = admit_fraction
        self.admit_max_wait_s = admit_max_wait_s
        # Prefix KV cache (engine thread only), valid for one weights epoch: weights_updated() bumps it.
        self.precision = precision
        self._kv_dtype = torch.bfloat16 if precision == "bf16" else None  # the batch's and the prefix cache's KV
        self.prefix_cache = PrefixCache(
            max_tokens=prefix_cache_tokens,
            min_tokens=prefix_min_tokens,
            remember_turns=remember_turns,
            dtype=self._kv_dtype,
        )
        self._weights_epoch = 0
        self._model_lock = threading.Lock()  # held by the engine while a batch runs, and by paused()
        self._inbox: queue.SimpleQueue[_Pending | list[_Pending]] = queue.SimpleQueue()
        self._hold = threading.Event()  # set by paused(): admit nothing new
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # admissions: prefill rounds; prefills: distinct prompts prefilled; steps: decode steps
        _LIVE.add(self)
        # prefill_tokens: prompt positions run through the model; reused_tokens: taken from a shared
        # or cached prefix instead; prefill_s / decode_s: engine seconds in admissions / decode steps;
        # kv_positions / kv_used_positions: the batch cache's positions after each admission, and those any
        # request attends to (the rest is left padding between rows of different lengths); kv_wait_steps:
        # engine steps at which a request waited for room under max_kv_positions; kv_peak_positions: the most
        # the batch cache held (cache rows x length, and the shared head); trim_s: seconds handing freed heap back to the OS (`_trim_heap`)
        self.stats = {
            "admissions": 0,
            "requests": 0,
            "prefills": 0,
            "tokens": 0,
            "steps": 0,
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "prefill_s": 0.0,
            "decode_s": 0.0,
            "kv_positions": 0,
            "kv_used_positions": 0,
            "kv_wait_steps": 0,
            "kv_peak_positions": 0,
            "trim_s": 0.0,
        }

    # --- TokenSampler -------------------------------------------------------------------------
    async def sample(self, request: SampleRequest) -> SampleResult:
        (fut,) = self._submit([request], together=False)
        return await fut

    def sample_together(self, requests: list[SampleRequest]) -> list[asyncio.Future[SampleResult]]:
        """Queue ``requests`` as one wave (`rollout.lockstep`): the engine takes them in one piece, in this
        order, and admits them as the KV budget allows, never by how long they waited; so the batches they
        decode in depend on the requests alone. Seeds are derived in this order too. One future per request;
        a request `sample` would refuse fails its own future alone."""
        return self._submit(requests, together=True)

    def _submit(self, requests: list[SampleRequest], *, together: bool) -> list[asyncio.Future[SampleResult]]:
        """Validate, seed and queue ``requests`` (as one inbox item when ``together``); a future for each."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[SampleResult]] = []
        queued: list[_Pending] = []
        now = time.perf_counter()
        for request in requests:
            fut: asyncio.Future[SampleResult] = loop.create_future()
            futures.append(fut)
            try:
                self._validate(request)
                if self._closed.is_set():
                    raise RuntimeError("HFSampler is closed")
            except Exception as exc:
                fut.set_exception(exc)
                continue
            queued.append(_Pending(request, fut, loop, now, self._seeds.seed_for(request), together=together))
        if queued:
            self._ensure_engine()
            for item in [queued] if together else queued:
                self._inbox.put(item)
        return futures

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold new requests back, let in-flight ones finish, and give the caller the model alone.
        The prefix cache's memory is freed on entry (the caller is about to need it). A frozen sampler refuses:
        its weights are stored as it computes them (bf16), so an update would be rounded and never trained."""
        self._refuse_if_frozen()
        self._hold.set()
        try:
            with self._model_lock:  # the engine is between batches from here on
                self.prefix_cache.clear()
                yield
        finally:
            self._hold.clear()

    def _refuse_if_frozen(self) -> None:
        if self.frozen:
            raise RuntimeError("this sampler was built frozen (an eval's): its weights are not trained")

    def weights_updated(self, version: int) -> None:
        """The weights changed: sample as `version` from now on, reusing no KV of older weights."""
        self._refuse_if_frozen()
        super().weights_updated(version)
        self._weights_epoch += 1

    def close(self) -> None:
        """Stop the engine thread; requests still queued fail."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- engine ---------------------------------------------------------------------------------
    def _ensure_engine(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._engine, name="agentrft-hf-engine", daemon=True)
                self._thread.start()

    def _gather(self, pending: deque[_Pending], block: bool) -> None:
        """Move requests from the inbox to `pending`; when `block`, wait for one and then `batch_wait_s`
        (not after a wave: it came whole)."""
        if block and not pending:
            try:
                _take(pending, self._inbox.get(timeout=0.2))
            except queue.Empty:
                return
            deadline = time.monotonic() + self.batch_wait_s
            while (
                not pending[0].together
                and len(pending) < self.max_batch_size
                and (left := deadline - time.monotonic()) > 0
            ):
                try:
                    _take(pending, self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                _take(pending, self._inbox.get_nowait())
            except queue.Empty:
                return

    def _note_kv_peak(self, batch: Any) -> None:
        if batch.cache is not None:
            self.stats["kv_peak_positions"] = max(self.stats["kv_peak_positions"], batch.cache_positions)

    def _engine(self) -> None:
        """The engine thread: admit, step, deliver, until closed.

        Long on purpose: one loop holds the batch's state (pending requests, the running batch, the compute
        context across a training pause) that every branch of it changes; split, each piece would pass all of it."""

        from agentrft.samplers.decode_rows import RowState, make_generator
        from agentrft.samplers.hf_decode import RunningBatch

        pending: deque[_Pending] = deque()
        batch: RunningBatch | None = None
        was_training = False
        compute: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        while not self._closed.is_set():
            self._gather(pending, block=batch is None)
            if batch is None:
                if not pending or self._hold.is_set():
                    time.sleep(0.002 if pending else 0)
                    continue
                self._model_lock.acquire()
                was_training, entered = self.model.training, False
                try:
                    self.model.eval()
                    compute = self._compute_context()
                    compute.__enter__()
                    entered = True
                    batch = RunningBatch(
                        self.model,
                        self._spec,
                        self.device,
                        self.prefix_cache,
                        kv_dtype=self._kv_dtype,
                        share_head=self.share_head,
                    )
                except Exception as exc:  # the waiting requests fail; the model and its lock are given back
                    if entered:
                        compute.__exit__(None, None, None)
                    self.model.train(was_training)
                    self._model_lock.release()
                    start_failed = RuntimeError(f"HF sampler failed: {type(exc).__name__}: {exc}")
                    while pending:
                        _resolve(pending.popleft(), exc=start_failed)
                    continue
            admit: list[_Pending] = []
            # the weights the next admission's prompts are prefilled with: a head built before them is not theirs,
            # which the budget's estimate below must know too (else it counts a stale head once that admission
            # then copies into every row)
            batch.weights_epoch = self._weights_epoch
            # Joining a running batch copies its whole cache: wait until a quarter of its size is
            # waiting, or the oldest request has waited admit_max_wait_s.
            wait = (
                bool(batch.n_alive and pending)
                and not pending[0].together
                and len(pending) < max(1, self.admit_fraction * batch.n_alive)
                and time.perf_counter() - pending[0].t0 < self.admit_max_wait_s
            )
            while not wait and pending and not self._hold.is_set() and batch.n_alive + len(admit) < self.max_batch_size:
                if pending[0].future.done():  # skip callers that gave up
                    pending.popleft()
                    continue
                # The KV budget: a request waits (in arrival order) while the batch would outgrow it; a batch
                # with no rows takes one request whatever its size, so nothing waits forever.
                if self.max_kv_positions is not None and (batch.n_alive or admit):
                    wanted = [p.request for p in admit] + [pending[0].request]
                    if batch.positions_with(wanted) > self.max_kv_positions:
                        self.stats["kv_wait_steps"] += 1
                        break
                admit.append(pending.popleft())
            done: list[Any] = []
            failed: list[_Pending] = []
            error: Exception | None = None
            try:
                # Rows whose caller gave up leave before the next step.
                batch.retire([a for a, r in enumerate(batch.rows) if r.owner.future.done()])
                if admit:
                    if self.prefix_cache.enabled:
                        self.prefix_cache.validate(self._weights_epoch)
                    rows = [
                        RowState(p.request.params, make_generator(p.request.params, self.device, p.seed), owner=p)
                        for p in admit
                    ]
                    before = (batch.prefills, batch.prefill_tokens, batch.reused_tokens)
                    kv_before = (batch.kv_positions, batch.kv_used_positions)
                    self.stats["trim_s"] += _trim_heap()
                    t_admit = time.perf_counter()
                    batch.admit([p.request for p in admit], rows)
                    self.stats["prefill_s"] += time.perf_counter() - t_admit
                    self.stats["trim_s"] += _trim_heap()
                    self.stats["prefill_tokens"] += batch.prefill_tokens - before[1]
                    self.stats["reused_tokens"] += batch.reused_tokens - before[2]
                    self.stats["admissions"] += 1
                    self.stats["requests"] += len(admit)
                    self.stats["prefills"] += batch.prefills - before[0]
                    self.stats["kv_positions"] += batch.kv_positions - kv_before[0]
                    self.stats["kv_used_positions"] += batch.kv_used_positions - kv_before[1]
                    self._note_kv_peak(batch)
                t_step = time.perf_counter()
                done = batch.step()
                self.stats["decode_s"] += time.perf_counter() - t_step
                self._note_kv_peak(batch)
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
                compute.__exit__(None, None, None)  # drops autocast's bf16 weight copies
                self.model.train(was_training)
                self._model_lock.release()
            for row in done:
                self._deliver(row)
            for p in failed:
                _resolve(p, exc=error)
        closed = RuntimeError("HFSampler was closed")
        for p in pending:
            _resolve(p, exc=closed)

    @contextlib.contextmanager
    def _compute_context(self) -> Iterator[None]:
        """What a batch runs under, from its first admission to its last row (the engine holds the model):
        with `precision="bf16"`, bf16 autocast with its weight-cast cache, so each weight is cast once per
        batch, not once per decode step (the weights do not change while the engine holds the model); the
        cache works under `no_grad`, not `inference_mode`, so bf16 batches use that."""
        import torch

        with contextlib.ExitStack() as stack:
            if self.precision == "bf16":
                stack.enter_context(torch.no_grad())
                stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=True))
            else:
                stack.enter_context(torch.inference_mode())
            yield

    def _deliver(self, row: Any) -> None:
        p: _Pending = row.owner
        self.stats["tokens"] += len(row.token_ids)
        # The EOS token stays in token_ids (the policy chose it and must learn to);
        # the text leaves it out, being the message content.
        text_ids = row.token_ids[:-1] if row.finish_reason == "stop" else row.token_ids
        _resolve(
            p,
            SampleResult(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                text=self.decode(text_ids),
                finish_reason=row.finish_reason,
                prompt_tokens=len(p.request.prompt_ids),
                completion_tokens=len(row.token_ids),
                latency_s=time.perf_counter() - p.t0,
                # weights change only while the engine is paused between batches (`paused`), so the
                # version now is the one every token of this row was sampled with
                policy_version=self.policy_version,
            ),
        )


GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"


def enable_sdpa_gqa() -> None:
    """Have transformers' SDPA attention attend grouped-query heads directly (`enable_gqa`, its documented
    switch) instead of first copying each layer's whole KV to repeat its heads (`repeat_kv`): the same
    function (tested), a third less time per decode step on long contexts. Set once for the process and
    never unset (the variable is process-wide; toggling it would race with other threads); a value the
    user set is kept."""
    os.environ.setdefault(GQA_SWITCH, "1")


def _trim_heap() -> float:
    """Hand the heap's free pages back to the OS (`memory.trim`) around each admission, where the batch's whole
    KV cache is rebuilt at a new size: freed caches, prefill chunks and prompt KV leave free chunks of sizes
    the next cache cannot reuse, and they stayed resident. A 64-episode level-3 eval peaked at 4,665 MiB
    without, 3,464 MiB with (2-core AMD EPYC, `benchmarks/long_episodes.py`). Returns the seconds it took."""
    from agentrft.memory import trim

    t0 = time.perf_counter()
    trim()
    return time.perf_counter() - t0


def _take(pending: deque[_Pending], item: _Pending | list[_Pending]) -> None:
    if isinstance(item, list):
        pending.extend(item)
    else:
        pending.append(item)


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

"""In-process Hugging Face sampler: token-in-token-out, batched across episodes.

Many episodes run concurrently on one event loop and each awaits `sample()`.
A background task gathers the pending requests (waiting `batch_wait_s` after
the first one, or until `max_batch_size`) and decodes them as one batch in a
single worker thread, so the event loop stays free for tool calls meanwhile.
Requests that arrive during a batch form the next one.

The sampler samples from the very `model` object the trainer updates (no weight
copy). `model_lock` is held for the whole of each batch; the trainer holds it
while it changes the weights, then bumps `policy_version`. See `hf_decode` for
the decode algorithm and what the returned log-probs mean.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrft.samplers.base import SampleRequest, SampleResult

_Pending = tuple[SampleRequest, "asyncio.Future[SampleResult]", float]


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
                 policy_version: int = 0) -> None:
        import torch

        from agentrft.samplers.hf_decode import DecodeSpec

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
        self.model_lock = threading.Lock()
        eos = {i for i in (tokenizer.eos_token_id,) if i is not None}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else ({gen_eos} if gen_eos is not None else set())
        self._spec = DecodeSpec(eos_ids=frozenset(eos),
                                max_positions=int(getattr(model.config, "max_position_embeddings", 1 << 30)),
                                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        self._vocab = int(model.get_input_embeddings().weight.shape[0])
        self.template_supports_tools = template_supports_tools(tokenizer)
        self._rng = random.Random()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrft-hf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.stats = {"batches": 0, "requests": 0, "prefills": 0, "tokens": 0}

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
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._batch_loop(), name="agentrft-hf-batcher")
        fut: asyncio.Future[SampleResult] = loop.create_future()
        assert self._queue is not None
        await self._queue.put((request, fut, time.perf_counter()))
        return await fut

    # --- batching ---------------------------------------------------------------------------
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

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        queue, loop = self._queue, asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0 and queue.empty():
                    break
                try:
                    batch.append(queue.get_nowait() if not queue.empty() else
                                 await asyncio.wait_for(queue.get(), remaining))
                except (asyncio.TimeoutError, TimeoutError):
                    break
            live = [p for p in batch if not p[1].done()]  # drop requests whose caller gave up
            if not live:
                continue
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, [p[0] for p in live])
            except Exception as exc:  # one failed batch fails its requests, not the sampler
                for _, fut, _ in live:
                    if not fut.done():
                        fut.set_exception(RuntimeError(f"HF sampler batch failed: {type(exc).__name__}: {exc}"))
                continue
            now = time.perf_counter()
            for (_, fut, t0), res in zip(live, results):
                res.latency_s = now - t0
                if not fut.done():
                    fut.set_result(res)

    def _run_batch(self, requests: list[SampleRequest]) -> list[SampleResult]:
        """Decode a batch (worker thread). Holds `model_lock`; eval mode, then the old mode back."""
        import torch

        from agentrft.samplers.hf_decode import RowState, generate_batch, make_generator

        rows = [RowState(r.params, make_generator(r.params, self.device, self._rng)) for r in requests]
        with self.model_lock:
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.inference_mode():
                    generate_batch(self.model, requests, rows, self._spec, self.device)
            finally:
                self.model.train(was_training)
        self.stats["batches"] += 1
        self.stats["requests"] += len(requests)
        self.stats["prefills"] += len({tuple(r.prompt_ids) for r in requests})
        results = []
        for req, row in zip(requests, rows):
            assert row.finish_reason is not None
            self.stats["tokens"] += len(row.token_ids)
            # The EOS token stays in token_ids (the policy chose it and must learn to);
            # the text leaves it out, being the message content.
            text_ids = row.token_ids[:-1] if row.finish_reason == "stop" else row.token_ids
            results.append(SampleResult(token_ids=row.token_ids, logprobs=row.logprobs,
                                        text=self.decode(text_ids), finish_reason=row.finish_reason,
                                        prompt_tokens=len(req.prompt_ids),
                                        completion_tokens=len(row.token_ids)))
        return results

    def close(self) -> None:
        """Stop the batching task (if its loop still runs) and the worker thread."""
        if self._worker is not None and not self._worker.done() and self._loop is not None \
                and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._worker.cancel)
        self._executor.shutdown(wait=False, cancel_futures=True)

"""vLLM-backed `TokenSampler` (GPU machines; extra `agentrft[vllm]`).

Token ids go in (`{"prompt_token_ids": ...}`) and come out, with the sampled
token's log-prob (`logprobs=0` asks vLLM for the chosen token only). The
engine is started with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2):
log-probs after temperature, top-k and top-p, i.e. of the distribution sampled
from, the contract of every sampler (`samplers.distribution`). vLLM's own
default, `raw_logprobs`, would report the untempered model.

vLLM batches, shares prefixes (automatic prefix caching) and schedules
continuously on its own, so `group_key` needs no handling here. Weight sync
after a training step is the trainer's business (it reloads or pushes weights
and bumps `policy_version`); this class only samples.

Not exercised on CPU: importing it without vLLM installed raises a clear error.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from agentrft.samplers.base import FinishReason, SampleRequest, SampleResult
from agentrft.samplers.chat_template import RendersWithTokenizer

try:  # vLLM pulls CUDA wheels; it is an optional extra
    import vllm
except ImportError as exc:  # pragma: no cover - exercised by the guarded-import test
    vllm = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None


class VLLMUnavailableError(ImportError):
    """vLLM is not installed here."""


def require_vllm() -> Any:
    if vllm is None:
        raise VLLMUnavailableError(
            f"the vllm sampler needs vLLM: install agentrft[vllm] on a GPU machine ({_IMPORT_ERROR})"
        )
    return vllm


class VLLMSampler(RendersWithTokenizer):
    """`TokenSampler` over vLLM's async engine."""

    def __init__(self, model: str, *, policy_version: int = 0, **engine_kwargs: Any) -> None:
        v = require_vllm()
        from transformers import AutoTokenizer

        self.policy = f"vllm:{model}"
        self.policy_version = policy_version
        self.tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        engine_kwargs = {"logprobs_mode": "processed_logprobs", **engine_kwargs}
        args = v.AsyncEngineArgs(model=model, enable_prefix_caching=True, **engine_kwargs)
        self.engine = v.AsyncLLMEngine.from_engine_args(args)
        self._ids = itertools.count()
        eos = self.tokenizer.eos_token_id
        self._eos = {eos} if eos is not None else set()

    async def sample(self, request: SampleRequest) -> SampleResult:
        v = require_vllm()
        p = request.params
        kwargs: dict[str, Any] = dict(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens,
            stop=list(p.stop) or None,
            seed=p.seed,
            logprobs=0,
            include_stop_str_in_output=True,
        )
        if p.top_k is not None:
            kwargs["top_k"] = p.top_k
        t0 = time.perf_counter()
        final = None
        async for out in self.engine.generate(
            {"prompt_token_ids": list(request.prompt_ids)},
            v.SamplingParams(**kwargs),
            request_id=f"agentrft-{next(self._ids)}",
        ):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output")
        comp = final.outputs[0]
        ids = list(comp.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids, strict=False)]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
        reason: FinishReason
        if comp.finish_reason == "length":
            reason = "length"
        elif isinstance(comp.stop_reason, str):
            reason = "stop_string"
        else:
            reason = "stop"
        text_ids = ids[:-1] if reason == "stop" and ids and ids[-1] in self._eos else ids
        return SampleResult(
            token_ids=ids,
            logprobs=logprobs,
            text=self.decode(text_ids),
            finish_reason=reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            latency_s=time.perf_counter() - t0,
        )

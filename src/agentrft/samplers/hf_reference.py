"""The reference in-process sampler: one plain transformers `generate()` per request.

It exists to be obviously right, not fast: no batching, no shared KV, no cache
layers of ours, nothing of transformers' internals but its public `generate`
API. The continuous-batching engine (`HFSampler`) must agree with it — same
token ids for the same seed, same log-probs within float noise — and the tests
check exactly that. Select it with ``policy.sampler: reference`` in a training
config (or `load_trainable_policy(..., sampler="reference")`) to rule the engine
out when something looks wrong.

Semantics match `HFSampler`: the request's seed (or one derived as `seeding`
does) drives the sampling, via torch's default generator forked for the call;
log-probs are those of the distribution sampled from (`generate`'s processed
scores: temperature, top-k, top-p applied), raw ones for greedy; a stop string
ends the reply at the token that completes it; finish reasons are "stop" (an
end-of-sequence id, kept in `token_ids`, left out of `text`), "stop_string",
"length".
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from agentrft.samplers.base import FinishReason, SampleRequest, SampleResult, SamplingParams
from agentrft.samplers.inprocess import InProcessPolicy


class ReferenceHFSampler(InProcessPolicy):
    """`TrainablePolicy` sampling each request alone with `model.generate` (serialised, in a worker thread)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        policy: str,
        *,
        device: str = "cpu",
        dtype: Any = None,
        policy_version: int = 0,
    ) -> None:
        super().__init__(model, tokenizer, policy, device=device, dtype=dtype, policy_version=policy_version)
        self._lock = threading.Lock()  # one generate at a time; paused() takes it too

    async def sample(self, request: SampleRequest) -> SampleResult:
        self._validate(request)
        seed = self._seeds.seed_for(request)
        t0 = time.perf_counter()
        ids, logprobs, reason, version = await asyncio.to_thread(self._generate, request, seed)
        text_ids = ids[:-1] if reason == "stop" else ids
        return SampleResult(
            token_ids=ids,
            logprobs=logprobs,
            text=self.decode(text_ids),
            finish_reason=reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            latency_s=time.perf_counter() - t0,
            policy_version=version,
        )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The caller has the model alone (no generate runs meanwhile)."""
        with self._lock:
            yield

    def _generate(self, request: SampleRequest, seed: int) -> tuple[list[int], list[float], FinishReason, int]:
        import torch
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

        p: SamplingParams = request.params
        prompt = torch.tensor([request.prompt_ids], device=self.device)
        room = self._spec.max_positions - prompt.shape[1]
        config = GenerationConfig(
            max_new_tokens=min(p.max_tokens, room),
            do_sample=not p.greedy,
            temperature=p.temperature if not p.greedy else None,
            top_p=p.top_p if not p.greedy else None,
            top_k=(p.top_k or 0) if not p.greedy else None,
            eos_token_id=sorted(self._spec.eos_ids) or None,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
            output_scores=True,
            return_dict_in_generate=True,
        )
        decode, stops = self._spec.decode, [s for s in p.stop if s]

        class _StopString(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                done = any(s in decode(input_ids[0, prompt.shape[1] :].tolist()) for s in stops)
                return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            version = self.policy_version  # weights change only under this lock (`paused`)
            was_training = self.model.training
            self.model.eval()
            try:
                out = self.model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    generation_config=config,
                    stopping_criteria=StoppingCriteriaList([_StopString()] if stops else []),
                )
            finally:
                self.model.train(was_training)
        ids = out.sequences[0, prompt.shape[1] :].tolist()
        ids = ids[: len(out.scores)]  # generate pads finished rows; one score per produced token
        logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, ids, strict=True)]
        reason: FinishReason = "length"
        if ids and ids[-1] in self._spec.eos_ids:
            reason = "stop"
        elif stops and any(s in decode(ids) for s in stops):
            reason = "stop_string"
        return ids, logprobs, reason, version

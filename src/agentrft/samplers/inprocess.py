"""What every in-process Hugging Face policy shares: the model and tokenizer, chat rendering,
request validation, end-of-sequence ids, order-independent seeds and the policy version.

`HFSampler` (the continuous-batching engine) and `ReferenceHFSampler` (plain `generate`)
build on it; both are `TrainablePolicy`s.
"""

from __future__ import annotations

from typing import Any

from agentrft.samplers.base import SampleRequest
from agentrft.samplers.chat_template import RendersWithTokenizer, template_supports_tools
from agentrft.samplers.hf_decode import DecodeSpec
from agentrft.samplers.seeding import RequestSeeds


class InProcessPolicy(RendersWithTokenizer):
    """Base of in-process samplers over a Hugging Face causal LM and its tokenizer."""

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
        import torch

        self.device = torch.device(device)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.tokenizer = tokenizer
        self.policy = policy
        self.policy_version = policy_version
        eos = {i for i in (tokenizer.eos_token_id,) if i is not None}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else ({gen_eos} if gen_eos is not None else set())
        self._spec = DecodeSpec(
            eos_ids=frozenset(eos),
            max_positions=int(getattr(model.config, "max_position_embeddings", 1 << 30)),
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        )
        self._vocab = int(model.get_input_embeddings().weight.shape[0])
        self.template_supports_tools = template_supports_tools(tokenizer)
        self._seeds = RequestSeeds()

    @property
    def max_positions(self) -> int:
        """Positions the model attends over: prompt + sampled tokens must fit in them."""
        return self._spec.max_positions

    def reseed(self, seed: int) -> None:
        """Make unseeded sampling reproducible from here on (the trainer calls this per step)."""
        self._seeds.reseed(seed)

    def weights_updated(self, version: int) -> None:
        """The weights changed: sample as `version` from now on."""
        self.policy_version = version

    def _validate(self, request: SampleRequest) -> None:
        ids = request.prompt_ids
        if not ids:
            raise ValueError("SampleRequest.prompt_ids is empty")
        bad = [i for i in ids if not 0 <= int(i) < self._vocab]
        if bad:
            raise ValueError(f"SampleRequest.prompt_ids has ids outside the vocabulary [0, {self._vocab}): {bad[:5]}")
        if len(ids) >= self._spec.max_positions:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the model's {self._spec.max_positions} positions"
            )

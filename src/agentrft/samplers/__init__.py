"""The policy behind one interface (see `base`). Importing this package imports no torch;
`load_policy` loads it only for the in-process policies."""

from agentrft.samplers.base import (
    ChatResult,
    ChatSampler,
    FinishReason,
    SampleRequest,
    SampleResult,
    SamplingParams,
    TokenSampler,
)
from agentrft.samplers.policies import DEFAULT_POLICY, PolicyError, load_model_and_tokenizer, load_policy

__all__ = [
    "DEFAULT_POLICY",
    "ChatResult",
    "ChatSampler",
    "FinishReason",
    "PolicyError",
    "SampleRequest",
    "SampleResult",
    "SamplingParams",
    "TokenSampler",
    "load_model_and_tokenizer",
    "load_policy",
]

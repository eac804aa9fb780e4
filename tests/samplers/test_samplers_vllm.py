"""The vLLM sampler is an optional GPU extra: without vLLM it fails with a clear message."""

from __future__ import annotations

import importlib.util

import pytest

from agentrft.samplers.policies import load_policy


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_says_how_to_install() -> None:
    from agentrft.samplers.vllm_sampler import VLLMUnavailableError

    with pytest.raises(VLLMUnavailableError, match=r"install agentrft\[vllm\] on a GPU machine"):
        load_policy("vllm:some/model")

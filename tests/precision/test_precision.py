"""`agentrft.precision`: ``auto`` is bf16 only where the CPU multiplies bf16 natively, for the trainer and the
sampler alike."""

from __future__ import annotations

import pytest
import torch

from agentrft import precision as P
from agentrft.train.config import PolicyConfig
from agentrft.train.core.update import autocast_dtype


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch):
    """Set what torch's CPU probe reports: cpu(avx512_bf16=..., amx=...)."""

    def set_flags(avx512_bf16: bool = False, amx: bool = False) -> None:
        P.bf16_native.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)

    yield set_flags
    P.bf16_native.cache_clear()


@pytest.mark.skipif(not P.bf16_works(), reason="this CPU runs no bf16 matmul")
@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "auto"), [(False, False, "fp32"), (True, False, "bf16"), (False, True, "bf16")]
)
def test_auto_is_bf16_only_on_native_bf16(cpu, avx512_bf16: bool, amx: bool, auto: str) -> None:
    cpu(avx512_bf16=avx512_bf16, amx=amx)
    assert P.resolve("auto") == auto
    assert autocast_dtype("auto") == (torch.bfloat16 if auto == "bf16" else None)
    # an explicit choice is kept whatever the CPU
    assert P.resolve("bf16") == "bf16" and autocast_dtype("bf16") == torch.bfloat16
    assert P.resolve("fp32") == "fp32" and autocast_dtype("fp32") is None


def test_a_cpu_whose_bf16_op_fails_is_not_native(cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu(avx512_bf16=True)
    monkeypatch.setattr(P, "bf16_works", lambda: False)
    assert P.resolve("auto") == "fp32"


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid: auto, bf16, fp32"):
        P.resolve("fp16")


def test_sampler_precision_auto_resolves_like_the_trainer(cpu) -> None:
    from agentrft.samplers.hf import HFSampler
    from agentrft.samplers.policies import load_trainable_policy

    opts = PolicyConfig(name="tiny", sampler_precision="auto").sampler_options()
    assert opts["precision"] == "auto"
    for native, expected in ((False, "fp32"), (True, "bf16")):
        cpu(avx512_bf16=native)
        if expected == "bf16" and not P.bf16_works():
            continue
        s = load_trainable_policy("tiny", seed=1, **opts)
        try:
            assert isinstance(s, HFSampler) and s.precision == expected == P.resolve("auto")
        finally:
            s.close()
    # the reference sampler computes in fp32 only: auto is fp32 there, an explicit bf16 is refused
    from agentrft.samplers.hf_reference import ReferenceHFSampler

    cpu(avx512_bf16=True)
    assert isinstance(load_trainable_policy("tiny", sampler="reference", precision="auto"), ReferenceHFSampler)


def test_the_agentic_presets_pick_the_sampler_precision_by_cpu() -> None:
    from agentrft.train.config.presets import PRESETS

    for name in ("agentic-imitation", "agentic-imitation-late", "agentic-rl"):
        assert PRESETS[name]["policy"]["sampler_precision"] == "auto"
        assert PRESETS[name]["policy"].get("precision", "auto") == "auto"

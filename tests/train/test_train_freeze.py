"""`policy.freeze_layers`: the embeddings (and a tied head) and the first N decoder layers stay fixed, the backward
stops at layer N, and the trainable weights get exactly the gradients they get in a full fine-tune."""

from __future__ import annotations

import copy

import fakes_train as F
import pytest
import torch
from conftest import tiny_llama

from agentrft.train import train
from agentrft.train.config import ConfigError
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.train.core.session import freeze_bottom


def _nll(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def test_the_trainable_layers_get_the_full_fine_tunes_gradients_and_the_backward_stops_below_them() -> None:
    full = tiny_llama(seed=4)  # fp64, tied embeddings, 2 decoder layers
    frozen = copy.deepcopy(full)
    freeze_bottom(frozen, 1)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(0))

    outputs: dict[int, torch.Tensor] = {}
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out, k=k: outputs.__setitem__(k, out[0] if isinstance(out, tuple) else out)
        )
        for k, layer in enumerate(frozen.model.layers)
    ]
    _nll(full, ids).backward()
    _nll(frozen, ids).backward()
    for h in hooks:
        h.remove()
    assert not outputs[0].requires_grad and outputs[1].requires_grad  # nothing below layer 1 enters the backward

    grads = dict(full.named_parameters())
    trainable = {n: p for n, p in frozen.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trainable), sorted(trainable)
    assert frozen.lm_head.weight is frozen.model.embed_tokens.weight and not frozen.lm_head.weight.requires_grad
    for name, p in trainable.items():
        assert p.grad is not None and torch.allclose(p.grad, grads[name].grad, rtol=0, atol=1e-12), name
    assert all(p.grad is None for p in frozen.parameters() if not p.requires_grad)


def test_more_layers_than_the_model_has_is_refused() -> None:
    with pytest.raises(ValueError, match="freeze_layers: 3 is more than the model's 2 decoder layers"):
        freeze_bottom(tiny_llama(), 3)


def test_freeze_layers_with_lora_is_refused_at_load_time() -> None:
    with pytest.raises(ConfigError, match="freeze_layers applies to finetune: full"):
        F.config(**{"policy.finetune": "lora", "policy.freeze_layers": 1})


def _strip(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def test_an_sft_run_keeps_the_frozen_weights_and_resumes_exactly(tmp_path) -> None:
    data = F.write_sft_store(tmp_path / "recorded.db")
    cfg = F.sft_config(data, steps=4, **{"policy.freeze_layers": 1})

    whole = F.components(tmp_path / "whole")
    start = {n: p.detach().clone() for n, p in whole.sampler.model.named_parameters()}
    train(cfg, tmp_path / "whole", components=whole)
    end = dict(whole.sampler.model.named_parameters())
    for name, before in start.items():
        moved = not torch.equal(before, end[name].detach())
        assert moved == name.startswith(("model.layers.1.", "model.norm.", "lm_head.")), name
    # the untied fake's lm_head trains; its embeddings and layer 0 do not

    stopped = tmp_path / "stopped"
    train(cfg, stopped, components=F.components(stopped), stop_after=2)
    resumed = F.components(stopped)
    train(cfg, stopped, resume=True, components=resumed)
    assert _strip(read_metrics(stopped)) == _strip(read_metrics(tmp_path / "whole"))
    for name, p in resumed.sampler.model.named_parameters():
        assert torch.equal(p.detach(), end[name].detach()), name


def test_the_run_record_says_what_the_trainer_computed_in_at_each_start(tmp_path) -> None:
    from agentrft.precision import bf16_native
    from agentrft.store import Store

    data = F.write_sft_store(tmp_path / "recorded.db")
    cfg = F.sft_config(data, steps=3)  # policy.precision: fp32
    run_dir = tmp_path / "run"
    train(cfg, run_dir, components=F.components(run_dir), stop_after=2)
    train(cfg, run_dir, resume=True, components=F.components(run_dir))
    with Store(run_dir / "agentrft.db") as store:
        run = next(r for r in store.list_runs() if r.kind == "train")
    native = bf16_native()
    assert run.metadata["compute"] == [
        {"from_step": 0, "precision": "fp32", "bf16_native": native},
        {"from_step": 2, "precision": "fp32", "bf16_native": native},
    ]

import random

import numpy as np
import pytest
import torch

from agentrft.train.core.checkpoint import (
    TrainerState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def _objects(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_roundtrip_restores_everything(tmp_path):
    model, opt, sched = _objects()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=3, policy_version=3, cursor=12))
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    m2, o2, s2 = _objects(seed=1)
    state = load_checkpoint(latest_checkpoint(tmp_path), m2, o2, s2)
    assert (state.step, state.policy_version, state.cursor) == (3, 3, 12)
    assert torch.equal(m2.weight, model.weight)
    assert s2.get_last_lr() == sched.get_last_lr()
    torch.testing.assert_close(
        o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"], rtol=0, atol=0
    )
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws


def test_keep_last_and_half_written_dirs_are_ignored(tmp_path):
    model, opt, sched = _objects()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=step), keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    # what a kill -9 during a save leaves behind: a temp dir, never a step-* dir
    (tmp_path / ".tmp-step-00000004-abc").mkdir()
    (tmp_path / ".tmp-step-00000004-abc" / "trainable.pt").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step-00000003"
    save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=4), keep_last=2)
    assert not list(tmp_path.glob(".tmp-*"))


def test_mismatched_model_is_refused(tmp_path):
    model, opt, sched = _objects()
    save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=1))
    other = torch.nn.Linear(3, 2, bias=False)
    o = torch.optim.AdamW(other.parameters())
    with pytest.raises(ValueError, match="does not match the model"):
        load_checkpoint(latest_checkpoint(tmp_path), other, o, torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0))

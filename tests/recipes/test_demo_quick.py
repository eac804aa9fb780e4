"""`agentrft demo --quick` end to end on the real default model (a few minutes on 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_demo_quick_leaves_a_complete_run_dir(tmp_path: Path) -> None:
    from agentrft.recipes.demo import DemoSettings, run_demo

    run_dir = tmp_path / "demo"
    result = run_demo(run_dir, DemoSettings.preset(quick=True), progress=False)
    assert result.train_steps == 2
    summary = json.loads((run_dir / "demo.json").read_text())
    for side in ("before", "after"):
        assert summary[side]["n_trajectories"] == 12 and set(summary[side]["pass_at_k"]) == {"1", "2"}
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [int(s["step"]) for s in steps] == [1, 2]
    html = (run_dir / "report.html").read_text()
    assert "baseline" in html and "final" in html
    assert (run_dir / "policy").is_dir()


def test_a_demo_whose_options_name_what_is_not_there_fails_before_the_policy_loads(tmp_path, monkeypatch) -> None:
    import agentrft.samplers.policies as policies
    from agentrft.recipes.demo import DemoSettings, run_demo
    from agentrft.train.config import ConfigError

    def no_model(*a, **k):
        raise AssertionError("the policy loaded before the options were checked")

    monkeypatch.setattr(policies, "load_trainable_policy", no_model)
    with pytest.raises(ConfigError, match="rollout.branch"):
        run_demo(
            tmp_path / "d",
            DemoSettings.preset(quick=True),
            ["policy.name=tiny", "rollout.branch.run=nope", f"rollout.branch.db={tmp_path / 'missing.db'}"],
            progress=False,
        )

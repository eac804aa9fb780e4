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

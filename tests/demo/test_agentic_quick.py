"""`agentrft demo --agentic --quick` end to end on the tiny model: every stage leaves its record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.agentic import AgenticSettings, agentic_configs, run_agentic
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import ConfigError


def test_overrides_go_to_their_stage_and_bad_ones_fail_before_anything_loads(tmp_path: Path) -> None:
    sft, rl = agentic_configs(tmp_path, False, ["imitation.steps=3", "rl.steps=5", "seed=7"])
    assert (sft.steps, rl.steps, sft.seed, rl.seed) == (3, 5, 7, 7)
    assert sft.method == "sft" and rl.method == "grpo"
    assert sft.data.source == str(tmp_path / RUN_STORE_NAME) and sft.data.runs == ["demos"]
    assert rl.rollout.curriculum.enabled and rl.algorithm.turn_level
    assert (sft.rollout.env, rl.rollout.env) == ("finqa-lite:1,2,3,4", "finqa-lite:1,2,3")
    with pytest.raises(ConfigError, match=r"expected \[imitation\.\|rl\.\]KEY=VALUE"):
        agentic_configs(tmp_path, False, ["steps"])
    with pytest.raises(ConfigError, match="rollout.group_size"):
        agentic_configs(tmp_path, False, ["rl.rollout.group_size=0"])
    with pytest.raises(ConfigError):
        run_agentic(tmp_path / "never", AgenticSettings.preset(True), ["rl.optimizer.lr=-1"], progress=False)
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match=r"all weights \(full\), not lora"):
        agentic_configs(tmp_path, False, ["policy.finetune=lora"])
    used = tmp_path / "used"
    used.mkdir()
    (used / "agentrft.db").write_text("")
    with pytest.raises(ConfigError, match="holds no agentic recipe"):
        run_agentic(used, AgenticSettings.preset(True), ["policy.name=tiny"], progress=False, resume=True)
    with pytest.raises(ConfigError, match="is not empty"):
        run_agentic(used, AgenticSettings.preset(True), ["policy.name=tiny"], progress=False)


def test_quick_recipe_on_the_tiny_model_stopped_in_rl_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentrft.train.loop as loop

    run_dir = tmp_path / "agentic"
    settings = AgenticSettings.preset(True).model_copy(update={"ood": True, "ood_tasks": 1})
    real_train = loop.train

    def dies_in_rl(cfg, *args, **kwargs):
        if cfg.method == "grpo":
            raise KeyboardInterrupt  # the recipe stopped (killed, out of time) as RL began
        return real_train(cfg, *args, **kwargs)

    monkeypatch.setattr(loop, "train", dies_in_rl)
    with pytest.raises(KeyboardInterrupt):
        run_agentic(run_dir, settings, ["policy.name=tiny"], progress=False)
    monkeypatch.setattr(loop, "train", real_train)
    store = Store(run_dir / RUN_STORE_NAME)
    first = {r.name: r.id for r in store.list_runs() if r.kind == "eval"}
    store.close()
    assert {"baseline", "baseline-ood", "demos", "imitation"} <= set(first)
    store = Store(run_dir / RUN_STORE_NAME)
    sft_run = next(r.id for r in store.list_runs() if r.kind == "train")
    store.close()
    sft_metrics = (run_dir / "imitation" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="differ from those"):
        run_agentic(run_dir, settings, ["policy.name=tiny", "rl.steps=3"], progress=False, resume=True)

    result = run_agentic(run_dir, settings, ["policy.name=tiny"], progress=False, resume=True)
    assert result.steps == {"imitation": 2, "rl": 2}
    assert set(result.evals) == {"baseline", "baseline-ood", "imitation", "final", "final-ood"}
    # finished stages were kept, not played again
    assert (run_dir / "imitation" / "metrics.jsonl").read_text() == sft_metrics
    for name, r in result.evals.items():
        per_task = 2 if "ood" not in name else 1
        assert set(r.per_level) == {"2", "3", "4"}
        assert all(b.n_samples == per_task * 2 for b in r.per_level.values()), name
        if name in first:
            assert r.run_id == first[name]
    assert [row[0] for row in result.level_table()] == [
        *(f"level {lv} (held-out)" for lv in (2, 3, 4)),
        *(f"level {lv} (ood)" for lv in (2, 3, 4)),
    ]
    store = Store(run_dir / RUN_STORE_NAME)
    try:
        kinds = sorted((r.name, r.kind) for r in store.list_runs())
        assert ("imitation", "train") in kinds and ("imitation", "eval") in kinds
        assert store.has_run(sft_run)  # the SFT run (also named "imitation") was kept
        runs = {r.name: r for r in store.list_runs() if r.kind == "eval"}
        assert runs["demos"].id == first["demos"]
        demos = store.query_trajectories(run_id=runs["demos"].id)
        # the oracle's demonstrations: 4 per level of the training split, every one a success
        assert len(demos) == 16 and all(t.grade is not None and t.grade.success for t in demos)
    finally:
        store.close()
    summary = json.loads((run_dir / "agentic.json").read_text())
    assert set(summary["paired"]) == {"imitation vs baseline", "final vs baseline", "final-ood vs baseline-ood"}
    assert set(summary["paired"]["final vs baseline"]) == {"2", "3", "4"}
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("curriculum/level_1_weight" in s for s in steps)
    sft_steps = [json.loads(line) for line in sft_metrics.splitlines()]
    assert len(sft_steps) == 2
    assert (run_dir / "policy").is_dir() and (run_dir / "imitation" / "policy").is_dir()
    assert "imitation" in (run_dir / "report.html").read_text()

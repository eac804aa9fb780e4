"""`agentrft demo --agentic --quick` end to end on the tiny model: every stage leaves its record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.envs.finqa.shots import shots_of, with_shots
from agentrft.envs.registry import make_env
from agentrft.recipes.agentic import run_agentic
from agentrft.recipes.agentic_settings import AgenticSettings, agentic_configs
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.train.config import ConfigError


def test_overrides_go_to_their_stage_and_bad_ones_fail_before_anything_loads(tmp_path: Path) -> None:
    full = AgenticSettings()
    sft, late, rl = agentic_configs(tmp_path, full, ["imitation.steps=3", "late.steps=2", "rl.steps=5", "seed=7"])
    assert (sft.steps, late.steps, rl.steps, sft.seed, late.seed, rl.seed) == (3, 2, 5, 7, 7, 7)
    assert sft.method == late.method == "sft" and rl.method == "grpo"
    assert sft.data.source == late.data.source == str(tmp_path / RUN_STORE_NAME)
    assert (sft.data.runs, late.data.runs) == (["demos"], ["demos-late"])
    # by default one pass over every level's demonstrations (the expert's plan keeps levels 3 and 4 apart)
    first, later = AgenticSettings().demo_counts()
    assert set(first) == {1, 2, 3, 4} and later == {}
    assert agentic_configs(tmp_path, full, [])[0].steps == -(-sum(first.values()) // 8)  # batches of 8
    # with late levels, each pass is one pass over its demonstrations: level 4's, and the first 64 of each
    # earlier level replayed
    two = AgenticSettings(late_levels=[4])
    first, later = two.demo_counts()
    defaults = agentic_configs(tmp_path, two, [])
    assert defaults[0].steps == -(-sum(first.values()) // 8) and defaults[1].steps == -(-sum(later.values()) // 8)
    assert set(first) == {1, 2, 3} and later == {**{lv: min(n, 64) for lv, n in first.items()}, 4: 64}
    # replayed demonstrations lengthen the late pass to one pass over them too: 64 + 3 x 8 in batches of 8
    replayed = agentic_configs(tmp_path, AgenticSettings(late_levels=[4], late_replay=8), [])[1]
    no_replay = AgenticSettings(late_levels=[4], late_replay=0).demo_counts()[1]
    assert replayed.steps == -(-(no_replay[4] + 24) // 8) and replayed.data.runs == ["demos-late"]
    assert rl.rollout.curriculum.enabled and rl.algorithm.turn_level
    # RL sees every level from its first step (on levels 1-3 alone it unlearned level 4: docs/agentic.md)
    cur = rl.rollout.curriculum
    assert (cur.start_unlocked, cur.weighting, cur.stratified) == (4, "learnability", True)
    # each step holds every level's share, and the answer after the work is done is credited (level 3's side)
    assert rl.rollout.grader["graders"]["process"]["answer_when_done"] == 1.0
    # every stage on the trained prompt (zero-shot by default), unless a stage's own override says otherwise
    assert (sft.rollout.env, late.rollout.env, rl.rollout.env) == (
        "finqa-lite:1,2,3,4?shots=0",
        "finqa-lite:1,2,3,4?shots=0",
        "finqa-lite:1,2,3,4?shots=0",
    )
    per_level = agentic_configs(tmp_path, AgenticSettings(trained_shots="0,4:1"), [])  # level 4's worked example
    assert [c.rollout.env for c in per_level] == [
        "finqa-lite:1,2,3,4?shots=0,4:1",
        *[per_level[0].rollout.env] * 2,
    ]
    with pytest.raises(ConfigError, match="trained_shots: .*LEVEL:N pairs"):
        AgenticSettings().with_overrides(["recipe.trained_shots=0,5:1"])
    few_shot = agentic_configs(tmp_path, AgenticSettings(trained_shots=None), ["rl.rollout.env=finqa-lite:2"])
    assert (few_shot[0].rollout.env, few_shot[2].rollout.env) == ("finqa-lite:1,2,3,4", "finqa-lite:2")
    # every stage trains on one prompt, the one the later evals measure
    with pytest.raises(ConfigError, match="same prompt; rollout.env shots differ: imitation 0, late 0, rl 1"):
        agentic_configs(tmp_path, full, ["rl.rollout.env=finqa-lite:2?shots=1"])
    with pytest.raises(ConfigError, match="imitation the environment default, late 0, rl 0"):
        agentic_configs(tmp_path, full, ["imitation.rollout.env=finqa-lite:1,2,3,4"])
    with pytest.raises(ConfigError, match=r"expected \[imitation\.\|late\.\|rl\.\]KEY=VALUE"):
        agentic_configs(tmp_path, full, ["steps"])
    with pytest.raises(ConfigError, match="rollout.group_size"):
        agentic_configs(tmp_path, full, ["rl.rollout.group_size=0"])
    with pytest.raises(ConfigError):
        run_agentic(tmp_path / "never", AgenticSettings.preset(True), ["rl.optimizer.lr=-1"], progress=False)
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match=r"all weights \(full\), not lora"):
        agentic_configs(tmp_path, full, ["policy.finetune=lora"])
    with pytest.raises(ConfigError, match=r"\(late imitation\): optimizer.lr"):
        agentic_configs(tmp_path, full, ["late.optimizer.lr=-1"])
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
    guided = ["policy.name=tiny", "rl.rollout.expert_per_group=1"]  # the expert plays one of each RL group
    real_train = loop.train

    def dies_in_rl(cfg, *args, **kwargs):
        if cfg.method == "grpo":
            raise KeyboardInterrupt  # the recipe stopped (killed, out of time) as RL began
        return real_train(cfg, *args, **kwargs)

    monkeypatch.setattr(loop, "train", dies_in_rl)
    with pytest.raises(KeyboardInterrupt):
        run_agentic(run_dir, settings, guided, progress=False)
    monkeypatch.setattr(loop, "train", real_train)
    store = Store(run_dir / RUN_STORE_NAME)
    first = {r.name: r.id for r in store.list_runs() if r.kind == "eval"}
    store.close()
    assert {
        "baseline",
        "baseline-ood",
        "baseline-trained-prompt",
        "baseline-trained-prompt-ood",
        "demos",
        "demos-late",
        "imitation",
    } <= set(first)
    store = Store(run_dir / RUN_STORE_NAME)
    sft_run = next(r.id for r in store.list_runs() if r.kind == "train")
    store.close()
    sft_metrics = (run_dir / "imitation" / "metrics.jsonl").read_text()
    late_metrics = (run_dir / "imitation-late" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="differ from those"):
        run_agentic(run_dir, settings, [*guided, "rl.steps=3"], progress=False, resume=True)

    result = run_agentic(run_dir, settings, guided, progress=False, resume=True)
    assert result.steps == {"imitation": 2, "imitation_late": 1, "rl": 2}
    assert set(result.evals) == {
        "baseline",
        "baseline-ood",
        "baseline-trained-prompt",
        "baseline-trained-prompt-ood",
        "imitation",
        "final",
        "final-ood",
    }
    # finished stages were kept, not played again
    assert (run_dir / "imitation" / "metrics.jsonl").read_text() == sft_metrics
    assert (run_dir / "imitation-late" / "metrics.jsonl").read_text() == late_metrics
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
        late = store.query_trajectories(run_id=runs["demos-late"].id)
        # the oracle's demonstrations: 4 per level of the training split, every one a success; level 4's
        # in their own run, which only the second imitation pass learns from, with each earlier level's replayed
        assert len(demos) == 12 and len(late) == 16
        assert all(t.grade is not None and t.grade.success for t in demos + late)
        # played on the trained prompt, zero-shot: the system prompt, then the task's question
        assert all([m.role for m in t.messages[:2]] == ["system", "user"] for t in demos + late)
        assert all(r.config["env"] == "finqa-lite:1,2,3,4?shots=0" for r in (runs["demos"], runs["demos-late"]))
        assert runs["baseline"].config["env"] == "finqa-lite:2,3,4"
        assert runs["final"].config["env"] == runs["baseline-trained-prompt"].config["env"]
        level = {t.id: t.data["level"] for t in make_env("finqa-lite:1,2,3,4").tasks("train")}
        assert {level[t.task_id] for t in demos} == {1, 2, 3}
        late_levels = sorted(level[t.task_id] for t in late)
        assert late_levels == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
        assert {t.task_id for t in late if level[t.task_id] < 4} == {t.task_id for t in demos}  # the replayed
        rl_run = next(r for r in store.list_runs() if r.kind == "train" and r.config.get("method") == "grpo")
        rl_trajs = store.query_trajectories(run_id=rl_run.id)
        groups: dict[str, list[bool]] = {}
        for t in rl_trajs:
            groups.setdefault(t.group_id, []).append(bool(t.metadata.get("expert")))
        # 2 steps x 2 tasks, each group 3 of the policy's episodes and 1 of the expert's (written as the oracle)
        assert len(groups) == 4 and all(sorted(g) == [False, False, False, True] for g in groups.values())
        assert {t.policy for t in rl_trajs if t.metadata.get("expert")} == {"oracle:tiny"}
    finally:
        store.close()
    summary = json.loads((run_dir / "agentic.json").read_text())
    assert set(summary["paired"]) == {
        "imitation vs baseline",
        "final vs baseline",
        "imitation vs baseline-trained-prompt",
        "final vs baseline-trained-prompt",
        "final-ood vs baseline-ood",
        "final-ood vs baseline-trained-prompt-ood",
        "final vs imitation",
    }
    assert set(summary["paired"]["final vs baseline"]) == {"2", "3", "4"}
    assert set(summary["paired"]["final vs imitation"]) == {"2", "3", "4"}
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("curriculum/level_1_weight" in s for s in steps)
    sft_steps = [json.loads(line) for line in sft_metrics.splitlines()]
    assert len(sft_steps) == 2
    assert len(late_metrics.splitlines()) == 1
    assert all((run_dir / d / "policy").is_dir() for d in (".", "imitation", "imitation-late"))
    assert "imitation" in (run_dir / "report.html").read_text()


def test_an_environment_spec_gets_its_shots_option_set() -> None:
    assert with_shots("finqa-lite:1,2,3", 0) == "finqa-lite:1,2,3?shots=0"
    assert with_shots("finqa-lite:2?shots=3", 1) == "finqa-lite:2?shots=1"
    assert with_shots("finqa-lite?shots=0", None) == "finqa-lite" and with_shots("finqa-lite:4", None) == "finqa-lite:4"
    assert [shots_of(s) for s in ("finqa-lite:2?shots=1", "finqa-lite:2", "finqa-lite?shots=0")] == ["1", None, "0"]


def test_late_levels_split_the_demonstrations_and_are_checked() -> None:
    settings = AgenticSettings(demo_tasks={1: 3, 2: 5, 3: 7, 4: 2}, late_levels=[4], late_replay=0)
    assert settings.demo_counts() == ({1: 3, 2: 5, 3: 7}, {4: 2})
    assert AgenticSettings(demo_tasks=4, late_levels=[]).demo_counts() == (dict.fromkeys(range(1, 5), 4), {})
    assert AgenticSettings(late_levels=[4, 3, 4]).late_levels == [3, 4]
    # the late pass replays the first N demonstrations of each first-pass level beside the late ones
    replay = AgenticSettings(demo_tasks={1: 3, 2: 5, 3: 7, 4: 2}, late_levels=[4], late_replay=4)
    assert replay.demo_counts() == ({1: 3, 2: 5, 3: 7}, {1: 3, 2: 4, 3: 4, 4: 2})
    assert AgenticSettings(demo_tasks=4, late_levels=[], late_replay=2).demo_counts()[1] == {}
    with pytest.raises(ValueError, match="late_replay"):
        AgenticSettings(late_replay=-1)


def test_recipe_settings_are_set_by_name_and_bad_ones_are_named() -> None:
    base = AgenticSettings()
    got = base.with_overrides(["recipe.late_replay=8", 'recipe.demo_tasks={"1": 4, "4": 2}', "recipe.ood=false"])
    assert (got.late_replay, got.demo_tasks, got.ood) == (8, {1: 4, 4: 2}, False)
    assert base.late_replay == 64 and base.with_overrides([]) == base
    with pytest.raises(ValueError, match="recipe.nope=1.*KEY one of quick, levels"):
        base.with_overrides(["recipe.nope=1"])
    with pytest.raises(
        ValueError, match=r"recipe.late_replay=-2: recipe.late_replay: Input should be greater than or equal to 0$"
    ):
        base.with_overrides(["recipe.late_replay=-2"])
    with pytest.raises(ValueError, match="late_levels: levels 1-4"):
        AgenticSettings(late_levels=[5])
    with pytest.raises(ValueError, match="at least one level that is not late"):
        AgenticSettings(late_levels=[1, 2, 3, 4])


def test_a_bad_recipe_setting_on_the_command_line_fails_before_anything_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentrft.cli.main import app

    run_dir = tmp_path / "run"
    for bad, says in (("recipe.late_replay=x", "late_replay"), ("recipe.nope=1", "KEY one of")):
        result = CliRunner().invoke(app, ["demo", "--agentic", "--run-dir", str(run_dir), "--set", bad])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert not run_dir.exists()

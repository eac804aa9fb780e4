"""The HTML report: content checks in Python and a render in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from eval_fakes import make_task, make_traj

from agentrft.eval.harness import summarize
from agentrft.eval.report import build_report, pick_before_after, write_report
from agentrft.types import Run

EVIL = '</script><img id="pwned" src=x onerror="document.title=\'pwned\'">__DATA__'
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI sets AGENTRFT_REQUIRE_BROWSER=1: there a missing Chromium fails the test instead of skipping it
SKIP_BROWSER = CHROMIUM is None and not os.environ.get("AGENTRFT_REQUIRE_BROWSER")


def make_run_dir(root: Path, *, metrics_jsonl: bool = False) -> Path:
    from agentrft.store import Store

    run_dir = root / "run"
    run_dir.mkdir()
    tasks = [
        make_task("task-alpha", 2, level=1),
        make_task("task-beta", 2, level=2, template="ratio"),
        make_task("task-gamma", 2, level=3, template="sum"),
    ]
    store = Store(run_dir / "agentrft.db")
    plan = {
        "baseline": {"task-alpha": [1.0, 0.0], "task-beta": [0.0, 0.0], "task-gamma": [0.0, 0.0]},
        "final": {"task-alpha": [1.0, 1.0], "task-beta": [1.0, 0.0], "task-gamma": [0.0, 0.0]},
    }
    for i, (name, rewards) in enumerate(plan.items()):
        run_id = f"run-{name}"
        trajs = [
            make_traj(tid, r, run_id=run_id, answer="2" if r else EVIL, tool_error=(tid == "task-gamma"))
            for tid, rs in rewards.items()
            for r in rs
        ]
        for t in trajs:
            store.add_trajectory(t)
        res = summarize(trajs, tasks, run_id=run_id, run_name=name)
        store.add_run(
            Run(
                id=run_id,
                name=name,
                kind="eval",
                created_at=1000.0 + i,
                metadata={"result": res.model_dump(mode="json"), "task_data": {t.id: t.data for t in tasks}},
            )
        )
    store.add_run(Run(id="run-train", name="grpo", kind="train", created_at=1000.5))
    rows = [
        {
            "step": s,
            "train_reward_mean": 0.1 * s,
            "valid_reward_mean": 0.05 * s,
            "valid_pass@1": 0.1 * s,
            "train_success_rate": 0.02 * s,
            "train_grader_errors/other_error": 1.0,
            "train_sequences": 30.0,
            **({"excluded/grader_error": 2.0, "groups_dropped/too_small": 1.0} if s == 3 else {}),
        }
        for s in range(6)
    ]
    if metrics_jsonl:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        for r in rows:
            store.log_metrics("run-train", r["step"], {k: v for k, v in r.items() if k != "step"})
    store.close()
    return run_dir


def test_pick_before_after() -> None:
    a, b, c = Run(name="x"), Run(name="final"), Run(name="baseline")
    assert pick_before_after([a, b, c]) == (c, b)
    assert pick_before_after([a, b.model_copy(update={"name": "y"})])[0] is a
    assert pick_before_after([a]) == (a, None)
    assert pick_before_after([]) == (None, None)


def test_report_contains_data_and_escapes(tmp_path: Path) -> None:
    html = build_report(make_run_dir(tmp_path))
    assert "<svg" in html and "Reward over training steps" in html and 'data-series="train_reward_mean"' in html
    assert "task-alpha" in html and "baseline" in html and "final" in html
    assert "Paired comparison on 3 shared tasks" in html
    # errors never train, and the report says what left the batches and why
    assert "Excluded from training" in html and "180 trajectories trained" in html
    assert "<td>excluded/grader_error</td><td>2</td><td>1</td>" in html
    assert "<td>groups_dropped/too_small</td><td>1</td><td>1</td>" in html
    assert "<img" not in html and "</script><img" not in html  # model output stays inside the JSON, escaped
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


def test_report_reads_metrics_jsonl_and_names_missing_db(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, metrics_jsonl=True)
    html = build_report(run_dir)
    assert 'data-series="valid_pass@1"' in html and 'data-series="train_success_rate"' in html
    assert 'data-series="train_grader_errors/other_error"' not in html
    with pytest.raises(FileNotFoundError, match="agentrft.db"):
        build_report(tmp_path / "nowhere")
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"loss": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: a metrics line needs a numeric 'step'"):
        build_report(run_dir)


def test_report_draws_the_loss_and_pairwise_curves_of_dpo_and_the_reward_model(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    rows = [
        {"step": 1, "loss": 0.6931, "rewards/accuracy": 0.0, "rewards/margin": 0.0, "train_sequences": 16},
        {"step": 2, "loss": 0.52, "rewards/accuracy": 0.875, "rewards/margin": 0.5, "train_sequences": 16},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = build_report(run_dir)
    for series in ("loss", "rewards/accuracy", "rewards/margin"):
        assert f'data-series="{series}"' in html
    # a method that logs no rewards gets no empty reward charts
    assert "Reward over training steps" not in html and "32 trajectories trained" in html
    rows = [{"step": 1, "loss": 0.69, "rm/accuracy": 0.5, "rm/heldout_accuracy": 0.83, "rm/heldout_loss": 0.63}]
    (run_dir / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    html = build_report(run_dir)
    for series in ("loss", "rm/accuracy", "rm/heldout_accuracy", "rm/heldout_loss"):
        assert f'data-series="{series}"' in html


def test_report_shows_the_asynchronous_pipeline(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    rows = [
        {"step": 1, "train_reward_mean": 0.2, "async/staleness/0": 6, "async/staleness/1": 0, "is/weight_mean": 1.0,
         "async/trainer_utilisation": 0.3, "async/queue_groups": 1, "time/sync_s": 0.01, "train_sequences": 6},
        {"step": 2, "train_reward_mean": 0.4, "async/staleness/0": 2, "async/staleness/1": 4, "is/weight_mean": 1.1,
         "async/trainer_utilisation": 0.8, "async/queue_groups": 2, "time/sync_s": 0.02, "train_sequences": 6},
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = build_report(run_dir)
    for series in ("async/trainer_utilisation", "async/queue_groups", "time/sync_s", "is/weight_mean"):
        assert f'data-series="{series}"' in html
    assert "Staleness of the trained trajectories" in html
    assert "Curriculum" not in html  # no curriculum, no empty chart
    assert "<td>0</td><td>8</td>" in html and "<td>1</td><td>4</td>" in html


def test_report_draws_the_curriculum_mix(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    rows = [
        {"step": 1, "train_reward_mean": 0.2, "curriculum/level_1_weight": 1.0, "curriculum/level_1_pass_rate": 0.3},
        {"step": 2, "train_reward_mean": 0.5, "curriculum/level_1_weight": 0.2, "curriculum/level_2_weight": 0.8,
         "curriculum/level_1_pass_rate": 0.8, "curriculum/level_2_pass_rate": 0.1},
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = build_report(run_dir)
    for series in ("curriculum/level_1_weight", "curriculum/level_2_weight", "curriculum/level_2_pass_rate"):
        assert f'data-series="{series}"' in html


def _chromium(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="agentrft-chromium-")
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
        url,
    ]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(SKIP_BROWSER, reason="chromium is not installed (sudo apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None, "AGENTRFT_REQUIRE_BROWSER is set but no chromium is on PATH"
    path = write_report(make_run_dir(tmp_path))
    proc = _chromium(["--virtual-time-budget=5000", "--dump-dom"], path.as_uri())
    dom = proc.stdout
    assert "<svg" in dom, proc.stderr[-2000:]
    # the trajectory browser was built by the script: rows with task ids and rewards
    assert 'class="row' in dom and "task-alpha" in dom and "task-beta" in dom
    assert "1.000" in dom and "0.000" in dom
    assert "12 of 12 shown" in dom
    # injected markup never became an element (it is shown as text) and never ran
    assert '<img id="pwned"' not in dom and "<title>pwned" not in dom
    assert "<h3>Task task-" in dom  # the first trajectory's detail was rendered
    shot = tmp_path / "shot.png"
    _chromium(["--window-size=1300,2600", f"--screenshot={shot}"], path.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000
    keep = os.environ.get("AGENTRFT_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)

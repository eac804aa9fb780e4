"""method: reward_model end to end on a tiny model: it learns a separable preference, reports held-out
accuracy, saves a loadable model, resumes exactly, and refuses bad input before any model loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import fakes_rm as R
import pytest
import torch
from conftest import tiny_llama

from agentrft.inputs import InputError
from agentrft.pairs import build_pairs, write_pairs
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.train.data.reward_model import heldout_tasks, train_reward_model


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _run(run_dir: Path, db: Path, *, stop_after=None, resume=False, on_step=None, **over):
    return train_reward_model(
        R.rm_config(db, **over),
        run_dir,
        resume=resume,
        stop_after=stop_after,
        model_and_tokenizer=(tiny_llama(0, torch.float32), None),
        on_step=on_step,
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return R.separable_store(tmp_path_factory.mktemp("rm-data") / "graded.db")


def test_learns_a_separable_preference_and_reports_heldout_accuracy(db, tmp_path):
    res = _run(tmp_path, db, **{"optimizer.lr": 1e-2})
    first, last = res.history[0], res.history[-1]
    # zero-initialised head: every pair starts at log 2, every comparison a tie
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-7) and first["rm/accuracy"] == 0.5  # fp32 model
    assert last["rm/heldout_accuracy"] >= 0.95, last
    assert "rm/heldout_accuracy" not in res.history[-2]  # heldout_every_steps 0: only after the last step
    # 20 tasks x 4 pairs; 5 tasks held out; token records used as recorded
    assert last["data/pairs"] == 80 and last["rm/train_pairs"] == 60 and last["rm/heldout_pairs"] == 20
    assert last["data/pairs_token_records"] == 80 and last["data/pairs_rendered"] == 0
    assert read_metrics(tmp_path)[-1]["rm/heldout_accuracy"] == last["rm/heldout_accuracy"]
    manifest = json.loads((tmp_path / "reward_model" / "manifest.json").read_text())
    assert manifest["heldout"]["accuracy"] == last["rm/heldout_accuracy"]
    assert manifest["heldout"]["pairs"] == 20 and len(manifest["heldout"]["tasks"]) == 5
    assert manifest["finetune"] == "full" and manifest["steps"] == 30
    assert (tmp_path / "reward_model" / "body" / "config.json").exists()
    assert not (tmp_path / "policy").exists()  # the reward model is the export, not a policy
    # pairs.jsonl lists every pair (held out too); the split is the hash rule's, by task
    tasks = [p["task_id"] for p in map(json.loads, (tmp_path / "pairs.jsonl").read_text().splitlines())]
    assert len(tasks) == 80 and set(manifest["heldout"]["tasks"]) == heldout_tasks(tasks, 0.25)


def test_heldout_split_is_by_task_and_deterministic():
    keys = [f"task-{i}" for i in range(10)] * 3
    held = heldout_tasks(keys, 0.3)
    assert len(held) == 3 and held == heldout_tasks(list(reversed(keys)), 0.3)
    assert heldout_tasks(keys, 0.3) <= heldout_tasks(keys, 0.5)  # a larger fraction holds out a superset
    assert len(heldout_tasks(keys, 0.01)) == 1 and len(heldout_tasks(keys, 0.99)) == 9  # at least one, never all
    assert heldout_tasks(keys, 0.0) == set()
    with pytest.raises(InputError, match="reward_model.heldout_fraction"):
        heldout_tasks(["only"] * 4, 0.2)


def test_resumed_run_equals_uninterrupted(db, tmp_path):
    over = {"steps": 6, "reward_model.heldout_every_steps": 2, "checkpoint.every_steps": 1}
    _run(tmp_path / "a", db, **over)
    _run(tmp_path / "b", db, stop_after=3, **over)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [1, 2, 3]
    assert not (tmp_path / "b" / "reward_model").exists()  # exported only after the last step
    _run(tmp_path / "b", db, resume=True, **over)
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert _strip(a) == _strip(b)
    assert {"rm/heldout_accuracy", "rm/heldout_loss"} <= set(a[1]) and "rm/heldout_accuracy" not in a[2]
    from safetensors.torch import load_file

    head_a = load_file(str(tmp_path / "a" / "reward_model" / "head.safetensors"))
    head_b = load_file(str(tmp_path / "b" / "reward_model" / "head.safetensors"))
    assert all(torch.equal(head_a[k], head_b[k]) for k in head_a)
    ma = json.loads((tmp_path / "a" / "reward_model" / "manifest.json").read_text())
    mb = json.loads((tmp_path / "b" / "reward_model" / "manifest.json").read_text())
    assert ma["heldout"] == mb["heldout"]


# ---------------------------------------------------------------- bad input, before any model loads


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("agentrft.samplers.policies.load_model_and_tokenizer", refuse)


def _refused(run_dir: Path, cfg, match: str) -> None:
    with pytest.raises(InputError, match=match):
        train_reward_model(cfg, run_dir)
    assert not run_dir.exists()


def test_bad_input_is_one_clear_error_before_the_model_loads(db, tmp_path, no_model):
    run_dir = tmp_path / "run"
    _refused(run_dir, R.rm_config(db, **{"data.runs": "[nope]"}), r"data.runs: no run 'nope'")
    _refused(run_dir, R.rm_config(db, **{"data.tasks": "[nope]"}), r"no trajectory .* left after the 'tasks' filter")
    _refused(run_dir, R.rm_config(db, **{"data.success_only": "true"}), r"no pair of trajectories.*margin 0.5")
    _refused(run_dir, R.rm_config(db, **{"reward_model.margin": 2.0}), r"reward gap >= margin 2.0")
    _refused(run_dir, R.rm_config(None), r"reward_model.pairs / data.source: name exactly one")
    _refused(run_dir, R.rm_config(tmp_path / "missing.db"), r"data.source: .*missing.db: no such file")
    pairs_file = tmp_path / "pairs.jsonl"
    pairs, _ = build_pairs(R.separable_trajectories(n_tasks=2), margin=0.5)
    write_pairs(pairs, pairs_file)
    _refused(run_dir, R.rm_config(db, **{"reward_model.pairs": str(pairs_file)}), "name exactly one")
    with pairs_file.open("a") as f:
        f.write('{"prompt": [{"role": "user", "content": "q"}], "chosen": [], "rejected": []}\n')
    _refused(run_dir, R.rm_config(None, **{"reward_model.pairs": str(pairs_file)}), rf"{pairs_file}:9: field 'chosen'")
    one_task = tmp_path / "one.db"
    R.separable_store(one_task, n_tasks=1)
    _refused(run_dir, R.rm_config(one_task), r"reward_model.heldout_fraction: .* one task")


# ---------------------------------------------------------------- the reward model as GRPO's grader


def test_a_grpo_run_grades_with_a_reward_model(db, tmp_path):
    """A reward model trained through `train()` (method: reward_model) on the fake policy's own model, then a
    tiny GRPO run whose grader is `{"type": "reward_model", "path": ...}`: every episode gets sigmoid(score)."""
    import fakes_train as F

    from agentrft.graders import load_grader
    from agentrft.store import Store
    from agentrft.train import train

    res = train(R.rm_config(db, steps=3), tmp_path / "rm", components=F.components(tmp_path / "rm"))
    assert res.steps == 3 and res.history[-1]["rm/heldout_pairs"] == 20
    grader = load_grader({"type": "reward_model", "path": str(tmp_path / "rm" / "reward_model")})
    comps = F.components(tmp_path / "grpo")
    comps.grader = grader
    out = train(F.config(steps=2, **{"eval.every_steps": 0}), tmp_path / "grpo", components=comps)
    m = out.history[-1]
    assert m["train_grader_errors"] == 0 and 0.0 < m["train_reward_mean"] < 1.0
    with Store(tmp_path / "grpo" / "agentrft.db") as s:
        trajs = s.query_trajectories()
    assert len(trajs) == 12 and all(t.grade is not None and t.grade.grader == "reward_model" for t in trajs)
    scores = [t.grade.metadata["score"] for t in trajs if t.grade is not None]
    assert len(set(scores)) > 1  # episodes differ, so do their scores: a signal for the group advantages


def test_the_step_hook_reaches_the_reward_model_and_can_stop_it(db, tmp_path):
    seen = []

    def hook(step, metrics):
        seen.append(step)
        return step == 1

    res = _run(tmp_path / "rm", db, steps=3, on_step=hook)
    assert seen == [1] and res.steps == 1

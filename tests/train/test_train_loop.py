"""The loop end to end on a fake env + tiny model: it learns, it logs, and resume equals no interruption."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fakes_train as F
import pytest

from agentrft.train import ConfigError, train
from agentrft.train.core.checkpoint import list_checkpoints
from agentrft.train.core.metrics import is_timing_key, read_metrics

HERE = Path(__file__).parent


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _run(run_dir, resume=False, stop_after=None, allow_config_change=False, **over):
    return train(
        F.config(**over),
        run_dir,
        resume=resume,
        components=F.components(run_dir),
        stop_after=stop_after,
        allow_config_change=allow_config_change,
    )


def _store_state(run_dir):
    """What exports, evals and reports would count: the training run's trajectories (task, weights version,
    reward), its logged steps, its status, and the eval runs."""
    from agentrft.store import Store

    with Store(run_dir / "agentrft.db") as s:
        train_run = next(r for r in s.list_runs() if r.kind == "train")
        trajs = s.query_trajectories(run_id=train_run.id)
        return {
            "trajectories": sorted((t.task_id, t.policy_version, round(t.reward or 0.0, 9)) for t in trajs),
            "steps": [m["step"] for m in s.get_metrics(train_run.id)],
            "status": train_run.status,
            "evals": sorted(
                (r.name.rsplit("-eval-", 1)[-1], r.status, s.count_trajectories(run_id=r.id))
                for r in s.list_runs()
                if r.kind == "eval"
            ),
        }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    res = _run(d)
    return d, res


def test_loop_logs_every_stage(reference):
    d, res = reference
    rows = read_metrics(d)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and res.steps == 4
    r = rows[-1]
    for key in (
        "train_reward_mean",
        "train_reward/low",
        "train_success_rate",
        "adv_mean",
        "zero_signal_frac",
        "clip_frac",
        "entropy",
        "loss",
        "grad_norm",
        "lr",
        "train_sampled_tokens_per_episode",
        "train_tool_calls_per_episode",
        "time/sampling_s",
        "time/grading_s",
        "time/training_s",
        "time/eval_s",
        "valid_reward_mean",
        "policy_version",
        "train_tokens_per_s",
    ):
        assert key in r, key
    assert r["policy_version"] == 4.0
    assert (d / "config.yaml").exists()
    assert (d / "policy" / "config.json").exists()  # full fine-tune: a Hugging Face model directory
    assert [p.name for p in list_checkpoints(d / "checkpoints")] == ["step-00000003", "step-00000004"]
    from agentrft.store import Store

    with Store(d / "agentrft.db") as s:
        assert [m["step"] for m in s.get_metrics(res.run_id)] == [1, 2, 3, 4]
        assert s.count_trajectories(run_id=res.run_id) == 4 * 2 * 3


def test_ratio_is_one_on_policy(reference):
    d, _ = reference
    for r in read_metrics(d):
        assert r["ratio_mean"] == pytest.approx(1.0, abs=1e-12) and r["clip_frac"] == 0.0


def test_trainer_recomputes_the_sampler_logprobs_on_policy(reference):
    """fp32 on both sides, same distribution: the first pass's log-probs equal the sampler's to float noise."""
    d, _ = reference
    for r in read_metrics(d):
        assert r["sampler_logprob_gap_max"] < 1e-4 and r["sampler_logprob_gap_mean"] < 1e-5


class _FlakyGrader(F.FakeGrader):
    """Crashes on every third episode it sees (a judge that times out now and then)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def score(self, sample, item):
        self.calls += 1
        if self.calls % 3 == 0:
            raise ConnectionError("judge unreachable")
        return super().score(sample, item)


def test_grader_crashes_are_excluded_and_counted_never_trained(tmp_path):
    comps = F.components(tmp_path)
    comps.grader = _FlakyGrader()
    res = train(F.config(steps=2, **{"eval.every_steps": 0}), tmp_path, components=comps)
    rows = read_metrics(tmp_path)
    assert sum(r.get("excluded/grader_error", 0) for r in rows) == comps.grader.calls // 3 == 4
    assert all(r.get("excluded/grader_error/other_error", 0) == r.get("excluded/grader_error", 0) for r in rows)
    # what trained is exactly what was not excluded: 2 groups x 3 samples per step, minus exclusions
    for r in rows:
        dropped = r.get("excluded_trajectories", 0)
        assert r["train_sequences"] == 6 - dropped
    assert res.steps == 2


def test_a_policy_that_cannot_train_in_process_is_refused(tmp_path):
    comps = F.components(tmp_path)

    class EvalOnly:
        policy, policy_version = "openai:x", 0

    comps.sampler = EvalOnly()
    with pytest.raises(TypeError, match="cannot be trained in process"):
        train(F.config(steps=1), tmp_path, components=comps)
    assert not (tmp_path / "config.yaml").exists()


def test_stop_and_resume_equals_uninterrupted(reference, tmp_path):
    ref_dir, _ = reference
    _run(tmp_path, stop_after=2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.raises(FileExistsError):
        _run(tmp_path)
    from agentrft.store import Store

    with Store(tmp_path / "agentrft.db") as s:
        assert next(r for r in s.list_runs() if r.kind == "train").status == "incomplete"  # stopped midway
    with pytest.raises(ConfigError, match=r"--resume with a changed config \(optimizer.lr: 0.01 -> 0.02\)"):
        _run(tmp_path, resume=True, **{"optimizer.lr": 0.02})
    _run(tmp_path, resume=True)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))
    assert _store_state(tmp_path) == _store_state(ref_dir)
    with Store(tmp_path / "agentrft.db") as s:
        resumes = next(r for r in s.list_runs() if r.kind == "train").metadata["resumes"]
    assert [(n["from_step"], n["removed_trajectories"]) for n in resumes] == [(2, 0)]


class _Interrupt(F.FakeGrader):
    """Grades normally, then the process is interrupted (Ctrl-C) in the middle of its N-th grade."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def score(self, sample, item):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return super().score(sample, item)


@pytest.mark.parametrize("at", [14, 16])  # during step 2's periodic eval; during step 3's grading
def test_an_interrupted_step_leaves_nothing_counted_after_resume(reference, tmp_path, at):
    from agentrft.store import Store

    ref_dir, _ = reference
    comps = F.components(tmp_path)
    comps.grader = _Interrupt(at)
    with pytest.raises(KeyboardInterrupt):
        train(F.config(), tmp_path, components=comps)
    with Store(tmp_path / "agentrft.db") as s:
        runs = s.list_runs()
        assert [r.status for r in runs if r.kind == "train"] == ["incomplete"]
        if at == 14:  # the eval run killed midway is there, and marked incomplete
            assert [r.status for r in runs if r.kind == "eval"] == ["incomplete"]
        orphans = s.count_trajectories(run_id=next(r.id for r in runs if r.kind == "train"))
    assert orphans > 6 * (1 if at == 14 else 2)  # episodes of the step that never finished are in the store
    _run(tmp_path, resume=True)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))
    assert _store_state(tmp_path) == _store_state(ref_dir)


def test_a_changed_config_resumes_only_when_allowed(tmp_path):
    _run(tmp_path, stop_after=1, steps=2, **{"eval.every_steps": 0})
    res = _run(tmp_path, resume=True, allow_config_change=True, steps=3, **{"eval.every_steps": 0})
    assert res.steps == 3 and [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_kill_9_then_resume_equals_uninterrupted(reference, tmp_path):
    ref_dir, _ = reference
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "resume_worker_train.py"), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (tmp_path / "checkpoints" / "step-00000002").exists():
        assert proc.poll() is None, "worker ended before its second checkpoint"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed mid-run, not finished
    # the kill may have torn the last metrics line: resume repairs it rather than failing
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "loss": 0.1')
    _run(tmp_path, resume=True)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    # the interrupted step's trajectories and eval runs are gone: the store equals the uninterrupted one's
    assert _store_state(tmp_path) == _store_state(ref_dir)
    assert _store_state(ref_dir)["status"] == "complete" and len(_store_state(ref_dir)["trajectories"]) == 24


def test_lora_run_trains_only_the_adapter_and_resumes(tmp_path):
    over = {
        "policy.finetune": "lora",
        "policy.lora_r": 4,
        "policy.lora_target_modules": "[q_proj,v_proj]",
        "steps": 3,
        "eval.every_steps": 0,
        "policy.gradient_checkpointing": "true",
    }
    ref = _run(tmp_path / "a", **over)
    assert all(h["grad_norm"] > 0 for h in ref.history)  # gradients reach the adapter through recomputed layers
    import torch

    saved = torch.load(tmp_path / "a" / "checkpoints" / "step-00000003" / "trainable.pt")
    assert saved and all("lora_" in name for name in saved)
    assert (tmp_path / "a" / "policy" / "adapter_config.json").exists()  # peft adapter export
    _run(tmp_path / "b", stop_after=1, **over)
    _run(tmp_path / "b", resume=True, **over)
    assert _strip(read_metrics(tmp_path / "b")) == _strip(read_metrics(tmp_path / "a"))
    assert ref.steps == 3


def test_every_algorithm_option_runs_and_reports(tmp_path):
    res = _run(
        tmp_path,
        **{
            "algorithm.dynamic_sampling.enabled": "true",
            "algorithm.dynamic_sampling.max_rounds": 3,
            "algorithm.overlong.enabled": "true",
            "algorithm.overlong.max_len": 5,
            "algorithm.overlong.cache_len": 2,
            "algorithm.turn_level": "true",
            "algorithm.advantage": "rloo",
            "algorithm.aggregation": "seq_mean_token_mean",
            "algorithm.kl_coef": 0.05,
            "algorithm.updates_per_batch": 2,
            "algorithm.off_policy.correction": "tis",
            "steps": 2,
            "eval.every_steps": 0,
        },
    )
    m = res.history[-1]
    for key in (
        "kl",
        "is/weight_mean",
        "is/weight_max",
        "overlong_frac",
        "sampling_rounds",
        "turn_adv_mean",
        "groups_trained",
    ):
        assert key in m, key
    assert m["overlong_frac"] == 1.0  # every episode samples 6 > max_len 5 tokens
    assert m["kl"] > 0.0  # second update of the batch has moved away from the reference


def test_learns_on_the_fake_task(tmp_path):
    res = _run(tmp_path, steps=12, **{"eval.every_steps": 0, "checkpoint.every_steps": 0})
    first = sum(h["train_reward_mean"] for h in res.history[:3]) / 3
    last = sum(h["train_reward_mean"] for h in res.history[-3:]) / 3
    assert last > first + 0.1, (first, last)

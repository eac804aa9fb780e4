"""Jobs end to end on the tiny policy: `rft create` runs a hosted-format job to `succeeded` with the hosted metric
names in its events; a bad job exits 2 before any model loads; cancel stops at a step boundary and resume finishes
it; a worker killed with kill -9 shows as running with a dead pid and resume continues it from its checkpoint.

That a resumed run equals an uninterrupted one number for number is the training core's property, tested with a
deterministic sampler in tests/train (test_train_loop.py); the HF engine batches requests as they arrive, so its
samples are not bitwise repeatable across processes, and these tests check what the job adds: the steps after the
checkpoint redone once, the ones before kept as logged, events and status consistent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrft.cli.main import app
from agentrft.rft.events import EventLog
from agentrft.rft.jobs import Job, JobStore
from agentrft.rft.runner import create_job
from agentrft.rft.spec import load_job_spec
from agentrft.rft.validate import validate_job
from agentrft.tools import sandbox
from agentrft.train.core.metrics import read_metrics

torch.set_num_threads(1)  # tiny models on a shared 2-core box; the worker subprocess does the same
HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
cli = CliRunner()


def _job_file(root: Path, **hp: object) -> Path:
    """The fixture job (4 training rows, 3 validation rows, a multi grader, a tools module) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "valid.jsonl", "tools.py"):
        shutil.copy(FIXTURES / name, root / name)
    body = json.loads((FIXTURES / "job.json").read_text())
    body["method"]["reinforcement"]["hyperparameters"].update(hp)
    path = root / "job.json"
    path.write_text(json.dumps(body))
    return path


def _metrics_steps(job: Job) -> list[int]:
    return [int(e["data"]["step"]) for e in EventLog(job.run_dir).read() if e["type"] == "metrics"]


def _messages(job: Job) -> list[str]:
    return [e["message"] for e in EventLog(job.run_dir).read() if e["type"] == "message"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Job]:
    root = tmp_path_factory.mktemp("job")
    result = cli.invoke(
        app, ["rft", "create", "--job", str(_job_file(root)), "--jobs-dir", str(root / "jobs"), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return root / "jobs", JobStore(root / "jobs").get(data["id"])


def test_a_hosted_format_job_runs_to_succeeded(finished: tuple[Path, Job]) -> None:
    _, job = finished
    assert job.status == "succeeded" and job.error is None and job.finished_at is not None
    assert (job.model, job.seed, job.suffix, job.metadata) == ("tiny", 3, "fx-test", {"team": "treasury"})
    assert job.agentrft.step == job.agentrft.total_steps == 2  # 4 rows, batch_size 2, one epoch
    run_dir = job.run_dir
    assert job.fine_tuned_model == f"hf:{run_dir / 'policy'}"
    for name in ("job_spec.json", "mapping.json", "config.yaml", "metrics.jsonl", "report.html", "agentrft.db"):
        assert (run_dir / name).is_file(), name
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert any(r["grad_norm"] > 0 for r in rows)  # the graders' rewards differ within groups: weights moved
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir())] == ["step-00000001", "step-00000002"]
    mapping = {r["hyperparameter"]: r for r in json.loads((run_dir / "mapping.json").read_text())["hyperparameters"]}
    assert (mapping["compute_multiplier"]["config"], mapping["compute_multiplier"]["value"]) == (
        "rollout.group_size",
        2,
    )
    assert mapping["learning_rate_multiplier"]["value"] == pytest.approx(3e-4)


def test_the_exported_model_is_a_plain_hugging_face_directory(finished: tuple[Path, Job]) -> None:
    from agentrft.samplers.policies import load_model_and_tokenizer

    _, job = finished
    assert job.fine_tuned_model is not None
    model, tok = load_model_and_tokenizer(job.fine_tuned_model)  # what `agentrft serve --policy hf:DIR` loads
    assert model.config.num_hidden_layers == 2 and len(tok) > 1000


def test_events_carry_the_hosted_metric_names(finished: tuple[Path, Job]) -> None:
    _, job = finished
    events = EventLog(job.run_dir).read()
    assert all(e["object"] == "fine_tuning.job.event" and e["level"] in ("info", "warn") for e in events)
    messages = _messages(job)
    assert messages[0] == "Validated training file: 4 rows; validation file: 3 rows"
    assert any("reasoning_effort='low' is not applicable" in m for m in messages)
    assert messages[-1] == f"The job has successfully completed; model: {job.fine_tuned_model}"
    assert _metrics_steps(job) == [0, 1, 2]  # the baseline, then each step (eval_interval 1: each evaluated)
    steps = [e["data"] for e in events if e["type"] == "metrics"]
    for data in steps:
        assert 0.0 <= data["full_valid_mean_reward"] <= 1.0 and data["full_valid_mean_parse_error"] == 0.0
        graders = {g["name"]: g for g in data["scores"]["graders"]}
        assert {n: g["type"] for n, g in graders.items()} == {"close": "text_similarity", "exact": "string_check"}
        assert all("valid_reward_mean" in g for g in graders.values())
    for data in steps[1:]:
        assert data["total_steps"] == 2 and 0.0 <= data["train_mean_reward"] <= 1.0
        assert data["scores"]["train_reward_mean"] == data["train_mean_reward"]
        assert all("train_reward_mean" in g for g in data["scores"]["graders"])
        assert data["completion_tokens_mean"] > 0 and data["mean_unresponsive_rewards"] == 0.0
        assert set(data["timing"]["step"]) == {"sampling", "grading", "training", "eval", "full_iteration"}
    # the same figures as the trainer's metrics, under their hosted names
    last = read_metrics(job.run_dir)[-1]
    assert steps[-1]["train_mean_reward"] == last["train_reward_mean"]
    assert steps[-1]["full_valid_mean_reward"] == last["valid_reward_mean"]


def test_the_report_shows_train_vs_valid_per_grader_and_before_after(finished: tuple[Path, Job]) -> None:
    _, job = finished
    html = (job.run_dir / "report.html").read_text()
    assert 'data-series="train_reward_mean"' in html and 'data-series="valid_reward_mean"' in html
    assert "Reward per grader over training steps" in html
    assert 'data-series="train_reward/exact"' in html and 'data-series="valid_reward/close"' in html
    assert "Paired comparison on 3 shared tasks" in html  # baseline vs the last eval, on the validation rows
    assert '"run": "baseline"' in html and "-eval-v1" in html  # trajectories of every eval


def test_list_get_events_and_what_a_finished_job_refuses(finished: tuple[Path, Job], tmp_path: Path) -> None:
    jobs_dir, job = finished
    report = cli.invoke(app, ["rft", "report", job.id, "--jobs-dir", str(jobs_dir), "--out", str(tmp_path / "r.html")])
    assert report.exit_code == 0 and "Reward per grader" in (tmp_path / "r.html").read_text()
    listed = cli.invoke(app, ["rft", "list", "--jobs-dir", str(jobs_dir)])
    assert listed.exit_code == 0 and job.id in listed.stdout and "succeeded" in listed.stdout
    got = json.loads(cli.invoke(app, ["rft", "get", job.id[:12], "--jobs-dir", str(jobs_dir)]).stdout)
    assert got["object"] == "fine_tuning.job" and got["id"] == job.id and got["agentrft"]["worker_alive"] is None
    lines = cli.invoke(app, ["rft", "events", job.id, "--jobs-dir", str(jobs_dir), "--json"]).stdout.splitlines()
    assert [json.loads(x)["id"] for x in lines] == [e["id"] for e in EventLog(job.run_dir).read()]
    text = cli.invoke(app, ["rft", "events", job.id, "--jobs-dir", str(jobs_dir), "--limit", "1"]).stdout
    assert text.strip().endswith(f"The job has successfully completed; model: {job.fine_tuned_model}")
    for command in ("resume", "cancel"):
        refused = cli.invoke(app, ["rft", command, job.id, "--jobs-dir", str(jobs_dir)])
        assert refused.exit_code == 2 and "already succeeded" in refused.stderr
    unknown = cli.invoke(app, ["rft", "get", "ftjob-nope", "--jobs-dir", str(jobs_dir)])
    assert unknown.exit_code == 2 and unknown.stderr.startswith("error: no job 'ftjob-nope'")


def _refuse_models(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrft.samplers import policies

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded for a job that does not validate")

    monkeypatch.setattr(policies, "load_model_and_tokenizer", no_model)
    monkeypatch.setattr(policies, "load_trainable_policy", no_model)


@pytest.mark.skipif(sandbox.backend_problem("auto") is not None, reason="no sandbox backend for the python grader")
def test_a_bad_grader_and_bad_rows_exit_2_before_any_model_loads(tmp_path: Path, monkeypatch) -> None:
    _refuse_models(monkeypatch)
    path = _job_file(tmp_path)
    body = json.loads(path.read_text())
    body["method"]["reinforcement"]["grader"]["graders"]["py"] = {
        "type": "python",
        "source": "def score(sample, item):\n    return 1.0\n",
    }
    body["method"]["reinforcement"]["grader"]["calculate_output"] = "exact + close + py"
    path.write_text(json.dumps(body))
    with open(tmp_path / "valid.jsonl", "a") as fh:
        fh.write('{"messages": [{"role": "user", "content": "hi"}], "id": "v9"}\n')
    result = cli.invoke(app, ["rft", "create", "--job", str(path), "--jobs-dir", str(tmp_path / "jobs")])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {path}: field 'method.reinforcement.grader.graders.py.source': defines no grade(sample, item) "
        "function (no def, assignment or import binds it; every call would fail)",
        f"error: {tmp_path / 'valid.jsonl'}:4: field 'answer': is missing or null, but the grader reads "
        "{{ item.answer }} (method.reinforcement.grader.graders.exact.reference)",
        f"error: {tmp_path / 'valid.jsonl'}:4: field 'explanation': is missing or null, but the grader reads "
        "{{ item.explanation }} (method.reinforcement.grader.graders.close.reference)",
    ]
    assert not (tmp_path / "jobs").exists()  # nothing written


def test_dry_run_validates_and_maps_without_writing(tmp_path: Path, monkeypatch) -> None:
    _refuse_models(monkeypatch)
    path = _job_file(tmp_path, n_epochs=3)
    result = cli.invoke(
        app, ["rft", "create", "--job", str(path), "--jobs-dir", str(tmp_path / "jobs"), "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["training_rows"], out["validation_rows"], out["config"]["steps"]) == (4, 3, 6)
    assert out["tools_implemented"] == ["get_rate"]
    assert not (tmp_path / "jobs").exists()
    bad = cli.invoke(app, ["rft", "create", "--job", str(path), "--model", "tiny", "--dry-run"])
    assert bad.exit_code == 2 and "either as --job FILE or as flags" in bad.stderr


def _start_worker(jobs_dir: Path, job: Job, delay: float, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(HERE / "job_worker.py"), str(jobs_dir), job.id, str(delay), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"worker ended before {what}"
        assert time.time() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.05)


def _six_step_job(root: Path) -> tuple[JobStore, Job]:
    """6 steps (3 epochs of 4 rows, 2 per step), an eval and a checkpoint every 2 steps."""
    spec = load_job_spec(_job_file(root, n_epochs=3, eval_interval=2))
    jobs = JobStore(root / "jobs")
    return jobs, create_job(jobs, spec, validate_job(spec, "job.json"))


def test_cancel_stops_at_a_step_boundary_and_resume_finishes(tmp_path: Path) -> None:
    jobs, job = _six_step_job(tmp_path)
    proc = _start_worker(jobs.root, job, 0.4)
    _wait_for(lambda: jobs.get(job.id).agentrft.step >= 2, proc, "step 2")
    result = cli.invoke(app, ["rft", "cancel", job.id, "--jobs-dir", str(jobs.root)])
    assert result.exit_code == 0, result.output
    assert proc.wait(timeout=120) == 0
    cancelled = jobs.get(job.id)
    k = cancelled.agentrft.step
    assert cancelled.status == "cancelled" and 2 <= k < 6 and cancelled.fine_tuned_model is None
    assert json.loads(result.stdout)["status"] == "cancelled"
    assert (job.run_dir / "checkpoints" / f"step-{k:08d}").is_dir()  # saved at the cancel, not only every 2 steps
    assert "Cancellation requested; the job stops after its current step" in _messages(cancelled)
    assert f"Job cancelled at step {k}; resume continues from the checkpoint saved there" in _messages(cancelled)
    before = read_metrics(job.run_dir)
    assert [r["step"] for r in before] == list(range(1, k + 1))

    resumed = cli.invoke(app, ["rft", "resume", job.id, "--jobs-dir", str(jobs.root), "--json"])
    assert resumed.exit_code == 0, resumed.output
    done = jobs.get(job.id)
    assert done.status == "succeeded" and json.loads(resumed.stdout.strip().splitlines()[-1])["status"] == "succeeded"
    assert f"Job resumed from step {k} (metrics events of 0 later steps redone)" in _messages(done)
    assert _metrics_steps(done) == [0, 1, 2, 3, 4, 5, 6]
    after = read_metrics(job.run_dir)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6] and after[:k] == before  # steps to k kept as logged
    assert (job.run_dir / "policy" / "config.json").is_file()


def test_a_job_killed_with_kill_9_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    jobs, job = _six_step_job(tmp_path)
    proc = _start_worker(jobs.root, job, 0.3)
    _wait_for(lambda: (job.run_dir / "checkpoints" / "step-00000002").is_dir(), proc, "the step-2 checkpoint")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    before = read_metrics(job.run_dir)[:2]
    killed = jobs.get(job.id)
    assert killed.status == "running" and killed.agentrft.pid == proc.pid and not killed.worker_alive()
    listed = cli.invoke(app, ["rft", "list", "--jobs-dir", str(jobs.root)]).stdout
    assert "running (worker gone)" in listed
    got = json.loads(cli.invoke(app, ["rft", "get", job.id, "--jobs-dir", str(jobs.root)]).stdout)
    assert got["status"] == "running" and got["agentrft"]["worker_alive"] is False

    resumed = cli.invoke(app, ["rft", "resume", job.id, "--jobs-dir", str(jobs.root), "--json"])
    assert resumed.exit_code == 0, resumed.output
    done = jobs.get(job.id)
    assert done.status == "succeeded" and done.agentrft.pid == os.getpid()
    assert any(m.startswith("Job resumed from step 2 ") for m in _messages(done))
    assert _metrics_steps(done) == [0, 1, 2, 3, 4, 5, 6]  # the steps after the checkpoint once, not twice
    after = read_metrics(job.run_dir)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6] and after[:2] == before
    assert (job.run_dir / "policy" / "config.json").is_file()


def test_a_job_with_tool_endpoints_wires_them_into_its_environment(tmp_path: Path) -> None:
    """No model needed: the saved config's environment calls the endpoint (here a closed port: a tool error)."""
    import asyncio

    from agentrft.envs.registry import make_env
    from agentrft.train.config import load_config

    path = _job_file(tmp_path)
    body = json.loads(path.read_text())
    body["agentrft"] = {"tool_endpoints": {"get_rate": {"url": "http://127.0.0.1:9/rate", "timeout_s": 2}}}
    path.write_text(json.dumps(body))
    spec = load_job_spec(path)
    report = validate_job(spec, "job.json")
    assert report.ok and report.tools_implemented == ["get_rate"]
    job = create_job(JobStore(tmp_path / "jobs"), spec, report)
    assert json.loads((job.run_dir / "tool_endpoints.json").read_text())["get_rate"]["timeout_s"] == 2
    env = make_env(load_config(job.run_dir / "config.yaml").rollout.env)
    assert env.implemented_tools() == ["get_rate"]  # type: ignore[attr-defined]
    episode = env.start(env.tasks("valid")[0])
    result = asyncio.run(episode.call_tool("get_rate", {"base": "CHF", "quote": "EUR"}))
    assert result.error_kind == "unreachable"
    assert job.status == "validating" and job.agentrft.total_steps == 2


def test_detach_runs_the_job_in_a_background_worker(tmp_path: Path) -> None:
    path = _job_file(tmp_path)
    jobs_dir = tmp_path / "jobs"
    started = cli.invoke(app, ["rft", "create", "--job", str(path), "--jobs-dir", str(jobs_dir), "--detach", "--json"])
    assert started.exit_code == 0, started.output
    data = json.loads(started.stdout)
    assert data["status"] == "validating"  # returned at once; the worker takes it from here
    jobs = JobStore(jobs_dir)
    deadline = time.time() + 300
    while jobs.get(data["id"]).status not in ("succeeded", "failed", "cancelled"):
        assert time.time() < deadline, "the detached job did not finish"
        time.sleep(0.2)
    job = jobs.get(data["id"])
    assert job.status == "succeeded" and job.agentrft.pid == data["worker_pid"]
    followed = cli.invoke(app, ["rft", "events", job.id, "--jobs-dir", str(jobs_dir), "--follow"])
    assert followed.exit_code == 0 and "The job has successfully completed" in followed.stdout
    # the worker prints its summary after it records the job's status: wait for that line, not for the status
    log = (job.run_dir / "worker.log").read_text()
    while "status       succeeded" not in log:
        assert time.time() < deadline, f"the worker wrote no summary: {log[-500:]}"
        time.sleep(0.2)
        log = (job.run_dir / "worker.log").read_text()
    assert "step 2/2  reward " in log  # its step lines

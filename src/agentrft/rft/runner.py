"""Running a job: create it from a validated spec, run it (in this process or a detached worker),
cancel it, resume it.

A job's run directory (``JOBS_DIR/<id>/``):

    job_spec.json        the job body as validated, paths made absolute
    mapping.json         each hyperparameter: given, resolved, the config key and value (`mapping.py`)
    tool_endpoints.json  the HTTP tools, when the spec has any
    config.yaml          the GRPO config the job trains with (`agentrft train config.yaml` reruns it)
    events.jsonl         the job's events (`events.py`)
    metrics.jsonl        every step's metrics under agentrft's names; agentrft.db the run store
                         (training episodes, the ``baseline`` eval and each periodic eval, step metrics)
    checkpoints/         a checkpoint every ``eval_interval`` steps, at the last step and at a cancel
    policy/              the trained model, a plain Hugging Face directory: ``agentrft serve --policy hf:DIR``
    report.html          reward curves train vs valid, per grader, trajectories per eval, before/after
    worker.log           the detached worker's output

A run: the policy loads (status ``validating`` until then) -> ``running``: the baseline eval on the
validation file (the "before"), then GRPO with a full-validation eval every ``eval_interval`` steps
(the last one is the "after"), each step's metrics as an event; between two steps a cancel request
stops it with a checkpoint (``cancelled``); at the end the model is exported, the report written
(``succeeded``). An exception marks it ``failed`` with the error; ``resume`` continues a cancelled,
failed or killed job from its latest checkpoint, exactly (`train.session`), redoing the steps after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentrft.rft.events import EventLog, metrics_event_data
from agentrft.rft.jobs import TERMINAL, Job, JobError, JobErrorInfo, JobStore, cancel_requested, process_start
from agentrft.rft.mapping import BASE_LR, job_env_spec, map_hyperparameters
from agentrft.rft.spec import JobSpec
from agentrft.rft.validate import Report

if TYPE_CHECKING:
    from agentrft.graders import Grader
    from agentrft.train.config import TrainConfig
    from agentrft.train.loop import Components

SPEC_NAME = "job_spec.json"
MAPPING_NAME = "mapping.json"
ENDPOINTS_NAME = "tool_endpoints.json"
WORKER_LOG = "worker.log"
BASELINE_RUN = "baseline"


def create_job(jobs: JobStore, spec: JobSpec, report: Report) -> Job:
    """A new job (status ``validating``) and the files it runs on; nothing loads. ``report``: `validate_job`'s."""
    from agentrft.train.core.resume import CONFIG_NAME

    if not report.ok:
        raise JobError(f"the job has {len(report.problems) + report.more} problems; fix them first")
    job = jobs.create(spec, total_steps=0)
    run_dir = job.run_dir
    endpoints_file = None
    if spec.agentrft.tool_endpoints:
        endpoints_file = run_dir / ENDPOINTS_NAME
        endpoints = {k: v.model_dump(mode="json") for k, v in spec.agentrft.tool_endpoints.items()}
        endpoints_file.write_text(json.dumps(endpoints, indent=2))
    cfg, table = map_hyperparameters(spec, report.train_rows, report.valid_rows, job_env_spec(spec, endpoints_file))
    (run_dir / SPEC_NAME).write_text(spec.model_dump_json(indent=2))
    (run_dir / MAPPING_NAME).write_text(json.dumps({"base_lr": BASE_LR, "hyperparameters": table}, indent=2))
    cfg.save(run_dir / CONFIG_NAME)
    events = EventLog(run_dir)
    events.emit(f"Validated training file: {report.train_rows} rows; validation file: {report.valid_rows} rows")
    for note in report.notes:
        events.emit(note, level="warn")
    events.emit(f"Created fine-tuning job: {job.id} ({cfg.steps} steps)")
    return jobs.set(job.id, agentrft={"total_steps": cfg.steps})


def _grader_types(grader: Grader) -> dict[str, str]:
    """Each name the step metrics use for a grader (a multi grader's keys), with its spec type."""
    from agentrft.graders.multi import MultiGrader

    if isinstance(grader, MultiGrader):
        return {key: sub.type for key, sub in grader.parts.items()}
    return {grader.name: grader.type}


def _checkpoint_step(run_dir: Path) -> int:
    from agentrft.train.core.checkpoint import latest_checkpoint

    last = latest_checkpoint(run_dir / "checkpoints")
    return int(last.name.split("-", 1)[1]) if last is not None else 0


def check_resumable(job: Job) -> None:
    """Refuse to resume a job that finished or whose worker still runs."""
    if job.status == "succeeded":
        raise JobError(f"job {job.id} already succeeded; its model is {job.fine_tuned_model}")
    if job.status in ("running", "validating") and job.worker_alive():
        raise JobError(f"job {job.id} is {job.status} in process {job.agentrft.pid}; cancel it first")


def run_job(jobs: JobStore, ref: str, *, resume: bool = False, progress: bool = False) -> Job:
    """Run (or, ``resume``, continue) a job in this process until it succeeds, fails or is cancelled.

    Returns the job as it ended; a failure is recorded on the job and raised again."""
    from agentrft.train.config import load_config
    from agentrft.train.core.resume import CONFIG_NAME
    from agentrft.train.loop import build_components

    job = jobs.get(ref)
    if resume:
        check_resumable(job)
    elif job.status != "validating" or job.agentrft.pid is not None:
        raise JobError(f"job {job.id} has already started (status {job.status}); use resume")
    run_dir, events = job.run_dir, EventLog(job.run_dir)
    me = os.getpid()
    job = jobs.set(
        job.id,
        status="validating",
        error=None,
        finished_at=None,
        agentrft={"pid": me, "pid_start": process_start(me), "cancel_requested_at": None},
    )
    comps = None
    try:
        cfg = load_config(run_dir / CONFIG_NAME)
        comps = build_components(cfg, run_dir)
        types = _grader_types(comps.grader)
        from_step = _checkpoint_step(run_dir) if resume else 0
        if resume:
            dropped = events.rewind(from_step)
            events.emit(f"Job resumed from step {from_step} (metrics events of {dropped} later steps redone)")
        else:
            events.emit("Fine-tuning job started")
        job = jobs.set(job.id, status="running", agentrft={"step": from_step})
        _baseline(cfg, comps, events, types)
        if cancel_requested(jobs.get(job.id)):
            return _cancelled(jobs, job.id, events, from_step)

        def on_step(step: int, metrics: dict[str, float]) -> bool:
            message, data = metrics_event_data(step, cfg.steps, metrics, types)
            events.emit(message, kind="metrics", data=data)
            return cancel_requested(jobs.set(job.id, agentrft={"step": step}))

        from agentrft.train.loop import train

        result = train(cfg, run_dir, resume=resume, components=comps, on_step=on_step, progress=progress)
        if result.steps < cfg.steps:
            return _cancelled(jobs, job.id, events, result.steps)
        return _succeeded(jobs, job.id, events)
    except KeyboardInterrupt:
        step = jobs.get(job.id).agentrft.step
        events.emit(f"Interrupted at step {step}; resume continues from the last checkpoint", level="warn")
        jobs.set(job.id, status="cancelled", finished_at=int(time.time()))
        raise
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}".strip()
        events.emit(f"Job failed: {message}", level="error")
        jobs.set(
            job.id,
            status="failed",
            finished_at=int(time.time()),
            error=JobErrorInfo(code="job_failed", message=message[:2000]),
        )
        raise
    finally:
        if comps is not None and comps.store is not None:
            comps.store.close()


def _baseline(cfg: TrainConfig, comps: Components, events: EventLog, types: dict[str, str]) -> None:
    """The validation file before any training (eval run ``baseline``), once per job: a resumed job keeps it."""
    import asyncio

    from agentrft.eval.harness import evaluate_async
    from agentrft.samplers.base import SamplingParams
    from agentrft.train.core.metrics import eval_metrics

    store = comps.store
    if store is None:
        raise ValueError("a job's components need a store")
    for run in store.list_runs():
        if run.name == BASELINE_RUN:
            if run.status == "complete":
                return
            store.delete_run(run.id)  # killed midway: measured again, never counted half
    t0 = time.perf_counter()
    result = asyncio.run(
        evaluate_async(
            comps.env,
            comps.sampler,
            split=cfg.eval.split,
            samples=cfg.eval.samples_per_task,
            tasks=cfg.eval.num_tasks,
            store=store,
            run_name=BASELINE_RUN,
            params=SamplingParams(temperature=cfg.eval.temperature, max_tokens=cfg.rollout.max_tokens),
            env_spec=cfg.rollout.env,
            grader=comps.grader,
            tool_format=cfg.rollout.tool_format,
            seed=cfg.seed,
            progress=False,
        )
    )
    metrics = eval_metrics(result, "valid")
    metrics["time/eval_s"] = time.perf_counter() - t0
    message, data = metrics_event_data(0, cfg.steps, metrics, types)
    events.emit(message, kind="metrics", data=data)


def _cancelled(jobs: JobStore, job_id: str, events: EventLog, step: int) -> Job:
    events.emit(f"Job cancelled at step {step}; resume continues from the checkpoint saved there")
    return jobs.set(job_id, status="cancelled", finished_at=int(time.time()))


def _succeeded(jobs: JobStore, job_id: str, events: EventLog) -> Job:
    from agentrft.eval.report import write_report

    job = jobs.get(job_id)
    report = write_report(job.run_dir)
    model = f"hf:{job.run_dir / 'policy'}"
    events.emit(f"The job has successfully completed; model: {model}")
    return jobs.set(
        job_id,
        status="succeeded",
        finished_at=int(time.time()),
        fine_tuned_model=model,
        result_files=[str(job.run_dir / "metrics.jsonl"), str(report)],
        agentrft={"report": str(report)},
    )


def spawn_worker(jobs: JobStore, job: Job, *, resume: bool = False) -> int:
    """Run the job in a detached process (its own session, output in ``worker.log``); returns its pid."""
    cmd = [sys.executable, "-m", "agentrft.cli.main", "rft", "worker", job.id, "--jobs-dir", str(jobs.root)]
    if resume:
        cmd.append("--resume")
    with open(job.run_dir / WORKER_LOG, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc.pid


def cancel_job(jobs: JobStore, ref: str, *, wait_s: float = 0.0) -> Job:
    """Ask a running job to stop after its current step (and wait up to ``wait_s`` for it); a job whose
    worker is gone is marked cancelled at once."""
    job = jobs.get(ref)
    if job.status in TERMINAL:
        raise JobError(f"job {job.id} is already {job.status}")
    events = EventLog(job.run_dir)
    if not job.worker_alive():
        events.emit("Job cancelled (no worker was running it)")
        return jobs.set(job.id, status="cancelled", finished_at=int(time.time()))
    job = jobs.set(job.id, agentrft={"cancel_requested_at": time.time()})
    events.emit("Cancellation requested; the job stops after its current step")
    deadline = time.monotonic() + wait_s
    while job.status not in TERMINAL and job.worker_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        job = jobs.get(job.id)
    return job

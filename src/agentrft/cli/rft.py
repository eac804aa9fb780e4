"""`agentrft rft create|list|get|events|cancel|resume|report`: hosted-style RFT jobs run locally.

`create` reads the job body (``--job job.json|yaml``, or flags), validates the files, the grader
and the tools before anything loads (every problem is one ``error: FILE:LINE: field '...': ...``
line on stderr, exit 2, nothing written; ``--dry-run`` stops there), creates the job under
``--jobs-dir`` (default ``runs/rft``) and runs it in the foreground, or in a detached worker with
``--detach``. The other commands take a job id (or a unique prefix of it). See docs/rft.md.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from agentrft.cli.support import EXIT_BAD_INPUT

if TYPE_CHECKING:
    from agentrft.rft.jobs import Job, JobStore
    from agentrft.rft.validate import Report

rft_app = typer.Typer(
    help="Reinforcement fine-tuning jobs in the hosted services' format, run locally.", no_args_is_help=True
)
DEFAULT_JOBS_DIR = Path("runs/rft")
_SHOWN_PROBLEMS = 20
_JOBS_HELP = "Where the jobs live (jobs.db and one run directory per job)."


def _jobs(jobs_dir: Path) -> JobStore:
    from agentrft.rft.jobs import JobStore

    return JobStore(jobs_dir)


def _refuse(report: Report) -> typer.Exit:
    """Every problem on its own ``error:`` line (the first ones), then exit 2."""
    for problem in report.problems[:_SHOWN_PROBLEMS]:
        typer.echo(f"error: {problem}", err=True)
    more = len(report.problems) - _SHOWN_PROBLEMS + report.more
    if more > 0:
        typer.echo(f"error: ... and {more} more problems", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _when(ts: int | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _summary(job: Job) -> None:
    typer.echo(f"job          {job.id}")
    typer.echo(f"status       {job.status}")
    typer.echo(f"steps        {job.agentrft.step}/{job.agentrft.total_steps}")
    typer.echo(f"run dir      {job.run_dir}")
    if job.fine_tuned_model:
        typer.echo(f"model        {job.fine_tuned_model}")
    if job.agentrft.report:
        typer.echo(f"report       {job.agentrft.report}")
    if job.error is not None:
        typer.echo(f"error        {job.error.message}")


def _finish(job: Job, jobs: JobStore, *, detach: bool, resume: bool, as_json: bool) -> None:
    from agentrft.rft.runner import run_job, spawn_worker

    if detach:
        pid = spawn_worker(jobs, job, resume=resume)
        job = jobs.get(job.id)
        if as_json:
            typer.echo(json.dumps({**job.public(), "worker_pid": pid}))
        else:
            typer.echo(f"{job.id} started in process {pid}; follow it with: agentrft rft events {job.id} --follow")
        return
    job = run_job(jobs, job.id, resume=resume, progress=not as_json)
    if as_json:
        typer.echo(json.dumps(job.public()))
    else:
        _summary(job)


@rft_app.command("create")
def create_cmd(
    job_file: Path | None = typer.Option(None, "--job", help="The job body: JSON or YAML (model, training_file, ...)."),
    model: str | None = typer.Option(None, "--model", help="tiny | smollm2-135m | hf:PATH (without --job)."),
    training_file: str | None = typer.Option(None, "--training-file", help="Training JSONL (without --job)."),
    validation_file: str | None = typer.Option(None, "--validation-file", help="Validation JSONL (without --job)."),
    grader: str | None = typer.Option(None, "--grader", help="Grader spec file, JSON or YAML (without --job)."),
    hyperparameters: list[str] = typer.Option(
        [], "--hyperparameters", "-H", help="KEY=VALUE, e.g. -H n_epochs=2 -H batch_size=auto (repeatable)."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Seed (default 0)."),
    suffix: str | None = typer.Option(None, "--suffix", help="Up to 64 letters, digits, '-' or '_'."),
    tools_module: str | None = typer.Option(None, "--tools-module", help="Python tools (a .py file or module)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show the mapping; create nothing."),
    detach: bool = typer.Option(False, "--detach", help="Run in a background worker and return at once."),
    as_json: bool = typer.Option(False, "--json", help="Print the job (or the dry run) as JSON."),
) -> None:
    """Validate a reinforcement fine-tuning job and run it (checks everything before any model loads)."""
    from agentrft.rft.mapping import job_env_spec, map_hyperparameters
    from agentrft.rft.runner import create_job
    from agentrft.rft.spec import JobSpecError, job_spec_from_flags, load_job_spec
    from agentrft.rft.validate import validate_job

    flags = [model, training_file, validation_file, grader, seed, suffix, tools_module]
    if job_file is not None:
        if any(v is not None for v in flags) or hyperparameters:
            raise JobSpecError("give the job either as --job FILE or as flags, not both")
        spec, source = load_job_spec(job_file), str(job_file)
    else:
        spec = job_spec_from_flags(
            model=model,
            training_file=training_file,
            validation_file=validation_file,
            grader=grader,
            hyperparameters=hyperparameters,
            seed=seed,
            suffix=suffix,
            tools_module=tools_module,
        )
        source = "flags"
    report = validate_job(spec, source)
    if not report.ok:
        raise _refuse(report)
    if dry_run:
        cfg, table = map_hyperparameters(spec, report.train_rows, report.valid_rows, job_env_spec(spec, None))
        if as_json:
            out = {
                "valid": True,
                "training_rows": report.train_rows,
                "validation_rows": report.valid_rows,
                "tools_declared": report.tools_declared,
                "tools_implemented": report.tools_implemented,
                "notes": report.notes,
                "mapping": table,
                "config": cfg.model_dump(mode="json"),
            }
            typer.echo(json.dumps(out))
            return
        typer.echo(f"valid: {report.train_rows} training rows, {report.valid_rows} validation rows, {cfg.steps} steps")
        for note in report.notes:
            typer.echo(f"note: {note}")
        for row in table:
            value = "-" if row["value"] is None else row["value"]
            typer.echo(f"  {row['hyperparameter']:<25} {row['resolved']!s:<14} -> {row['config']} = {value}")
        return
    jobs = _jobs(jobs_dir)
    job = create_job(jobs, spec, report)
    if not as_json:
        typer.echo(f"created {job.id} in {job.run_dir}")
    _finish(job, jobs, detach=detach, resume=False, as_json=as_json)


@rft_app.command("list")
def list_cmd(
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    as_json: bool = typer.Option(False, "--json", help="The list object as JSON."),
) -> None:
    """The jobs, newest first (a running job whose worker is gone says so: resume it)."""
    all_jobs = _jobs(jobs_dir).all()
    if as_json:
        typer.echo(json.dumps({"object": "list", "data": [j.public() for j in all_jobs], "has_more": False}))
        return
    if not all_jobs:
        typer.echo(f"no jobs in {jobs_dir}")
        return
    typer.echo(f"{'id':<34} {'status':<24} {'steps':>9}  {'created':<20} model")
    for j in all_jobs:
        status: str = j.status
        if status in ("running", "validating") and j.agentrft.pid is not None and not j.worker_alive():
            status += " (worker gone)"
        steps = f"{j.agentrft.step}/{j.agentrft.total_steps}"
        typer.echo(f"{j.id:<34} {status:<24} {steps:>9}  {_when(j.created_at):<20} {j.fine_tuned_model or j.model}")


@rft_app.command("get")
def get_cmd(
    job_id: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
) -> None:
    """The job object as JSON (hosted fields, and ``agentrft``: run dir, worker pid and liveness, step)."""
    from agentrft.rft.jobs import dumps

    typer.echo(dumps(_jobs(jobs_dir).get(job_id)))


@rft_app.command("events")
def events_cmd(
    job_id: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the last N events."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events until the job ends."),
    as_json: bool = typer.Option(False, "--json", help="One event object per line (fine_tuning.job.event)."),
) -> None:
    """The job's events, oldest first: messages and each step's metrics under the hosted names."""
    from agentrft.rft.events import EventLog
    from agentrft.rft.jobs import TERMINAL

    jobs = _jobs(jobs_dir)
    job = jobs.get(job_id)
    log = EventLog(job.run_dir)
    events = log.read()
    shown = events[-limit:] if limit else events

    def show(event: dict[str, object]) -> None:
        if as_json:
            typer.echo(json.dumps(event))
        else:
            created = event.get("created_at")
            typer.echo(
                f"{_when(created if isinstance(created, int) else None)}  {event['level']:<5}  {event['message']}"
            )

    for e in shown:
        show(e)
    seen = len(events)
    while follow:
        job = jobs.get(job.id)
        done = job.status in TERMINAL or (job.agentrft.pid is not None and not job.worker_alive())
        events = log.read()
        for e in events[seen:]:
            show(e)
        seen = len(events)
        if done:
            break
        time.sleep(0.5)


@rft_app.command("cancel")
def cancel_cmd(
    job_id: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    wait: float = typer.Option(600.0, "--wait", min=0.0, help="Seconds to wait for the job to stop (0: return)."),
) -> None:
    """Stop a job after its current step (with a checkpoint: `resume` continues it); prints the job."""
    from agentrft.rft.jobs import dumps
    from agentrft.rft.runner import cancel_job

    typer.echo(dumps(cancel_job(_jobs(jobs_dir), job_id, wait_s=wait)))


@rft_app.command("resume")
def resume_cmd(
    job_id: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    detach: bool = typer.Option(False, "--detach", help="Run in a background worker and return at once."),
    as_json: bool = typer.Option(False, "--json", help="Print the job as JSON when it ends."),
) -> None:
    """Continue a cancelled, failed or killed job from its latest checkpoint (exact resume)."""
    from agentrft.rft.runner import check_resumable

    jobs = _jobs(jobs_dir)
    job = jobs.get(job_id)
    check_resumable(job)
    _finish(job, jobs, detach=detach, resume=True, as_json=as_json)


@rft_app.command("report")
def report_cmd(
    job_id: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir", help=_JOBS_HELP),
    out: Path | None = typer.Option(None, "--out", help="Output file (default RUN_DIR/report.html)."),
) -> None:
    """Write the job's HTML report: reward curves train vs valid and per grader, trajectories per eval,
    before/after on the validation file."""
    from agentrft.eval.report import write_report

    typer.echo(f"wrote {write_report(_jobs(jobs_dir).get(job_id).run_dir, out)}")


@rft_app.command("worker", hidden=True)
def worker_cmd(
    job_id: str = typer.Argument(...),
    jobs_dir: Path = typer.Option(DEFAULT_JOBS_DIR, "--jobs-dir"),
    resume: bool = typer.Option(False, "--resume"),
) -> None:
    """The body of a detached job (``create --detach``, ``resume --detach``); one line per step in worker.log."""
    from agentrft.rft.runner import run_job

    _summary(run_job(_jobs(jobs_dir), job_id, resume=resume, progress=True))


def register(app: typer.Typer) -> None:
    app.add_typer(rft_app, name="rft")

"""Reinforcement fine-tuning jobs in the hosted services' shape, run locally (``agentrft rft ...``).

A team that built a dataset (``{"messages": [...], "tools": [...], ...item fields}`` per line) and
a grader JSON for a hosted RFT job runs the same body here, on an open model:

* `spec` — the job body (model, files, method.reinforcement.grader/hyperparameters, seed, suffix,
  metadata, and the local ``agentrft`` settings), checked by pydantic;
* `validate` — every file, row, template variable and tool checked before anything loads;
* `mapping` — the hyperparameters as a GRPO `TrainConfig` (the documented table);
* `jobs` — jobs as local objects: a row in ``JOBS_DIR/jobs.db`` and a run directory;
* `events` — the events stream, step metrics under the hosted service's names;
* `runner` — create, run, cancel and resume a job (the only module that loads torch, lazily).

`spec`, `validate`, `mapping`, `jobs` and `events` import no torch. See docs/rft.md.
"""

"""Subprocess body of the cancel and kill -9 tests: run a job with every step slowed, so it can be stopped midway."""

import sys
import time
from pathlib import Path

import torch

from agentrft.rft import runner
from agentrft.rft.jobs import JobStore

torch.set_num_threads(1)  # as in the test process: the same numerics, no contention
jobs_dir, job_id, delay = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
event_data = runner.metrics_event_data


def slowed(*args, **kwargs):  # called once per step (and for the baseline), before the step's checkpoint
    time.sleep(delay)
    return event_data(*args, **kwargs)


runner.metrics_event_data = slowed
runner.run_job(JobStore(jobs_dir), job_id, resume="--resume" in sys.argv)

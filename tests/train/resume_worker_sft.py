"""Subprocess body of the SFT kill -9 test: the reference SFT run, slowed per step so it can be killed midway."""

import sys
import time
from pathlib import Path

import fakes_train as F
import torch

from agentrft.train import train
from agentrft.train.data import sft

torch.set_num_threads(1)  # as in the test process (conftest): same numerics, no contention
real_stage = sft.train_stage


def slow_stage(*args, **kwargs):
    time.sleep(0.2)  # wall time only: the numbers are the reference run's
    return real_stage(*args, **kwargs)


sft.train_stage = slow_stage
run_dir, data = Path(sys.argv[1]), Path(sys.argv[2])
train(F.sft_config(data, steps=12), run_dir, components=F.components(run_dir))

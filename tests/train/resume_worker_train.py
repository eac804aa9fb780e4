"""Subprocess body of the kill -9 test: the same run as the reference, killed from outside."""

import sys
from pathlib import Path

import fakes_train as F
import torch

from agentrft.train import train

torch.set_num_threads(1)  # as in the test process (conftest): same numerics, no contention
run_dir = Path(sys.argv[1])
train(F.config(), run_dir, components=F.components(run_dir))

"""Subprocess body of the asynchronous kill -9 test: an async run (config overrides as JSON in argv[2])."""

import json
import sys
from pathlib import Path

import fakes_train as F
import torch

from agentrft.train import train

torch.set_num_threads(1)
run_dir = Path(sys.argv[1])
train(F.config(**json.loads(sys.argv[2])), run_dir, components=F.components(run_dir))

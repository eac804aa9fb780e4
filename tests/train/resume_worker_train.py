"""Subprocess body of the kill -9 test: the same run as the reference, killed from outside."""

import sys
from pathlib import Path

import fakes_train as F

from agentrft.train import train

run_dir = Path(sys.argv[1])
train(F.config(), run_dir, components=F.components(run_dir))

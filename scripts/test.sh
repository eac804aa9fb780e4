#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite (real-model, browser and sandbox tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

# Debian packages some tests need: installed when we can (root, or passwordless sudo), else named.
apt_install() {  # PACKAGE COMMAND WHAT-SKIPS-WITHOUT-IT
  command -v "$2" >/dev/null && return 0
  local sudo=""
  [ "$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && sudo="sudo"; } || true
  if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; then
    ($sudo apt-get update -qq && $sudo apt-get install -y -qq "$1" >/dev/null) || echo "test.sh: could not install $1" >&2
  fi
  command -v "$2" >/dev/null || echo "test.sh: $1 is missing, so $3; install it (sudo apt-get install $1)" >&2
}
# extras only tests need: Ray for the rollout-worker test (agentrft[ray])
.venv/bin/python -m pip install -q -e ".[ray]"
apt_install chromium chromium "the report's browser test will be skipped"
apt_install bubblewrap bwrap "the sandbox tests cover only the unshare backend"
exec .venv/bin/python -m pytest "$@"

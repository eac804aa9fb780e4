#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite (real-model and browser tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The report's browser test needs Chromium (Debian package `chromium`); install it when we can.
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "test.sh: could not install chromium" >&2
  elif command -v apt-get >/dev/null && sudo -n true 2>/dev/null; then
    (sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null) || echo "test.sh: could not install chromium" >&2
  fi
fi
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "test.sh: Chromium is missing, so the report's browser test will be skipped; install it (sudo apt-get install chromium) to run it" >&2
fi
# The code sandbox prefers bubblewrap (Debian package `bubblewrap`); util-linux `unshare` is its fallback, tested either way.
if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "test.sh: could not install bubblewrap" >&2
  elif command -v apt-get >/dev/null && sudo -n true 2>/dev/null; then
    (sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap >/dev/null) || echo "test.sh: could not install bubblewrap" >&2
  fi
fi
if ! command -v bwrap >/dev/null; then
  echo "test.sh: bubblewrap is missing, so the sandbox tests cover only the unshare backend; install it (sudo apt-get install bubblewrap) to test both" >&2
fi
exec .venv/bin/python -m pytest "$@"

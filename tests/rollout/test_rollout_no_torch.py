"""Rollout imports no torch (ARCHITECTURE.md): checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def test_rollout_modules_import_without_torch() -> None:
    code = (
        "import sys, agentrft.rollout, agentrft.rollout.serve, agentrft.cli.serve; "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers')));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

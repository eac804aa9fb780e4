"""Loading a grader imports no environment: the grader registry stays light (issue 50: finqa_process imported the
finqa-lite corpus at module level, so loading any grader loaded it)."""

from __future__ import annotations

import subprocess
import sys


def test_loading_a_grader_imports_no_environment() -> None:
    code = (
        "import sys\n"
        "from agentrft.graders import load_grader\n"
        "load_grader({'type': 'numeric', 'input': '{{ sample.output_text }}', 'reference': '1'})\n"
        "print(sorted(m for m in sys.modules if m.startswith('agentrft.envs')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

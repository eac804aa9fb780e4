"""`agentrft ... | head`: a reader that leaves early gets no `error: BrokenPipeError` line on stderr."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _blocked_writing(pid: int) -> bool:
    """Whether the process sleeps in a write to a full pipe (Linux's /proc wait channel)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip().endswith("pipe_write")  # pipe_write, anon_pipe_write
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux pipes and /proc")
def test_a_reader_that_leaves_mid_output_ends_the_command_quietly() -> None:
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)  # one page: `eval --help` (~5.6 KB at 100 columns) overfills it
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrft.cli.main", "eval", "--help"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "100"},
    )
    os.close(write_end)
    deadline = time.monotonic() + 60
    while not _blocked_writing(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the command blocks on a full pipe, mid-output
    assert proc.poll() is None, "the help text fitted the pipe; the test needs a longer output"
    os.close(read_end)  # the reader leaves, as `head` does
    _, err = proc.communicate(timeout=60)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "BrokenPipe" not in text and "error:" not in text and "Traceback" not in text, text

"""A sandbox lives no longer than the process that called it (issue 47, graders item 1).

The caller here is a child python process running one long grade; the test kills it the way an operator or an
OOM killer would (kill -9, SIGTERM: no cleanup runs), then waits — for events, with a generous deadline — until
no process of the sandbox is left, and checks that the call's directory and cgroups do not outlive the next call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from agentrft.tools import sandbox

SRC = Path(sandbox.__file__).resolve().parents[2]  # the package under test, for the child processes


CALLER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from agentrft.tools.sandbox import run_sandboxed
GRADER = '''
import os, time
def grade(s, i):
    if os.fork() == 0:  # a daemon: double fork, new session
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", [i["tag"], "600"])
        os._exit(0)
    if os.fork() == 0:
        os.execv("/bin/sleep", [i["tag"], "600"])
    time.sleep(600)
'''
run_sandboxed(GRADER, {"s": {}, "i": {"tag": sys.argv[3]}}, sandbox=sys.argv[2], timeout_s=900)
"""

NEXT_CALL = r"""
import sys
sys.path.insert(0, sys.argv[1])
from agentrft.tools.sandbox import run_sandboxed
r = run_sandboxed("def grade(s, i):\n    return 0.5\n", {"s": {}, "i": {}}, sandbox=sys.argv[2], timeout_s=60)
assert r.ok, r.error
"""


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    state = fields[0].decode()
    return None if state in ("Z", "X") else (int(fields[1]), state, int(fields[19]))


def _tree(root: int) -> dict[int, int]:
    """The live descendants of `root` (host pids, through every namespace), with their start times."""
    parents: dict[int, tuple[int, int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            parents[int(d)] = (st[0], st[2])
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == pid and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == start


def _tagged(tag: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if d.isdigit() and f.read().split(b"\0", 1)[0] == tag.encode() and _stat(int(d)):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def _call_dirs(pid: int) -> list[Path]:
    """The call directories `pid` holds open (locked) right now."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target).startswith("agentrft-sbx-") and os.path.dirname(target) == tempfile.gettempdir():
            found.append(Path(target))
    return found


def _wait_for(done: Callable[[], bool], what: str, deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, f"still waiting, after {deadline_s:g}s, for {what}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_sandbox_dies_with_its_caller_and_leaves_nothing(backend: str, sig: int) -> None:
    tag = "sbx" + uuid.uuid4().hex[:10]
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(SRC), backend, tag])
    tree: dict[int, int] = {}
    try:
        _wait_for(lambda: len(_tagged(tag)) == 2 or caller.poll() is not None, "the grade's two sleepers")
        assert caller.poll() is None, "the caller ended before its grade got going"
        tree = _tree(caller.pid)  # launcher, the sandbox's PID 1, the grader, its sleepers (the daemon included)
        dirs = _call_dirs(caller.pid)
        assert len(dirs) == 1 and set(_tagged(tag)) <= set(tree), (dirs, tree)
        cgroups = json.loads((dirs[0] / "cgroups.json").read_text())
        caller.send_signal(sig)
        caller.wait()
        _wait_for(lambda: not any(_alive(p, t) for p, t in tree.items()), "every process of the sandbox to end")
        # what the killed caller could not remove, the next process to make a call does
        subprocess.run([sys.executable, "-c", NEXT_CALL, str(SRC), backend], check=True, timeout=120)
        assert not dirs[0].exists()
        assert not [c for c in cgroups if os.path.exists(c)]
    finally:
        caller.kill()
        caller.wait()
        for pid, start in tree.items():
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)


def test_a_live_call_is_never_swept(tmp_path: Path) -> None:
    """The sweep takes only what a dead process left: a call running now (locked) and one being set up stay."""
    from agentrft.tools.sandbox_backends import CallDir, sweep_stale_calls

    live = CallDir()
    try:
        being_made = Path(tempfile.mkdtemp(prefix="agentrft-sbx-"))  # not yet locked nor marked: someone's new call
        stale = Path(tempfile.mkdtemp(prefix="agentrft-sbx-"))
        (stale / "cgroups.json").write_text("[]")  # marked, unlocked: its process died mid-call
        removed = sweep_stale_calls(tempfile.gettempdir())
        assert str(stale) in removed and not stale.exists()
        assert live.path.exists() and being_made.exists()
        being_made.rmdir()
    finally:
        live.close(None)
    assert not live.path.exists()

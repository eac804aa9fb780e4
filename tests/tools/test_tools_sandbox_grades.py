"""One grade is one unit (issue 47, graders items 2-5): its memory and processes are capped as a whole, no grade
changes another's result, its result channel cannot be forged by what it starts, and no result or limit it is
given can hang or crash the host."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentrft.graders import GraderSpecError, load_grader
from agentrft.tools import sandbox
from agentrft.tools.sandbox import SandboxResult, run_sandboxed

MiB = 1024**2


def _run(source: str, item: dict[str, Any], backend: str, **kw: Any) -> SandboxResult:
    return run_sandboxed(source, {"s": {}, "i": item}, sandbox=backend, **{"timeout_s": 60, **kw})


def _grade_cap_or_skip(backend: str) -> None:
    r = _run("def grade(s, i):\n    return 0\n", {}, backend)
    assert r.ok, r.error
    if not r.isolation["memory"].startswith("the grade as a whole"):
        pytest.skip(f"no memory cgroup here: {r.isolation['memory']}")


# --- item 2: memory is capped for the grade, not per process ---------------------------------------------------

HOLDERS = r"""
import os, signal, time
def grade(s, i):
    r, w = os.pipe()
    kids = []
    for _ in range(i["kids"]):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            block = b"x" * i["each"]  # written, so resident
            os.write(w, b"1")
            os.close(w)
            time.sleep(600)
            os._exit(0)
        kids.append(pid)
    os.close(w)
    while os.read(r, 1):  # end-of-file once every child has its block or is dead
        pass
    # A child still alive now holds its block (no one allocates any more): it dies by our SIGTERM, while one the
    # kernel killed over the cap died by SIGKILL.
    for pid in kids:
        os.kill(pid, signal.SIGTERM)
    return sum(os.WTERMSIG(os.waitpid(pid, 0)[1]) == signal.SIGTERM for pid in kids)
"""


def test_memory_is_capped_for_the_grade_as_a_whole(backend: str) -> None:
    """Four processes of 100 MiB each under a 256 MiB cap: at most two can hold theirs at once."""
    _grade_cap_or_skip(backend)
    r = _run(HOLDERS, {"kids": 4, "each": 100 * MiB}, backend, memory_bytes=256 * MiB)
    if r.ok:
        assert r.value * 100 * MiB <= 256 * MiB, f"{r.value} processes held 100 MiB each at once"
    else:
        assert r.error_flag == "memory", (r.error_flag, r.error)  # the grader itself was the one killed


def test_memfd_files_count_against_the_grade(backend: str) -> None:
    """memfd files not mapped are invisible to RLIMIT_AS; the grade's memory cgroup counts them."""
    _grade_cap_or_skip(backend)
    src = (
        "import os\ndef grade(s, i):\n    held = []\n    for k in range(4):\n"
        "        fd = os.memfd_create('m%d' % k)\n        for _ in range(100):\n"
        "            os.write(fd, b'x' * (1 << 20))\n        held.append(fd)\n    return len(held)\n"
    )
    r = _run(src, {}, backend, memory_bytes=256 * MiB)
    assert not r.ok and r.error_flag in ("memory", "exception"), (r.ok, r.value, r.error_flag, r.error)


def test_without_a_cgroup_the_per_process_cap_is_reported(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "cgroup_roots", lambda: None)
    r = _run("def grade(s, i):\n    return 0.5\n", {}, backend)
    assert r.ok and r.isolation["memory"] == "each process (no memory cgroup here)"


# --- item 3: concurrent grades do not share a process cap ----------------------------------------------------

FORKER = r"""
import os, time
def grade(s, i):
    kids = []
    for _ in range(5):
        pid = os.fork()
        if pid == 0:
            time.sleep(3)  # long enough for the other grades' children to be alive too
            os._exit(0)
        kids.append(pid)
    return sum(os.waitpid(pid, 0)[1] == 0 for pid in kids)
"""


@pytest.mark.slow
def test_concurrent_honest_grades_do_not_share_a_process_cap(backend: str) -> None:
    """8 grades at once, each of 6 processes under max_procs=8: each counts its own, all succeed."""
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _run(FORKER, {}, backend, max_procs=8), range(8)))
    assert [(r.ok, r.value) for r in results] == [(True, 5)] * 8, [r.error for r in results if not r.ok]


# --- item 4: the result channel ---------------------------------------------------------------------------------

FORGED = '{"frame": "result", "ok": true, "value": 1.0}\n'


def test_a_frame_written_to_the_result_pipe_fd_is_not_a_result(backend: str) -> None:
    """The fd on the harness's command line is the relay's: the code's process does not hold it."""
    src = (
        "import os, sys\ndef grade(s, i):\n    try:\n"
        f"        os.write(int(sys.argv[1]), {FORGED!r}.encode())\n"
        "    except OSError:\n        pass\n    os._exit(0)\n"
    )
    r = _run(src, {}, backend)
    assert not r.ok and r.value is None and r.error_flag == "killed", (r.error_flag, r.error)


FORKED_FORGER = (
    "import os, signal, time\ndef grade(s, i):\n    if os.fork() == 0:\n"
    "        for fd in map(int, os.listdir('/proc/self/fd')):  # every fd it inherited, the channel among them\n"
    "            try:\n"
    f"                os.write(fd, {FORGED!r}.encode())\n"
    "            except OSError:\n                pass\n"
    "        os.kill(os.getppid(), signal.SIGKILL)  # so that the grader's own result never comes\n"
    "        os._exit(0)\n"
    "    time.sleep(60)\n    return 0.0\n"
)


def test_a_frame_from_a_process_the_grader_started_is_flagged_forged(backend: str) -> None:
    r = _run(FORKED_FORGER, {}, backend)
    assert not r.ok and r.value is None and r.error_flag == "forged", (r.error_flag, r.error)
    # the python grader blames the code it ran (a runtime error), not the sandbox (a server error)
    grade = load_grader({"type": "python", "source": FORKED_FORGER, "timeout_s": 60, "sandbox": backend}).grade("", {})
    assert grade.reward == 0.0 and [e.flag for e in grade.errors] == ["python_grader_runtime_error"], grade.errors


# --- item 5: large results, absurd limits --------------------------------------------------------------------


def test_a_result_larger_than_a_pipe_buffer_arrives(backend: str) -> None:
    r = _run("def grade(s, i):\n    return 'x' * 1_000_000\n", {}, backend)
    assert r.ok and r.value == "x" * 1_000_000, (r.error_flag, r.error)


def test_a_result_over_the_cap_is_flagged_not_waited_for(backend: str) -> None:
    r = _run("def grade(s, i):\n    return 'x' * (5 << 20)\n", {}, backend)
    assert not r.ok and r.error_flag == "malformed" and "larger than 4 MiB" in r.error, (r.error_flag, r.error)


@pytest.mark.parametrize("timeout_s", [1e308, float("inf"), float("nan"), 0.0])
def test_an_absurd_timeout_is_refused_by_name(timeout_s: float) -> None:
    spec = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n", "timeout_s": timeout_s}
    with pytest.raises(GraderSpecError, match="^timeout_s: "):
        load_grader(spec)
    with pytest.raises(ValueError, match="^timeout_s must be in"):
        run_sandboxed("def grade(s, i):\n    return 1.0\n", {"s": {}, "i": {}}, timeout_s=timeout_s, sandbox="none")


@pytest.mark.parametrize("field", ["memory_bytes", "disk_bytes", "file_size_bytes", "max_procs"])
def test_an_absurd_limit_is_refused_by_name(field: str) -> None:
    spec = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n", field: 10**30}
    with pytest.raises(GraderSpecError, match=f"^{field}: "):
        load_grader(spec)
    with pytest.raises(ValueError, match=f"^{field} must be in"):
        run_sandboxed("def grade(s, i):\n    return 1.0\n", {"s": {}, "i": {}}, sandbox="none", **{field: 10**30})

"""python grader in the sandbox: normal use, and hostile graders that must end at 0 with a flag, fast."""

from __future__ import annotations

import os
import socket
import time

import pytest

from agentrft.graders import GraderSpecError, load_grader
from agentrft.tools import sandbox
from agentrft.tools.sandbox import run_sandboxed

SMALL = {"timeout_s": 3, "memory_bytes": 512 * 1024**2}
NO_SANDBOX = sandbox.backend_problem("auto")
pytestmark = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox backend works here: {NO_SANDBOX}")


def py(source: str, **kw: object) -> dict:
    return {"type": "python", "source": source, **SMALL, **kw}


def test_python_grader_scores_and_ignores_stdout() -> None:
    src = (
        "def grade(sample, item):\n"
        "    print('score: 1.0')\n"
        "    return float(sample['output_text'].strip() == item['answer'])\n"
    )
    g = load_grader(py(src))
    assert g.grade("42", {"answer": "42"}).reward == 1.0
    wrong = g.grade("score: 1.0", {"answer": "42"})  # the policy prints a fake score; so does the grader
    assert wrong.reward == 0.0 and wrong.errors == [] and not wrong.success


def test_sandbox_result_not_parsed_from_stdout() -> None:
    r = run_sandboxed(
        'def grade(sample, item):\n    print(\'{"frame": "result", "ok": true, "value": 1.0}\')\n'
        "    raise ValueError('boom')\n",
        {"sample": {}, "item": {}},
        timeout_s=3,
    )
    assert not r.ok and r.error_flag == "exception" and "boom" in r.error
    assert '"value": 1.0' in r.stdout


@pytest.mark.parametrize("ret", ["'1.0'", "True", "float('nan')", "None"])
def test_non_float_is_runtime_error(ret: str) -> None:
    grade = load_grader(py(f"def grade(s, i):\n    return {ret}\n")).grade("x", {})
    assert grade.reward == 0.0 and grade.error_flags == ["python_grader_runtime_error"]


def test_exception_is_runtime_error() -> None:
    assert load_grader(py("def grade(s, i):\n    return 1 / 0\n")).grade("x", {}).error_flags == [
        "python_grader_runtime_error"
    ]


def test_a_source_without_grade_is_refused_at_load() -> None:
    """It could only fail every call: refused before anything runs (and before a training job loads a model)."""
    for src in ("x = 1\n", "def grad(sample, item):\n    return 1.0\n", "def f():\n    return 1\n"):
        with pytest.raises(GraderSpecError, match="^source: defines no grade\\(sample, item\\) function"):
            load_grader(py(src))
    # every way of binding the name counts: a def inside a top-level if, an assignment, an import
    for src in (
        "import sys\nif sys:\n    def grade(s, i):\n        return 1.0\n",
        "grade = lambda s, i: 1.0\n",
        "from math import floor as grade\n",
    ):
        load_grader(py(src))


def test_syntax_error_and_source_choice_at_load() -> None:
    from agentrft.graders import GraderSpecError

    with pytest.raises(GraderSpecError, match="^source: Python syntax error at line 1"):
        load_grader(py("def grade(:\n"))
    with pytest.raises(GraderSpecError, match="exactly one of source or source_path"):
        load_grader({"type": "python"})


@pytest.mark.slow
def test_infinite_loop_times_out() -> None:
    t0 = time.monotonic()
    grade = load_grader(py("def grade(s, i):\n    while True:\n        pass\n", timeout_s=1.5)).grade("x", {})
    assert grade.reward == 0.0 and grade.error_flags == ["unresponsive_reward_error"]
    assert time.monotonic() - t0 < 120  # it ended (a generous bound: a loaded machine is slower, not wrong)


@pytest.mark.slow
def test_fork_bomb_contained() -> None:
    src = "import os\ndef grade(s, i):\n    while True:\n        os.fork()\n"
    t0 = time.monotonic()
    grade = load_grader(py(src, max_procs=16)).grade("x", {})
    assert grade.reward == 0.0 and grade.error_flags[0] in ("python_grader_runtime_error", "unresponsive_reward_error")
    assert time.monotonic() - t0 < 120  # it ended (a generous bound, not a speed test)
    # host unharmed: we can still start processes
    assert os.system("true") == 0


def test_allocating_10gb_is_memory_error() -> None:
    grade = load_grader(py("def grade(s, i):\n    x = bytearray(10 * 1024**3)\n    return 1.0\n")).grade("x", {})
    assert grade.reward == 0.0 and grade.error_flags == ["python_grader_runtime_error"]
    assert "MemoryError" in grade.errors[0].message


def test_no_network_even_to_localhost() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        src = (
            "import socket\ndef grade(s, i):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n    return 1.0\n"
        )
        g = load_grader(py(src))
        grade = g.grade("x", {})
        if g.last_isolation.get("network") != "namespace":
            pytest.skip(f"no network namespace here: {g.last_isolation.get('network')}")
        assert grade.reward == 0.0 and grade.error_flags == ["python_grader_runtime_error"]
    finally:
        srv.close()


def test_cannot_write_outside_or_overwrite_own_source(tmp_path) -> None:
    target = tmp_path / "owned.txt"
    g = load_grader(py(f"def grade(s, i):\n    open({str(target)!r}, 'w').write('x')\n    return 1.0\n"))
    grade = g.grade("x", {})
    assert grade.reward == 0.0 and grade.error_flags == ["python_grader_runtime_error"] and not target.exists()
    src = "def grade(s, i):\n    open(__file__, 'w').write('def grade(s, i):\\n    return 1.0\\n')\n    return 1.0\n"
    g = load_grader(py(src))
    for _ in range(2):  # a second call runs the original source again
        again = g.grade("x", {})
        assert again.reward == 0.0 and again.error_flags == ["python_grader_runtime_error"]


def test_edits_to_source_file_after_load_do_not_change_grade(tmp_path) -> None:
    path = tmp_path / "grader.py"
    path.write_text("def grade(s, i):\n    return 0.25\n")
    g = load_grader({"type": "python", "source_path": str(path), **SMALL})
    path.write_text("def grade(s, i):\n    return 1.0\n")  # e.g. a policy's file tool
    assert g.grade("x", {}).reward == 0.25


def test_parent_environment_is_not_visible(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRFT_TEST_SECRET", "hunter2")
    src = (
        "import os\ndef grade(s, i):\n"
        "    if os.environ.get('AGENTRFT_TEST_SECRET') == 'hunter2':\n        return 1.0\n"
        "    return float('hunter2' in open('/proc/%d/environ' % os.getppid()).read())\n"
    )
    grade = load_grader(py(src)).grade("x", {})
    assert grade.reward == 0.0
    if os.geteuid() == 0:
        assert grade.error_flags == ["python_grader_runtime_error"]  # PermissionError reading /proc/<ppid>/environ


def test_isolation_is_reported() -> None:
    g = load_grader(py("def grade(s, i):\n    return 0.5\n"))
    grade = g.grade("x", {})
    iso = grade.metadata["isolation"]
    assert iso["rlimits"]["RLIMIT_AS"] == 512 * 1024**2 and "network" in iso and "uid" in iso


def test_multi_with_python_runs_async_concurrently() -> None:
    import asyncio

    g = load_grader(
        {
            "type": "multi",
            "calculate_output": "a + b",
            "graders": {
                "a": py("def grade(s, i):\n    return 0.25\n"),
                "b": {"type": "string_check", "input": "{{ sample.output_text }}", "reference": "x", "operation": "eq"},
            },
        }
    )
    grades = asyncio.run(_many(g))
    assert [gr.reward for gr in grades] == [1.25] * 4
    assert g.grade("x", {}).reward == 1.25


async def _many(g):  # type: ignore[no-untyped-def]
    import asyncio

    return await asyncio.gather(*(g.agrade("x", {}) for _ in range(4)))


def test_stray_children_are_killed_with_the_call() -> None:
    # Pids inside the sandbox are not host pids (PID namespace): find the child on the host by its argv[0].
    tag = f"agentrft-stray-{os.getpid()}-{time.monotonic_ns()}"
    src = (
        "import os\ndef grade(s, i):\n    pid = os.fork()\n    if pid == 0:\n"
        f"        os.execv('/bin/sleep', [{tag!r}, '60'])\n    return pid\n"
    )
    r = run_sandboxed(src, {"s": {}, "i": {}}, timeout_s=5)
    assert r.ok and isinstance(r.value, int)
    deadline = time.monotonic() + 3  # SIGKILL delivery and reaping by init are asynchronous
    while time.monotonic() < deadline and _tagged(tag):
        time.sleep(0.05)
    assert not _tagged(tag)


def _tagged(tag: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if d.isdigit() and f.read().split(b"\0", 1)[0] == tag.encode():
                    pids.append(int(d))
        except OSError:
            pass
    for pid in pids:  # never leave one behind, even when the test fails
        os.kill(pid, 9)
    return pids


def test_only_one_result_frame_counts() -> None:
    # a forked child that falls through must not report a second (possibly different) result
    src = "import os\ndef grade(s, i):\n    os.fork()\n    return 0.5\n"
    r = run_sandboxed(src, {"s": {}, "i": {}}, timeout_s=5)
    assert r.ok and r.value == 0.5


def test_source_path_relative_to_spec_file(tmp_path) -> None:
    import json

    (tmp_path / "g.py").write_text("def grade(s, i):\n    return 0.5\n")
    (tmp_path / "spec.json").write_text(json.dumps({"type": "python", "source_path": "g.py", **SMALL}))
    assert load_grader(tmp_path / "spec.json").grade("x", {}).reward == 0.5
    (tmp_path / "g.py").write_bytes("def grade(s, i):\n    return 0.5  # \u00e9\n".encode("latin-1"))
    with pytest.raises(GraderSpecError, match=r"source_path: .*g.py: not UTF-8 text"):
        load_grader(tmp_path / "spec.json")


def test_stdlib_imports_work_after_privilege_drop() -> None:
    src = (
        "import statistics\nfrom fractions import Fraction\n"
        "def grade(s, i):\n    import difflib\n"
        "    return statistics.mean([0.25, 0.75]) + float(Fraction(1, 4)) + difflib.SequenceMatcher(None, 'a', 'a').ratio()\n"
    )
    grade = load_grader(py(src, range=[0, 2])).grade("x", {})  # 1.75 is outside the default range [0, 1]
    assert grade.errors == [] and grade.reward == pytest.approx(1.75)


def test_readonly_paths_are_readable_not_writable(tmp_path) -> None:
    data = tmp_path / "answers.json"
    data.write_text('{"q1": 0.5}')
    src = (
        "import json, os\ndef grade(s, i):\n"
        "    here = os.path.dirname(__file__)\n"
        "    value = json.load(open(os.path.join(here, 'answers.json')))['q1']\n"
        "    try:\n        open(os.path.join(here, 'answers.json'), 'w').write('{}')\n        return 1.0\n"
        "    except OSError:\n        return value\n"  # EROFS: a read-only bind, whoever the user is
    )
    r = run_sandboxed(src, {"s": {}, "i": {}}, timeout_s=5, readonly_paths=[data])
    assert r.ok and r.value == 0.5
    assert data.read_text() == '{"q1": 0.5}'


@pytest.mark.parametrize(
    "ret", ["1e308", "float('inf')", "-float('inf')", "float('nan')", "10**400", "10**20", "1.5", "-0.5"]
)
def test_rewards_outside_the_declared_range_are_errors(ret: str) -> None:
    grade = load_grader(py(f"def grade(s, i):\n    return {ret}\n")).grade("x", {})
    assert grade.reward == 0.0 and not grade.success and grade.error_flags == ["python_grader_runtime_error"]
    assert "declared range [0, 1]" in grade.errors[0].message


def test_declared_range_widens_and_is_validated() -> None:
    from agentrft.graders import GraderSpecError

    low = load_grader(py("def grade(s, i):\n    return -0.5\n", range=[-1, 1])).grade("x", {})
    assert low.reward == -0.5 and low.errors == [] and not low.success
    top = load_grader(py("def grade(s, i):\n    return 2\n", range=[0, 2])).grade("x", {})
    assert top.reward == 2.0 and top.errors == [] and top.success  # success at the top of the declared range
    assert load_grader(py("def grade(s, i):\n    return 1\n")).grade("x", {}).success  # an int is a number
    for bad in ([1, 0], [0, float("inf")]):
        with pytest.raises(GraderSpecError, match="^range: must be"):
            load_grader(py("def grade(s, i):\n    return 0\n", range=bad))


def test_refused_at_load_unless_unsandboxed_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrft.graders import GraderSpecError

    monkeypatch.setattr(
        sandbox, "backend_problem", lambda name: None if name == "none" else f"{name} is missing (test)"
    )
    with pytest.raises(GraderSpecError, match=r'^sandbox: no sandbox .*bwrap is missing.*sandbox="none"'):
        load_grader(py("def grade(s, i):\n    return 0.5\n"))
    with pytest.raises(GraderSpecError, match=r"^graders.a.sandbox: sandbox 'unshare' cannot run"):
        load_grader({"type": "multi", "calculate_output": "a", "graders": {"a": py("x = 1\n", sandbox="unshare")}})
    g = load_grader(py("def grade(s, i):\n    return 0.5\n", sandbox="none"))
    grade = g.grade("x", {})
    assert grade.reward == 0.5 and g.last_isolation["backend"] == "none" and g.last_isolation["mounts"] == "host"

"""Run untrusted Python (python graders, code tools) in a fresh, isolated subprocess.

One call = one new interpreter (`python -I`, scrubbed environment) in new PID,
mount, network, IPC and UTS namespaces, launched by bubblewrap or util-linux
`unshare` (`sandbox_backends`; `sandbox="auto"` picks the first that works
here). The harness (`sandbox_harness.py`, ours, copied read-only next to the
code) finishes the fences *before* any user code runs, then calls
`entrypoint(*payload.values())` and writes one JSON frame to a dedicated pipe.
Nothing is ever parsed from stdout: a printed "score: 1.0" cannot become a result.

Fences, each reported in `SandboxResult.isolation` as observed from inside:

- processes: a PID namespace, so the whole tree dies with the call (`setsid`,
  `setpgid` or double-forked daemons included); RLIMIT_NPROC on top.
- files: only /usr, the interpreter and its environment, read-only; the code
  read-only at /sandbox; /tmp (cwd, HOME, TMPDIR) a fresh tmpfs of
  `disk_bytes` that /dev/shm links into, gone after the call. The project
  tree, the host's /tmp, /proc and UNIX sockets are not visible.
- network: a new network namespace (only `lo`), unless `network=True`.
- user: as root the harness becomes nobody (65534); every backend ends in a
  user namespace that cannot create more (so no private, uncapped tmpfs),
  with no capabilities and no_new_privs.
- rlimits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0.
  As root, RLIMIT_NPROC counts all of nobody's processes on the host.

Without namespaces (`sandbox="none"`, only ever on explicit request) the code
runs as the caller with rlimits and a process-group kill, and can read
whatever the caller can. If no backend works, the call is refused with
`error_flag="unavailable"` and a message naming that option.

Not a fence against a malicious *author* of the sandboxed code (it can write to
the result pipe itself); it is a fence between the grader and the host, and
between the policy's output (data) and the grade. Memory that RLIMIT_AS does
not see (pipe buffers, memfd files) is not capped: that needs a memory cgroup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agentrft.tools.sandbox_backends import (
    BACKENDS,
    SANDBOX_DIR,
    SANDBOX_ENV,
    SandboxUnavailable,
    bwrap_args,
    file_tree,
    unavailable_message,
    unshare_argv,
    which,
)

__all__ = ["SandboxResult", "SandboxUnavailable", "backend_problem", "resolve_backend", "run_sandboxed"]

_MAX_CAPTURE = 64 * 1024  # bytes of stdout/stderr kept for diagnostics; the rest is read and dropped
_MAX_RESULT = 4 * 1024 * 1024
_HARNESS = Path(__file__).with_name("sandbox_harness.py")


@dataclass
class SandboxResult:
    """Outcome of one sandboxed call.

    `error_flag` (None when ok) is one of: `timeout` (wall clock), `cpu_limit`,
    `memory` (MemoryError), `exception` (raised in the code), `killed` (died by
    a signal or exited without a result), `protocol` (the result pipe held
    something other than exactly one result frame), `start_failed` (the
    sandbox could not be built), `unavailable` (no backend works here).
    """

    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error_flag: str | None = None
    error: str = ""
    isolation: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_bytes: int
    cpu_s: int
    file_size_bytes: int
    disk_bytes: int
    max_procs: int
    network: bool


def backend_problem(name: str) -> str | None:
    """None when backend `name` (or `auto`: any) works here, else why not. Checked once per process."""
    if name == "none":
        return None
    if name == "auto":
        reasons = [backend_problem(b) for b in BACKENDS if b != "none"]
        return None if None in reasons else "; ".join(r for r in reasons if r)
    return _probe(name)


def resolve_backend(name: str) -> str:
    """The backend a call with `sandbox=name` uses; raises `SandboxUnavailable` (with the opt-out) when none works."""
    if name not in ("auto", *BACKENDS):
        raise ValueError(f"sandbox must be one of auto, {', '.join(BACKENDS)}; got {name!r}")
    candidates = [b for b in BACKENDS if b != "none"] if name == "auto" else [name]
    reasons: dict[str, str] = {}
    for b in candidates:
        why = backend_problem(b)
        if why is None:
            return b
        reasons[b] = why
    raise SandboxUnavailable(unavailable_message(name, reasons))


@functools.cache
def _probe(name: str) -> str | None:
    if which(name) is None:
        return f"{name} is not installed"
    limits = _Limits(30.0, 512 * 1024**2, 30, 1024**2, 1024**2, 16, False)
    res = _call(name, "def probe():\n    return 1\n", {}, "probe", limits, [])
    if res.ok and res.value == 1:
        return None
    detail = (res.error or res.stderr or "no result").strip().splitlines()
    return f"a trial call failed ({res.error_flag}): {detail[-1] if detail else ''}"[:300]


def run_sandboxed(
    source_or_path: str | Path,
    payload: dict[str, Any],
    *,
    entrypoint: str = "grade",
    timeout_s: float = 120.0,
    memory_bytes: int = 2 * 1024**3,
    cpu_s: int | None = None,
    file_size_bytes: int = 1024**3,
    disk_bytes: int = 1024**3,
    max_procs: int = 32,
    network: bool = False,
    readonly_paths: list[str | Path] | None = None,
    sandbox: str = "auto",
) -> SandboxResult:
    """Run `entrypoint(*payload.values())` from the given code in a fresh isolated interpreter.

    `source_or_path` is Python source text, or a `Path` to a .py file (read now).
    `payload` must be JSON-serialisable; it arrives on the child's stdin.
    `cpu_s` defaults to `ceil(timeout_s)`. `disk_bytes` caps everything the code
    writes (files anywhere, /dev/shm); `file_size_bytes` caps one file.
    `readonly_paths` are extra files or directories copied read-only next to
    the code (the grader's own data; `os.path.dirname(__file__)` finds them).
    `sandbox`: `auto`, `bwrap`, `unshare`, or `none` (no isolation; see module docstring).
    """
    start = time.monotonic()
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailable as e:
        return SandboxResult(ok=False, error_flag="unavailable", error=str(e), seconds=time.monotonic() - start)
    if isinstance(source_or_path, Path):
        source = source_or_path.read_text(encoding="utf-8")
    else:
        source = source_or_path
    cpu = int(cpu_s if cpu_s is not None else max(1, -(-timeout_s // 1)))
    limits = _Limits(timeout_s, memory_bytes, cpu, file_size_bytes, disk_bytes, max_procs, network)
    return _call(backend, source, payload, entrypoint, limits, readonly_paths or [])


def _call(
    backend: str,
    source: str,
    payload: dict[str, Any],
    entrypoint: str,
    limits: _Limits,
    readonly_paths: list[str | Path],
) -> SandboxResult:
    start = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="agentrft-sbx-"))
    try:
        res = _run(root, backend, source, payload, entrypoint, limits, readonly_paths)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res.seconds = time.monotonic() - start
    return res


def _prepare(
    root: Path, backend: str, source: str, entrypoint: str, limits: _Limits, readonly_paths: list[str | Path]
) -> tuple[list[str], dict[str, str], Path, IO[bytes] | None]:
    """Write the code directory; return the command line, environment, cwd and (bwrap) the options file."""
    code_dir = root / "code"
    code_dir.mkdir()
    shutil.copyfile(_HARNESS, code_dir / "harness.py")
    (code_dir / "code.py").write_text(source, encoding="utf-8")
    for extra in readonly_paths:
        src = Path(extra)
        if src.is_dir():
            shutil.copytree(src, code_dir / src.name)
        else:
            shutil.copy2(src, code_dir / src.name)
    inside = SANDBOX_DIR if backend != "none" else str(code_dir)
    tree = file_tree(str(code_dir), limits.disk_bytes)
    new_root = root / "newroot"
    cfg = {
        "backend": backend,
        "code_path": f"{inside}/code.py",
        "entrypoint": entrypoint,
        "host_uid": os.getuid(),
        "root": tree.as_config(str(new_root)) if backend == "unshare" else None,
        "limits": {
            "RLIMIT_CPU": limits.cpu_s,
            "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_FSIZE": limits.file_size_bytes,
            "RLIMIT_NPROC": limits.max_procs,
            "RLIMIT_CORE": 0,
        },
    }
    (code_dir / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    # Readable by nobody whatever the copied modes were; read-only comes from the mount (a 0555 tree could not
    # be removed afterwards by a non-root owner).
    for dirpath, _dirnames, filenames in os.walk(code_dir):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    python = [sys.executable, "-I", "-B"]
    if backend == "none":
        work = root / "work"
        work.mkdir(mode=0o700)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
        return [*python, str(code_dir / "harness.py"), "{fd}", str(code_dir / "config.json")], env, work, None
    if backend == "unshare":
        new_root.mkdir()
        argv = [*unshare_argv(limits.network), *python, str(code_dir / "harness.py")]
        return [*argv, "{fd}", str(code_dir / "config.json")], dict(SANDBOX_ENV), root, None
    opts = root / "bwrap.args"
    opts.write_bytes(b"".join(a.encode() + b"\0" for a in bwrap_args(tree, limits.network)))
    opts_file = open(opts, "rb")  # noqa: SIM115 (closed by the caller after the launch)
    argv = ["bwrap", "--args", str(opts_file.fileno()), *python, f"{SANDBOX_DIR}/harness.py"]
    return [*argv, "{fd}", f"{SANDBOX_DIR}/config.json"], dict(SANDBOX_ENV), root, opts_file


class _Capture(threading.Thread):
    """Reads a child's stdout or stderr to the end, keeping the first `_MAX_CAPTURE` bytes (nothing on disk)."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.stream, self.data = stream, bytearray()
        self.start()

    def run(self) -> None:
        with self.stream:
            while chunk := self.stream.read(65536):
                if len(self.data) < _MAX_CAPTURE:
                    self.data += chunk[: _MAX_CAPTURE - len(self.data)]

    def text(self) -> str:
        self.join(timeout=2.0)  # a process that escaped (backend none) may keep the pipe open
        return bytes(self.data).decode("utf-8", "replace")


def _run(
    root: Path,
    backend: str,
    source: str,
    payload: dict[str, Any],
    entrypoint: str,
    limits: _Limits,
    readonly_paths: list[str | Path],
) -> SandboxResult:
    (root / "stdin.json").write_text(json.dumps(payload))
    argv, env, cwd, opts_file = _prepare(root, backend, source, entrypoint, limits, readonly_paths)
    r_fd, w_fd = os.pipe()
    argv = [str(w_fd) if a == "{fd}" else a for a in argv]
    pass_fds = (w_fd,) if opts_file is None else (w_fd, opts_file.fileno())
    try:
        with open(root / "stdin.json", "rb") as fin:
            try:
                proc = subprocess.Popen(
                    argv,
                    executable=which(argv[0]) if backend != "none" else None,
                    stdin=fin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    pass_fds=pass_fds,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                return SandboxResult(ok=False, error_flag="start_failed", error=f"{argv[0]}: {e}")
            finally:
                os.close(w_fd)
                if opts_file is not None:
                    opts_file.close()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout), _Capture(proc.stderr)
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        # Kill the group too: the namespace's init with it (so everything inside), or with `none` the
        # children that stayed in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raw = _drain(r_fd)
    finally:
        os.close(r_fd)
    res = SandboxResult(ok=False, stdout=out.text(), stderr=err.text())
    return _classify(res, raw, proc.returncode, timed_out, backend, limits)


def _classify(
    res: SandboxResult, raw: bytes, returncode: int, timed_out: bool, backend: str, limits: _Limits
) -> SandboxResult:
    frames = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            frames.append(json.loads(line))
        except ValueError:  # includes ints too long to read back (a forged frame)
            frames.append({"frame": "garbage"})
    started = bool(frames) and frames[0].get("frame") == "isolation"
    if started:
        res.isolation = {k: v for k, v in frames.pop(0).items() if k != "frame"}
        res.isolation["process_group_kill"] = True
    # The launcher reports a signal N either as -N (none, unshare) or as exit status 128+N (bwrap, our init).
    sig = -returncode if returncode < 0 else returncode - 128 if backend != "none" and returncode > 128 else 0
    if timed_out:
        res.error_flag, res.error = "timeout", f"no result within {limits.timeout_s:g}s (sandbox killed)"
        return res
    if started and not frames and sig in (signal.SIGXCPU, signal.SIGKILL):
        res.error_flag, res.error = "cpu_limit", f"CPU time limit of {limits.cpu_s}s exceeded"
        return res
    if len(frames) == 1 and frames[0].get("kind") == "setup":
        res.error_flag, res.error = "start_failed", f"the {backend} sandbox could not be set up: {frames[0]['error']}"
        return res
    if not started and not frames:
        res.error_flag = "start_failed"
        res.error = f"the {backend} sandbox did not start (status {returncode}): {res.stderr[-500:].strip()}"
        return res
    if len(frames) != 1 or frames[0].get("frame") != "result":
        if not frames:
            res.error_flag = "killed"
            res.error = f"exited with status {returncode} and no result; stderr: {res.stderr[-500:]}"
        else:
            res.error_flag, res.error = "protocol", f"result pipe held {len(frames)} frames, expected 1"
        return res
    frame = frames[0]
    if frame.get("ok"):
        res.ok, res.value = True, frame.get("value")
        return res
    res.error = str(frame.get("error", ""))
    res.error_flag = "memory" if res.error.startswith("MemoryError") else "exception"
    return res


def _drain(fd: int) -> bytes:
    # Non-blocking: with backend none a child that escaped the process group may still hold the write end.
    os.set_blocking(fd, False)
    chunks, total = [], 0
    while total < _MAX_RESULT:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)

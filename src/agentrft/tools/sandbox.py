"""Run untrusted Python (python graders, code tools) in a fresh, isolated subprocess.

One call = one new interpreter (`python -I`, scrubbed environment) in new PID,
mount, network, IPC and UTS namespaces, launched by bubblewrap or util-linux
`unshare` (`sandbox_backends`; `sandbox="auto"` picks the first that works
here). The harness (`sandbox_harness.py`, ours, copied read-only next to the
code) finishes the fences *before* any user code runs, then calls
`entrypoint(*payload.values())` and sends one JSON frame to the relay (the
harness's first process, PID 1 of the namespace), which alone holds the
result pipe to the host and runs none of the code.
Nothing is ever parsed from stdout: a printed "score: 1.0" cannot become a result.

Fences, each reported in `SandboxResult.isolation` as observed from inside:

- processes: a PID namespace, so the whole tree dies with the call (`setsid`,
  `setpgid` or double-forked daemons included) — and with the caller: the
  relay holds the read end of a lifeline pipe whose only writer is the calling
  process, and ends the namespace when the caller dies (kill -9, SIGTERM),
  as it does at the call's deadline whatever the host does; bubblewrap also
  runs with --die-with-parent. Process count: the call's own pids cgroup where
  there is one, and RLIMIT_NPROC, which as root counts only this call's
  processes (each call runs as a uid of its own, `sandbox_backends.call_uid`).
- memory: with a memory cgroup (`isolation["memory"]` says which), the grade
  as a whole — every process, memfd and /dev/shm file, and the /tmp tmpfs,
  which is memory too — holds at most `memory_bytes` (swap included where the
  kernel accounts it); past it the kernel kills a process (`error_flag=
  "memory"` when no result came). Without one (a non-root caller, a cgroup
  tree not delegated to us) memory is capped per process only: RLIMIT_AS of
  `memory_bytes` each, so up to `max_procs` × `memory_bytes` of address space
  in all, plus what RLIMIT_AS does not see — memfd files not mapped (each at
  most `file_size_bytes`) and pipe and socket buffers. Either way one
  allocation past `memory_bytes` is a MemoryError.
- files: only /usr, the interpreter and its environment, read-only; the code
  read-only at /sandbox; /tmp (cwd, HOME, TMPDIR) a fresh tmpfs of
  `disk_bytes` that /dev/shm links into, gone after the call. The project
  tree, the host's /tmp, /proc and UNIX sockets are not visible. The call's
  directory on the host is removed after the call, or, if the caller was
  killed first, by the next process that makes a call.
- network: a new network namespace (only `lo`), unless `network=True`.
- user: as root the harness becomes the call's own uid; no backend lets the
  code make a user namespace (a new one whose limit is 0, or with `unshare`
  as root the chroot, where the kernel refuses them), so no private, uncapped
  tmpfs; no capabilities and no_new_privs.
- rlimits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0.
- the result: the relay forwards only what the code's own process sent (the
  kernel stamps each message with its sender's pid), so nothing the code
  starts — a subprocess, a fork, a shell — can forge a result: that is
  `error_flag="forged"`. What the code's own interpreter sends *is* its
  result: code it runs in-process (exec of a submission) can make it return
  anything, so a grader must run untrusted submissions in a subprocess.

Without namespaces (`sandbox="none"`, only ever on explicit request) the code
runs as the caller with rlimits, the cgroups where there are any, and a
process-group kill; it can read whatever the caller can, and its RLIMIT_NPROC
counts all of the caller's processes. If no backend works, the call is refused
with `error_flag="unavailable"` and a message naming that option.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agentrft.tools.sandbox_backends import (
    BACKENDS,
    SANDBOX_DIR,
    SANDBOX_ENV,
    CallCgroup,
    CallDir,
    SandboxUnavailable,
    bwrap_args,
    call_uid,
    cgroup_roots,
    file_tree,
    sweep_stale_calls,
    unavailable_message,
    unshare_argv,
    which,
)
from agentrft.tools.sandbox_result import SandboxResult, classify

__all__ = [
    "MAX_BYTES",
    "MAX_PROCS",
    "MAX_TIMEOUT_S",
    "SandboxResult",
    "SandboxUnavailable",
    "backend_problem",
    "resolve_backend",
    "run_sandboxed",
]

# Past these a limit is a typo (timeout_s: 1e308) that would fail every call: refused by name, at load time by specs.
MAX_TIMEOUT_S = 24 * 3600.0  # a grade is a call, not a job
MAX_BYTES = 2**50  # far above any machine, far below what rlimits and cgroups overflow at
MAX_PROCS = 2**22  # the kernel's PID_MAX_LIMIT
_MAX_CAPTURE = 64 * 1024  # bytes of stdout/stderr kept for diagnostics; the rest is read and dropped
_MAX_RESULT = 4 * 1024 * 1024
_DEADLINE_GRACE_S = 10.0  # the relay's own deadline, past the host's: it ends the call should the host not
_HARNESS = Path(__file__).with_name("sandbox_harness.py")


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_bytes: int
    cpu_s: int
    file_size_bytes: int
    disk_bytes: int
    max_procs: int
    network: bool

    def __post_init__(self) -> None:
        bounds = {"cpu_s": (1, int(MAX_TIMEOUT_S)), "max_procs": (1, MAX_PROCS), "file_size_bytes": (0, MAX_BYTES)}
        bounds |= {"memory_bytes": (1, MAX_BYTES), "disk_bytes": (1, MAX_BYTES)}
        for name, (low, high) in bounds.items():
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name} must be in [{low}, {high}]; got {getattr(self, name)!r}")


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
    `timeout_s` is at most `MAX_TIMEOUT_S`; `cpu_s` defaults to `ceil(timeout_s)`.
    `memory_bytes` caps the grade as a whole where there is a memory cgroup, else each process (module docstring).
    `disk_bytes` caps everything the code writes (files anywhere, /dev/shm); `file_size_bytes` caps one file.
    `max_procs` caps the grade's processes and threads together.
    `readonly_paths` are extra files or directories copied read-only next to
    the code (the grader's own data; `os.path.dirname(__file__)` finds them).
    `sandbox`: `auto`, `bwrap`, `unshare`, or `none` (no isolation; see module docstring).
    Raises ValueError for a limit no sandbox can apply, naming it.
    """
    start = time.monotonic()
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # before rounding it: 1e308 and NaN do not round
        raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}] seconds; got {timeout_s!r}")
    cpu = cpu_s if cpu_s is not None else math.ceil(timeout_s)
    limits = _Limits(timeout_s, memory_bytes, cpu, file_size_bytes, disk_bytes, max_procs, network)  # checks the rest
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailable as e:
        return SandboxResult(ok=False, error_flag="unavailable", error=str(e), seconds=time.monotonic() - start)
    if isinstance(source_or_path, Path):
        source = source_or_path.read_text(encoding="utf-8")
    else:
        source = source_or_path
    return _call(backend, source, payload, entrypoint, limits, readonly_paths or [])


@functools.cache
def _sweep_once() -> None:
    """At this process's first call: remove what calls of processes killed mid-call (kill -9) left behind."""
    sweep_stale_calls(tempfile.gettempdir())


def _call(
    backend: str,
    source: str,
    payload: dict[str, Any],
    entrypoint: str,
    limits: _Limits,
    readonly_paths: list[str | Path],
) -> SandboxResult:
    start = time.monotonic()
    _sweep_once()
    roots = cgroup_roots()
    call, cgroup = CallDir(), None
    try:
        if roots is not None:
            try:
                cgroup = call.make_cgroup(roots, limits.memory_bytes, limits.max_procs)
            except OSError as e:
                return SandboxResult(ok=False, error_flag="start_failed", error=f"the call's cgroup: {e}")
        res = _run(call.path, backend, source, payload, entrypoint, limits, readonly_paths, cgroup)
        memory = f"the grade as a whole (cgroup {roots.version})" if roots else "each process (no memory cgroup here)"
        if res.isolation:
            res.isolation["memory"] = memory
    finally:
        call.close(cgroup)
    res.seconds = time.monotonic() - start
    return res


@dataclass
class _Fds:
    """Descriptors the harness inherits: the result pipe (write end), the lifeline (read end), cgroup.procs files."""

    result: int
    lifeline: int
    cgroups: list[int]

    def all(self) -> tuple[int, ...]:
        return (self.result, self.lifeline, *self.cgroups)


def _prepare(
    root: Path,
    backend: str,
    source: str,
    entrypoint: str,
    limits: _Limits,
    readonly_paths: list[str | Path],
    fds: _Fds,
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
        "uid": call_uid(),
        "root": tree.as_config(str(new_root)) if backend == "unshare" else None,
        "lifeline_fd": fds.lifeline,
        "cgroup_fds": fds.cgroups,
        "deadline_s": limits.timeout_s + _DEADLINE_GRACE_S,
        "limits": {
            "RLIMIT_CPU": limits.cpu_s,
            "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_FSIZE": limits.file_size_bytes,
            "RLIMIT_NPROC": limits.max_procs,
            "RLIMIT_CORE": 0,
        },
    }
    (code_dir / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    # Readable by the sandbox's uid whatever the copied modes were; read-only comes from the mount (a 0555 tree
    # could not be removed afterwards by a non-root owner).
    for dirpath, _dirnames, filenames in os.walk(code_dir):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    python = [sys.executable, "-I", "-B"]
    fd = str(fds.result)
    if backend == "none":
        work = root / "work"
        work.mkdir(mode=0o700)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
        return [*python, str(code_dir / "harness.py"), fd, str(code_dir / "config.json")], env, work, None
    if backend == "unshare":
        new_root.mkdir()
        argv = [*unshare_argv(limits.network), *python, str(code_dir / "harness.py")]
        return [*argv, fd, str(code_dir / "config.json")], dict(SANDBOX_ENV), root, None
    opts = root / "bwrap.args"
    opts.write_bytes(b"".join(a.encode() + b"\0" for a in bwrap_args(tree, limits.network)))
    opts_file = open(opts, "rb")  # noqa: SIM115 (closed by the caller after the launch)
    argv = ["bwrap", "--args", str(opts_file.fileno()), *python, f"{SANDBOX_DIR}/harness.py"]
    return [*argv, fd, f"{SANDBOX_DIR}/config.json"], dict(SANDBOX_ENV), root, opts_file


class _Reader(threading.Thread):
    """Reads a pipe to the end while the call runs, keeping the first `limit` bytes (nothing on disk)."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit, self.data, self.overflow = stream, limit, bytearray(), False
        self.start()

    def run(self) -> None:
        with self.stream:
            while chunk := self.stream.read(65536):
                self.overflow |= len(self.data) + len(chunk) > self.limit
                self.data += chunk[: self.limit - len(self.data)]

    def result(self) -> bytes:
        self.join(timeout=2.0)  # a process that escaped (backend none) may keep stdout open
        return bytes(self.data)


def _run(
    root: Path,
    backend: str,
    source: str,
    payload: dict[str, Any],
    entrypoint: str,
    limits: _Limits,
    readonly_paths: list[str | Path],
    cgroup: CallCgroup | None,
) -> SandboxResult:
    (root / "stdin.json").write_text(json.dumps(payload))
    r_fd, w_fd = os.pipe()
    # The lifeline's write end stays in this process alone (O_CLOEXEC, never passed on): when this process dies,
    # however it dies, the relay reads end-of-file and ends the sandbox.
    life_r, life_w = os.pipe()
    fds, opts_file = _Fds(w_fd, life_r, []), None
    try:
        try:
            for path in cgroup.procs_paths() if cgroup else []:  # the harness joins them by writing "0"
                fds.cgroups.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
            argv, env, cwd, opts_file = _prepare(root, backend, source, entrypoint, limits, readonly_paths, fds)
            with open(root / "stdin.json", "rb") as fin:
                proc = subprocess.Popen(
                    argv,
                    executable=which(argv[0]) if backend != "none" else None,
                    stdin=fin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    pass_fds=fds.all() if opts_file is None else (*fds.all(), opts_file.fileno()),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            return SandboxResult(ok=False, error_flag="start_failed", error=f"starting the {backend} sandbox: {e}")
        finally:
            for fd in fds.all():
                os.close(fd)
            if opts_file is not None:
                opts_file.close()
        assert proc.stdout is not None and proc.stderr is not None
        result = _Reader(os.fdopen(r_fd, "rb", buffering=0), _MAX_RESULT)  # now: a large result fills the pipe
        r_fd = -1
        out, err = _Reader(proc.stdout, _MAX_CAPTURE), _Reader(proc.stderr, _MAX_CAPTURE)
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
    finally:
        os.close(life_w)
        if r_fd >= 0:
            os.close(r_fd)
    res = SandboxResult(ok=False, stdout=_text(out), stderr=_text(err))
    raw = result.result()
    if result.overflow:
        res.error_flag, res.error = "malformed", f"the result is larger than {_MAX_RESULT // 1024**2} MiB"
        return res
    oom_kills = cgroup.oom_kills() if cgroup else 0
    return classify(
        res,
        raw,
        proc.returncode,
        timed_out,
        oom_kills,
        backend,
        timeout_s=limits.timeout_s,
        memory_bytes=limits.memory_bytes,
        cpu_s=limits.cpu_s,
    )


def _text(reader: _Reader) -> str:
    return reader.result().decode("utf-8", "replace")

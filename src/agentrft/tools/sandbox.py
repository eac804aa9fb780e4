"""Run untrusted Python (python graders, code tools) in a fresh, fenced subprocess.

One call = one new interpreter (`python -I`, scrubbed environment) in its own
session, so a timeout kills the whole process group. The harness script (ours,
written read-only next to the code) applies the fences *before* any user code
runs, then calls `entrypoint(*payload.values())` and writes one JSON frame to a
dedicated pipe. Nothing is ever parsed from stdout: a printed "score: 1.0"
cannot become a result.

Fences (what `SandboxResult.isolation` reports, so weaker isolation is never silent):

- network: a new network namespace (`unshare(CLONE_NEWNET)`, needs root) with
  only a downed loopback; otherwise "shared".
- uid: as root the harness drops to `nobody` (65534) after the privileged
  steps, so it cannot write the harness/code files (root-owned, 0444 in a 0555
  directory), cannot read other processes' environment, and RLIMIT_NPROC is
  enforced (it is not for root). Without root the uid stays the same and
  RLIMIT_NPROC counts the user's existing processes too.
  Caveat: after the drop only files readable by `nobody` can be imported, so the
  harness imports, while still root, a small core (`_PRELOAD`) plus every module
  the code imports at top level or in functions (found with `ast`); a module
  imported only dynamically (`__import__(name)`) may then fail to load.
- rlimits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC.
- files: cwd, HOME and TMPDIR are a fresh work directory; code is a fresh
  read-only copy per call, so edits from an earlier call cannot leak forward.

Not a fence against a malicious *author* of the sandboxed code (it can write to
the result pipe itself); it is a fence between the grader and the host, and
between the policy's output (data) and the grade.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOBODY_UID = 65534
_MAX_CAPTURE = 64 * 1024  # bytes of stdout/stderr kept for diagnostics
_MAX_RESULT = 4 * 1024 * 1024

# Stdlib modules imported while still privileged (see module docstring, caveat).
_PRELOAD = "__future__ json math re traceback encodings.idna encodings.ascii encodings.latin_1"


def imported_modules(source: str) -> list[str]:
    """Absolute module names the source imports anywhere (and `pkg.name` for `from pkg import name`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    return sorted(set(names))


_HARNESS = r"""
import ctypes, json, os, resource, sys
_PRELOAD = %(preload)r
def _fail(out, kind, msg):
    out.write(json.dumps({"frame": "result", "ok": False, "kind": kind, "error": msg[-2000:]}) + "\n"); out.flush()

def main():
    fd, code_path, entry, cfg_json = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    cfg = json.loads(cfg_json)
    out = os.fdopen(fd, "w")
    iso = {"network": "shared", "uid": "same", "rlimits": {}}
    if cfg["network_off"]:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
            iso["network"] = "namespace"
        else:
            iso["network"] = "shared (unshare failed: errno %%d)" %% ctypes.get_errno()
    else:
        iso["network"] = "allowed"
    payload = json.load(sys.stdin)
    for name in _PRELOAD.split() + cfg["preload"]:
        try:
            __import__(name)
        except Exception:
            pass
    nproc = cfg["max_procs"]
    drop = os.geteuid() == 0
    if not drop:
        me = os.getuid()
        n = sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == me)
        nproc += n
    limits = {"RLIMIT_CPU": cfg["cpu_s"], "RLIMIT_AS": cfg["memory_bytes"],
              "RLIMIT_FSIZE": cfg["file_size_bytes"], "RLIMIT_NPROC": nproc}
    for key, value in limits.items():
        if value is None:
            continue
        hard = value + 1 if key == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, key), (value, hard))
        iso["rlimits"][key] = value
    if drop:
        os.setgroups([])
        os.setgid(%(uid)d)
        os.setuid(%(uid)d)
        iso["uid"] = "nobody(%(uid)d)"
    out.write(json.dumps({"frame": "isolation", **iso}) + "\n"); out.flush()
    pid = os.getpid()
    try:
        with open(code_path, encoding="utf-8") as f:
            src = f.read()
        ns = {"__name__": "sandboxed", "__file__": code_path}
        exec(compile(src, code_path, "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn):
            raise NameError("the code defines no function %%r" %% entry)
        value = fn(*payload.values())
        text = json.dumps({"frame": "result", "ok": True, "value": value})
    except BaseException as e:
        if os.getpid() != pid:
            os._exit(1)  # a forked child never reports
        import traceback
        _fail(out, "exception", "".join(traceback.format_exception_only(type(e), e)).strip())
        return
    if os.getpid() != pid:
        os._exit(0)
    out.write(text + "\n"); out.flush()

def _owner(p):
    try:
        return os.stat("/proc/" + p).st_uid
    except OSError:
        return -1

main()
"""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed call.

    `error_flag` (None when ok) is one of: `timeout` (wall clock), `cpu_limit`,
    `memory` (MemoryError), `exception` (raised in the code), `killed` (died by
    a signal or exited without a result), `protocol` (the result pipe held
    something other than exactly one result frame), `start_failed`.
    """

    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error_flag: str | None = None
    error: str = ""
    isolation: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _read_capped(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_MAX_CAPTURE).decode("utf-8", "replace")


def run_sandboxed(
    source_or_path: str | Path,
    payload: dict[str, Any],
    *,
    entrypoint: str = "grade",
    timeout_s: float = 120.0,
    memory_bytes: int = 2 * 1024**3,
    cpu_s: int | None = None,
    file_size_bytes: int = 1024**3,
    max_procs: int = 32,
    network: bool = False,
    readonly_paths: list[str | Path] | None = None,
) -> SandboxResult:
    """Run `entrypoint(*payload.values())` from the given code in a fresh fenced interpreter.

    `source_or_path` is Python source text, or a `Path` to a .py file (read now).
    `payload` must be JSON-serialisable; it arrives on the child's stdin.
    `cpu_s` defaults to `ceil(timeout_s)`. `readonly_paths` are extra files or
    directories copied read-only next to the code (the grader's own data).
    """
    if isinstance(source_or_path, Path):
        source = source_or_path.read_text(encoding="utf-8")
    else:
        source = source_or_path
    cpu = int(cpu_s if cpu_s is not None else max(1, -(-timeout_s // 1)))
    root = Path(tempfile.mkdtemp(prefix="agentrft-sbx-"))
    start = time.monotonic()
    try:
        return _run(
            root,
            source,
            payload,
            entrypoint,
            timeout_s,
            memory_bytes,
            cpu,
            file_size_bytes,
            max_procs,
            network,
            readonly_paths or [],
            start,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(
    root: Path,
    source: str,
    payload: dict[str, Any],
    entrypoint: str,
    timeout_s: float,
    memory_bytes: int,
    cpu_s: int,
    file_size_bytes: int,
    max_procs: int,
    network: bool,
    readonly_paths: list[str | Path],
    start: float,
) -> SandboxResult:
    is_root = os.geteuid() == 0
    code_dir, work_dir, io_dir = root / "code", root / "work", root / "io"
    for d in (code_dir, work_dir, io_dir):
        d.mkdir()
    (code_dir / "harness.py").write_text(_HARNESS % {"preload": _PRELOAD, "uid": NOBODY_UID})
    code_path = code_dir / "code.py"
    code_path.write_text(source, encoding="utf-8")
    for extra in readonly_paths:
        src = Path(extra)
        dst = code_dir / src.name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    # Read-only code: files 0444, directories 0555; owned by root when we are root.
    for dirpath, dirnames, filenames in os.walk(code_dir):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)
    os.chmod(code_dir, 0o555)
    os.chmod(root, 0o711)
    if is_root:
        os.chown(work_dir, NOBODY_UID, NOBODY_UID)
    os.chmod(work_dir, 0o700)
    os.chmod(io_dir, 0o700)
    (io_dir / "stdin.json").write_text(json.dumps(payload))
    cfg = {
        "network_off": not network,
        "cpu_s": cpu_s,
        "memory_bytes": memory_bytes,
        "file_size_bytes": file_size_bytes,
        "max_procs": max_procs,
        "preload": imported_modules(source),
    }
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work_dir), "TMPDIR": str(work_dir)}
    r_fd, w_fd = os.pipe()
    argv = [
        sys.executable,
        "-I",
        "-B",
        str(code_dir / "harness.py"),
        str(w_fd),
        str(code_path),
        entrypoint,
        json.dumps(cfg),
    ]
    try:
        with (
            open(io_dir / "stdin.json", "rb") as fin,
            open(io_dir / "out", "wb") as fout,
            open(io_dir / "err", "wb") as ferr,
        ):
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    cwd=work_dir,
                    env=env,
                    pass_fds=(w_fd,),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                return SandboxResult(
                    ok=False, error_flag="start_failed", error=str(e), seconds=time.monotonic() - start
                )
            finally:
                os.close(w_fd)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            # Always kill the group: stray children (fork bombs, daemons) die with the call.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raw = _drain(r_fd)
    finally:
        os.close(r_fd)
    stdout, stderr = _read_capped(io_dir / "out"), _read_capped(io_dir / "err")
    res = SandboxResult(ok=False, stdout=stdout, stderr=stderr, seconds=time.monotonic() - start)
    frames = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            frames.append(json.loads(line))
        except json.JSONDecodeError:
            frames.append({"frame": "garbage"})
    if frames and frames[0].get("frame") == "isolation":
        res.isolation = {k: v for k, v in frames.pop(0).items() if k != "frame"}
    res.isolation.setdefault("process_group_kill", True)
    if timed_out:
        res.error_flag, res.error = "timeout", f"no result within {timeout_s:g}s (process group killed)"
        return res
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not frames:
        res.error_flag, res.error = "cpu_limit", f"CPU time limit of {cpu_s}s exceeded"
        return res
    if len(frames) != 1 or frames[0].get("frame") != "result":
        if not frames:
            res.error_flag = "killed"
            res.error = f"exited with status {proc.returncode} and no result; stderr: {stderr[-500:]}"
        else:
            res.error_flag, res.error = "protocol", f"result pipe held {len(frames)} frames, expected 1"
        return res
    frame = frames[0]
    if frame.get("ok"):
        res.ok, res.value = True, frame.get("value")
        return res
    err = str(frame.get("error", ""))
    res.error = err
    res.error_flag = "memory" if err.startswith("MemoryError") else "exception"
    return res


def _drain(fd: int) -> bytes:
    # Non-blocking: a child that escaped the process group may still hold the write end.
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

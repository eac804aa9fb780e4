"""What a sandboxed call returns (`SandboxResult`), and how the host reads it from the result pipe (`classify`).

The relay (`sandbox_harness.py`, PID 1 of the call's namespace) writes JSON frames, one a line: an `isolation`
frame once the fences are up, then the code's one `result` frame (``ok`` with a ``value``, or an ``error``), and a
`forged` frame where a process other than the code's own wrote on the channel. `classify` turns those frames, the
launcher's exit status, the deadline and the memory cgroup's kills into one `SandboxResult` with one error flag.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SandboxResult:
    """Outcome of one sandboxed call.

    `error_flag` (None when ok) is one of: `timeout` (wall clock), `cpu_limit`,
    `memory` (MemoryError, or killed over the grade's memory cgroup), `exception`
    (raised in the code), `killed` (died by a signal or exited without a
    result), `forged` (a process other than the code's own sent on its result
    channel), `malformed` (a frame that is not a JSON object of the protocol's
    shape, or over 4 MiB), `protocol` (not exactly one result frame),
    `start_failed` (the sandbox could not be built), `unavailable` (no backend
    works here).
    """

    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error_flag: str | None = None
    error: str = ""
    isolation: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def classify(
    res: SandboxResult,
    raw: bytes,
    returncode: int,
    timed_out: bool,
    oom_kills: int,
    backend: str,
    *,
    timeout_s: float,
    memory_bytes: int,
    cpu_s: int,
) -> SandboxResult:
    """Fill ``res`` from what the call left: the result pipe's bytes (``raw``), the launcher's exit status, whether
    the host's deadline passed and how many processes the memory cgroup killed; the limits name themselves in the
    error text. The first problem found wins, in the order of the branches below."""
    frames, malformed = _frames(raw)
    forged = [f for f in frames if f["frame"] == "forged"]
    if forged:
        res.error_flag = "forged"
        res.error = (
            f"a process other than the code's own (pid {forged[0].get('pid')} inside) wrote to its result channel"
        )
        return res
    if malformed:
        res.error_flag, res.error = "malformed", malformed
        return res
    started = bool(frames) and frames[0]["frame"] == "isolation"
    if started:
        res.isolation = {k: v for k, v in frames.pop(0).items() if k != "frame"}
        res.isolation["process_group_kill"] = True
    # The relay reports the code's process dying by signal N as exit status 128+N; -N is the launcher's own signal.
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if timed_out:
        res.error_flag, res.error = "timeout", f"no result within {timeout_s:g}s (sandbox killed)"
        return res
    answered = len(frames) == 1 and frames[0]["frame"] == "result" and frames[0]["ok"]
    if oom_kills and not answered:
        res.error_flag = "memory"
        res.error = f"MemoryError: over the grade's memory cap of {memory_bytes} bytes ({oom_kills} killed)"
        return res
    if started and not frames and sig in (signal.SIGXCPU, signal.SIGKILL):
        res.error_flag, res.error = "cpu_limit", f"CPU time limit of {cpu_s}s exceeded"
        return res
    if len(frames) == 1 and frames[0].get("kind") == "setup":
        res.error_flag, res.error = "start_failed", f"the {backend} sandbox could not be set up: {frames[0]['error']}"
        return res
    if not started and not frames:
        res.error_flag = "start_failed"
        res.error = f"the {backend} sandbox did not start (status {returncode}): {res.stderr[-500:].strip()}"
        return res
    if len(frames) != 1 or frames[0]["frame"] != "result":
        if not frames:
            res.error_flag = "killed"
            res.error = f"exited with status {returncode} and no result; stderr: {res.stderr[-500:]}"
        else:
            res.error_flag, res.error = "protocol", f"result pipe held {len(frames)} frames, expected 1"
        return res
    frame = frames[0]
    if frame["ok"]:
        res.ok, res.value = True, frame["value"]
        return res
    res.error = frame["error"]
    res.error_flag = "memory" if res.error.startswith("MemoryError") else "exception"
    return res


def _frames(raw: bytes) -> tuple[list[dict[str, Any]], str]:
    """The well-formed frames on the result pipe, and a one-line reason if any line was not one."""
    frames, malformed = [], ""
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():  # the relay puts a forged frame on a line of its own
            continue
        try:
            frame = json.loads(line)
        except (ValueError, RecursionError) as e:  # an int too long to read back; nesting too deep
            malformed = malformed or f"result line {n} is not JSON the host can read ({type(e).__name__})"
            continue
        if _well_formed(frame):
            frames.append(frame)
        else:
            malformed = malformed or f"result line {n} is not a frame of the protocol: {line[:80]!r}"
    return frames, malformed


def _well_formed(frame: Any) -> bool:
    if not isinstance(frame, dict):
        return False
    if frame.get("frame") == "result":
        ok = frame.get("ok")
        return (ok is True and "value" in frame) or (ok is False and isinstance(frame.get("error"), str))
    return frame.get("frame") in ("isolation", "forged")

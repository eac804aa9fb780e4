"""`python` grader: `source` defining `grade(sample, item) -> float`, run in `agentrft.tools.sandbox`.

Each call is a fresh interpreter in its own namespaces (no network, no host
files or processes; 2 min, 2 GB address space, 1 GB written in all by
default — configurable; see `tools/sandbox.py`) that receives
`grade(sample_dict, item)`; `sample_dict` has output_text, output_json,
output_tools, choices (and trajectory when grading one). The source is read
once at load time (from `source`, or `source_path`, relative to the spec file's directory), so
editing files later — by the grader itself or by a policy's tool — cannot
change what runs. Only the returned value counts; stdout is kept for
diagnostics and never parsed.

A source in which nothing binds the name `grade` (no `def`, assignment or
import) is refused at load time (`GraderSpecError` on `source`),
before any model loads: it could only ever fail every call.

Isolation: `sandbox: auto` (default) uses bubblewrap, else util-linux
`unshare`; if neither works here the spec is refused at load time
(`GraderSpecError` on `sandbox`, naming the fix). `sandbox: "none"` runs the
code without isolation (rlimits only) and must be asked for explicitly. What
was in force is in every grade's `metadata["isolation"]` and in
`last_isolation`.

Declared range *(choice)*: OpenAI's graders guide says a grade is in the range
0 to 1 and the python grader has no range field, so the default is `[0, 1]`;
`range: [low, high]` (an agentrft extension, as on `score_model`) widens it, and
its top is the grader's maximum reward (the default `pass_threshold`). Unlike
`score_model`, a value outside the range is not clamped: it is an error.

Flags (reward 0 with the flag):
- `python_grader_runtime_error`: the code raised (including MemoryError past the
  memory limit, OSError writing outside /tmp), or returned a
  non-number (bool, str), a non-finite number, a number outside the declared
  range (1e308, 10**400, 1.5 by default), or a process it started wrote a result of
  its own on the code's result channel (a forged result: the code's doing, not the
  sandbox's).
- `unresponsive_reward_error`: wall-clock timeout or CPU limit (the sandbox is killed).
- `python_grader_server_error`: the sandbox itself failed (could not be set
  up, died by a signal without a result, or a corrupt result channel).
"""

from __future__ import annotations

import ast
import asyncio
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrft.graders.base import Grader, GraderFailure, GraderSpecError, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.tools.sandbox import (
    MAX_BYTES,
    MAX_PROCS,
    MAX_TIMEOUT_S,
    SandboxResult,
    SandboxUnavailable,
    resolve_backend,
    run_sandboxed,
)

_FLAGS = {
    "exception": "python_grader_runtime_error",
    "memory": "python_grader_runtime_error",
    "forged": "python_grader_runtime_error",
    "timeout": "unresponsive_reward_error",
    "cpu_limit": "unresponsive_reward_error",
    "killed": "python_grader_server_error",
    "protocol": "python_grader_server_error",
    "start_failed": "python_grader_server_error",
    "unavailable": "python_grader_server_error",
}


ENTRYPOINT = "grade"


def bound_names(source: str) -> set[str]:
    """Names the module may bind when it runs: its definitions, assignments and imports, also inside
    top-level if/try/with blocks. Generous on purpose (a name bound only inside a function counts too):
    it refuses a source only when no statement anywhere could bind the name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


class PythonSpec(SpecBase):
    type: Literal["python"]
    source: str | None = None
    source_path: str | None = None
    image_tag: str | None = None  # accepted for OpenAI compatibility; there is no image here
    # bounded above too: `timeout_s: 1e308` would load and then fail every grade
    timeout_s: float = Field(default=120.0, gt=0, le=MAX_TIMEOUT_S)
    memory_bytes: int = Field(default=2 * 1024**3, gt=0, le=MAX_BYTES)
    file_size_bytes: int = Field(default=1024**3, ge=0, le=MAX_BYTES)
    max_procs: int = Field(default=32, ge=1, le=MAX_PROCS)
    disk_bytes: int = Field(
        default=1024**3, gt=0, le=MAX_BYTES
    )  # everything written (files anywhere, /dev/shm) together
    sandbox: Literal["auto", "bwrap", "unshare", "none"] = "auto"  # "none" only if you accept no isolation
    range: tuple[float, float] = (0.0, 1.0)


@register_grader("python")
class PythonGrader(Grader):
    Spec = PythonSpec
    is_async = True  # a subprocess per call: run in a thread so many can be in flight

    def __init__(self, name: str, source: str, spec: PythonSpec, where: str = "") -> None:
        lo, hi = spec.range
        pre = f"{where}." if where else ""
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise GraderSpecError(f"{pre}range", "must be [low, high], finite numbers with low < high")
        super().__init__(name, spec.pass_threshold, max_reward=hi)
        try:
            compile(source, "<python grader>", "exec")
        except SyntaxError as e:
            raise GraderSpecError(f"{pre}source", f"Python syntax error at line {e.lineno}: {e.msg}") from None
        if ENTRYPOINT not in bound_names(source):
            raise GraderSpecError(
                f"{pre}source",
                f"defines no {ENTRYPOINT}(sample, item) function (no def, assignment or import binds it; every call would fail)",
            )
        self.source = source
        self.spec = spec
        self.last_isolation: dict[str, Any] = {}

    @classmethod
    def build(cls, spec: PythonSpec, where: str, options: LoadOptions) -> PythonGrader:
        pre = f"{where}." if where else ""
        if (spec.source is None) == (spec.source_path is None):
            raise GraderSpecError(f"{pre}source", "give exactly one of source or source_path")
        source = spec.source
        if source is None:
            path = Path(str(spec.source_path))
            if not path.is_absolute() and options.base_dir is not None:
                path = Path(options.base_dir) / path
            try:
                source = path.read_text(encoding="utf-8")
            except OSError as e:
                raise GraderSpecError(f"{pre}source_path", f"cannot read: {e.strerror or e}") from None
            except UnicodeDecodeError as e:
                raise GraderSpecError(f"{pre}source_path", f"{path}: not UTF-8 text (byte {e.start})") from None
        try:  # refuse at load time, not with every grade, when the code cannot be isolated here
            resolve_backend(spec.sandbox)
        except SandboxUnavailable as e:
            raise GraderSpecError(f"{pre}sandbox", str(e)) from None
        return cls(spec.name or "python", source, spec, where)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        return self._finish(self._run(sample, item))

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        return self._finish(await asyncio.to_thread(self._run, sample, item))

    def _run(self, sample: Sample, item: dict[str, Any]) -> SandboxResult:
        s = self.spec
        return run_sandboxed(
            self.source,
            {"sample": sample.to_dict(), "item": item},
            entrypoint=ENTRYPOINT,
            timeout_s=s.timeout_s,
            memory_bytes=s.memory_bytes,
            file_size_bytes=s.file_size_bytes,
            disk_bytes=s.disk_bytes,
            max_procs=s.max_procs,
            sandbox=s.sandbox,
        )

    def _finish(self, res: SandboxResult) -> Score:
        self.last_isolation = res.isolation
        meta = {"isolation": res.isolation, "seconds": round(res.seconds, 4)}
        if not res.ok:
            flag = _FLAGS.get(res.error_flag or "", "python_grader_server_error")
            raise GraderFailure(flag, f"{res.error_flag}: {res.error}")
        return Score(self._checked(res.value), metadata=meta)

    def _checked(self, v: Any) -> float:
        """The reward, or `python_grader_runtime_error` when it is not a number in the declared range."""
        lo, hi = self.spec.range
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            shown = repr(v)[:80]
        elif (isinstance(v, int) or math.isfinite(v)) and lo <= v <= hi:  # int vs float compares exactly
            return float(v)
        else:
            shown = repr(v) if len(repr(v)) <= 40 else f"an int of {len(str(abs(v)))} digits"
        raise GraderFailure(
            "python_grader_runtime_error",
            f"grade() returned {shown}; expected a finite number in the declared range [{lo:g}, {hi:g}]"
            " (widen it with the spec's `range`)",
        )

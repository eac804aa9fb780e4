"""An agent program as the policy's client: one process per episode, talking to an in-process server.

`CommandAgent` plays a task by starting ``agent.command`` (e.g. ``python my_agent.py``) with

* the task as JSON on stdin, and in the file ``$AGENTRFT_TASK_FILE``: ``task_id``, ``question``
  (the text of its last user message), ``messages`` (the task's prompt, OpenAI format) and
  ``item`` (the task's grading data, less the fields in ``agent.withhold``: the agent must not
  see the reference answer);
* ``OPENAI_BASE_URL`` — ``http://127.0.0.1:PORT/v1/sessions/<id>``, a session of an
  OpenAI-compatible server (`serve.create_app`) that agentrft runs over the policy while the
  rollout lasts, and ``OPENAI_API_KEY`` — a key made for that server; any OpenAI client works
  unchanged. ``AGENTRFT_SESSION_ID`` names the session.

The episode's final answer is what the command writes to ``$AGENTRFT_ANSWER_FILE`` (JSON
``{"answer": ...}`` or plain text) if it writes it, else its stdout, stripped (logs go to stderr).
Its trajectory is the session (`sessions.Session.trajectory`): the stitched token record, the tool
calls the agent's requests carried, the final answer. A command that times out, exits non-zero,
is killed or cannot start is an episode error (``status: "error"`` with the reason): never a
reward, and never trained on (`Trajectory.untrainable_reason`).

Concurrency: at most ``agent.max_concurrency`` commands run at once; their requests meet in the
policy's batching sampler like the in-process agent loop's. Each request samples from the run's
distribution whatever the agent asks (`serve` ``sampling``): the trainer trains what was sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrft.envs.base import Environment
from agentrft.rollout.serve_request import ServeLimits
from agentrft.rollout.sessions import Session
from agentrft.samplers.base import SamplingParams, TokenSampler
from agentrft.types import Task, Trajectory, new_id

MAX_OUTPUT_BYTES = 1024 * 1024


class AgentCommandConfig(BaseModel):
    """An agent program run once per episode (see `agent_command`)."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(description='the command line, e.g. "python my_agent.py" (split as a POSIX shell would)')
    timeout_s: float = Field(default=600.0, gt=0, description="an episode's command past this is killed: an error")
    max_concurrency: int = Field(default=8, ge=1, description="commands running at once")
    withhold: list[str] = Field(
        default_factory=lambda: ["answer", "exe_ans", "program"],
        description="item fields left out of the task the agent reads (the reference answer)",
    )
    cwd: str | None = Field(default=None, description="working directory of the command; None: the current one")

    @field_validator("command")
    @classmethod
    def _splits(cls, value: str) -> str:
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split the command line: {exc}") from None
        if not argv:
            raise ValueError("the command is empty")
        return value

    def argv(self) -> list[str]:
        return shlex.split(self.command)

    def missing_program(self) -> str | None:
        """Why the command cannot start (its program is not found), or None."""
        program = self.argv()[0]
        base = Path(self.cwd) if self.cwd else Path.cwd()
        if os.sep in program:
            path = Path(program) if Path(program).is_absolute() else base / program
            return None if os.access(path, os.X_OK) else f"{program}: no such executable file"
        return None if shutil.which(program) else f"{program}: not found on PATH"


def task_payload(task: Task, withhold: list[str]) -> dict[str, Any]:
    """What the agent reads on stdin for `task`."""
    user = [m for m in task.messages if m.role == "user"]
    return {
        "task_id": task.id,
        "question": user[-1].text() if user else "",
        "messages": [m.to_openai() for m in task.messages],
        "item": {k: v for k, v in task.data.items() if k not in withhold},
    }


def read_answer(path: Path, stdout: bytes) -> str:
    """The final answer: the answer file (``{"answer": ...}`` or text) if written, else stdout."""
    if path.exists() and path.stat().st_size:
        text = path.read_text(encoding="utf-8", errors="replace")
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(text)
            if isinstance(value, dict) and "answer" in value:
                return str(value["answer"]).strip()
        return text.strip()
    return stdout.decode("utf-8", errors="replace").strip()


def _tail(data: bytes, limit: int = 300) -> str:
    lines = [ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-limit:] if lines else "(nothing on stderr)"


class CommandAgent:
    """Plays episodes by running an agent command against a session of an in-process server."""

    def __init__(
        self,
        config: AgentCommandConfig,
        env: Environment,
        sampler: TokenSampler,
        *,
        params: SamplingParams,
        tool_format: str = "xml",
        limits: ServeLimits | None = None,
    ) -> None:
        self.config, self.env, self.sampler = config, env, sampler
        self.params, self.tool_format, self.limits = params, tool_format, limits
        self.sessions = (limits or ServeLimits()).session_book(on_evict=self._keep_evicted)
        self._live: set[str] = set()  # the session ids of episodes being played
        self._evicted: dict[str, tuple[Session, str]] = {}  # of those, the sessions the book let go, and why
        self._gate: asyncio.Semaphore | None = None  # made in `running()`: each rollout may run on a new event loop
        self._base: str | None = None
        self._key = secrets.token_urlsafe(24)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve the policy on a free loopback port for as long as the block runs."""
        import uvicorn

        from agentrft.rollout.serve import create_app
        from agentrft.rollout.serve_http import server_config

        app = create_app(
            self.sampler,
            tool_format=self.tool_format,
            api_key=self._key,
            sessions=self.sessions,
            sampling=self.params,
            limits=self.limits,
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = server_config(
            app,
            self.limits or ServeLimits(),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        self._gate = asyncio.Semaphore(self.config.max_concurrency)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if serving.done():
                    serving.result()  # raises what stopped it
                    raise RuntimeError("the agent server stopped before it started")
                await asyncio.sleep(0.01)
            self._base = f"http://127.0.0.1:{port}/v1"
            yield
        finally:
            self._base, self._gate = None, None
            server.should_exit = True
            with contextlib.suppress(Exception):
                await serving
            sock.close()

    async def play(self, task: Task, *, group_id: str, run_id: str, policy_version: int | None) -> Trajectory:
        """One episode of `task` (never raises for the agent's misbehaviour: that is an episode error)."""
        if self._base is None or self._gate is None:
            raise RuntimeError("CommandAgent.play needs the server: call it inside `async with agent.running()`")
        sid = new_id()
        self._live.add(sid)
        try:
            async with self._gate:
                answer, error = await self._run(task, f"{self._base}/sessions/{sid}", sid)
            session = self.sessions.pop(sid)
        finally:
            self._live.discard(sid)
            kept = self._evicted.pop(sid, None)
        if kept is not None:  # the server let it go mid-episode (too idle, or too much held): not trained, but
            evicted, reason = kept  # what it held, and what the agent asked after, stay in the record
            error = error or f"session evicted: {reason}"
            if session is not None:
                evicted.calls.extend(session.calls)
            session = evicted
        session = session or Session(sid)  # no session: the agent never called the model
        traj = session.trajectory(
            policy=self.sampler.policy,
            run_id=run_id,
            task_id=task.id,
            group_id=group_id,
            env=self.env.ref(),
            final_answer=None if error else answer,
            status="error" if error else None,
            error=error,
            metadata={"agent_command": self.config.command},
        )
        if not session.calls and policy_version is not None:
            traj.policy_version = policy_version
        return traj

    def _keep_evicted(self, session: Session, reason: str) -> None:
        """The book evicts a session (`sessions.SessionBook`): if it is a running episode's, that episode's `play`
        records what it held (a session evicted twice: both parts, in order); any other is the server's to drop."""
        if session.id not in self._live:
            return
        if (earlier := self._evicted.get(session.id)) is not None:
            earlier[0].calls.extend(session.calls)
            return
        self._evicted[session.id] = (session, reason)

    async def _run(self, task: Task, base_url: str, sid: str) -> tuple[str, str | None]:
        """(final answer, episode error or None) of one run of the command."""
        cfg = self.config
        with tempfile.TemporaryDirectory(prefix="agentrft-agent-") as tmp:
            answer_file, task_file = Path(tmp) / "answer.json", Path(tmp) / "task.json"
            payload = json.dumps(task_payload(task, cfg.withhold)).encode()
            task_file.write_bytes(payload)
            env = {
                **os.environ,
                "OPENAI_BASE_URL": base_url,
                "OPENAI_API_KEY": self._key,
                "AGENTRFT_SESSION_ID": sid,
                "AGENTRFT_ANSWER_FILE": str(answer_file),
                "AGENTRFT_TASK_FILE": str(task_file),
            }
            try:
                proc = await asyncio.create_subprocess_exec(
                    *cfg.argv(),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=env,
                    cwd=cfg.cwd,
                    start_new_session=True,  # its own process group: a timeout kills its children too
                )
            except OSError as exc:
                return "", f"agent command could not start: {type(exc).__name__}: {exc}"
            try:
                stdout, stderr = await asyncio.wait_for(proc.communicate(payload), cfg.timeout_s)
            except TimeoutError:
                _kill(proc)
                await proc.wait()
                return "", f"agent command timed out after {cfg.timeout_s:g} s"
            finally:
                if proc.returncode is None:  # cancelled (runner wall time): leave nothing running
                    _kill(proc)
            if proc.returncode and proc.returncode < 0:
                return "", f"agent command was killed by signal {signal.Signals(-proc.returncode).name}"
            if proc.returncode:
                return "", f"agent command exited with code {proc.returncode}: {_tail(stderr)}"
            if len(stdout) > MAX_OUTPUT_BYTES:
                return "", f"agent command wrote {len(stdout)} bytes to stdout (at most {MAX_OUTPUT_BYTES})"
            return read_answer(answer_file, stdout), None


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)

"""How `serve` meets the network: uvicorn with a connection cap, a deadline for a request's headers, and one
log line per condition.

A client that opens sockets and sends nothing (or a header a byte at a time) holds a file descriptor each;
past the process's open-file limit every accept failed and asyncio logged a traceback per failure (149,503
of them, 60 MB in 10 s, while ``/v1/models`` timed out). Here:

* at most ``ServeLimits.max_connections`` connections are open at once (kept below the open-file limit,
  which `raise_open_files` lifts to its hard cap first); a connection past it is closed as it arrives;
* a connection whose request headers are not complete ``header_timeout_s`` after it opened (or after its
  previous response) is closed; the body has its own deadline (`serve_request.read_body`);
* `ConditionLog` lets one record of each kind through per minute, then one line saying how many were held back.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentrft.rollout.serve_request import ServeLimits

_OPEN_FILES_SPARE = 64  # descriptors kept for the store, the model's files and the log


class ConditionLog(logging.Filter):
    """Per message template: the first record passes, the rest are held back for ``window_s`` seconds; the
    next one after that passes with a count of those held back."""

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template) -> (shown at, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        shown = self._seen.get(key)
        if shown is not None and now - shown[0] < self.window_s:
            self._seen[key] = (shown[0], shown[1] + 1)
            return False
        if shown is not None and shown[1]:
            record.msg = f"{record.msg} ({shown[1]} more like it in the last {self.window_s:g} s)"
            record.exc_info = None  # the first one showed its traceback
        self._seen[key] = (now, 0)
        return True

    def forget(self) -> None:
        """Start over: every condition's next record passes."""
        self._seen.clear()


CONDITIONS = ConditionLog()  # one for the process: each logger it guards holds it once


def raise_open_files() -> int:
    """Lift this process's soft open-file limit to its hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection past ``max_connections`` and one whose request headers are
    not complete within ``header_timeout_s``."""
    log = logging.getLogger("agentrft.serve")

    class Guarded(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _armed_for: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log.warning("more than %d connections open: new ones are closed as they arrive", max_connections)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.scope is not self._armed_for:  # a request's headers are in: the body has its own deadline
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._armed_for = self.scope
            self._deadline = self.loop.call_later(header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.scope is self._armed_for and not self.transport.is_closing():
                log.warning("a request's headers took longer than %g s: connection closed", header_timeout_s)
                self.transport.close()

    return Guarded


def server_config(app: Any, limits: ServeLimits, **kw: Any) -> uvicorn.Config:
    """The uvicorn config every agentrft server runs with (`serve`, an agent command's server)."""
    soft = raise_open_files()
    cap = max(1, min(limits.max_connections, soft - _OPEN_FILES_SPARE))
    for name in ("asyncio", "uvicorn.error", "agentrft.serve"):
        if CONDITIONS not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(CONDITIONS)
    return uvicorn.Config(app, http=guarded_protocol(cap, limits.header_timeout_s), **kw)

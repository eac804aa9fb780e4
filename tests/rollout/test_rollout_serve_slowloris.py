"""A client that holds connections open and sends nothing (or trickles) cannot starve the server, and the log
gets one line per condition, not one per failure (issue 47, item 6)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
import httpx
import uvicorn
from rollout_fakes import FakeSampler

from agentrft.rollout.serve import ServeLimits, create_app
from agentrft.rollout.serve_http import CONDITIONS, ConditionLog, server_config

LIMITS = ServeLimits(max_connections=16, header_timeout_s=0.5, body_timeout_s=0.5)


@contextlib.contextmanager
def guarded_server(limits: ServeLimits) -> Iterator[tuple[str, int]]:
    app = create_app(FakeSampler(["ok"] * 100), limits=limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, limits, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _closed_by_server(s: socket.socket, within_s: float = 30.0) -> bool:
    """Whether the server closes ``s`` (a generous deadline: the event, not its speed, is under test)."""
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:  # closed with data unread: the kernel answers with a reset
        return True
    except TimeoutError:
        return False
    return True


def test_idle_and_slow_connections_are_closed_and_the_server_stays_up(caplog: pytest.LogCaptureFixture) -> None:
    CONDITIONS.forget()  # another test's lines within the minute would hold these back
    with caplog.at_level(logging.WARNING), guarded_server(LIMITS) as (host, port):
        idle = [socket.create_connection((host, port)) for _ in range(40)]  # far past the cap of 16
        slow = socket.create_connection((host, port))
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        assert all(_closed_by_server(s) for s in [*idle, slow])
        for s in [*idle, slow]:
            s.close()
        with socket.create_connection((host, port)) as body:  # headers in, a body that never finishes
            body.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 500\r\n\r\n{"messages": ['
            )
            body.settimeout(30)
            assert body.recv(4096).startswith(b"HTTP/1.1 408 ")
            assert _closed_by_server(body)
        r = httpx.get(f"http://{host}:{port}/v1/models", timeout=30)
        assert r.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "agentrft.serve"]
    assert 1 <= sum("connections open" in m for m in lines) <= 2  # 24 refusals: one line
    assert 1 <= sum("headers took longer" in m for m in lines) <= 2  # 17 slow ones: one line
    assert not [r for r in caplog.records if "Too many open files" in r.getMessage()]


def test_condition_log_lets_one_record_through_per_window() -> None:
    log = ConditionLog(window_s=3600)
    records = [logging.LogRecord("x", logging.WARNING, __file__, 1, "accept failed: %s", ("EMFILE",), None)] * 1000
    assert sum(log.filter(r) for r in records) == 1
    other = logging.LogRecord("x", logging.WARNING, __file__, 1, "another condition", None, None)
    assert log.filter(other)

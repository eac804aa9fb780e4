"""HTTP tools against a real local server: results, error flags, timeouts, bad answers, and the jsonl env using them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentrft.envs.jsonl import JsonlDataError, JsonlEnv
from agentrft.envs.registry import make_env
from agentrft.inputs import InputError
from agentrft.tools.http_tool import HttpEndpoint, HttpTool, parse_endpoints

SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_rate",
        "parameters": {
            "type": "object",
            "properties": {"base": {"type": "string"}, "quote": {"type": "string"}},
            "required": ["base", "quote"],
        },
    },
}
RATES = {("USD", "EUR"): 0.92}


RECEIVED: list[tuple[str, dict, str | None]] = []  # (path, arguments, Authorization) of every call


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RECEIVED.append((self.path, body, self.headers.get("Authorization")))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/boom":
            self._send(500, b"internal trouble")
        elif self.path == "/text":
            self._send(200, b"not json")
        elif self.path == "/odd":
            self._send(200, b'{"value": 1}')
        elif self.path == "/long":
            self._send(200, json.dumps({"result": "x" * 5000}).encode())
        else:
            pair = (body["base"], body["quote"])
            answer = {"result": RATES[pair]} if pair in RATES else {"error": f"no rate for {pair[0]}/{pair[1]}"}
            self._send(200, json.dumps(answer).encode())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _call(tool: HttpTool, args: object):
    return asyncio.run(tool.call(args))  # type: ignore[arg-type]


def test_result_error_flag_and_headers(server: str) -> None:
    tool = HttpTool(SCHEMA, HttpEndpoint(url=f"{server}/rate", headers={"Authorization": "Bearer t"}))
    ok = _call(tool, '{"base": "USD", "quote": "EUR"}')
    assert ok.ok and ok.content == "0.92" and ok.latency_s > 0
    assert RECEIVED[-1] == ("/rate", {"base": "USD", "quote": "EUR"}, "Bearer t")
    flagged = _call(tool, {"base": "USD", "quote": "XXX"})
    assert flagged.error_kind == "tool_error" and flagged.content == "Error: get_rate: no rate for USD/XXX"


def test_arguments_are_checked_against_the_declared_schema_before_any_call(server: str) -> None:
    tool = HttpTool(SCHEMA, HttpEndpoint(url=f"{server}/rate"))
    before = len(RECEIVED)
    missing = _call(tool, {"base": "USD"})
    assert missing.error_kind == "bad_arguments" and "'quote' is a required property" in missing.content
    wrong = _call(tool, {"base": 1, "quote": "EUR"})
    assert wrong.error_kind == "bad_arguments" and wrong.content.startswith("Error: bad arguments for get_rate: base:")
    assert _call(tool, "{oops").error_kind == "malformed" and _call(tool, "[1]").error_kind == "malformed"
    assert len(RECEIVED) == before


@pytest.mark.parametrize(
    ("path", "kind", "text"),
    [
        ("/boom", "http_error", "the endpoint answered HTTP 500: internal trouble"),
        ("/text", "bad_response", "the endpoint's answer is not JSON"),
        ("/odd", "bad_response", 'neither {"result": ...} nor {"error": "..."}'),
    ],
)
def test_bad_answers_are_tool_errors(server: str, path: str, kind: str, text: str) -> None:
    res = _call(HttpTool(SCHEMA, HttpEndpoint(url=f"{server}{path}")), {"base": "USD", "quote": "EUR"})
    assert res.error_kind == kind and text in res.content and res.error == res.content


def test_timeout_unreachable_and_long_output(server: str) -> None:
    slow = _call(HttpTool(SCHEMA, HttpEndpoint(url=f"{server}/slow", timeout_s=0.2)), {"base": "a", "quote": "b"})
    # a timeout, not the endpoint's late answer (1 s): the behaviour, whatever the machine's load
    assert slow.error_kind == "timeout" and "timed out after 0.2 s" in slow.content
    gone = _call(HttpTool(SCHEMA, HttpEndpoint(url="http://127.0.0.1:9/x", timeout_s=2)), {"base": "a", "quote": "b"})
    assert gone.error_kind == "unreachable"
    long = _call(
        HttpTool(SCHEMA, HttpEndpoint(url=f"{server}/long"), max_output_chars=100), {"base": "a", "quote": "b"}
    )
    assert long.truncated and long.content.endswith("…[truncated 4900 chars]") and long.ok


def test_endpoint_specs_are_checked() -> None:
    parsed = parse_endpoints({"a": "http://h/a", "b": {"url": "https://h/b", "timeout_s": 3}}, "job.json")
    assert parsed["a"].timeout_s == 10.0 and parsed["b"].timeout_s == 3
    with pytest.raises(InputError, match="^job.json: field 'a.url': must be an http:// or https:// URL"):
        parse_endpoints({"a": "ftp://h/a"}, "job.json")
    with pytest.raises(InputError, match="^job.json: field 'b.timeout_s'"):
        parse_endpoints({"b": {"url": "http://h", "timeout_s": 0}}, "job.json")


def _rows(path: Path) -> Path:
    row = {"messages": [{"role": "user", "content": "12 USD in EUR?"}], "tools": [SCHEMA], "answer": "11.04"}
    path.write_text(json.dumps(row) + "\n")
    return path


def test_the_jsonl_env_runs_declared_tools_through_their_endpoints(server: str, tmp_path: Path) -> None:
    train = _rows(tmp_path / "train.jsonl")
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"get_rate": f"{server}/rate"}))
    env = make_env(f"jsonl:{train}?endpoints={endpoints}&valid={train}")
    assert isinstance(env, JsonlEnv) and env.implemented_tools() == ["get_rate"]
    episode = env.start(env.tasks("valid")[0])
    res = asyncio.run(episode.call_tool("get_rate", '{"base": "USD", "quote": "EUR"}'))
    assert res.ok and res.content == "0.92"
    with pytest.raises(JsonlDataError, match="tool endpoint 'lookup': no row of .* declares a tool of that name"):
        JsonlEnv(train, endpoints={"lookup": HttpEndpoint(url=f"{server}/x")})

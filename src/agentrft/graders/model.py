"""HTTP graders: `score_model`, `label_model` (an LLM judge behind an OpenAI-compatible
`/v1/chat/completions`) and `endpoint` (your own scoring service).

Judges: `input` is a list of `{role, content}` messages whose contents are
templates. The judge must reply with JSON `{"result": …, "steps": [...]}`
(code fences tolerated): a float for score_model (clamped to `range`), a label
for label_model (a bare reply equal to one of the labels is accepted too).
Replies are cached on disk by a hash of (url, request body) in SQLite, so a
re-grade costs nothing and is reproducible (including at temperature > 0).

Flags: unparsable or non-numeric reply → `model_grader_parse_error`; a refusal
(`message.refusal` set or `finish_reason == "content_filter"`) →
`model_grader_refusal_error`; HTTP errors, timeouts, connection failures (after
`max_retries`, retried by `agentrft.http_retry`) → `model_grader_server_error`. Endpoint graders POST
`{sample, item, trace_id}` and read `{"score": float}`; transport failures are
`unresponsive_reward_error`, a bad body `other_error`.
Concurrency is bounded per grader (`LoadOptions.concurrency`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import sqlite3
import uuid
import weakref
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from agentrft.graders.base import Grader, GraderFailure, GraderSpecError, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.graders.template import compile_template
from agentrft.http_retry import RetriesExhausted, RetryPolicy, send_with_retries


class ReplyCache:
    """SQLite map request-hash → reply JSON (one short connection per access: thread-safe, tiny)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "judge_replies.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(self.path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, body TEXT NOT NULL)")

    @staticmethod
    def key(url: str, body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps([url, body], sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT body FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, body: dict[str, Any]) -> None:
        with sqlite3.connect(self.path) as db:
            db.execute("INSERT OR REPLACE INTO replies (key, body) VALUES (?, ?)", (key, json.dumps(body)))


class _Http:
    """Per-event-loop AsyncClient and semaphore (asyncio objects cannot cross loops)."""

    def __init__(self, options: LoadOptions, timeout_s: float) -> None:
        self.options = options
        self.timeout_s = timeout_s
        self._per_loop: weakref.WeakKeyDictionary[Any, tuple[httpx.AsyncClient, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        pair = self._per_loop.get(loop)
        if pair is None:
            kw: dict[str, Any] = {"timeout": self.timeout_s}
            if self.options.transport is not None:
                kw["transport"] = self.options.transport
            pair = (httpx.AsyncClient(**kw), asyncio.Semaphore(max(1, self.options.concurrency)))
            self._per_loop[loop] = pair
        return pair

    async def post(
        self, url: str, body: dict[str, Any], headers: dict[str, str], retries: int, fail_flag: str
    ) -> dict[str, Any]:
        client, sem = self.get()
        # A grade waits on this call inside a batch: shorter waits than the sampler's.
        policy = RetryPolicy(max_retries=retries, backoff_s=0.2, max_backoff_s=2.0, max_retry_after_s=10.0)
        async with sem:
            try:
                resp = await send_with_retries(lambda: client.post(url, json=body, headers=headers), policy)
            except RetriesExhausted as e:
                raise GraderFailure(fail_flag, f"POST {url} {e}") from None
            except httpx.HTTPError as e:
                raise GraderFailure(fail_flag, f"{type(e).__name__} calling {url}: {e}") from None
        if resp.status_code >= 400:
            raise GraderFailure(fail_flag, f"HTTP {resp.status_code} from {url}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError:
            raise GraderFailure(fail_flag, f"non-JSON response from {url}") from None
        if not isinstance(data, dict):
            raise GraderFailure(fail_flag, f"response from {url} is not a JSON object")
        return data


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: str
    type: Literal["message"] | None = None


class _JudgeSpec(SpecBase):
    model: str
    input: list[Msg] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    base_url: str | None = None  # agentrft extension; else LoadOptions.base_url
    api_key_env: str | None = None  # name of the environment variable holding the key (read at load)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)


class ScoreModelSpec(_JudgeSpec):
    type: Literal["score_model"]
    range: tuple[float, float] = (0.0, 1.0)


class LabelModelSpec(_JudgeSpec):
    type: Literal["label_model"]
    labels: list[str] = Field(min_length=1)
    passing_labels: list[str] = Field(min_length=1)


_FENCE = re.compile(r"^```[a-zA-Z]*\n?|\n?```$")


class _JudgeGrader(Grader):
    is_async = True

    def __init__(self, name: str, spec: _JudgeSpec, where: str, options: LoadOptions, max_reward: float) -> None:
        super().__init__(name, spec.pass_threshold, max_reward)
        pre = f"{where}." if where else ""
        base = spec.base_url or options.base_url
        if not base:
            raise GraderSpecError(f"{pre}base_url", "no judge endpoint: set base_url in the spec or LoadOptions")
        self.url = base.rstrip("/") + (
            "/chat/completions" if base.rstrip("/").endswith("/v1") else "/v1/chat/completions"
        )
        self.model = spec.model
        self.sampling = dict(spec.sampling_params)
        self.messages = [
            (m.role, compile_template(m.content, f"{pre}input[{i}].content")) for i, m in enumerate(spec.input)
        ]
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else (options.api_key or "")
        if spec.api_key_env and not key:
            raise GraderSpecError(f"{pre}api_key_env", f"environment variable {spec.api_key_env} is not set")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.retries = spec.max_retries
        self.http = _Http(options, spec.timeout_s)
        self.cache: ReplyCache | None = None
        if options.cache:
            self.cache = ReplyCache(options.cache_dir or Path.home() / ".cache" / "agentrft" / "graders")

    async def _reply(self, sample: Sample, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        body = {
            "model": self.model,
            **self.sampling,
            "messages": [{"role": r, "content": t.render(sample, item)} for r, t in self.messages],
        }
        key = ReplyCache.key(self.url, body)
        data = self.cache.get(key) if self.cache else None
        if data is None:
            data = await self.http.post(self.url, body, self.headers, self.retries, "model_grader_server_error")
        try:
            choice = data["choices"][0]
            msg = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise GraderFailure("model_grader_server_error", "reply has no choices[0].message") from None
        if msg.get("refusal") or choice.get("finish_reason") == "content_filter":
            raise GraderFailure("model_grader_refusal_error", str(msg.get("refusal") or "content filtered")[:300])
        if self.cache is not None:
            self.cache.put(key, data)  # only well-formed, non-refused replies are kept
        return str(msg.get("content") or ""), data

    @staticmethod
    def _result(content: str) -> Any:
        text = _FENCE.sub("", content.strip()).strip()
        try:
            obj = json.loads(text)
        except ValueError:
            start, end = text.find("{"), text.rfind("}")
            try:
                obj = json.loads(text[start : end + 1]) if start >= 0 < end else None
            except ValueError:
                obj = None
        if isinstance(obj, dict) and "result" in obj:
            return obj["result"]
        return None


@register_grader("score_model")
class ScoreModelGrader(_JudgeGrader):
    Spec = ScoreModelSpec

    def __init__(self, name: str, spec: ScoreModelSpec, where: str, options: LoadOptions) -> None:
        lo, hi = spec.range
        if not lo < hi:
            raise GraderSpecError(f"{where}.range" if where else "range", "must be [low, high] with low < high")
        super().__init__(name, spec, where, options, max_reward=hi)
        self.lo, self.hi = lo, hi

    @classmethod
    def build(cls, spec: ScoreModelSpec, where: str, options: LoadOptions) -> ScoreModelGrader:
        return cls(spec.name or "score_model", spec, where, options)

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        content, _ = await self._reply(sample, item)
        result = self._result(content)
        if isinstance(result, str):
            with contextlib.suppress(ValueError):
                result = float(result)
        if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
            raise GraderFailure("model_grader_parse_error", f"judge reply has no numeric result: {content[:200]!r}")
        return Score(min(self.hi, max(self.lo, float(result))))


@register_grader("label_model")
class LabelModelGrader(_JudgeGrader):
    Spec = LabelModelSpec

    def __init__(self, name: str, spec: LabelModelSpec, where: str, options: LoadOptions) -> None:
        bad = [p for p in spec.passing_labels if p not in spec.labels]
        if bad:
            raise GraderSpecError(
                f"{where}.passing_labels" if where else "passing_labels", f"{bad[0]!r} is not one of labels"
            )
        super().__init__(name, spec, where, options, max_reward=1.0)
        self.labels, self.passing = spec.labels, set(spec.passing_labels)

    @classmethod
    def build(cls, spec: LabelModelSpec, where: str, options: LoadOptions) -> LabelModelGrader:
        return cls(spec.name or "label_model", spec, where, options)

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        content, _ = await self._reply(sample, item)
        label = self._result(content)
        if label is None and content.strip() in self.labels:
            label = content.strip()
        if label not in self.labels:
            raise GraderFailure("model_grader_parse_error", f"judge reply is not one of the labels: {content[:200]!r}")
        return Score(1.0 if label in self.passing else 0.0, metadata={"label": label})


class EndpointSpec(SpecBase):
    type: Literal["endpoint"]
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    range: tuple[float, float] | None = None


@register_grader("endpoint")
class EndpointGrader(Grader):
    Spec = EndpointSpec
    is_async = True

    def __init__(self, name: str, spec: EndpointSpec, options: LoadOptions) -> None:
        super().__init__(name, spec.pass_threshold, spec.range[1] if spec.range else 1.0)
        self.spec = spec
        self.http = _Http(options, spec.timeout_s)

    @classmethod
    def build(cls, spec: EndpointSpec, where: str, options: LoadOptions) -> EndpointGrader:
        if not spec.url.startswith(("http://", "https://")):
            raise GraderSpecError(f"{where}.url" if where else "url", "must be an http(s) URL")
        return cls(spec.name or "endpoint", spec, options)

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        trace = sample.trajectory.id if sample.trajectory is not None else uuid.uuid4().hex
        body = {"sample": sample.to_dict(), "item": item, "trace_id": trace}
        data = await self.http.post(
            self.spec.url, body, self.spec.headers, self.spec.max_retries, "unresponsive_reward_error"
        )
        v = data.get("score")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GraderFailure("other_error", f"endpoint reply has no numeric 'score': {str(data)[:200]}")
        v = float(v)
        if self.spec.range:
            v = min(self.spec.range[1], max(self.spec.range[0], v))
        return Score(v, metadata={"trace_id": trace})

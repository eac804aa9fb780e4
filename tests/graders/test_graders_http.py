"""score_model / label_model / endpoint graders against a fake OpenAI-compatible server (httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrft.graders import GraderSpecError, LoadOptions, load_grader


class FakeJudge:
    """Answers /v1/chat/completions with scripted contents; counts requests."""

    def __init__(self, reply):  # type: ignore[no-untyped-def]
        self.reply = reply
        self.requests: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host == "127.0.0.1"
        body = json.loads(request.content)
        self.requests.append(body)
        out = self.reply(body)
        if isinstance(out, httpx.Response):
            return out
        msg = {"role": "assistant", "content": out} if isinstance(out, str) else out
        return httpx.Response(200, json={"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]})


def judge_spec(kind: str = "score_model", **kw: object) -> dict:
    spec = {
        "type": kind,
        "name": "judge",
        "model": "fake-judge",
        "base_url": "http://127.0.0.1:9/v1",
        "input": [
            {"role": "system", "content": "Grade the answer."},
            {"role": "user", "content": "Q: {{ item.question }}\nA: {{ sample.output_text }}"},
        ],
        "max_retries": 0,
    }
    if kind == "label_model":
        spec.update(labels=["correct", "incorrect"], passing_labels=["correct"])
    spec.update(kw)
    return spec


def opts(fake: FakeJudge, tmp_path, cache: bool = True) -> LoadOptions:
    return LoadOptions(transport=httpx.MockTransport(fake), cache_dir=tmp_path, cache=cache)


def test_score_model_templating_clamp_and_cache(tmp_path) -> None:
    fake = FakeJudge(lambda body: '```json\n{"result": 1.7, "steps": ["ok"]}\n```')
    g = load_grader(judge_spec(sampling_params={"temperature": 0.0}), opts(fake, tmp_path))
    grade = g.grade("Paris", {"question": "Capital of France?"})
    assert grade.reward == 1.0 and grade.success  # clamped to range [0, 1]
    sent = fake.requests[0]
    assert sent["model"] == "fake-judge" and sent["temperature"] == 0.0
    assert sent["messages"][1]["content"] == "Q: Capital of France?\nA: Paris"
    again = load_grader(judge_spec(sampling_params={"temperature": 0.0}), opts(fake, tmp_path))
    assert again.grade("Paris", {"question": "Capital of France?"}).reward == 1.0
    assert len(fake.requests) == 1  # second grade served from the on-disk cache


@pytest.mark.parametrize(
    ("reply", "flag"),
    [
        ("I think it's good", "model_grader_parse_error"),
        ('{"result": "high"}', "model_grader_parse_error"),
        ({"role": "assistant", "content": None, "refusal": "I can't help with that."}, "model_grader_refusal_error"),
        (httpx.Response(500, text="oops"), "model_grader_server_error"),
        (httpx.Response(404, text="no model"), "model_grader_server_error"),
    ],
)
def test_score_model_error_flags(tmp_path, reply, flag) -> None:  # type: ignore[no-untyped-def]
    g = load_grader(judge_spec(), opts(FakeJudge(lambda body: reply), tmp_path))
    grade = g.grade("x", {"question": "q"})
    assert grade.reward == 0.0 and grade.error_flags == [flag] and grade.errors[0].grader == "judge"


def test_timeout_is_server_error(tmp_path) -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    g = load_grader(judge_spec(), LoadOptions(transport=httpx.MockTransport(boom), cache=False))
    assert g.grade("x", {"question": "q"}).error_flags == ["model_grader_server_error"]


def test_retries_then_succeeds(tmp_path) -> None:
    n = {"k": 0}

    def flaky(body):  # type: ignore[no-untyped-def]
        n["k"] += 1
        return httpx.Response(503) if n["k"] == 1 else '{"result": 0.5}'

    g = load_grader(judge_spec(max_retries=1), opts(FakeJudge(flaky), tmp_path, cache=False))
    assert g.grade("x", {"question": "q"}).reward == 0.5


def test_label_model(tmp_path) -> None:
    g = load_grader(judge_spec("label_model"), opts(FakeJudge(lambda b: '{"result": "correct"}'), tmp_path))
    assert g.grade("x", {"question": "q"}).reward == 1.0
    g = load_grader(judge_spec("label_model"), opts(FakeJudge(lambda b: "incorrect"), tmp_path, cache=False))
    assert g.grade("x", {"question": "q"}).reward == 0.0
    g = load_grader(judge_spec("label_model"), opts(FakeJudge(lambda b: "maybe"), tmp_path, cache=False))
    assert g.grade("x", {"question": "q"}).error_flags == ["model_grader_parse_error"]
    with pytest.raises(GraderSpecError, match="^passing_labels: 'great' is not one of labels"):
        load_grader(judge_spec("label_model", passing_labels=["great"]), LoadOptions(cache=False))


def test_judge_missing_variable_and_base_url() -> None:
    with pytest.raises(GraderSpecError, match="^base_url: no judge endpoint"):
        load_grader({**judge_spec(), "base_url": None}, LoadOptions(cache=False))
    fake = FakeJudge(lambda b: '{"result": 1}')
    g = load_grader(judge_spec(), LoadOptions(transport=httpx.MockTransport(fake), cache=False))
    assert g.grade("x", {}).error_flags == ["invalid_variable_error"] and fake.requests == []


def test_endpoint_grader() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        assert request.headers["x-key"] == "k"
        return httpx.Response(200, json={"score": 0.75 if body["sample"]["output_text"] == "ok" else "bad"})

    spec = {"type": "endpoint", "url": "http://127.0.0.1:9/score", "headers": {"x-key": "k"}, "max_retries": 0}
    g = load_grader(spec, LoadOptions(transport=httpx.MockTransport(handler), cache=False))
    grade = g.grade("ok", {"answer": 1})
    assert grade.reward == 0.75 and not grade.success
    assert set(seen[0]) == {"sample", "item", "trace_id"} and seen[0]["item"] == {"answer": 1}
    assert g.grade("no", {}).error_flags == ["other_error"]

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    g = load_grader(spec, LoadOptions(transport=httpx.MockTransport(down)))
    assert g.grade("ok", {}).error_flags == ["unresponsive_reward_error"]


def test_many_concurrent_judgements(tmp_path) -> None:
    import asyncio

    from agentrft.graders import agrade_many

    fake = FakeJudge(lambda body: json.dumps({"result": len(body["messages"][1]["content"]) % 2}))
    g = load_grader(judge_spec(), opts(fake, tmp_path, cache=False))
    pairs = [(str(i), {"question": "q"}) for i in range(20)]
    grades = asyncio.run(agrade_many(g, pairs, concurrency=5))
    assert [gr.reward for gr in grades] == [float(len(f"Q: q\nA: {i}") % 2) for i in range(20)]

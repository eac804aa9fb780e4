"""The agent loop with a fake sampler and environment: statuses, events, and the token-in-token-out invariant."""

from __future__ import annotations

import asyncio

import pytest
from rollout_fakes import EOS, FakeEnv, FakeSampler, chatml, decode, encode, rewriting, task

from agentrft.envs.base import EnvLimits
from agentrft.rollout.agent import run_episode
from agentrft.samplers.base import SamplingParams
from agentrft.types import FinalAnswerEvent, Grade, ModelCallEvent, ToolCallEvent, Trajectory

PARAMS = SamplingParams(temperature=1.0, max_tokens=200)


def play(sampler: FakeSampler, env: FakeEnv | None = None, fmt: str = "xml", **kw) -> Trajectory:
    return asyncio.run(
        run_episode(env or FakeEnv(), sampler, task(), params=PARAMS, tool_format=fmt, run_id="r1", group_id="g1", **kw)
    )


def assert_tito(traj: Trajectory, sampler: FakeSampler) -> None:
    """Every prompt the sampler got is a prefix of the trajectory ids, and what followed it is exactly its output."""
    tok = traj.tokens
    assert tok is not None
    assert len(sampler.prompts) == len(sampler.results)
    for prompt, result in zip(sampler.prompts, sampler.results, strict=True):
        assert tok.ids[: len(prompt)] == prompt
        end = len(prompt) + len(result.token_ids)
        assert tok.ids[len(prompt) : end] == result.token_ids
        assert tok.logprobs[len(prompt) : end] == result.logprobs
    # loss_mask is 1 exactly on the sampled spans
    sampled_positions = {
        p
        for prompt, r in zip(sampler.prompts, sampler.results, strict=True)
        for p in range(len(prompt), len(prompt) + len(r.token_ids))
    }
    assert {i for i, m in enumerate(tok.loss_mask) if m == 1} == sampled_positions
    assert all(lp == 0.0 for lp, m in zip(tok.logprobs, tok.loss_mask, strict=True) if m == 0)


def test_tool_call_then_final_answer() -> None:
    sampler = FakeSampler(["I will compute.<calculate>5829 - 5735</calculate> ignored", "The answer is 94."])
    traj = play(sampler)
    assert traj.status == "completed" and traj.error is None
    assert traj.final_answer == "The answer is 94."
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call_msg = traj.messages[2]
    assert call_msg.content == "I will compute." and call_msg.tool_calls[0].function.name == "calculate"
    assert traj.messages[3].content == "94" and traj.messages[3].tool_call_id == call_msg.tool_calls[0].id
    tool_events = traj.tool_calls
    assert len(tool_events) == 1 and tool_events[0].arguments == {"expression": "5829 - 5735"}
    assert tool_events[0].result == "94" and tool_events[0].error is None
    kinds = [type(e) for e in traj.events]
    assert kinds == [ModelCallEvent, ToolCallEvent, ModelCallEvent, FinalAnswerEvent]
    assert [e.finish_reason for e in traj.events if isinstance(e, ModelCallEvent)] == ["stop_string", "stop"]
    assert (traj.run_id, traj.group_id, traj.policy, traj.policy_version) == ("r1", "g1", "fake-policy", 3)
    assert traj.env.name == "fake-env" and traj.finished_at is not None
    # the stop strings of the format were passed, and the per-turn cap applied
    assert "</calculate>" in sampler.requests[0].params.stop
    assert sampler.requests[0].params.max_tokens == 200
    assert sampler.requests[0].group_key == "g1"
    assert_tito(traj, sampler)


def test_token_delta_text_and_turn_indices() -> None:
    sampler = FakeSampler(["<calculate>1 + 2</calculate>", "3"])
    traj = play(sampler)
    tok = traj.tokens
    first_prompt, second_prompt = sampler.prompts
    # the sampler stopped at the stop string, so the delta closes the turn with <|im_end|>\n itself
    delta = second_prompt[len(first_prompt) + len(sampler.results[0].token_ids) :]
    assert decode(delta) == "<|im_end|>\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    n0 = len(first_prompt)
    n1 = n0 + len(sampler.results[0].token_ids)
    assert tok.turn == [0] * n1 + [1] * (len(tok.ids) - n1)
    assert tok.ids[-1] == EOS and tok.loss_mask[-1] == 1
    assert tok.num_sampled == sum(len(r.token_ids) for r in sampler.results)
    # the first prompt is the system prompt with the xml instructions, then the user question
    text0 = decode(first_prompt)
    assert text0.startswith("<|im_start|>system\nYou answer with numbers.\n\nYou can use these tools:")
    assert text0.endswith("What is 5829 minus 5735?<|im_end|>\n<|im_start|>assistant\n")


def test_hermes_episode() -> None:
    # an xml-style call is plain text under hermes: the turn is a final answer
    traj = play(FakeSampler(["<calculate>2 * 3</calculate>"]), fmt="hermes")
    assert traj.status == "completed" and traj.tool_calls == []
    sampler = FakeSampler(['<tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>', "6"])
    traj = play(sampler, fmt="hermes")
    assert traj.status == "completed" and traj.tool_calls[0].result == "6"
    assert sampler.requests[0].params.stop == ["</tool_call>"]
    assert_tito(traj, sampler)


def test_eos_overlap_when_no_stop_string() -> None:
    class NoStop(FakeSampler):
        async def sample(self, request):  # ignores stop strings: ends with EOS after the call
            request.params = request.params.model_copy(update={"stop": []})
            return await super().sample(request)

    sampler = NoStop(["<calculate>2 * 3</calculate>", "6"])
    traj = play(sampler)
    assert sampler.results[0].token_ids[-1] == EOS
    delta = sampler.prompts[1][len(sampler.prompts[0]) + len(sampler.results[0].token_ids) :]
    assert decode(delta) == "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n"
    assert_tito(traj, sampler)


def test_non_append_only_template_keeps_sampled_tokens() -> None:
    sampler = FakeSampler(
        [
            "<think>subtract</think><calculate>5829 - 5735</calculate>",
            "<think>now the answer</think><calculate>94 * 1</calculate>",
            "answer: 94",
        ],
        template=rewriting,
    )
    traj = play(sampler)
    assert traj.status == "completed" and traj.final_answer == "answer: 94"
    assert_tito(traj, sampler)
    # the template really does rewrite the past: re-rendering the conversation would not give the sampler's ids
    from agentrft.rollout.agent import to_render
    from agentrft.rollout.formats import make_format

    fmt = make_format("xml", FakeEnv().tool_schemas())
    rerendered = sampler.render([to_render(m, fmt) for m in traj.messages[:-1]], None, True)
    assert rerendered != sampler.prompts[-1]
    # sampled ids use tokens ("calculate" as one id) that the template's own encoding never produces
    assert 900 in traj.tokens.ids and 900 not in encode(decode(traj.tokens.ids))
    delta = sampler.prompts[1][len(sampler.prompts[0]) + len(sampler.results[0].token_ids) :]
    assert decode(delta) == "<|im_end|>\n<|im_start|>user\n<r>94</r><|im_end|>\n<|im_start|>assistant\n"


def test_max_turns() -> None:
    env = FakeEnv(EnvLimits(max_turns=2, max_tokens_per_turn=100, max_total_tokens=100_000))
    sampler = FakeSampler(["<calculate>1 + 1</calculate>", "<calculate>2 + 2</calculate>", "never"])
    traj = play(sampler, env)
    assert traj.status == "max_turns" and traj.final_answer is None
    assert len(sampler.prompts) == 2 and len(traj.tool_calls) == 2
    assert traj.messages[-1].role == "tool" and traj.messages[-1].content == "4"
    assert traj.tokens.ids[-1] == sampler.results[-1].token_ids[-1]  # nothing appended after the last sample
    assert_tito(traj, sampler)


def test_budget_errors_are_counted_and_loop_continues() -> None:
    env = FakeEnv(EnvLimits(max_turns=5, max_tool_calls=1, max_total_tokens=100_000))
    sampler = FakeSampler(["<calculate>1 + 1</calculate>", "<calculate>2 + 2</calculate>", "2"])
    traj = play(sampler, env)
    assert traj.status == "completed"
    kinds = [e.error_kind for e in traj.tool_calls]
    assert kinds == [None, "budget"]
    assert traj.messages[5].content == "Error: tool-call budget exhausted"


def test_malformed_call_becomes_tool_error_and_loop_continues() -> None:
    sampler = FakeSampler(['<lookup>{"key": </lookup>', '<lookup>{"key": "rev", "year": 2019}</lookup>', "7"])
    traj = play(sampler)
    assert traj.status == "completed" and traj.final_answer == "7"
    first = traj.tool_calls[0]
    assert first.error_kind == "malformed" and first.name == "lookup" and first.arguments == '<lookup>{"key": </lookup>'
    assert first.error.startswith("Error: arguments of <lookup> are not valid JSON")
    assistant, tool_msg = traj.messages[2], traj.messages[3]
    assert assistant.tool_calls[0].id == tool_msg.tool_call_id and tool_msg.content == first.error
    assert traj.tool_calls[1].arguments == {"key": "rev", "year": 2019} and traj.tool_calls[1].error is None
    assert "Error: arguments of <lookup>" in decode(sampler.prompts[1])
    assert_tito(traj, sampler)


def test_unknown_tool_via_hermes_reaches_env() -> None:
    sampler = FakeSampler(['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "done"])
    traj = play(sampler, fmt="hermes")
    assert traj.tool_calls[0].error_kind == "unknown_tool" and traj.status == "completed"


def test_turn_token_limit_truncates() -> None:
    env = FakeEnv(EnvLimits(max_turns=3, max_tokens_per_turn=5, max_total_tokens=100_000))
    sampler = FakeSampler(["a long rambling answer"])
    traj = play(sampler, env)
    assert traj.status == "truncated" and "token limit of 5" in traj.error
    assert traj.tokens.num_sampled == 5 and traj.final_answer is None
    assert_tito(traj, sampler)


def test_total_token_limit_caps_last_turn_and_stops_before_overflow() -> None:
    outputs = ["<calculate>1 + 1</calculate>", "22222"]
    probe_sampler = FakeSampler(list(outputs))
    play(probe_sampler)
    p0, s0 = len(probe_sampler.prompts[0]), len(probe_sampler.results[0].token_ids)
    d0 = len(probe_sampler.prompts[1]) - p0 - s0
    # room for 2 tokens in turn 1: the request is capped to 2 and the turn is cut
    sampler = FakeSampler(list(outputs))
    traj = play(sampler, FakeEnv(EnvLimits(max_turns=3, max_tokens_per_turn=100, max_total_tokens=p0 + s0 + d0 + 2)))
    assert sampler.requests[1].params.max_tokens == 2
    assert traj.status == "truncated" and len(traj.tokens.ids) == p0 + s0 + d0 + 2
    assert_tito(traj, sampler)
    # no room after the delta: the episode stops without appending tokens the sampler never saw
    sampler = FakeSampler(list(outputs))
    traj = play(sampler, FakeEnv(EnvLimits(max_turns=3, max_tokens_per_turn=100, max_total_tokens=p0 + s0 + d0)))
    assert traj.status == "truncated" and "token limit" in traj.error
    assert len(sampler.prompts) == 1 and len(traj.tokens.ids) == p0 + s0
    # a prompt that alone fills the limit is truncated before any sampling
    sampler = FakeSampler(list(outputs))
    traj = play(sampler, FakeEnv(EnvLimits(max_turns=3, max_total_tokens=p0)))
    assert traj.status == "truncated" and sampler.prompts == [] and traj.tokens.num_sampled == 0


def test_sampler_exception_is_error_status() -> None:
    sampler = FakeSampler(["<calculate>1 + 1</calculate>", "2"], fail_on=1)
    traj = play(sampler)
    assert traj.status == "error" and "RuntimeError: device lost" in traj.error
    assert len(traj.tool_calls) == 1


def test_wall_time_is_a_timeout_never_trained() -> None:
    # a time budget measures the machine and the tools as much as the policy: its own status, never trained
    # (a token budget, the policy's own doing, stays truncated and trains)
    env = FakeEnv(EnvLimits(max_turns=3, wall_time_s=0.05))
    traj = play(FakeSampler(["slow"], delay_s=1.0), env)  # one model call past the limit
    assert traj.status == "timeout" and traj.error == "a model call took longer than the wall time of 0.05 s"
    # the first tool answers at once, the second would take 60 s: the episode's own 1 s cuts it off, however
    # loaded the machine (a slower machine only cuts it later)
    calls = iter([0.0, 60.0, 60.0])
    slow_tools = FakeEnv(EnvLimits(max_turns=4, wall_time_s=1.0), tool_delay=lambda t: next(calls))
    traj = play(FakeSampler(["<calculate>1 + 1</calculate>"] * 3 + ["2"]), slow_tools)
    assert traj.status == "timeout" and traj.error == "wall time of 1 s exceeded"
    assert len(traj.tool_calls) == 1
    traj.grade = Grade(reward=1.0, success=True)
    assert traj.untrainable_reason() == "timeout"


def test_a_samplers_own_timeout_is_an_error_not_the_wall_time() -> None:
    class TimingOut(FakeSampler):
        async def sample(self, request):  # an HTTP client's timeout, well inside the wall time
            raise TimeoutError("read timed out")

    traj = play(TimingOut(["2"]), FakeEnv(EnvLimits(max_turns=3, wall_time_s=60.0)))
    assert traj.status == "error" and traj.error == "sampler failed: TimeoutError: read timed out"


def test_wall_time_does_not_count_model_calls_against_the_episode() -> None:
    # three model calls of 0.2 s each (a batching sampler's queue) and quick tools: 0.6 s in all, past the
    # episode's 0.5 s, but no call is past it and the episode's own time is small
    env = FakeEnv(EnvLimits(max_turns=4, wall_time_s=0.5))
    outputs = ["<calculate>1 + 1</calculate>", "<calculate>2 + 2</calculate>", "4"]
    traj = play(FakeSampler(outputs, delay_s=0.2), env)
    assert traj.status == "completed" and traj.error is None and len(traj.tool_calls) == 2


def test_few_shot_rendered_in_format() -> None:
    sampler = FakeSampler(["94"])
    traj = play(sampler, FakeEnv(few_shot=True))
    text = decode(sampler.prompts[0])
    assert "<|im_start|>assistant\n<calculate>2 + 2</calculate><|im_end|>\n<|im_start|>tool\n4<|im_end|>" in text
    # the trajectory keeps the few-shot turns in OpenAI form
    assert traj.messages[2].tool_calls[0].function.name == "calculate"


def test_native_format_requires_template_tool_support() -> None:
    traj_err = None
    with pytest.raises(ValueError, match="needs a chat template with tool support"):
        traj_err = play(FakeSampler(["x"]), fmt="native")
    assert traj_err is None

    def tool_template(messages, tools, gen):
        head = f"<|im_start|>system\ntools: {[t['function']['name'] for t in tools]}<|im_end|>\n" if tools else ""
        body = []
        for m in messages:
            calls = "".join(f"<tool_call>{c['function']['arguments']}</tool_call>" for c in m.get("tool_calls", []))
            body.append({"role": m["role"], "content": (m.get("content") or "") + calls})
        return head + chatml(body, None, gen)

    sampler = FakeSampler(
        ['<tool_call>{"name": "calculate", "arguments": {"expression": "3 - 1"}}</tool_call>', "2"],
        template=tool_template,
    )
    traj = play(sampler, fmt="native")
    assert traj.status == "completed" and traj.tool_calls[0].result == "2"
    assert decode(sampler.prompts[0]).startswith("<|im_start|>system\ntools: ['calculate', 'lookup']")
    assert_tito(traj, sampler)


def test_trajectory_json_round_trip() -> None:
    traj = play(FakeSampler(["<calculate>1 + 1</calculate>", "2"]))
    assert Trajectory.from_json(traj.to_json()) == traj


class FakeChat:
    """ChatSampler: first a native tool call, then an xml call in text, then the answer; no token ids."""

    policy, policy_version = "chat-endpoint", 0

    def __init__(self) -> None:
        from agentrft.samplers.base import ChatResult

        call = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+2"}'}}
        self.replies = [
            ChatResult({"role": "assistant", "content": None, "tool_calls": [call]}, "stop", 10, 5),
            ChatResult({"role": "assistant", "content": "<calculate>4 * 2</calculate>"}, "stop", 20, 6),
            ChatResult({"role": "assistant", "content": "8"}, "stop", 30, 1),
        ]
        self.seen: list[list[dict]] = []

    async def chat(self, messages, tools, params):
        self.seen.append(messages)
        assert tools and params.max_tokens == 200
        return self.replies.pop(0)


def test_chat_sampler_episode_has_no_tokens() -> None:
    chat = FakeChat()
    traj = asyncio.run(run_episode(FakeEnv(), chat, task(), params=PARAMS))
    assert traj.tokens is None and traj.status == "completed" and traj.final_answer == "8"
    assert [e.result for e in traj.tool_calls] == ["4", "8"]
    assert [m.role for m in traj.messages[2:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    # the endpoint saw the OpenAI form, tool results paired with their call ids
    assert chat.seen[1][-1] == {"role": "tool", "content": "4", "tool_call_id": "c1", "name": "calculate"}
    assert traj.messages[4].tool_calls[0].function.name == "calculate"


class _UpdatingSampler(FakeSampler):
    """Reports the version it sampled with, and the weights change (version + 1) after every sample."""

    async def sample(self, request):  # type: ignore[no-untyped-def]
        result = await super().sample(request)
        result.policy_version = self.policy_version
        self.policy_version += 1
        return result


def test_an_episode_that_spans_a_weight_update_records_each_turns_version() -> None:
    sampler = _UpdatingSampler(["<calculate>1 + 1</calculate>", "<calculate>2 + 2</calculate>", "It is 4."])
    sampler.policy_version = 5
    traj = play(sampler)
    assert traj.status == "completed" and traj.tokens is not None
    assert traj.tokens.turn_versions == [5, 6, 7]
    assert [e.policy_version for e in traj.events if isinstance(e, ModelCallEvent)] == [5, 6, 7]
    assert traj.policy_version == 5  # as stale as its oldest turn
    # a caller that names the version keeps it; a sampler that does not say records none
    sampler = _UpdatingSampler(["It is 4."])
    assert play(sampler, policy_version=2).policy_version == 2
    plain = play(FakeSampler(["It is 4."]))
    assert plain.tokens is not None and plain.tokens.turn_versions is None and plain.policy_version == 3

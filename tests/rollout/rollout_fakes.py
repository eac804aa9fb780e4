"""Fakes for the rollout tests: a char-level tokenizer sampler with scripted outputs, and a small environment.

The fake sampler records every prompt it is given, so tests can check the
token-in-token-out invariant: each prompt equals the trajectory's ids up to that point.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from agentrft.envs.base import Environment, EnvLimits, Episode
from agentrft.samplers.base import SampleRequest, SampleResult
from agentrft.tools.base import ToolResult
from agentrft.types import Message, Task, ToolCall, ToolCallFunction

SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}
EOS = 2
# Multi-character tokens only the sampler emits: re-encoding sampled text char by char gives other ids.
SAMPLER_ONLY = {"calculate": 900, "answer": 901}
_INV = {v: k for k, v in {**SPECIALS, **SAMPLER_ONLY}.items()}
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


def encode(text: str) -> list[int]:
    ids: list[int] = []
    for piece in _SPECIAL_RE.split(text):
        if piece in SPECIALS:
            ids.append(SPECIALS[piece])
        else:
            ids += [ord(c) + 1000 for c in piece]
    return ids


def encode_sampled(text: str) -> list[int]:
    """Non-canonical tokenisation, as a real sampler may produce: known words become one id."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        for word, tid in SAMPLER_ONLY.items():
            if text.startswith(word, i):
                ids.append(tid)
                i += len(word)
                break
        else:
            ids += encode(text[i])
            i += 1
    return ids


def decode(ids: list[int]) -> str:
    return "".join(_INV[i] if i in _INV else chr(i - 1000) for i in ids)


def chatml(messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool) -> str:
    out = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def rewriting(messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool) -> str:
    """Not append-only: reasoning is stripped from every assistant turn but the last one,
    and tool results are grouped into one user block (like Qwen)."""
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    out = ""
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        if m["role"] == "assistant" and i != last_assistant:
            content = re.sub(r"<think>.*?</think>", "", content, flags=re.DOTALL)
        if m["role"] == "tool":
            opens = i == 0 or messages[i - 1]["role"] != "tool"
            closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            out += ("<|im_start|>user\n" if opens else "") + f"<r>{content}</r>" + ("<|im_end|>\n" if closes else "")
        else:
            out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class FakeSampler:
    """Scripted TokenSampler. Each output is cut at the first stop string (kept); EOS is added on a natural end."""

    policy = "fake-policy"
    policy_version = 3

    def __init__(
        self,
        outputs: list[str] | None = None,
        template: Any = chatml,
        emit_eos: bool = True,
        delay_s: float = 0.0,
        fail_on: int | None = None,
    ) -> None:
        self.outputs = list(outputs or [])
        self.template = template
        self.emit_eos = emit_eos
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.prompts: list[list[int]] = []
        self.requests: list[SampleRequest] = []
        self.results: list[SampleResult] = []

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return encode(self.template(messages, tools, add_generation_prompt))

    def decode(self, ids: list[int]) -> str:
        return decode(ids)

    def next_output(self, request: SampleRequest) -> str:
        return self.outputs.pop(0)

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.prompts.append(list(request.prompt_ids))
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_on is not None and len(self.prompts) - 1 == self.fail_on:
            raise RuntimeError("device lost")
        text = self.next_output(request)
        finish = "stop"
        cut = [(text.find(s) + len(s)) for s in request.params.stop if s in text]
        if cut:
            text, finish = text[: min(cut)], "stop_string"
        ids = encode_sampled(text)
        if len(ids) > request.params.max_tokens:
            ids, finish = ids[: request.params.max_tokens], "length"
            text = decode(ids)
        elif finish == "stop" and self.emit_eos:
            ids = [*ids, EOS]
        logprobs = [-0.01 * (k + 1) for k in range(len(ids))]
        result = SampleResult(
            token_ids=ids,
            logprobs=logprobs,
            text=text,
            finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            latency_s=0.001,
        )
        self.results.append(result)
        return result


def _schema(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


TOOLS = [
    _schema("calculate", {"expression": {"type": "string"}}),
    _schema("lookup", {"key": {"type": "string"}, "year": {"type": "integer"}}),
]


class FakeEpisode(Episode):
    def __init__(self, task: Task, env: FakeEnv) -> None:
        self.task = task
        self.env = env
        self.calls = 0

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        self.calls += 1
        if self.env.tool_delay is not None:
            await asyncio.sleep(self.env.tool_delay(self.task))
        if self.calls > self.env.limits.max_tool_calls:
            return ToolResult("Error: tool-call budget exhausted", error="budget", error_kind="budget")
        if not isinstance(arguments, dict):
            return ToolResult("Error: arguments must be an object", error="bad", error_kind="bad_arguments")
        if name == "calculate":
            expr = str(arguments.get("expression", ""))
            if not re.fullmatch(r"[0-9+\-*/ .()]+", expr):
                return ToolResult("Error: bad expression", error="bad", error_kind="bad_arguments")
            return ToolResult(str(eval(expr)))
        if name == "lookup":
            return ToolResult(json.dumps({"key": arguments.get("key"), "year": arguments.get("year"), "value": 7}))
        return ToolResult(f"Error: unknown tool {name}", error="unknown", error_kind="unknown_tool")


class FakeEnv(Environment):
    name = "fake-env"
    version = "1"

    def __init__(self, limits: EnvLimits | None = None, few_shot: bool = False, tool_delay: Any = None) -> None:
        self.limits = limits or EnvLimits(max_turns=4, max_tokens_per_turn=200, max_total_tokens=100_000)
        self._few_shot = few_shot
        self.tool_delay = tool_delay

    def system_prompt(self) -> str:
        return "You answer with numbers."

    def tool_schemas(self) -> list[dict[str, Any]]:
        return TOOLS

    def tool_schema_hash(self) -> str:
        return "hash-fake"

    def tasks(self, split: str = "train") -> list[Task]:
        return [task(f"t{i}") for i in range(3)]

    def start(self, t: Task) -> Episode:
        return FakeEpisode(t, self)

    def few_shot(self) -> list[Message]:
        if not self._few_shot:
            return []
        call = ToolCall(id="ex1", function=ToolCallFunction(name="calculate", arguments='{"expression": "2 + 2"}'))
        return [
            Message(role="user", content="What is 2 plus 2?"),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", tool_call_id="ex1", content="4"),
            Message(role="assistant", content="4"),
        ]


def task(task_id: str = "t0", question: str = "What is 5829 minus 5735?", answer: str = "94") -> Task:
    return Task(id=task_id, messages=[Message(role="user", content=question)], data={"answer": answer})

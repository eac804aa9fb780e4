"""Token records for recorded trajectories: a token-less one renders to exactly the chat template's tokens,
its assistant turns (and their turn-end token) are the loss tokens, and what cannot be cut into turns is refused."""

from __future__ import annotations

from typing import Any

import pytest

from agentrft.envs.registry import make_env
from agentrft.samplers.chat_template import TokenizerRenderer
from agentrft.samplers.policies import smollm2_tokenizer
from agentrft.train.data.records import RecordError, learnable_records, render_token_record, token_record_problem
from agentrft.types import Message, ToolCall, ToolCallFunction, Trajectory


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _chat(metadata: dict[str, Any] | None = None, tool: str = "calculate", args: str = '{"expression": "2+2"}'):
    call = ToolCall(id="call_1", function=ToolCallFunction(name=tool, arguments=args))
    return Trajectory(
        messages=[
            Message(role="system", content="S"),
            Message(role="user", content="Example?"),
            Message(role="assistant", content="An example answer."),  # a worked example in the prompt: not learned
            Message(role="user", content="What is 2+2?"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="call_1", name=tool, content="4"),
            Message(role="assistant", content="The answer is 4."),
        ],
        n_prompt_messages=4,
        metadata=metadata or {},
    )


def test_a_tokenless_trajectory_renders_to_the_templates_tokens_and_learns_its_own_turns(tok):
    rec = render_token_record(_chat(), TokenizerRenderer(tok), "xml", make_env("finqa-lite:1").tool_schemas())
    pieces = [  # (ChatML text the template writes, learned?) in order; SmolLM2's template is ChatML
        ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nExample?<|im_end|>\n", False),
        ("<|im_start|>assistant\nAn example answer.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        ("<calculate>2+2</calculate><|im_end|>", True),  # the call in the xml format, then the turn end
        ("\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n", False),
        ("The answer is 4.<|im_end|>", True),
    ]
    ids: list[int] = []
    mask: list[int] = []
    for text, learned in pieces:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        mask += [int(learned)] * len(piece)
    assert rec.ids == tok.encode("".join(t for t, _ in pieces), add_special_tokens=False) == ids
    assert rec.loss_mask == mask
    first_end = len(tok.encode("".join(t for t, _ in pieces[:4]), add_special_tokens=False))
    assert rec.turn == [0] * first_end + [1] * (len(ids) - first_end)  # context before turn k carries k
    assert rec.logprobs == [0.0] * len(ids)
    # the rendered record passes the checks a recorded one must pass
    assert token_record_problem(_chat().model_copy(update={"tokens": rec}), len(tok)) is None


def test_a_chat_logs_own_tools_render_its_calls(tok):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "d",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    chat = _chat({"tools": tools}, tool="lookup", args='{"q": "ACME"}')
    rec = render_token_record(chat, TokenizerRenderer(tok), "xml", [])
    learned = [i for i, m in zip(rec.ids, rec.loss_mask, strict=True) if m]
    assert tok.decode(learned) == "<lookup>ACME</lookup><|im_end|>The answer is 4.<|im_end|>"
    rec = render_token_record(chat, TokenizerRenderer(tok), "hermes", [])
    learned = [i for i, m in zip(rec.ids, rec.loss_mask, strict=True) if m]
    assert tok.decode(learned).startswith('<tool_call>{"name": "lookup", "arguments": {"q": "ACME"}}</tool_call>')


class _ForgetfulTemplate:
    """A template that drops earlier assistant turns' text once a later message follows (as Qwen3 drops reasoning)."""

    def render(self, messages, tools=None, add_generation_prompt=True):
        out: list[int] = []
        for k, m in enumerate(messages):
            last = k == len(messages) - 1
            text = m["content"] if m["role"] != "assistant" or last else ""
            out += [ord(m["role"][0])] + [ord(c) for c in text] + [0]
        return out + ([ord("a")] if add_generation_prompt else [])


def test_a_template_that_rewrites_earlier_turns_is_refused_by_id():
    chat = _chat()
    with pytest.raises(RecordError) as exc:
        learnable_records([chat], renderer=_ForgetfulTemplate(), tool_format="xml", tool_schemas=[])
    assert str(exc.value).startswith(
        f"data: trajectory {chat.id}: the chat template renders the conversation before message 4 (assistant turn 0) "
        "differently once later messages follow"
    )
    with pytest.raises(RecordError, match=rf"^data: trajectory {chat.id} has no token record and there is no chat"):
        learnable_records([chat], renderer=None, tool_format="xml", tool_schemas=[])

"""Pairs as token sequences: pairs without token records rendered through the chat template (by the renderer
SFT uses too: loss tokens are each assistant turn through its turn end) and the checks of recorded token records."""

from __future__ import annotations

import random

import fakes_dpo as D
import pytest

from agentrft.inputs import InputError
from agentrft.pairs import Pair
from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import make_format
from agentrft.train.data.preference_data import check_token_record, encode_pair
from agentrft.types import Message, ToolCall, ToolCallFunction

CALL = ToolCall(id="c1", function=ToolCallFunction(name="calculate", arguments='{"expression": "2+2"}'))
PROMPT = [Message(role="system", content="Use tools."), Message(role="user", content="What is 2+2?")]
ANSWER = [
    Message(role="assistant", content=None, tool_calls=[CALL]),
    Message(role="tool", content="4", tool_call_id="c1"),
    Message(role="assistant", content="The answer is 4."),
]


def _spans(ids, mask):
    out, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    return [*out, cur] if cur else out


class _Fn:
    """A ChatRenderer from a plain function."""

    def __init__(self, fn):
        self.fn = fn

    def render(self, messages, tools=None, add_generation_prompt=True):
        return self.fn(messages, tools, add_generation_prompt)


def _pair() -> Pair:
    return Pair(id="p1", task_id="t", prompt=PROMPT, chosen=ANSWER, rejected=ANSWER[-1:], where="pairs.jsonl:1")


def test_smollm2_template_loss_tokens_are_the_assistant_turns_through_their_end_token():
    from agentrft.samplers.chat_template import TokenizerRenderer, render_chat
    from agentrft.samplers.policies import smollm2_tokenizer

    tok = smollm2_tokenizer()
    fmt = make_format("xml", [])
    enc = encode_pair(_pair(), TokenizerRenderer(tok), "xml", [])
    ids, mask = enc.chosen_ids, enc.chosen_mask
    assert enc.rendered
    whole = render_chat(tok, [to_render(m, fmt) for m in PROMPT + ANSWER], None, False)
    assert ids == whole[: len(ids)] and tok.decode(whole[len(ids) :]) == "\n"  # the chat, up to the last turn end
    spans = [tok.decode(s) for s in _spans(ids, mask)]
    assert spans == [fmt.render_assistant(ANSWER[0]) + "<|im_end|>", "The answer is 4.<|im_end|>"]
    first_end = mask.index(0, mask.index(1))
    between = ids[first_end : mask.index(1, first_end)]  # the template's newline, the tool result, the next prompt
    assert tok.decode(between) == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


def _chatml(messages, tools, gen):
    """A toy template: <role> content </s>(0) \\n(9) per message; the generation prompt is <assistant>.
    Token = ord(char) % 50 + 10."""
    out = []
    for m in messages:
        out += [{"system": 1, "user": 2, "assistant": 3, "tool": 4}[m["role"]]]
        out += [ord(c) % 50 + 10 for c in m["content"]] + [0, 9]
    return out + ([3] if gen else [])


def test_rendered_masks_skip_tool_results_and_generation_prompts():
    enc = encode_pair(_pair(), _Fn(_chatml), "xml", [])
    ids, mask = enc.chosen_ids, enc.chosen_mask
    spans = _spans(ids, mask)
    assert len(spans) == 2 and all(s[-1] == 0 and s[0] != 3 for s in spans)  # content and end, not the role token
    tool_at = ids.index(4)
    assert mask[tool_at : tool_at + 3] == [0, 0, 0]
    assert _spans(enc.rejected_ids, enc.rejected_mask) == spans[1:]  # the same answer turn, the same tokens


def test_a_template_that_rewrites_earlier_turns_is_refused():
    def forgetful(messages, tools, gen):  # drops earlier assistant turns, as some templates drop reasoning
        last = max(i for i, m in enumerate(messages) if m["role"] != "tool")
        kept = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == last]
        return _chatml(kept, tools, gen)

    with pytest.raises(
        InputError,
        match=r"pairs.jsonl:1: chosen: .*renders the conversation before message 2 \(assistant turn 0\) differently",
    ):
        encode_pair(_pair(), _Fn(forgetful), "xml", [])


def test_token_record_checks():
    t = D.episode(random.Random(0), 0, 0)
    check_token_record(t, "db")  # two sampled runs, turns 0 and 1, two assistant turns
    bad = t.model_copy(deep=True)
    bad.tokens.turn = [0] * len(bad.tokens.turn)
    with pytest.raises(
        InputError,
        match=rf"db: trajectory {t.id}: field 'tokens': sampled tokens .* belong to assistant turn 1 but carry turn \[0\]",
    ):
        check_token_record(bad, "db")
    bad = t.model_copy(deep=True)
    bad.tokens.loss_mask = [0] * len(bad.tokens.loss_mask)
    with pytest.raises(InputError, match="field 'tokens': .*0 runs of sampled tokens"):
        check_token_record(bad, "db")

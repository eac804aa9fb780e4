"""Token-in-token-out bookkeeping: the episode's ids grow only by appending.

The sampler's prompt for turn k+1 is exactly ``previous_ids + sampled_ids + delta_ids``.
Earlier tokens are never re-tokenised, because re-rendering a conversation does
not reproduce what the sampler saw in general: templates rewrite past turns
(Qwen3 strips reasoning from old assistant turns), and the text the model
sampled may tokenise differently when encoded afresh.

`delta_ids` is computed by rendering the new tool messages *alone*, after a
fixed stand-in conversation, in a way that follows the template:

* ``close`` — the tokens that end an assistant turn (``<|im_end|>\\n`` in ChatML):
  the common token suffix of two renderings of a stand-in assistant message
  whose contents differ only in their last token. When the sampled ids already
  end with a prefix of ``close`` (the model emitted ``<|im_end|>`` itself), only
  the rest is appended.
* ``tool part`` — ``render(stub + [assistant] + tools, gen=True)`` minus
  ``render(stub + [assistant], gen=False)``: the tool messages plus the next
  generation prompt, rendered in context so templates that group consecutive
  tool messages (Qwen) or need a preceding assistant call still work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrft.samplers.base import ChatRenderer

_STUB: list[dict[str, Any]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


class TemplateError(RuntimeError):
    """The chat template cannot be extended by appending tokens (named in the message)."""


def _common_suffix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _overlap(sampled: list[int], close: list[int]) -> int:
    """Largest k with sampled[-k:] == close[:k] (the model already produced part of the turn end)."""
    for k in range(min(len(sampled), len(close)), 0, -1):
        if sampled[-k:] == close[:k]:
            return k
    return 0


@dataclass
class TokenLedger:
    """The growing token record of one episode. Shape legend: T = tokens so far, all lists length T."""

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)

    def add_prompt(self, ids: list[int], turn: int) -> None:
        self.ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turn += [turn] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float], turn: int) -> None:
        if len(logprobs) != len(ids):
            raise ValueError(f"sampler returned {len(ids)} token ids but {len(logprobs)} log-probs")
        self.ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.turn += [turn] * len(ids)


class DeltaRenderer:
    """Computes the ids to append after a turn's sampled ids, for one sampler and tool set."""

    def __init__(self, sampler: ChatRenderer, tools: list[dict[str, Any]] | None) -> None:
        self.sampler = sampler
        self.tools = tools  # passed to render only for the native format
        self._close: list[int] | None = None

    def _render(self, messages: list[dict[str, Any]], gen: bool) -> list[int]:
        return list(self.sampler.render(messages, self.tools, add_generation_prompt=gen))

    def close_ids(self) -> list[int]:
        if self._close is None:
            a = self._render([*_STUB, {"role": "assistant", "content": "0"}], gen=False)
            b = self._render([*_STUB, {"role": "assistant", "content": "1"}], gen=False)
            self._close = a[len(a) - _common_suffix(a, b) :]
        return self._close

    def delta(self, sampled: list[int], assistant: dict[str, Any], tool_messages: list[dict[str, Any]]) -> list[int]:
        """Ids that close the assistant turn, render `tool_messages`, and open the next assistant turn."""
        close = self.close_ids()
        stub_assistant = {**assistant, "content": "0"}
        before = self._render([*_STUB, stub_assistant], gen=False)
        after = self._render([*_STUB, stub_assistant, *tool_messages], gen=True)
        if after[: len(before)] != before:
            raise TemplateError(
                "the chat template renders an assistant turn differently once tool or user messages follow it, "
                "so they cannot be appended token by token"
            )
        return close[_overlap(sampled, close) :] + after[len(before) :]

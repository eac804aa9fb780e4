"""Rendering a conversation to token ids through a tokenizer's chat template.

Shared by every token-in-token-out sampler (in-process HF, the reference sampler,
vLLM): the ids a trajectory records are exactly what this returns.
"""

from __future__ import annotations

from typing import Any


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template reads a `tools` variable. SmolLM2's does not: tool
    schemas are then left to the agent loop's tool-call format (system prompt)."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template (tools passed where supported)."""
    # Templates concatenate `content` as a string; an assistant turn that only
    # calls tools has content None in OpenAI format. Copy, never mutate the input.
    msgs = [{**m, "content": m.get("content") or ""} for m in messages]
    kwargs: dict[str, Any] = {}
    if tools and template_supports_tools(tokenizer):
        kwargs["tools"] = tools
    out = tokenizer.apply_chat_template(
        msgs, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False, **kwargs
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


class RendersWithTokenizer:
    """`render` and `decode` of a token sampler that holds a Hugging Face ``tokenizer``."""

    tokenizer: Any

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Token ids of the conversation through the tokenizer's chat template."""
        return render_chat(self.tokenizer, messages, tools, add_generation_prompt)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included (the exact inverse view of `render`)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


class TokenizerRenderer(RendersWithTokenizer):
    """Rendering without a model: a config check renders recorded conversations with the policy's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

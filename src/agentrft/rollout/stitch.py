"""Token-exact stitching of a session's requests into one episode's token record.

A client that runs its own tool loop resends the whole conversation on every request.
The server must decide what the sampler consumes for request k and how that joins the
tokens of the requests before it. `plan_prompt` tries, for each earlier request c and each
of its sampled choices j (latest first), S = c's prompt ids + choice j's sampled ids:

1. **extend** — the full rendering of request k through the chat template starts with S,
   token for token: the sampler consumes that rendering; the segment grows by its tail.
2. **reuse** — request k's messages are c's messages, then choice j's reply exactly as the
   server returned it, then new messages (tool results, a user turn; no assistant turn), and the template renders
   c's messages the same as before: the sampler consumes S + the ids of the new messages
   (`tito.DeltaRenderer`, as the in-process agent loop does). Re-rendering the reply's text
   would give other ids than the model sampled (a tool call written back in canonical form,
   a stop string instead of the end-of-turn token, another tokenisation of the same text);
   the model's own ids are kept and nothing is re-tokenised.
3. **new segment** — neither holds (the client dropped or rewrote a message, the template
   renders earlier turns differently once more follow, the tools changed): the sampler
   consumes the full rendering, which starts a new segment of the same episode, and the
   reason is recorded (`types.SegmentBreak`).

Every id a segment holds is an id the sampler consumed or produced; `token_record` lays the
segments end to end (`TokenRecord.segment` tells them apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrft.rollout.tito import TemplateError, TokenLedger
from agentrft.types import Message, SegmentBreak, SplitReason, TokenRecord

# (sampled ids of the reply, the reply as the template sees it, the new messages as the template sees them)
# -> the ids that close the reply and render the new messages up to the next generation prompt
DeltaFn = Callable[[list[int], dict[str, Any], list[dict[str, Any]]], list[int]]


@dataclass
class Choice:
    """One sampled completion of a request. Shape legend: N = sampled tokens."""

    message: Message  # the reply as the server returned it
    token_ids: list[int]  # (N,)
    logprobs: list[float]  # (N,)
    rendered: dict[str, Any]  # the reply as the chat template sees it (`agent.to_render`)
    finish_reason: str
    latency_s: float = 0.0


@dataclass
class SessionCall:
    """One request of a session, as served. Shape legend: P = prompt ids the sampler consumed."""

    index: int
    messages: list[Message]  # the request's messages as the model sees them (tool instructions included)
    rendered_messages: list[dict[str, Any]]  # the same, as the chat template sees them
    tools: list[dict[str, Any]]
    rendered: list[int]  # the full rendering of `messages` through the chat template
    prompt_ids: list[int]  # (P,) what the sampler consumed: `rendered`, or an earlier call's ids + a delta
    choices: list[Choice]
    policy_version: int
    kind: Literal["first", "extend", "reuse", "new_segment"]
    parent: tuple[int, int] | None = None  # (call index, choice index) this call continues
    split: tuple[SplitReason, str] | None = None
    created_at: float = 0.0

    def sequence(self, choice: int) -> list[int]:
        return self.prompt_ids + self.choices[choice].token_ids


@dataclass
class Plan:
    """What the sampler consumes for a request, and how it joins the session."""

    prompt_ids: list[int]
    kind: Literal["first", "extend", "reuse", "new_segment"]
    parent: tuple[int, int] | None = None
    split: tuple[SplitReason, str] | None = None


def plan_prompt(
    calls: list[SessionCall],
    rendered_messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    rendered: list[int],
    delta: DeltaFn,
) -> Plan:
    """The prompt for a session's next request (see the module docstring for the three rules)."""
    if not calls:
        return Plan(list(rendered), "first")
    for c in reversed(calls):
        for j in range(len(c.choices)):
            seq = c.sequence(j)
            if rendered[: len(seq)] == seq:
                return Plan(list(rendered), "extend", (c.index, j))
    for c in reversed(calls):
        if c.tools != tools or rendered[: len(c.rendered)] != c.rendered:
            continue
        n = len(c.rendered_messages)
        if rendered_messages[:n] != c.rendered_messages or len(rendered_messages) <= n:
            continue
        if any(m.get("role") == "assistant" for m in rendered_messages[n + 1 :]):
            continue  # later replies as text would stand for ids another request sampled: not a continuation of c
        for j, choice in enumerate(c.choices):
            if rendered_messages[n] != choice.rendered:
                continue
            try:
                tail = delta(choice.token_ids, rendered_messages[n], rendered_messages[n + 1 :])
            except TemplateError as exc:
                return Plan(list(rendered), "new_segment", split=("template_rewrote_history", str(exc)))
            return Plan(c.sequence(j) + tail, "reuse", (c.index, j))
    return Plan(list(rendered), "new_segment", split=why_split(calls[-1], rendered_messages, tools, rendered))


def why_split(
    last: SessionCall, rendered_messages: list[dict[str, Any]], tools: list[dict[str, Any]], rendered: list[int]
) -> tuple[SplitReason, str]:
    """Why a request does not continue the session's latest request (its first choice's reply)."""
    if last.tools != tools:
        return "tools_changed", f"the tools differ from those of request {last.index}"
    if rendered_messages == last.rendered_messages:
        return "message_dropped", f"the request repeats request {last.index} without its reply (a retry)"
    before = [*last.rendered_messages, last.choices[0].rendered]
    common = 0
    while common < min(len(before), len(rendered_messages)) and before[common] == rendered_messages[common]:
        common += 1
    if common == len(before):  # the messages extend: the template rendered them differently
        at = next((i for i, (a, b) in enumerate(zip(last.rendered, rendered, strict=False)) if a != b), None)
        where = f"token {at}" if at is not None else f"token {min(len(last.rendered), len(rendered))}"
        return (
            "template_rewrote_history",
            f"the messages extend request {last.index}'s, but the chat template renders them differently "
            f"(first difference at {where})",
        )
    rest = rendered_messages[common:]
    resumes = any(
        before[k + 1 :] and rest[: len(before) - k - 1] == before[k + 1 :] for k in range(common, len(before))
    )
    if resumes or not rest:
        return "message_dropped", f"message {common} of request {last.index}'s conversation (with its reply) is missing"
    role = before[common].get("role") if common < len(before) else "?"
    return "history_rewritten", f"message {common} ({role}) differs from request {last.index}'s conversation"


@dataclass
class _Segment:
    calls: list[tuple[SessionCall, int]] = field(default_factory=list)  # (call, choice) in order
    start: tuple[int, SplitReason, str] | None = None  # (request, reason, detail) of the break


def segments(calls: list[SessionCall]) -> list[_Segment]:
    """The session's calls as chains: a call joins the segment whose last call it continues; otherwise
    (the first call, a split, or a branch from the middle of a segment) it starts one."""
    out: list[_Segment] = []
    tail_of: dict[int, int] = {}  # call index -> segment whose last call it is
    for c in calls:
        seg_idx = tail_of.get(c.parent[0]) if c.parent is not None else None
        if seg_idx is not None and c.parent is not None:
            seg = out[seg_idx]
            prev, _ = seg.calls[-1]
            seg.calls[-1] = (prev, c.parent[1])  # the choice the client went on with
            del tail_of[c.parent[0]]
        else:
            if c.split is not None:
                start = (c.index, c.split[0], c.split[1])
            elif c.parent is not None:  # continues a call another request already continued
                start = (c.index, "history_rewritten", f"request {c.index} branches from request {c.parent[0]}")
            else:
                start = None
            out.append(_Segment(start=start))
            seg_idx = len(out) - 1
            seg = out[seg_idx]
        seg.calls.append((c, 0))
        tail_of[c.index] = seg_idx
    return out


def token_record(calls: list[SessionCall]) -> TokenRecord | None:
    """The episode's token record: every segment's prompt and sampled ids, end to end (None: no calls)."""
    if not calls:
        return None
    ledger = TokenLedger()
    seg_of: list[int] = []
    breaks: list[SegmentBreak] = []
    for s, seg in enumerate(segments(calls)):
        if s:
            request, reason, detail = seg.start or (seg.calls[0][0].index, "history_rewritten", "")
            breaks.append(SegmentBreak(segment=s, request=request, reason=reason, detail=detail))
        have = 0
        for call, j in seg.calls:
            new_prompt = call.prompt_ids[have:]
            choice = call.choices[j]
            ledger.add_prompt(new_prompt, call.index)
            ledger.add_sampled(list(choice.token_ids), list(choice.logprobs), call.index)
            have = len(call.prompt_ids) + len(choice.token_ids)
        seg_of += [s] * (len(ledger.ids) - len(seg_of))
    return TokenRecord(
        ids=ledger.ids,
        loss_mask=ledger.loss_mask,
        logprobs=ledger.logprobs,
        turn=ledger.turn,
        segment=seg_of if breaks else None,
        breaks=breaks,
    )

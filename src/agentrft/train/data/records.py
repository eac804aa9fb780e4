"""Token records of recorded trajectories, for the methods that learn from them: checked, or rendered.

A trajectory with a token record is used exactly as recorded: its ids and loss mask are
what the sampler consumed and produced. `token_record_problem` checks that the record can
be the one its messages were played with, by the invariants every record the agent loop
writes holds: the first token is context, sampled tokens come in one contiguous run per
assistant turn of the episode (``messages[n_prompt_messages:]``), turn ``k``'s run carries
``turn == k`` and turns never decrease, ids lie in the vocabulary.

A trajectory without one (an imported chat log, an eval-only endpoint) is rendered through
the policy's chat template by `render_token_record`:

* each message is shown to the template as the agent loop shows it (`rollout.agent.to_render`):
  an assistant turn's tool calls written in the run's tool-call format (``xml``, ``hermes``),
  or passed to the template as they are (``native``);
* assistant turn ``k`` of the episode (message ``i``) is the span from
  ``render(messages[:i], generation prompt)`` to ``render(messages[:i+1])``, and each of these
  must be a prefix of the next and of the whole conversation, so a turn's tokens are exactly
  the template's; a template that renders a turn differently once later messages follow (Qwen3
  strips old reasoning) has no such spans and is refused, naming the trajectory and message;
* the loss tokens of a turn are its span up to and including the first token of the template's
  turn end (``<|im_end|>`` of ``<|im_end|>\\n`` in ChatML), so the model learns to end its turns;
  the rest of the turn end is context, as in a sampled record. The record stops there after the
  last assistant turn (what follows it was never shown to a sampler).

One difference from a sampled record remains, by design: a sampled turn that ends in a tool
call stops on the format's stop string (``</calculate>``) and its turn end is context, where
a rendered turn also trains the turn end after the call.

No torch here: a config check renders with the tokenizer alone, before any model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrft.inputs import InputError
from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import make_format
from agentrft.rollout.tito import DeltaRenderer
from agentrft.samplers.base import ChatRenderer
from agentrft.types import TokenRecord, Trajectory


class RecordError(InputError):
    """A recorded trajectory that cannot be learned from; the message names its id."""


def own_assistant_messages(traj: Trajectory) -> list[int]:
    """Indices into ``traj.messages`` of the episode's assistant turns (worked examples in the prompt excluded)."""
    return [i for i in range(traj.n_prompt_messages, len(traj.messages)) if traj.messages[i].role == "assistant"]


def _sampled_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def token_record_problem(traj: Trajectory, vocab_size: int | None = None) -> str | None:
    """Why ``traj`` cannot be learned from as recorded, or None. Without a token record only the
    messages are checked (an episode turn to learn from); with one, the record against the messages."""
    if traj.n_prompt_messages > len(traj.messages):
        return f"n_prompt_messages is {traj.n_prompt_messages} but there are {len(traj.messages)} messages"
    turns = len(own_assistant_messages(traj))
    if turns == 0:
        return f"no assistant turn after its {traj.n_prompt_messages} prompt messages: nothing to learn from"
    tok = traj.tokens
    if tok is None:
        return None
    if not tok.ids:
        return "its token record is empty"
    if tok.num_segments > 1:
        return (
            f"its token record has {tok.num_segments} segments (a session whose client rewrote its history); "
            "only one-segment records can be matched to the messages"
        )
    bad = next((i for i, t in enumerate(tok.ids) if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
    if bad is not None:
        where = f"[0, {vocab_size})" if vocab_size is not None else "the vocabulary"
        return f"token {bad} has id {tok.ids[bad]}, outside {where} (recorded with another tokenizer?)"
    if tok.loss_mask[0]:
        return "its first token is marked sampled; a record starts with the prompt"
    down = next((i for i in range(1, len(tok.turn)) if tok.turn[i] < tok.turn[i - 1]), None)
    if down is not None:
        return f"tokens.turn decreases at token {down} ({tok.turn[down - 1]} -> {tok.turn[down]})"
    runs = _sampled_runs(tok.loss_mask)
    if len(runs) != turns:
        return (
            f"its token record has {len(runs)} runs of sampled tokens but its messages have {turns} assistant "
            f"turns after the {traj.n_prompt_messages} prompt messages"
        )
    for k, (a, b) in enumerate(runs):
        if set(tok.turn[a:b]) != {k}:
            return (
                f"sampled tokens {a}..{b - 1} belong to assistant turn {k} but carry turn {sorted(set(tok.turn[a:b]))}"
            )
    return None


def render_token_record(
    traj: Trajectory, renderer: ChatRenderer, tool_format: str, tool_schemas: list[dict[str, Any]]
) -> TokenRecord:
    """The token record of ``traj``'s conversation through ``renderer``'s chat template (module docstring).
    ``tool_schemas`` are the environment's; a chat log's own ``metadata["tools"]`` take their place.
    Raises RecordError naming the trajectory and message where the template cannot be split into turns."""
    tools = traj.metadata.get("tools")
    schemas = tools if isinstance(tools, list) and all(isinstance(t, dict) for t in tools) else tool_schemas
    fmt = make_format(tool_format, schemas)
    template_tools = schemas if fmt.native else None
    msgs = [to_render(m, fmt) for m in traj.messages]

    def render(upto: int, gen: bool) -> list[int]:
        return list(renderer.render(msgs[:upto], template_tools, add_generation_prompt=gen))

    def refuse(why: str) -> RecordError:
        return RecordError(f"data: trajectory {traj.id}: {why}")

    close = DeltaRenderer(renderer, template_tools).close_ids()
    full = render(len(msgs), False)
    mask = [0] * len(full)
    turn = [0] * len(full)
    end = 0  # end of the previous turn's loss tokens
    for k, i in enumerate(own_assistant_messages(traj)):
        before, through = render(i, True), render(i + 1, False)
        if through[: len(before)] != before or full[: len(through)] != through:
            raise refuse(
                f"the chat template renders the conversation before message {i} (assistant turn {k}) differently "
                "once later messages follow, so its turns cannot be cut from one rendering; give it a token record"
            )
        a, b = len(before), len(through)
        if close and b - a >= len(close) and through[b - len(close) :] == close:
            b -= len(close) - 1  # the turn-end token is learned, what the template writes after it is context
        if b <= a:
            raise refuse(f"assistant message {i} (turn {k}) renders to no tokens")
        mask[a:b] = [1] * (b - a)
        turn[end:b] = [k] * (b - end)
        end = b
    if mask and mask[0]:
        raise refuse("the chat template renders an assistant turn first; a record starts with the prompt")
    return TokenRecord(ids=full[:end], loss_mask=mask[:end], logprobs=[0.0] * end, turn=turn[:end])


def learnable_records(
    trajs: list[Trajectory],
    *,
    renderer: ChatRenderer | None,
    tool_format: str,
    tool_schemas: list[dict[str, Any]],
    vocab_size: int | None = None,
) -> tuple[list[Trajectory], int]:
    """Every trajectory with the token record to learn from: its own, checked, or (without one) a rendered
    copy. Returns them in order and how many were rendered. A bad one raises RecordError naming its id;
    ``renderer`` None: rendering is not possible here, and a trajectory that needs it is refused."""
    out: list[Trajectory] = []
    rendered = 0
    for t in trajs:
        problem = token_record_problem(t, vocab_size)
        if problem is not None:
            raise RecordError(f"data: trajectory {t.id}: {problem}")
        if t.tokens is None:
            if renderer is None:
                raise RecordError(f"data: trajectory {t.id} has no token record and there is no chat template here")
            t = t.model_copy(update={"tokens": render_token_record(t, renderer, tool_format, tool_schemas)})
            rendered += 1
        out.append(t)
    return out, rendered

"""The data model every layer reads and writes: Task, Message, ToolCall, events,
token record, Grade, Trajectory, Run.

Layer 1: imports nothing from agentrft and never torch. The trajectory is the
contract (see ARCHITECTURE.md): the token record is exactly what the sampler
consumed and produced, never rebuilt by re-tokenising the chat text.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


_last_id = [0, 0]  # (ms, random part) of the previous id minted in this process
_id_lock = threading.Lock()


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON values (what a store row holds): tuples become lists, anything JSON cannot write
    becomes its ``str``. For what an environment or a benchmark hands back (its info, its task entries)."""
    return json.loads(json.dumps(value, default=str))


def new_id() -> str:
    """A 26-character time-sortable id (ULID layout: 48-bit ms time + 80 random bits).

    Lexicographic order of ids equals creation order: across processes at millisecond
    resolution, and strictly within a process (ids minted in the same millisecond
    step the random part up by a random amount, as monotonic ULIDs do), so `ORDER BY id` is chronological.
    """
    with _id_lock:
        ms, rand = int(time.time() * 1000), int.from_bytes(os.urandom(10), "big")
        if ms <= _last_id[0]:
            # a random step, not +1, so that short id prefixes (`traj show 01M8MK7YW2SH`) stay distinct
            ms, rand = _last_id[0], _last_id[1] + 1 + int.from_bytes(os.urandom(8), "big")
            if rand >= 1 << 80:  # random part exhausted within one millisecond: borrow the next one
                ms, rand = ms + 1, int.from_bytes(os.urandom(8), "big")
        _last_id[0], _last_id[1] = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


# ---------------------------------------------------------------- messages


class ToolCallFunction(_Model):
    name: str
    arguments: str = Field(description="JSON text of the arguments, as the OpenAI API sends it")


class ToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


Role = Literal["system", "user", "assistant", "tool", "developer"]


class Message(BaseModel):
    """One OpenAI chat message. Unknown keys are kept so ingested logs round-trip."""

    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """Content as plain text (text parts joined when content is a list of parts)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if isinstance(p, dict))

    def to_openai(self) -> dict[str, Any]:
        """The message as a plain dict, without unset optional keys."""
        return self.model_dump(exclude_none=True)


# ---------------------------------------------------------------- events


class _Event(_Model):
    t: float = Field(default_factory=time.time, description="wall-clock time, epoch seconds")
    turn: int = Field(ge=0, description="0-based assistant turn this event belongs to")


class ModelCallEvent(_Event):
    type: Literal["model_call"] = "model_call"
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    policy_version: int | None = None  # the weights that sampled this call, when the sampler says


class ToolCallEvent(_Event):
    type: Literal["tool_call"] = "tool_call"
    call_id: str | None = None
    name: str
    arguments: dict[str, Any] | str = Field(description="parsed arguments, or the raw text when unparsable")
    result: str | None = None
    error: str | None = Field(default=None, description="error text shown to the model, if the call failed")
    error_kind: str | None = Field(
        default=None,
        description="malformed | unknown_tool | bad_arguments | budget | timeout | exception",
    )
    latency_s: float = 0.0
    truncated: bool = False


class ReasoningEvent(_Event):
    type: Literal["reasoning"] = "reasoning"
    text: str


class FinalAnswerEvent(_Event):
    type: Literal["final_answer"] = "final_answer"
    text: str


Event = Annotated[ModelCallEvent | ToolCallEvent | ReasoningEvent | FinalAnswerEvent, Field(discriminator="type")]


# ---------------------------------------------------------------- tokens


SplitReason = Literal["message_dropped", "history_rewritten", "template_rewrote_history", "tools_changed"]


class SegmentBreak(_Model):
    """Why a session's token record starts a new segment: request `request`'s prompt does not extend
    the tokens the session had (see `rollout/stitch.py`); nothing was re-tokenised to force a match."""

    segment: int = Field(ge=1, description="index of the segment this break starts")
    request: int = Field(ge=0, description="index of the session request whose prompt started it")
    reason: SplitReason
    detail: str = ""


class TokenRecord(_Model):
    """Token-in-token-out record of one episode.

    Shape legend: T = number of tokens in the whole episode. All lists have length T.
    `loss_mask[i] == 1` exactly for tokens the sampler produced; prompt, chat-template
    and tool-result tokens are 0. `logprobs[i]` is the sampler's log-prob for sampled
    tokens and 0.0 elsewhere. `turn[i]` is the assistant turn the token belongs to
    (prompt tokens before turn k's sampled tokens carry k). `turn_versions[k]` is the
    policy version that sampled assistant turn k (an episode may span weight updates in
    asynchronous training); None when the sampler does not say.

    Segments: an episode played through `agentrft serve` sessions whose client rewrote its
    history holds several token sequences, each exactly what the sampler consumed and produced.
    `segment[i]` is token i's sequence (0, 1, ...: contiguous, in order; None: one segment) and
    `breaks` says why each segment after the first began. Each segment trains as a sequence of
    its own; all share the episode's reward.
    """

    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn: list[int]
    turn_versions: list[int] | None = None
    segment: list[int] | None = None
    breaks: list[SegmentBreak] = Field(default_factory=list)

    @model_validator(mode="after")
    def _same_lengths(self) -> TokenRecord:
        n = len(self.ids)
        for field in ("loss_mask", "logprobs", "turn"):
            if len(getattr(self, field)) != n:
                raise ValueError(f"tokens.{field} has length {len(getattr(self, field))}, ids has {n}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("tokens.loss_mask must hold only 0 and 1")
        if self.segment is not None:
            if len(self.segment) != n:
                raise ValueError(f"tokens.segment has length {len(self.segment)}, ids has {n}")
            prev = 0
            for s in self.segment:
                if s not in (prev, prev + 1):
                    raise ValueError("tokens.segment must start at 0 and count up by one, segment after segment")
                prev = s
            if n and self.segment[0] != 0:
                raise ValueError("tokens.segment must start at 0")
        if [b.segment for b in self.breaks] != list(range(1, self.num_segments)):
            raise ValueError(f"tokens.breaks must name segments 1..{self.num_segments - 1}, one break each")
        return self

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_segments(self) -> int:
        return (self.segment[-1] + 1) if self.segment else 1

    def segment_spans(self) -> list[tuple[int, int]]:
        """[start, end) of each segment in the flat lists."""
        if not self.segment:
            return [(0, len(self.ids))]
        spans: list[tuple[int, int]] = []
        start = 0
        for i in range(1, len(self.segment) + 1):
            if i == len(self.segment) or self.segment[i] != self.segment[i - 1]:
                spans.append((start, i))
                start = i
        return spans


# ---------------------------------------------------------------- grade

# The error flags of SPECS §1; graders may add their own but these are the shared names.
GRADER_ERROR_FLAGS = (
    "formula_parse_error",
    "invalid_variable_error",
    "sample_parse_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "model_grader_parse_error",
    "model_grader_refusal_error",
    "model_grader_server_error",
    "truncated_observation_error",
    "unresponsive_reward_error",
    "other_error",
)


class GradeError(_Model):
    flag: str
    grader: str = Field(description="name of the (sub-)grader that failed")
    message: str = ""


class Cost(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    seconds: float = 0.0
    usd: float | None = None


class Grade(_Model):
    reward: float
    sub_rewards: dict[str, float | None] = Field(default_factory=dict)
    turn_rewards: list[float] | None = Field(default=None, description="one process reward per assistant turn")
    success: bool = False
    errors: list[GradeError] = Field(default_factory=list)
    cost: Cost = Field(default_factory=Cost)
    grader: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def error_flags(self) -> list[str]:
        return [e.flag for e in self.errors]


# ---------------------------------------------------------------- tasks, trajectories, runs


class Task(_Model):
    """One problem for an environment: the prompt and the grading data (`data`)."""

    id: str
    env: str | None = None
    messages: list[Message] = Field(description="the task's prompt; the last message is the user's")
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="OpenAI tool schemas, if the task brings its own"
    )
    data: dict[str, Any] = Field(default_factory=dict, description="free grading data (answer, program, level ...)")


class EnvRef(_Model):
    name: str
    version: str = "0"
    tool_schema_hash: str = ""


# truncated: the episode ran out of tokens (the policy's doing: trained, and may be penalised); timeout: it ran
# out of wall time (the machine's or the tools' doing as much as the policy's: never trained)
Status = Literal["completed", "max_turns", "truncated", "timeout", "error"]


class Trajectory(_Model):
    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=new_id)
    run_id: str = ""
    task_id: str = ""
    group_id: str = ""
    env: EnvRef = Field(default_factory=lambda: EnvRef(name="none"))
    policy: str = ""
    policy_version: int = 0
    messages: list[Message] = Field(default_factory=list)
    n_prompt_messages: int = Field(
        default=0,
        ge=0,
        description="leading messages that were the prompt (system, worked examples, task); the episode's own turns follow",
    )
    events: list[Event] = Field(default_factory=list)
    tokens: TokenRecord | None = Field(
        default=None, description="None when the sampler returned no token ids (eval only)"
    )
    grade: Grade | None = None
    status: Status = "completed"
    error: str | None = None
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_schema(self) -> Trajectory:
        if self.schema_version > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is newer than this agentrft understands ({SCHEMA_VERSION})"
            )
        return self

    @property
    def tool_calls(self) -> list[ToolCallEvent]:
        return [e for e in self.events if isinstance(e, ToolCallEvent)]

    @property
    def final_answer(self) -> str | None:
        for e in reversed(self.events):
            if isinstance(e, FinalAnswerEvent):
                return e.text
        return None

    @property
    def num_turns(self) -> int:
        """Assistant turns of the episode itself (worked examples in the prompt do not count)."""
        return sum(1 for m in self.messages[self.n_prompt_messages :] if m.role == "assistant")

    @property
    def reward(self) -> float | None:
        return None if self.grade is None else self.grade.reward

    def untrainable_reason(self) -> str | None:
        """Why this trajectory must not enter a training batch, or None when it may.

        ``episode_error`` (the sampler or the loop failed: ``status == "error"``), ``timeout`` (stopped by
        its wall-time budget: how long it ran says as much about the machine's load as about the policy),
        ``injected_fault`` (an injected tool fault hit its last call and it ended without an answer:
        `envs.faults`), ``ungraded``,
        ``grader_error`` (the grade carries an error flag: the reward is not a measurement of the
        episode), ``no_tokens`` (an eval-only endpoint returned no token ids). Such trajectories
        never become rewards: they leave group statistics and the loss, and are counted.
        """
        if self.status == "error":
            return "episode_error"
        if self.status == "timeout":
            return "timeout"
        env = self.metadata.get("env")
        if self.status != "completed" and isinstance(env, dict) and env.get("last_call_faulted"):
            return "injected_fault"  # envs/faults.py: its last tool call failed by injection, no turn left after
        if self.grade is None:
            return "ungraded"
        if self.grade.errors:
            return "grader_error"
        if self.tokens is None:
            return "no_tokens"
        return None

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Trajectory:
        return cls.model_validate_json(text)


RunKind = Literal["eval", "train", "serve", "import", "demo", "check", "other"]


RunStatus = Literal["incomplete", "complete"]


class Run(_Model):
    id: str = Field(default_factory=new_id)
    name: str = ""
    kind: RunKind = "other"
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    metadata: dict[str, Any] = Field(default_factory=dict)
    status: RunStatus = Field(
        default="complete",
        description="incomplete from the start of a long run until it finishes: a run killed midway stays "
        "incomplete, and reports and exports say so instead of counting it as a result",
    )

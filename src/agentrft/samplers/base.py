"""The sampler interface: the only way rollout code talks to a policy.

Two kinds of sampler exist:

* `TokenSampler` — token-in-token-out (in-process Hugging Face, vLLM). The agent
  loop renders the conversation to token ids with `render`, asks `sample` for a
  continuation, and records the exact ids and log-probs for training.
* `ChatSampler` — an OpenAI-compatible endpoint that may return no token ids;
  trajectories made with it serve evaluation only (`Trajectory.tokens is None`).

A `TokenSampler` whose weights a trainer can update in place is a
`TrainablePolicy`: the seam that in-process samplers, async rollout workers,
Ray actors and vLLM engines plug into.

Log-probs: every sampler reports the log-probs of the distribution it sampled
from (temperature, top-k and top-p applied; see `samplers.distribution`).

No torch here: concrete samplers import it lazily.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agentrft.types import Message, Task

if TYPE_CHECKING:
    from typing_extensions import TypeIs

FinishReason = Literal["stop", "length", "stop_string", "error"]


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, description="0 means greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    stop: list[str] = Field(default_factory=list, description="stop strings; the matched string is kept in the output")
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class TurnWriter(Protocol):
    """Writes an assistant message as model text (the episode's tool-call format, `rollout.formats`)."""

    def render_assistant(self, message: Message) -> str: ...


@dataclass
class EpisodeView:
    """What the agent loop knows of the episode a request continues: its task, its messages after the
    prompt (assistant turns and tool results so far) and how its assistant turns are written. Model
    samplers ignore it; the `oracle` policy acts on it."""

    task: Task
    turns: list[Message]
    writer: TurnWriter


@dataclass
class SampleRequest:
    """Shape legend: P = prompt length. `prompt_ids` is what the sampler consumes."""

    prompt_ids: list[int]
    params: SamplingParams
    group_key: str | None = None  # requests sharing a key share a prompt prefix (prefill once)
    episode: EpisodeView | None = None  # set by the agent loop (rollout/agent.py); None outside an episode


@dataclass
class SampleResult:
    """Shape legend: N = number of sampled tokens; `token_ids` and `logprobs` have length N."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    latency_s: float = 0.0
    policy_version: int | None = None  # the weights that sampled it (a trainable in-process policy); None: unknown


class ChatRenderer(Protocol):
    """What renders a conversation to token ids: every token sampler, or a tokenizer alone
    (`chat_template.TokenizerRenderer`)."""

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]: ...


@runtime_checkable
class TokenSampler(Protocol):
    policy: str
    policy_version: int

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Token ids of the conversation through the model's chat template."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    async def sample(self, request: SampleRequest) -> SampleResult: ...


def is_token_sampler(sampler: object) -> TypeIs[TokenSampler]:
    """Whether `sampler` speaks token ids (it has `render` and `sample`); if not, it is a chat sampler.

    Duck-typed on the two methods the agent loop needs, as the callers always
    were; `isinstance(sampler, TokenSampler)` would also demand the data members.
    """
    return hasattr(sampler, "render") and hasattr(sampler, "sample")


@runtime_checkable
class TrainablePolicy(TokenSampler, Protocol):
    """A token sampler whose weights the trainer updates in place.

    ``model`` is the torch module the trainer optimises (a peft wrapper may be
    injected into it); ``tokenizer`` its Hugging Face tokenizer. The update runs
    inside ``with policy.paused():`` (in-flight requests finish, new ones wait,
    the caller has the model alone) and ends with ``weights_updated(version)``:
    the one way to say the weights changed, after which the policy samples as
    ``version`` and nothing computed with older weights (cached KV) is reused.
    ``reseed(seed)`` makes the unseeded sampling that follows reproducible.
    """

    model: Any
    tokenizer: Any

    def paused(self) -> AbstractContextManager[None]: ...

    def weights_updated(self, version: int) -> None: ...

    def reseed(self, seed: int) -> None: ...


@dataclass
class ChatResult:
    message: dict[str, Any]  # OpenAI assistant message (content, tool_calls)
    finish_reason: FinishReason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    prompt_ids: list[int] | None = None  # present only where the endpoint returns them
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ChatSampler(Protocol):
    policy: str
    policy_version: int

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> ChatResult: ...

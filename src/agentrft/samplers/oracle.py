"""The `oracle` policy: an environment's expert played through the agent loop, as a student model would.

`OracleSampler` is a `TokenSampler`. For each request it asks the environment's `Expert` for the
next assistant message, given the episode the agent loop describes (`SampleRequest.episode`),
writes it in the episode's tool-call format (``<search>{"query": ...}</search>``, the answer as
plain text) and returns the token ids of that text as the student's tokenizer encodes it, then
the end-of-sequence token, with log-probs 0.0. The agent loop parses, runs the tools and records
the episode exactly as for a model, so an oracle trajectory's token record is what the student's
chat template renders for its messages (`train/records.render_token_record`: same ids, loss mask
and turns): demonstrations to imitate token for token, stored and graded like any trajectory.

Names: ``oracle`` (the tokenizer of the default policy, smollm2-135m) or ``oracle:POLICY`` (the
tokenizer of an in-process policy: ``tiny``, ``hf:PATH``). The environment must have an expert
(`Environment.expert()`); that is checked before any tokenizer loads. At construction the sampler
also checks that the chat template writes an assistant turn as the text's own tokens followed by
EOS, which is what makes the record token-exact.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentrft.samplers.base import SampleRequest, SampleResult
from agentrft.samplers.chat_template import RendersWithTokenizer

if TYPE_CHECKING:
    from agentrft.envs.base import Environment, Expert

_PROBE_TEXT = '<search>{"query": "Probe 2020"}</search>'


class OracleError(ValueError):
    """The oracle cannot play here (no expert, no episode, a template it cannot match)."""


class OracleSampler(RendersWithTokenizer):
    """`TokenSampler` over an environment's expert and a student's tokenizer (module docstring)."""

    def __init__(self, expert: Expert, tokenizer: Any, policy: str = "oracle") -> None:
        self.expert = expert
        self.tokenizer = tokenizer
        self.policy = policy
        self.policy_version = 0
        eos = tokenizer.eos_token_id
        if eos is None:
            raise OracleError(f"policy {policy!r}: the tokenizer has no end-of-sequence token")
        self.eos_id = int(eos)
        self._check_template()

    def _check_template(self) -> None:
        """The template must write an assistant turn as encode(text) + EOS (then anything)."""
        stub: list[dict[str, Any]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        before = self.render(stub, None, add_generation_prompt=True)
        through = self.render([*stub, {"role": "assistant", "content": _PROBE_TEXT}], None, add_generation_prompt=False)
        want = self.encode(_PROBE_TEXT)
        if through[: len(before)] != before or through[len(before) : len(before) + len(want)] != want:
            raise OracleError(
                f"policy {self.policy!r}: the chat template does not write an assistant turn as the text's own "
                "tokens after the generation prompt, so the oracle's demonstrations would not be token-exact"
            )

    def encode(self, text: str) -> list[int]:
        """The assistant text's ids (no EOS): the student's tokenizer, no special tokens added."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    async def sample(self, request: SampleRequest) -> SampleResult:
        t0 = time.perf_counter()
        view = request.episode
        if view is None:
            raise OracleError(
                "the oracle acts on an episode (task and turns so far); it runs only inside the agent loop"
            )
        text = view.writer.render_assistant(self.expert.next_turn(view.task, list(view.turns)))
        ids = [*self.encode(text), self.eos_id]
        reason = "stop"
        if len(ids) > request.params.max_tokens:  # a model would be cut off there too
            ids = ids[: request.params.max_tokens]
            text, reason = self.decode(ids), "length"
        return SampleResult(
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            latency_s=time.perf_counter() - t0,
            policy_version=None,
        )


def oracle_student(name: str) -> str:
    """The policy whose tokenizer `oracle[:POLICY]` writes with."""
    from agentrft.samplers.policies import DEFAULT_POLICY

    return name.partition(":")[2] or DEFAULT_POLICY


def load_oracle(name: str, env: Environment | None) -> OracleSampler:
    """`oracle` / `oracle:POLICY` for `env`; PolicyError (before any tokenizer loads) where it cannot play."""
    from agentrft.samplers.policies import PolicyError, is_in_process, load_tokenizer

    if env is None:
        raise PolicyError(f"policy {name!r} plays an environment's expert and needs the environment (--env)")
    expert = env.expert()
    if expert is None:
        raise PolicyError(
            f"policy {name!r}: environment {env.name!r} has no expert that solves its tasks "
            "(Environment.expert(); finqa-lite has one)"
        )
    student = oracle_student(name)
    if not is_in_process(student):
        raise PolicyError(
            f"policy {name!r}: the oracle writes with the tokenizer of an in-process policy "
            f"(smollm2-135m, tiny, hf:PATH), not {student!r}"
        )
    try:
        return OracleSampler(expert, load_tokenizer(student), policy=name)
    except OracleError as exc:
        raise PolicyError(str(exc)) from None

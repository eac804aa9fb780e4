"""The agent loop: one episode of a tool-using agent, recorded as a Trajectory.

render → sample → parse → call tools → append tool results → repeat, until a
turn has no tool call (its text is the final answer) or a limit is hit:

| stop | status |
| --- | --- |
| a turn without tool calls (malformed calls count as calls) that the environment does not answer | ``completed`` |
| the environment ended the episode after a turn's tool calls (``Episode.finished``) | ``completed`` |
| ``limits.max_turns`` turns used and the last one still called a tool | ``max_turns`` |
| a turn ran into its token cap, the episode's total token cap, or the wall time (below) | ``truncated`` |
| the sampler raised or reported an error; the template cannot be extended | ``error`` |

The tool-call budget is the Episode's: calls past it come back as error results. An environment that answers
a turn without tool calls (``Episode.reply``: a user's next turn, a game's next observation) keeps the episode
going; what it measured (``Episode.outcome()``) is recorded in ``metadata["env"]`` however the episode ends.

The wall time (``limits.wall_time_s``) guards against hangs, and counts the episode's own time: its clock stops
while a model call is out, and each model call has the same limit of its own. A batching sampler serves many
episodes at once, so a call's time is mostly the batch's (64 level-4 episodes of a few thousand tokens each take
longer than 30 minutes on a 2-core CPU): counted against every episode, it cut off episodes that were working.
Rollout imports no torch: the policy is reached only through the sampler interface.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from agentrft.envs.base import Environment, Episode
from agentrft.rollout.formats import ParseError, ToolFormat, make_format
from agentrft.rollout.tito import DeltaRenderer, TemplateError, TokenLedger
from agentrft.samplers.base import (
    ChatSampler,
    EpisodeView,
    SampleRequest,
    SamplingParams,
    TokenSampler,
    is_token_sampler,
)
from agentrft.types import (
    FinalAnswerEvent,
    Message,
    ModelCallEvent,
    Task,
    TokenRecord,
    ToolCall,
    ToolCallEvent,
    ToolCallFunction,
    Trajectory,
    json_safe,
    new_id,
)


class _WallClock:
    """The episode's wall-time deadline (an ``asyncio.timeout``), stopped while a model call is out; the call
    gets ``limit_s`` of its own. A call that fails or runs past its limit ends the episode (`EpisodeEnd`)."""

    def __init__(self, deadline: asyncio.Timeout, limit_s: float) -> None:
        self.deadline, self.limit_s = deadline, limit_s

    async def model_call(self, call: Any) -> Any:
        loop = asyncio.get_running_loop()
        left = (self.deadline.when() or loop.time()) - loop.time()  # set by run_episode's timeout_at
        self.deadline.reschedule(None)
        guard = asyncio.timeout(self.limit_s)
        try:
            async with guard:
                return await call
        except Exception as exc:
            if isinstance(exc, TimeoutError) and guard.expired():
                raise EpisodeEnd(
                    "timeout", f"a model call took longer than the wall time of {self.limit_s:g} s"
                ) from None
            raise EpisodeEnd("error", f"sampler failed: {type(exc).__name__}: {exc}") from None
        finally:
            self.deadline.reschedule(loop.time() + left)


class EpisodeEnd(Exception):
    """Raised inside the loop to end the episode with a status (not an error of the caller)."""

    def __init__(self, status: str, error: str | None = None) -> None:
        super().__init__(error or status)
        self.status, self.error = status, error


def prompt_messages(env: Environment, task: Task, fmt: ToolFormat) -> list[Message]:
    """The episode's opening messages (OpenAI format): the system prompt gets the format's tool instructions."""
    messages = [m.model_copy(deep=True) for m in env.initial_messages(task)]
    instructions = fmt.render_tool_instructions(env.task_tool_schemas(task))
    if instructions:
        if messages and messages[0].role == "system":
            messages[0].content = f"{messages[0].text()}\n\n{instructions}".strip()
        else:
            messages.insert(0, Message(role="system", content=instructions))
    return messages


def to_render(message: Message, fmt: ToolFormat) -> dict[str, Any]:
    """What the chat template sees for one message: calls written in the format's text unless native."""
    if fmt.native:
        return message.to_openai()
    if message.role == "assistant":
        return {"role": "assistant", "content": fmt.render_assistant(message)}
    return {"role": message.role, "content": message.text()}


def check_native(sampler: TokenSampler, tools: list[dict[str, Any]]) -> None:
    """The native format needs a template that renders tools; say so plainly when it does not."""
    probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    if list(sampler.render(probe, tools)) == list(sampler.render(probe, None)):
        raise ValueError(
            f"tool format 'native' needs a chat template with tool support; {sampler.policy!r} "
            "ignores tools. Use tool_format='xml' or 'hermes'."
        )


async def _call_tools(
    episode: Episode, turn: int, calls: list[ToolCall], errors: list[str]
) -> tuple[list[Message], list[ToolCallEvent], list[ToolCall]]:
    """Run the turn's calls in order (the episode's budget counts them in order); malformed ones become errors."""
    messages: list[Message] = []
    events: list[ToolCallEvent] = []
    extra_calls: list[ToolCall] = []
    for call in calls:
        raw = call.function.arguments
        try:
            args: dict[str, Any] | str = json.loads(raw)
        except json.JSONDecodeError:
            args = raw
        t0 = time.monotonic()
        result = await episode.call_tool(call.function.name, args)
        latency = result.latency_s or (time.monotonic() - t0)
        events.append(
            ToolCallEvent(
                turn=turn,
                call_id=call.id,
                name=call.function.name,
                arguments=args,
                result=result.content,
                error=result.error,
                error_kind=result.error_kind,
                latency_s=latency,
                truncated=result.truncated,
            )
        )
        messages.append(Message(role="tool", tool_call_id=call.id, name=call.function.name, content=result.content))
    for err in errors:
        raw = err.raw if isinstance(err, ParseError) else ""
        name = (err.name if isinstance(err, ParseError) else None) or "invalid_tool_call"
        # The malformed call keeps a place in the assistant's tool_calls so the tool message pairs with an id.
        bad = ToolCall(id=f"call_{new_id()[-12:]}", function=ToolCallFunction(name=name, arguments=raw))
        extra_calls.append(bad)
        text = f"Error: {err}"
        events.append(
            ToolCallEvent(
                turn=turn, call_id=bad.id, name=name, arguments=raw, result=None, error=text, error_kind="malformed"
            )
        )
        messages.append(Message(role="tool", tool_call_id=bad.id, name=name, content=text))
    return messages, events, extra_calls


async def run_episode(
    env: Environment,
    sampler: TokenSampler | ChatSampler,
    task: Task,
    *,
    params: SamplingParams,
    tool_format: str = "xml",
    run_id: str = "",
    group_id: str = "",
    policy_version: int | None = None,
    group_key: str | None = None,
    prefix: EpisodePrefix | None = None,
) -> Trajectory:
    """Play one episode of `task` and return its Trajectory (never raises for model or tool misbehaviour).
    With ``prefix`` (a recorded episode's first turns, `rollout.replay`) the episode starts from there: its
    messages, events and token record as recorded, the environment brought to that point by running the
    prefix's tool calls again (their recorded results are what the policy sees), the policy sampling next."""
    fmt = make_format(tool_format, env.task_parse_schemas(task))
    traj = Trajectory(
        run_id=run_id,
        task_id=task.id,
        group_id=group_id,
        env=env.ref(),
        policy=getattr(sampler, "policy", ""),
        policy_version=policy_version if policy_version is not None else getattr(sampler, "policy_version", 0),
    )
    if prefix is None:
        traj.messages = prompt_messages(env, task, fmt)
        traj.n_prompt_messages = len(traj.messages)
    else:
        traj.messages = [m.model_copy(deep=True) for m in prefix.messages]
        traj.n_prompt_messages, traj.events = prefix.n_prompt_messages, list(prefix.events)
        traj.metadata.update(branch_of=prefix.parent, branch_turn=prefix.turn)
    limits = env.task_limits(task)
    ledger: TokenLedger | None = None
    episode: Episode | None = None
    try:
        episode = _start(env, task)
        if prefix is not None:
            traj.metadata["replayed_calls_differ"] = await _restore(episode, prefix)
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + limits.wall_time_s) as deadline:
            clock = _WallClock(deadline, limits.wall_time_s)
            if is_token_sampler(sampler):
                ledger = TokenLedger() if prefix is None else prefix.ledger()
                key = group_key or group_id or None
                first = 0 if prefix is None else prefix.turn
                await _token_loop(env, episode, sampler, task, traj, fmt, params, ledger, key, clock, first)
            else:
                await _chat_loop(env, episode, sampler, task, traj, fmt, params, clock)
    except EpisodeEnd as end:
        traj.status, traj.error = end.status, end.error  # type: ignore[assignment]
    except TimeoutError:
        traj.status, traj.error = "timeout", f"wall time of {limits.wall_time_s:g} s exceeded"
    except TemplateError as exc:
        traj.status, traj.error = "error", str(exc)
    finally:  # a cancelled or failed episode releases what the environment holds for it too
        if episode is not None:
            _finish_episode(episode, traj)
    if ledger is not None:
        versions = [e.policy_version for e in traj.events if isinstance(e, ModelCallEvent)]
        known = [v for v in versions if v is not None]
        traj.tokens = TokenRecord(
            ids=ledger.ids,
            loss_mask=ledger.loss_mask,
            logprobs=ledger.logprobs,
            turn=ledger.turn,
            turn_versions=known if known and len(known) == len(versions) else None,
        )
        if policy_version is None and traj.tokens.turn_versions:  # an episode that spanned a weight update
            traj.policy_version = min(traj.tokens.turn_versions)  # is as stale as its oldest turn
    traj.finished_at = time.time()
    return traj


@dataclass
class EpisodePrefix:
    """A recorded episode up to the moment its turn ``turn`` was sampled (`rollout.replay.prefix_of`): the
    conversation, the events and the token record (ids, loss mask, log-probs, turns) exactly as recorded;
    ``parent`` the recorded episode's id (an episode continuing it records ``metadata.branch_of`` and
    ``branch_turn``)."""

    turn: int
    messages: list[Message]
    n_prompt_messages: int
    events: list[Any]
    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turns: list[int]
    parent: str = ""

    def ledger(self) -> TokenLedger:
        return TokenLedger(list(self.ids), list(self.loss_mask), list(self.logprobs), list(self.turns))


async def _restore(episode: Episode, prefix: EpisodePrefix) -> list[int]:
    """Run the prefix's tool calls again, in order, so a stateful environment stands where the recorded episode
    stood; the policy sees the recorded results (in the prefix). Returns the calls whose result now differs."""
    differ = []
    calls = [e for e in prefix.events if isinstance(e, ToolCallEvent) and e.error_kind != "malformed"]
    for i, call in enumerate(calls):
        try:
            result = await episode.call_tool(call.name, call.arguments)
        except Exception as exc:
            raise EpisodeEnd("error", _env_failed("call_tool (replaying the prefix)", exc)) from None
        if (result.content if result.ok else None) != call.result:
            differ.append(i)
    return differ


def _env_failed(hook: str, exc: Exception) -> str:
    """What the environment's own code raised in one of its hooks: the episode's error (never trained on)."""
    return f"environment failed in {hook}: {type(exc).__name__}: {exc}"


def _start(env: Environment, task: Task) -> Episode:
    try:
        return env.start(task)
    except Exception as exc:
        raise EpisodeEnd("error", _env_failed("start", exc)) from None


async def _env_reply(episode: Episode, text: str) -> list[Message] | None:
    try:
        answer = await episode.reply(text)
    except Exception as exc:
        raise EpisodeEnd("error", _env_failed("reply", exc)) from None
    if answer is not None and (not isinstance(answer, list) or not all(isinstance(m, Message) for m in answer)):
        raise EpisodeEnd(
            "error", f"environment failed in reply: it returned {type(answer).__name__}, not list[Message]"
        )
    return answer


def _finish_episode(episode: Episode, traj: Trajectory) -> None:
    """Record what the environment measured and release the episode; its failure there is the episode's error."""
    try:
        outcome = episode.outcome()
        if outcome:
            traj.metadata["env"] = json_safe(outcome)
    except Exception as exc:
        traj.status, traj.error = "error", _env_failed("outcome", exc)
    try:
        episode.close()
    except Exception as exc:
        if traj.status != "error":
            traj.status, traj.error = "error", _env_failed("close", exc)


def _turn_params(params: SamplingParams, fmt: ToolFormat, budget: int) -> SamplingParams:
    stop = list(dict.fromkeys([*params.stop, *fmt.stop_strings()]))
    return params.model_copy(update={"max_tokens": budget, "stop": stop})


async def _token_loop(
    env: Environment,
    episode: Episode,
    sampler: TokenSampler,
    task: Task,
    traj: Trajectory,
    fmt: ToolFormat,
    params: SamplingParams,
    ledger: TokenLedger,
    group_key: str | None,
    clock: _WallClock,
    first_turn: int = 0,
) -> None:
    limits = env.task_limits(task)
    tools = env.task_tool_schemas(task) if fmt.native else None
    if fmt.native:
        check_native(sampler, env.task_tool_schemas(task))
    delta = DeltaRenderer(sampler, tools)
    if not ledger.ids:  # a replayed prefix brings its own (rollout.replay)
        ledger.add_prompt(
            list(sampler.render([to_render(m, fmt) for m in traj.messages], tools, add_generation_prompt=True)),
            turn=0,
        )
    for turn in range(first_turn, limits.max_turns):
        budget = min(params.max_tokens, limits.max_tokens_per_turn, limits.max_total_tokens - len(ledger.ids))
        if budget < 1:  # only the opening prompt can get here; later deltas are checked before appending
            raise EpisodeEnd(
                "truncated",
                f"prompt of {len(ledger.ids)} tokens leaves nothing of the episode "
                f"token limit of {limits.max_total_tokens}",
            )
        request = SampleRequest(
            prompt_ids=list(ledger.ids),
            params=_turn_params(params, fmt, budget),
            group_key=group_key,
            episode=EpisodeView(task=task, turns=traj.messages[traj.n_prompt_messages :], writer=fmt),
        )
        result = await clock.model_call(sampler.sample(request))
        ledger.add_sampled(list(result.token_ids), list(result.logprobs), turn)
        traj.events.append(
            ModelCallEvent(
                turn=turn,
                latency_s=result.latency_s,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                finish_reason=result.finish_reason,
                policy_version=result.policy_version,
            )
        )
        if result.finish_reason == "error":
            traj.messages.append(Message(role="assistant", content=result.text))
            raise EpisodeEnd("error", "sampler reported an error")
        parsed = fmt.parse(result.text)
        if result.finish_reason == "length" and not parsed.tool_calls:
            traj.messages.append(Message(role="assistant", content=result.text))
            raise EpisodeEnd("truncated", f"turn {turn} hit its token limit of {budget}")
        if not parsed.has_calls:
            assistant = Message(role="assistant", content=parsed.content)
            traj.messages.append(assistant)
            follow = await _env_reply(episode, parsed.content)
            if follow is None:
                traj.events.append(FinalAnswerEvent(turn=turn, text=parsed.content))
                traj.status = "completed"
                return
            traj.messages += follow
        else:
            follow, events, extra = await _call_tools(episode, turn, parsed.tool_calls, parsed.errors)
            assistant = Message(
                role="assistant", content=parsed.content or None, tool_calls=[*parsed.tool_calls, *extra]
            )
            traj.messages += [assistant, *follow]
            traj.events += events
            if episode.finished:
                traj.status = "completed"
                return
        if turn + 1 >= limits.max_turns:
            break
        next_ids = delta.delta(list(result.token_ids), to_render(assistant, fmt), [to_render(m, fmt) for m in follow])
        if len(ledger.ids) + len(next_ids) >= limits.max_total_tokens:
            # Not appended: the token record holds only what the sampler consumed and produced.
            raise EpisodeEnd("truncated", f"episode token limit of {limits.max_total_tokens} reached")
        ledger.add_prompt(next_ids, turn=turn + 1)
    raise EpisodeEnd("max_turns", f"{limits.max_turns} turns used without a final answer")


async def _chat_loop(
    env: Environment,
    episode: Episode,
    sampler: ChatSampler,
    task: Task,
    traj: Trajectory,
    fmt: ToolFormat,
    params: SamplingParams,
    clock: _WallClock,
) -> None:
    """Endpoint without token ids (eval only): OpenAI messages and tools go to the endpoint as they are."""
    limits = env.task_limits(task)
    for turn in range(limits.max_turns):
        result = await clock.model_call(
            sampler.chat(
                [m.to_openai() for m in traj.messages],
                env.task_tool_schemas(task) or None,
                params.model_copy(update={"max_tokens": min(params.max_tokens, limits.max_tokens_per_turn)}),
            )
        )
        traj.events.append(
            ModelCallEvent(
                turn=turn,
                latency_s=result.latency_s,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                finish_reason=result.finish_reason,
            )
        )
        msg = Message.model_validate({**result.message, "role": "assistant"})
        calls = list(msg.tool_calls or [])
        errors: list[str] = []
        if not calls:  # an endpoint without tool support may still write calls in the text
            parsed = fmt.parse(msg.text())
            calls, errors = parsed.tool_calls, parsed.errors
            if calls or errors:
                msg = Message(role="assistant", content=parsed.content or None)
        if not calls and not errors:
            traj.messages.append(msg)
            if result.finish_reason == "length":
                raise EpisodeEnd("truncated", f"turn {turn} hit its token limit")
            answer = await _env_reply(episode, msg.text())
            if answer is None:
                traj.events.append(FinalAnswerEvent(turn=turn, text=msg.text()))
                traj.status = "completed"
                return
            traj.messages += answer
            continue
        tool_msgs, events, extra = await _call_tools(episode, turn, calls, errors)
        msg.tool_calls = [*calls, *extra]
        traj.messages += [msg, *tool_msgs]
        traj.events += events
        if episode.finished:
            traj.status = "completed"
            return
    raise EpisodeEnd("max_turns", f"{limits.max_turns} turns used without a final answer")

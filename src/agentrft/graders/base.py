"""Core of the grader library: `Sample`, the `Grader` base class, errors, `Score`.

A grader is a pure function of (sample, item) → `Grade`. Leaf graders implement
`score()` (sync) or `ascore()` (async, for HTTP judges); the base class turns
every failure into a `GradeError` flag on the Grade (SPECS §1) so that an error
is never a silent 0.

Success rule (documented choice): `success = no errors and reward >= threshold`,
where threshold is the spec's `pass_threshold` if given, else the grader's
maximum reward (`max_reward`: 1.0 for most graders, the top of `range` for
`score_model`, 0.0 for `efficiency`, 1.0 for `multi`/weighted combinations).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from agentrft.inputs import InputError
from agentrft.types import Cost, Grade, GradeError, Message, Trajectory


class GraderSpecError(InputError):
    """A malformed grader spec, found at load time. `path` is the JSON path of the fault."""

    def __init__(self, path: str, message: str, flag: str | None = None) -> None:
        self.path = path
        self.message = message
        self.flag = flag
        super().__init__(f"{path}: {message}" if path else message)


class GraderFailure(Exception):
    """Raised inside a grader at grading time; becomes a `GradeError(flag, grader, message)`."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag = flag
        self.message = message
        super().__init__(f"{flag}: {message}")


@dataclass(slots=True)
class Score:
    """Raw outcome of one grader before it becomes a `Grade`."""

    value: float
    errors: list[GradeError] | None = None
    sub: dict[str, float | None] | None = None
    turn_rewards: list[float] | None = None
    metadata: dict[str, Any] | None = None


class Sample:
    """What a grader sees of the model's output (the `sample` template namespace).

    Built from text, a dict with OpenAI-style fields, or an agent `Trajectory`
    (`from_trajectory`: `output_text` is the final answer, i.e. the last assistant
    message when it has no tool calls; "" when the episode never answered).
    """

    __slots__ = ("_traj_dict", "choices", "output_json", "output_text", "output_tools", "trajectory")

    def __init__(
        self,
        output_text: str = "",
        output_json: Any = None,
        output_tools: list[dict[str, Any]] | None = None,
        choices: list[dict[str, Any]] | None = None,
        trajectory: Trajectory | None = None,
    ) -> None:
        self.output_text = output_text
        self.output_json = output_json if output_json is not None else _maybe_json(output_text)
        self.output_tools = output_tools if output_tools is not None else []
        self.choices = choices if choices is not None else []
        self.trajectory = trajectory
        self._traj_dict: dict[str, Any] | None = None

    @classmethod
    def from_trajectory(cls, traj: Trajectory) -> Sample:
        """The episode's final answer (its `FinalAnswerEvent`; else the last assistant message without tool
        calls) and the tool calls of its own turns (not those of worked examples in the prompt)."""
        last: Message | None = None
        for m in reversed(traj.messages):
            if m.role == "assistant":
                last = m
                break
        if traj.final_answer is not None:  # e.g. what an agent command printed, which no message holds
            text = traj.final_answer
        else:
            text = last.text() if last is not None and not last.tool_calls else ""
        own = traj.messages[traj.n_prompt_messages :]
        tools = [tc.model_dump() for m in own if m.role == "assistant" for tc in (m.tool_calls or [])]
        choices = [{"index": 0, "message": last.to_openai()}] if last is not None else []
        return cls(output_text=text, output_tools=tools, choices=choices, trajectory=traj)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """A dict with `output_text` etc., or a serialised trajectory (has `messages`)."""
        if "messages" in data and ("events" in data or "schema_version" in data or "output_text" not in data):
            return cls.from_trajectory(Trajectory.model_validate(data))
        unknown = set(data) - {"output_text", "output_json", "output_tools", "choices"}
        if unknown:
            raise ValueError(f"unknown sample field(s): {', '.join(sorted(unknown))}")
        text = data.get("output_text")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise ValueError("sample.output_text must be a string")
        return cls(text, data.get("output_json"), data.get("output_tools"), data.get("choices"))

    @classmethod
    def coerce(cls, obj: Sample | Trajectory | dict[str, Any] | str) -> Sample:
        if isinstance(obj, Sample):
            return obj
        if isinstance(obj, Trajectory):
            return cls.from_trajectory(obj)
        if isinstance(obj, dict):
            return cls.from_dict(obj)
        if isinstance(obj, str):
            return cls(obj)
        raise TypeError(f"cannot grade a {type(obj).__name__}; pass a Sample, Trajectory, dict or str")

    def field(self, name: str) -> Any:
        """Template lookup of a top-level field (None when absent)."""
        if name == "trajectory":
            if self.trajectory is None:
                return None
            if self._traj_dict is None:
                self._traj_dict = self.trajectory.model_dump(mode="json")
            return self._traj_dict
        if name in ("output_text", "output_json", "output_tools", "choices"):
            return getattr(self, name)
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON form handed to python and endpoint graders."""
        d: dict[str, Any] = {
            "output_text": self.output_text,
            "output_json": self.output_json,
            "output_tools": self.output_tools,
            "choices": self.choices,
        }
        if self.trajectory is not None:
            d["trajectory"] = self.field("trajectory")
        return d


def _maybe_json(text: str) -> Any:
    s = text.strip() if text else ""
    if not s or s[0] not in "{[":
        return None
    try:
        return json.loads(s)
    except ValueError:
        return None


class Grader:
    """Base of every grader. Subclasses set `type` and implement `score` or `ascore`."""

    type: ClassVar[str] = ""
    is_async: ClassVar[bool] = False  # True when ascore does real I/O (model, endpoint, sandbox)

    def __init__(self, name: str, pass_threshold: float | None = None, max_reward: float = 1.0) -> None:
        self.name = name
        self.pass_threshold = pass_threshold
        self.max_reward = max_reward

    # ---- to implement
    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        """Sync scoring. Raise `GraderFailure` for a flagged error."""
        if self.is_async:
            return run_sync(self.ascore(sample, item))
        raise NotImplementedError

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        return self.score(sample, item)

    # ---- public API
    def grade(self, sample: Sample | Trajectory | dict[str, Any] | str, item: dict[str, Any]) -> Grade:
        """Grade one sample against one dataset item (sync)."""
        if self.is_async:
            return run_sync(self.agrade(sample, item))
        return self.to_grade(self.safe_score(Sample.coerce(sample), item))

    async def agrade(self, sample: Sample | Trajectory | dict[str, Any] | str, item: dict[str, Any]) -> Grade:
        """Grade one sample (async; HTTP judges and sandboxes run concurrently)."""
        return self.to_grade(await self.safe_ascore(Sample.coerce(sample), item))

    # ---- error handling shared by leaves and combinators
    def safe_score(self, sample: Sample, item: dict[str, Any]) -> Score:
        try:
            return self.score(sample, item)
        except GraderFailure as e:
            return Score(0.0, [GradeError(flag=e.flag, grader=self.name, message=e.message)])
        except Exception as e:  # a grader bug is a counted error, never a silent 0
            return Score(0.0, [GradeError(flag="other_error", grader=self.name, message=f"{type(e).__name__}: {e}")])

    async def safe_ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        try:
            return await self.ascore(sample, item)
        except GraderFailure as e:
            return Score(0.0, [GradeError(flag=e.flag, grader=self.name, message=e.message)])
        except Exception as e:
            return Score(0.0, [GradeError(flag="other_error", grader=self.name, message=f"{type(e).__name__}: {e}")])

    def threshold(self) -> float:
        return self.max_reward if self.pass_threshold is None else self.pass_threshold

    def to_grade(self, s: Score) -> Grade:
        errors = s.errors or []
        sub = s.sub if s.sub is not None else {self.name: None if errors else s.value}
        success = not errors and s.value >= self.threshold() - 1e-12
        return _make_grade(
            {
                "reward": s.value,
                "sub_rewards": sub,
                "turn_rewards": s.turn_rewards,
                "success": success,
                "errors": errors,
                "cost": _make_cost(),
                "grader": self.name,
                "metadata": s.metadata or {},
            }
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_M = TypeVar("_M", bound=BaseModel)

_Builder = Callable[[dict[str, Any]], _M]


def _fast_builder(cls: type[_M]) -> tuple[_Builder[_M], _Builder[_M]]:
    """A constructor for pydantic models whose fields we build ourselves, correctly typed.

    Validation (and even `model_construct`, which walks every field) is the main
    cost of a string_check grade; this sets the instance state directly. It is
    checked once against `model_validate` at import and falls back to
    `model_construct` if pydantic's internals ever differ.
    """

    def fast(d: dict[str, Any]) -> _M:
        obj = cls.__new__(cls)
        object.__setattr__(obj, "__dict__", d)
        object.__setattr__(obj, "__pydantic_fields_set__", set(d))
        object.__setattr__(obj, "__pydantic_extra__", None)
        object.__setattr__(obj, "__pydantic_private__", None)
        return obj

    def slow(d: dict[str, Any]) -> _M:
        return cls.model_construct(**d)

    return fast, slow


def _select_builders() -> tuple[_Builder[Grade], _Builder[Cost]]:
    gf, gs = _fast_builder(Grade)
    cf, cs = _fast_builder(Cost)
    try:
        probe = {
            "reward": 0.5,
            "sub_rewards": {"a": 0.5},
            "turn_rewards": None,
            "success": False,
            "errors": [],
            "cost": cf({"prompt_tokens": 0, "completion_tokens": 0, "tool_calls": 0, "seconds": 0.0, "usd": None}),
            "grader": "a",
            "metadata": {},
        }
        fast = gf(dict(probe))
        if fast == Grade.model_validate(probe) and fast.model_dump() == Grade.model_validate(probe).model_dump():
            return gf, cf
    except Exception:  # pragma: no cover - only if pydantic internals change
        pass
    return gs, cs  # pragma: no cover


_make_grade_raw, _make_cost_raw = _select_builders()


def _make_grade(d: dict[str, Any]) -> Grade:
    return _make_grade_raw(d)


def _make_cost() -> Cost:
    return _make_cost_raw({"prompt_tokens": 0, "completion_tokens": 0, "tool_calls": 0, "seconds": 0.0, "usd": None})


def run_sync(coro: Any) -> Any:
    """Run a coroutine from sync code, also when an event loop is already running in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            box["e"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]

"""A Gymnasium-style text environment as an agentrft `Environment`.

The user's class needs two methods and nothing from agentrft:

- ``reset(seed) -> observation`` or ``(observation, info)``: the task's opening text (the user's first message);
- ``step(action_text) -> (observation, reward, terminated, truncated, info)``: the policy's reply without a tool
  call; the episode goes on with ``observation`` as the next user message until ``terminated`` or ``truncated``.

Optional class attributes: ``name``, ``system_prompt``, ``max_turns`` (6), ``max_tokens_per_turn`` (128),
``tools`` (names of methods the policy may call as tools: their type hints and docstrings are the JSON schema,
`tools/schema.py`; they may change the instance's state and return text), ``pass_threshold`` (the summed reward
that counts as a success, default 1.0). Each episode gets a fresh instance, built with the spec's options as
keyword arguments (strings); ``?train=N&test=M`` set how many seeds the splits hold (256 and 64): ``train`` is
seeds 0..N-1, ``held-out`` seeds from 1,000,000, so the two never share a seed.

The episode's reward is the sum of ``step``'s rewards, recorded in ``metadata["env"]["reward"]``; the
environment's default grader (``env_reward``) makes it the grade.
"""

from __future__ import annotations

import inspect
from typing import Any

from agentrft.envs.base import Environment, EnvLimits
from agentrft.envs.plugins import EnvSpec, started
from agentrft.envs.toolbox_episode import ToolboxEpisode
from agentrft.inputs import InputError
from agentrft.tools.registry import Tool, Toolbox
from agentrft.types import Message, Task, json_safe

HELD_OUT_SEED0 = 1_000_000
SPLITS = ("train", "held-out")
DEFAULT_PROMPT = "You are a helpful assistant. Reply to each message; use the tools when they help."


def is_text_env(cls: Any) -> bool:
    """A class with ``reset`` and ``step`` that is not already an Environment."""
    return (
        inspect.isclass(cls)
        and not issubclass(cls, Environment)
        and callable(getattr(cls, "reset", None))
        and callable(getattr(cls, "step", None))
    )


class GymEpisode(ToolboxEpisode):
    """One instance of the user's class: tools are its methods, replies are its steps."""

    def __init__(self, task: Task, instance: Any, toolbox: Toolbox, max_tool_calls: int) -> None:
        super().__init__(task, toolbox, max_tool_calls)
        self.instance = instance
        self.total = 0.0
        self.steps = 0
        self.terminated = self.truncated = False
        self.info: dict[str, Any] = {}

    async def reply(self, text: str) -> list[Message] | None:
        result = self.instance.step(text)
        if not isinstance(result, tuple) or len(result) != 5:
            raise TypeError("step must return (observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = result
        self.steps += 1
        self.total += float(reward)
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        self.info = dict(info or {})
        if self.terminated or self.truncated:
            return None
        return [Message(role="user", content=str(observation))]

    def outcome(self) -> dict[str, Any]:
        return {
            "reward": self.total,
            "steps": self.steps,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "info": self.info,  # made plain JSON with the rest by the agent loop
        }


class GymTextEnv(Environment):
    version = "1"

    def __init__(
        self,
        cls: type,
        *,
        name: str | None = None,
        options: dict[str, Any] | None = None,
        n_train: int = 256,
        n_test: int = 64,
    ) -> None:
        self.cls, self.options = cls, dict(options or {})
        self.name = name or str(getattr(cls, "name", cls.__name__))
        self.n = {"train": n_train, "held-out": n_test}
        self.limits = EnvLimits(
            max_turns=int(getattr(cls, "max_turns", 6)),
            max_tokens_per_turn=int(getattr(cls, "max_tokens_per_turn", 128)),
        )
        self.pass_threshold = float(getattr(cls, "pass_threshold", 1.0))
        self._probe = self._new()  # fails here, before any model loads, when the options do not fit the class
        self._schemas = self._toolbox(self._probe).schemas()
        self._tasks: dict[str, list[Task]] = {}

    @classmethod
    def from_spec_of(cls, target: type, spec: EnvSpec, **kwargs: Any) -> GymTextEnv:
        if spec.arg:
            raise spec.error(f"{spec.name} takes no argument after ':' (options go after '?')")
        options = {k: v for k, v in spec.options.items() if k not in ("train", "test")}
        counts = {"n_train": spec.int_option("train", 256, minimum=1), "n_test": spec.int_option("test", 64, minimum=1)}
        if counts["n_train"] > HELD_OUT_SEED0:
            raise spec.error(f"train must be at most {HELD_OUT_SEED0:,} (held-out seeds start there)")
        env = started(
            spec, lambda: cls(target, name=getattr(target, "name", spec.name), options={**options, **kwargs}, **counts)
        )
        started(spec, lambda: env.tasks("held-out"))  # reset's signature and behaviour, before any model loads
        return env

    def _new(self) -> Any:
        return self.cls(**self.options)

    def _toolbox(self, instance: Any) -> Toolbox:
        names = list(getattr(self.cls, "tools", ()) or ())
        return Toolbox(
            Tool.from_function(getattr(instance, n), name=n, timeout_s=self.limits.tool_timeout_s) for n in names
        )

    def system_prompt(self) -> str:
        return str(getattr(self.cls, "system_prompt", DEFAULT_PROMPT))

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    def grader_spec(self) -> dict[str, Any]:
        return {"type": "env_reward", "name": "reward", "pass_threshold": self.pass_threshold}

    @staticmethod
    def _reset(instance: Any, seed: int) -> tuple[str, dict[str, Any]]:
        result = instance.reset(seed=seed)
        if isinstance(result, tuple):
            observation, info = result
            return str(observation), dict(info or {})
        return str(result), {}

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise InputError(f"unknown split {split!r} of {self.name}; valid splits: {', '.join(SPLITS)}")
        if split not in self._tasks:
            first = 0 if split == "train" else HELD_OUT_SEED0
            tasks = []
            for seed in range(first, first + self.n[split]):
                observation, info = self._reset(self._new(), seed)
                tasks.append(
                    Task(
                        id=f"{self.name}/{split}/{seed}",
                        env=self.name,
                        messages=[Message(role="user", content=observation)],
                        data={"seed": seed, "info": json_safe(info)},
                    )
                )
            self._tasks[split] = tasks
        return self._tasks[split]

    def start(self, task: Task) -> GymEpisode:
        instance = self._new()
        self._reset(instance, int(task.data["seed"]))
        return GymEpisode(task, instance, self._toolbox(instance), self.limits.max_tool_calls)

"""``reasoning-gym:NAME[,NAME...]``: procedural tasks from the package reasoning-gym, scored by its own checkers.

Each NAME is a reasoning-gym dataset (``chain_sum``, ``basic_arithmetic``, ``leg_counting``, ...). Options:

- ``train=N`` / ``test=M``: tasks per dataset in the ``train`` and ``held-out`` splits (256 and 64);
- ``seed=S``: the generators' seed (0); ``train`` is generated with S, ``held-out`` with S + 1,000,003, and a
  held-out question that also appears in train is dropped, so the two splits never share a question;
- ``tools=calc``: a ``calculate`` tool (the safe arithmetic of `agentrft.arith`) and one worked example of a
  call in the prompt (two by default; ``shots=N`` keeps the first N, 0 none); without tools the policy answers directly;
- ``NAME.KEY=VALUE``: a generator setting (``chain_sum.max_terms=3``), the value read as JSON when it parses.

A task's ``level`` is its dataset's position in NAME,... (1-based), so the curriculum can order datasets.

The grade is the ``reasoning_gym`` grader: the dataset's own ``score_answer(answer, entry)`` on the final answer
(the text inside ``<answer>...</answer>`` when the reply has such tags, as reasoning-gym's ``extract_answer``
reads it), partial credit as the generator gives it; success is a score of 1.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from agentrft.arith import ArithError, Syntax, evaluate, parse
from agentrft.envs.base import Environment, EnvLimits, Episode
from agentrft.envs.plugins import EnvSpec
from agentrft.envs.toolbox_episode import ToolboxEpisode
from agentrft.inputs import InputError
from agentrft.tools.registry import Tool, Toolbox
from agentrft.types import Message, Task, ToolCall, ToolCallFunction, json_safe

SPLITS = ("train", "held-out")
HELD_OUT_SEED_OFFSET = 1_000_003
SYSTEM_PROMPT = "Solve the problem. Reply with the final answer alone, with no other words."
TOOL_PROMPT = (
    "Solve the problem. Use the calculate tool for arithmetic. "
    "When you know the answer, reply with the final answer alone, without a tool call."
)
_CALC_SYNTAX = Syntax(double_star=True)
# Worked examples of the tool's use in the prompt (how to call, then answer with the result alone), on questions
# of no dataset's own form: the prompt shows the call format, never a task's solution.
EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is 17 - 4 + 9?", "17 - 4 + 9"),
    ("A shop sells 3 boxes of 12 pens and 5 single pens. How many pens is that?", "3 * 12 + 5"),
)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as "(12 + 30) * 4 - 7".

    Args:
        expression: numbers with + - * / ^ and parentheses.
    """
    left = expression.split("=", 1)[0]  # "3 + 4 =" or "3 + 4 = 8": the expression is what stands before "="
    try:
        value = evaluate(parse(left, _CALC_SYNTAX))
    except ArithError as exc:
        raise ValueError(str(exc)) from None
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def package() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise InputError(
            "reasoning-gym environments need the package reasoning-gym: pip install 'agentrft[reasoning-gym]'"
        ) from None
    return reasoning_gym


def generated(name: str, source: dict[str, Any]) -> list[dict[str, Any]]:
    """A dataset's entries as the package generates them (``source``: seed, size and settings, as a task's data
    records them); kept as generated, since some datasets' ``score_answer`` reads Python values (tuples, grids)
    a JSON copy loses."""
    return _generated(name, json.dumps({k: source[k] for k in ("seed", "size", "settings")}, sort_keys=True))


@lru_cache(maxsize=64)
def _generated(name: str, source: str) -> list[dict[str, Any]]:
    spec = json.loads(source)
    data = package().create_dataset(name, size=spec["size"], seed=spec["seed"], **spec["settings"])
    return [data[i] for i in range(len(data))]


def _setting(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class ReasoningGymEnv(Environment):
    name = "reasoning-gym"
    version = "1"

    def __init__(
        self,
        datasets: list[str],
        *,
        n_train: int = 256,
        n_test: int = 64,
        seed: int = 0,
        tools: bool = False,
        shots: int = 2,
        settings: dict[str, dict[str, Any]] | None = None,
        limits: EnvLimits | None = None,
    ) -> None:
        rg = package()
        self.datasets, self.seed, self.tools, self.shots = list(datasets), seed, tools, shots
        self.settings = settings or {}
        self.n = {"train": n_train, "held-out": n_test}
        self.limits = limits or EnvLimits(max_turns=4 if tools else 1, max_tokens_per_turn=96, max_total_tokens=2048)
        self._tasks: dict[str, list[Task]] = {}
        for name in self.datasets:  # an unknown name or a bad setting fails here, before any model loads
            try:
                rg.create_dataset(name, size=1, seed=seed, **self.settings.get(name, {}))
            except Exception as exc:
                raise InputError(f"reasoning-gym dataset {name!r}: {type(exc).__name__}: {exc}") from None
        self._toolbox = Toolbox([Tool.from_function(calculate, timeout_s=self.limits.tool_timeout_s)] if tools else [])

    @classmethod
    def from_spec(cls, spec: EnvSpec, **kwargs: Any) -> ReasoningGymEnv:
        names = [n.strip() for n in spec.arg.split(",") if n.strip()]
        if not names:
            raise spec.error("name one or more reasoning-gym datasets, e.g. reasoning-gym:chain_sum")
        settings: dict[str, dict[str, Any]] = {}
        for key, value in spec.options.items():
            dataset, dot, setting = key.partition(".")
            if dot:
                if dataset not in names:
                    raise spec.error(f"option {key} sets a dataset not named ({', '.join(names)})")
                settings.setdefault(dataset, {})[setting] = _setting(value)
            elif key not in ("train", "test", "seed", "tools", "shots"):
                raise spec.error(f"unknown option {key} (known: train, test, seed, tools, shots, NAME.KEY)")
        tools = spec.options.get("tools", "")
        if tools not in ("", "calc", "none"):
            raise spec.error(f"tools must be calc or none, got {tools!r}")
        if "shots" in spec.options and tools != "calc":
            raise spec.error("shots sets the calculator's worked examples; it needs tools=calc")
        return cls(
            names,
            n_train=spec.int_option("train", 256, minimum=1),
            n_test=spec.int_option("test", 64, minimum=1),
            seed=spec.int_option("seed", 0),
            tools=tools == "calc",
            shots=spec.int_option("shots", len(EXAMPLES)),
            settings=settings,
            **kwargs,
        )

    def system_prompt(self) -> str:
        return TOOL_PROMPT if self.tools else SYSTEM_PROMPT

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._toolbox.schemas()

    def few_shot(self) -> list[Message]:
        """Worked examples of a calculate call (the first ``shots`` of `EXAMPLES`); none without tools."""
        if not self.tools:
            return []
        messages: list[Message] = []
        for n, (question, expression) in enumerate(EXAMPLES[: self.shots], 1):
            call = ToolCall(
                id=f"example_{n}",
                function=ToolCallFunction(name="calculate", arguments=json.dumps({"expression": expression})),
            )
            messages += [
                Message(role="user", content=question),
                Message(role="assistant", content=None, tool_calls=[call]),
                Message(role="tool", tool_call_id=call.id, name="calculate", content=calculate(expression)),
                Message(role="assistant", content=calculate(expression)),
            ]
        return messages

    def grader_spec(self) -> dict[str, Any]:
        return {"type": "reasoning_gym", "name": "score"}

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise InputError(f"unknown reasoning-gym split {split!r}; valid splits: {', '.join(SPLITS)}")
        if split not in self._tasks:
            self._tasks[split] = [
                t for level, name in enumerate(self.datasets, 1) for t in self._generate(name, level, split)
            ]
        return self._tasks[split]

    def _source(self, name: str, split: str) -> dict[str, Any]:
        """How a split's entries are generated: enough for the grader to generate the very entry again."""
        seed = self.seed if split == "train" else self.seed + HELD_OUT_SEED_OFFSET
        return {"seed": seed, "size": self.n[split], "settings": self.settings.get(name, {})}

    def _generate(self, name: str, level: int, split: str) -> list[Task]:
        source = self._source(name, split)
        entries = [json_safe(e) for e in generated(name, source)]
        seen: set[str] = set()
        if split != "train":
            seen = {str(e["question"]) for e in generated(name, self._source(name, "train"))}
        return [
            Task(
                id=f"{name}/{split}/{i}",
                env=self.name,
                messages=[Message(role="user", content=e["question"])],
                data={
                    "dataset": name,
                    "answer": e["answer"],
                    "entry": e,
                    "source": {**source, "index": i},
                    "level": level,
                },
            )
            for i, e in enumerate(entries)
            if e["question"] not in seen
        ]

    def start(self, task: Task) -> Episode:
        return ToolboxEpisode(task, self._toolbox, self.limits.max_tool_calls)

"""The ``bfcl`` grader: the package's own evaluator on an episode's function calls (see `package.py`).

An episode becomes the model result the benchmark's OpenAI function-calling handler records:

- single-turn: the first assistant turn, as a list of ``{name: arguments JSON}`` when it called functions, or
  its text when it called nothing;
- multi-turn: per user turn, per assistant step, the same; a step's call that the episode could not execute
  safely (a name no involved class exposes, a key that is not one of the function's parameters) is left out, as
  the episode refused it; every other call was executed by the episode, as the benchmark executes it. An episode that ended before its last user turn has fewer turns, which the benchmark fails as
  force-terminated.

The item is the task's data (``bfcl``: the test entry, ``truth``: its ground truth, ``category``). Reward 1 when
the package's verdict is valid, else 0, with the verdict's ``error_type`` in the grade's metadata.

``partial: true`` (a training reward, not the benchmark's score): an invalid single-turn verdict earns credit by
how far the package's AST checker got before it failed the call, in the checker's own order of checks: the
right function but a required parameter missing or an unknown one given 0.1, the right parameter names but a
value of the wrong type 0.2, the right types but a wrong value (or a missing optional one) 0.3
(`PARTIAL_CREDIT`). Success stays the valid verdict alone (reward 1).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from agentrft.envs.bfcl import package
from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.types import Message, Trajectory


def _step(message: Message, allowed: dict[str, set[str]] | None) -> Any:
    """One assistant message as the handler records it: its calls, or its text when it has none."""
    if not message.tool_calls:
        return message.text()
    calls = []
    for call in message.tool_calls:
        name, raw = call.function.name, call.function.arguments
        if allowed is not None:
            try:
                arguments = json.loads(raw)
            except ValueError:
                arguments = None
            if package.safe_call(name, arguments, allowed) is None:
                continue
        calls.append({name: raw})
    return calls


def model_result(traj: Trajectory, item: dict[str, Any]) -> Any:
    """The benchmark's model result of one episode (see the module's docstring)."""
    own = traj.messages[traj.n_prompt_messages :]
    if item["category"] not in package.MULTI_TURN:
        first = next((m for m in own if m.role == "assistant"), None)
        return "" if first is None else _step(first, None)
    allowed = package.entry_calls(item["bfcl"])
    turns: list[list[Any]] = [[]]
    for message in own:
        if message.role == "user":
            turns.append([])
        elif message.role == "assistant":
            turns[-1].append(_step(message, allowed))
    return turns


# error_type (or its kind before ":") of an invalid AST verdict -> credit under ``partial``
PARTIAL_CREDIT = {
    "simple_function_checker:missing_required": 0.1,
    "simple_function_checker:unexpected_param": 0.1,
    "type_error": 0.2,
    "value_error": 0.3,
    "simple_function_checker:missing_optional": 0.3,
}


def partial_credit(error_type: str | None) -> float:
    if not error_type:
        return 0.0
    return PARTIAL_CREDIT.get(error_type, PARTIAL_CREDIT.get(error_type.split(":")[0], 0.0))


class BfclSpec(SpecBase):
    type: Literal["bfcl"]
    partial: bool = False


@register_grader("bfcl")
class BfclGrader(Grader):
    Spec = BfclSpec

    @classmethod
    def build(cls, spec: BfclSpec, where: str, options: LoadOptions) -> BfclGrader:
        return cls(spec.name or "bfcl", spec.pass_threshold, partial=spec.partial)

    def __init__(self, name: str, pass_threshold: float | None = None, *, partial: bool = False) -> None:
        super().__init__(name, pass_threshold)
        self.partial = partial

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        if sample.trajectory is None:
            raise GraderFailure("sample_parse_error", f"{self.name} needs a trajectory, got a plain sample")
        if not isinstance(item.get("bfcl"), dict) or "category" not in item:
            raise GraderFailure("invalid_variable_error", f"{self.name}: the item is not a bfcl task's data")
        result = model_result(sample.trajectory, item)
        category = item["category"]
        if category in package.MULTI_TURN:
            verdict = package.evaluate_multi_turn(item["bfcl"], item["truth"], category, result)
        else:
            verdict = package.evaluate_single(item["bfcl"], item.get("truth"), category, result)
        valid = bool(verdict.get("valid"))
        error = verdict.get("error")
        error_type = verdict.get("error_type") or (error.get("error_type") if isinstance(error, dict) else None)
        value = 1.0 if valid else 0.0
        if self.partial and not valid and category not in package.MULTI_TURN:
            value = partial_credit(error_type)
        return Score(value, metadata={"valid": valid, "error_type": error_type})

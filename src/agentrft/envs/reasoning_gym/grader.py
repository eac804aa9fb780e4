"""The ``reasoning_gym`` grader: the dataset's own ``score_answer`` (see `envs/reasoning_gym/env.py`)."""

from __future__ import annotations

from typing import Any, Literal

from agentrft.envs.reasoning_gym.env import generated, package
from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader


class ReasoningGymSpec(SpecBase):
    type: Literal["reasoning_gym"]


@register_grader("reasoning_gym")
class ReasoningGymGrader(Grader):
    """reasoning-gym's own ``score_answer`` of the task's dataset; item: ``dataset`` and ``entry`` (the entry is
    generated again from ``source`` where the item has it: some datasets score with values a JSON copy loses)."""

    Spec = ReasoningGymSpec

    @classmethod
    def build(cls, spec: ReasoningGymSpec, where: str, options: LoadOptions) -> ReasoningGymGrader:
        return cls(spec.name or "reasoning_gym", spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        name, entry = item.get("dataset"), item.get("entry")
        if not isinstance(name, str) or not isinstance(entry, dict):
            raise GraderFailure("invalid_variable_error", f"{self.name}: the item needs 'dataset' and 'entry'")
        source = item.get("source")
        if isinstance(source, dict) and isinstance(source.get("index"), int):  # the entry as generated
            entries = generated(name, source)
            if 0 <= source["index"] < len(entries) and entries[source["index"]]["question"] == entry["question"]:
                entry = entries[source["index"]]
        rg = package()
        from reasoning_gym.utils import extract_answer

        text = sample.output_text
        tagged = extract_answer(text) if "<answer>" in text else None
        answer = (tagged if tagged is not None else text).strip()
        value = float(rg.get_score_answer_fn(name)(answer, entry))
        return Score(value, metadata={"answer": answer})

"""`env_reward`: the reward the environment itself measured, as the grade.

An environment that scores its own episodes (a Gymnasium-style text env's summed ``step`` rewards,
`envs/gym_text.py`) records the measurement in the trajectory's ``metadata["env"]``; this grader reads
``metadata["env"][key]`` (``reward`` by default). A trajectory without it, or a plain sample, is a
``sample_parse_error``, never a silent 0. Success: reward ≥ ``pass_threshold`` (default 1.0).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from agentrft.graders.base import Grader, GraderFailure, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader


class EnvRewardSpec(SpecBase):
    type: Literal["env_reward"]
    key: str = "reward"


@register_grader("env_reward")
class EnvRewardGrader(Grader):
    Spec = EnvRewardSpec

    def __init__(self, name: str, key: str, pass_threshold: float | None) -> None:
        super().__init__(name, pass_threshold)
        self.key = key

    @classmethod
    def build(cls, spec: EnvRewardSpec, where: str, options: LoadOptions) -> EnvRewardGrader:
        return cls(spec.name or "env_reward", spec.key, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        if sample.trajectory is None:
            raise GraderFailure("sample_parse_error", f"{self.name} needs a trajectory, got a plain sample")
        measured = sample.trajectory.metadata.get("env")
        value = measured.get(self.key) if isinstance(measured, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GraderFailure(
                "sample_parse_error", f"{self.name}: the trajectory records no finite metadata.env.{self.key}"
            )
        return Score(float(value))

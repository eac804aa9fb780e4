"""Graders: OpenAI-style grader specs and agent graders → `agentrft.types.Grade`.

    from agentrft.graders import load_grader, Sample
    grader = load_grader({"type": "string_check", "input": "{{ sample.output_text }}",
                          "reference": "{{ item.answer }}", "operation": "eq"})
    grade = grader.grade({"output_text": "42"}, {"answer": "42"})

Types (one registry, `grader_types()`): string_check, text_similarity,
score_model, label_model, python, multi, endpoint (SPECS §1); numeric,
finqa_program, json_schema, answered, tool_called, tool_arguments_match,
no_tool_errors, within_tool_budget, efficiency, tool_process, reward_model (agentrft).
Python functions combine with `combine({...: (fn, weight)})`.
Layer 4: imports no torch.
"""

from agentrft.graders.base import Grader, GraderFailure, GraderSpecError, Sample, Score
from agentrft.graders.multi import FunctionGrader, WeightedGrader, combine
from agentrft.graders.registry import LoadOptions, grader_types, load_grader, register_grader
from agentrft.graders.results import (
    agrade_many,
    agrade_trajectories,
    agrade_trajectory,
    grade_trajectory,
    summarize_grades,
    trajectory_cost,
)

__all__ = [
    "FunctionGrader",
    "Grader",
    "GraderFailure",
    "GraderSpecError",
    "LoadOptions",
    "Sample",
    "Score",
    "WeightedGrader",
    "agrade_many",
    "agrade_trajectories",
    "agrade_trajectory",
    "combine",
    "grade_trajectory",
    "grader_types",
    "load_grader",
    "register_grader",
    "summarize_grades",
    "trajectory_cost",
]

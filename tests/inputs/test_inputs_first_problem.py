"""`first_problem`: the parts every one-line validation error is written from (dotted field, message without
pydantic's "Value error, " prefix, how many more)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from agentrft.inputs import Problem, first_problem


class _Inner(BaseModel):
    rate: float

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError(f"a rate is in [0, 1], got {value}")
        return value


class _Outer(BaseModel):
    inner: _Inner
    count: int


def _problem(value: object) -> Problem:
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate(value)
    return first_problem(info.value)


def test_the_first_problem_names_its_dotted_field_and_counts_the_others() -> None:
    p = _problem({"inner": {"rate": 2}, "count": "many"})
    assert p == Problem("inner.rate", "a rate is in [0, 1], got 2.0", 1)
    assert p.more == " (and 1 more)"


def test_one_problem_has_no_more_and_the_whole_value_has_no_field() -> None:
    p = _problem({"inner": {"rate": 0.5}, "count": "many"})
    assert (p.field, p.others, p.more) == ("count", 0, "")
    assert p.message.startswith("Input should be a valid integer")
    assert _problem([1, 2]).field == ""

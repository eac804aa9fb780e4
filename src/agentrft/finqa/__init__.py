"""FinQA: the official program language, its executor and evaluator, the JSON loader, and the calculator.

Program semantics follow the official FinQA evaluation script (see :mod:`agentrft.finqa.program`);
program accuracy needs sympy, imported only when it is computed.
"""

from agentrft.finqa.calc import CalcError, calculate
from agentrft.finqa.dataset import FinqaDataError, FinqaQA, FinqaRecord, load_finqa_json
from agentrft.finqa.evaluate import evaluate_predictions
from agentrft.finqa.program import (
    ProgramError,
    execute_program,
    execute_tokens,
    execution_accuracy,
    program_accuracy,
    program_to_tokens,
    tokens_to_program,
)

__all__ = [
    "CalcError",
    "FinqaDataError",
    "FinqaQA",
    "FinqaRecord",
    "ProgramError",
    "calculate",
    "evaluate_predictions",
    "execute_program",
    "execute_tokens",
    "execution_accuracy",
    "load_finqa_json",
    "program_accuracy",
    "program_to_tokens",
    "tokens_to_program",
]

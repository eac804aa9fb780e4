"""Evaluation: the harness (pass@k, pass^k, reward CI, tool use, cost per success), failure
attribution, the RFT eligibility check, the HTML report and dataset exports.

Modules: `metrics` (pure formulas), `failures` (first wrong step), `harness`
(`evaluate`, `summarize`, `EvalResult`), `check` (`check`, `assess`), `report`
(`build_report`, `write_report`), `exports` (RFT / SFT / DPO / Parquet). No torch.
"""

from agentrft.eval.failures import FAILURE_CATEGORIES, classify_failure, count_failures
from agentrft.eval.harness import EvalResult, Prices, evaluate, evaluate_async, result_from_run, summarize
from agentrft.eval.metrics import bootstrap_ci, paired_test, pass_at_k, pass_hat_k, wilson_interval

__all__ = [
    "FAILURE_CATEGORIES",
    "EvalResult",
    "Prices",
    "bootstrap_ci",
    "classify_failure",
    "count_failures",
    "evaluate",
    "evaluate_async",
    "paired_test",
    "pass_at_k",
    "pass_hat_k",
    "result_from_run",
    "summarize",
    "wilson_interval",
]

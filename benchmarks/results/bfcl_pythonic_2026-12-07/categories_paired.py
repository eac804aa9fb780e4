"""Per-category paired tests of the other single-turn categories (never trained on), base against the policy after
50 GRPO steps on `simple`, from `bash benchmarks/oracle_free.sh bfcl-py-eval`'s store (run from the repo root)."""

from agentrft.cli.support import eval_result_of
from agentrft.eval.metrics import paired_test
from agentrft.store import Store

CATEGORIES = {"1": "multiple", "2": "parallel", "3": "parallel_multiple", "4": "irrelevance"}


def rates(run: str) -> dict[str, dict[str, float]]:
    with Store.open_existing("runs/bfclpy_eval.db") as store:
        result = eval_result_of(store, store.find_run(run))
    return {category: result.task_rates(level) for level, category in CATEGORIES.items()}


base, trained = rates("smollm2-135m"), rates("hf_runs_bfclpy2_policy")
for category in CATEGORIES.values():
    print(f"{category}:", paired_test(base[category], trained[category]))

"""Paired tests on held-out BFCL simple across the two GRPO runs, from their stores (run from the repo root):
base (bfcl-py's baseline eval) -> bfcl-py's final eval (= bfcl-py2's baseline, the same policy) -> bfcl-py2's final."""

from agentrft.cli.support import eval_result_of
from agentrft.eval.metrics import paired_test
from agentrft.store import Store


def task_rates(db: str, run: str) -> dict[str, float]:
    with Store.open_existing(db) as store:
        result = eval_result_of(store, store.find_run(run))
    return result.task_rates()


evals = {
    "base": ("runs/bfclpy/agentrft.db", "baseline"),
    "bfcl-py": ("runs/bfclpy/agentrft.db", "final"),
    "bfcl-py2 baseline": ("runs/bfclpy2/agentrft.db", "baseline"),
    "bfcl-py2": ("runs/bfclpy2/agentrft.db", "final"),
}
rates = {name: task_rates(db, run) for name, (db, run) in evals.items()}
for a, b in [("base", "bfcl-py"), ("bfcl-py", "bfcl-py2 baseline"), ("bfcl-py", "bfcl-py2"), ("base", "bfcl-py2")]:
    print(f"{a} -> {b}:", paired_test(rates[a], rates[b]))

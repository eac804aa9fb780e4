"""Paired tests on level 2 across the oracle-free chain, from the two runs' stores (run from the repo root):
base (finqa-ei's baseline eval) -> finqa-ei's final eval -> finqa-l2's baseline (the same policy) -> its final."""

from agentrft.cli.support import eval_result_of
from agentrft.eval.metrics import paired_test
from agentrft.store import Store


def level_rates(db: str, run: str, level: str) -> dict[str, float]:
    with Store.open_existing(db) as store:
        result = eval_result_of(store, store.find_run(run))
    return result.task_rates(level)


evals = {
    "base": ("runs/fq3/agentrft.db", "baseline"),
    "finqa-ei": ("runs/fq3/agentrft.db", "final"),
    "finqa-l2 baseline": ("runs/fq5/agentrft.db", "baseline"),
    "finqa-l2": ("runs/fq5/agentrft.db", "final"),
}
rates = {name: level_rates(db, run, "2") for name, (db, run) in evals.items()}
for a, b in [("base", "finqa-ei"), ("finqa-ei", "finqa-l2 baseline"), ("base", "finqa-l2")]:
    print(f"{a} -> {b}:", paired_test(rates[a], rates[b]))

"""Paired tests on finqa-lite level 3 (held-out, T = 0.7, seed 0), run from the repo root after `bash
benchmarks/oracle_free.sh finqa-l3`, `finqa-l3-base`, `finqa-l3b`, `finqa-l3c` and `finqa-l3d`: the planned test
over all 60 held-out tasks x 2 (the base SmolLM2-135M -> the level-3 GRPO policy, runs/fq8, -> its continuation with
the process credit on the report and the figures, runs/fq9, -> that one's with done_needs_result, runs/fq10, and the
step-8 policy -> branched GRPO from the policies' own episodes that opened the task's report, runs/fq11; finqa-l2's
policy, runs/fq5 -> them), and the same over the first 32 tasks, the protocol of the earlier level-3 rows."""

from agentrft.cli.support import eval_result_of
from agentrft.envs.registry import make_env
from agentrft.eval.metrics import paired_test
from agentrft.store import Store


def level_rates(db: str, run: str) -> dict[str, float]:
    with Store.open_existing(db) as store:
        result = eval_result_of(store, store.find_run(run))
    return result.task_rates("3")


evals = {
    "base": ("runs/l3_60.db", "l3-60-base"),
    "finqa-l2": ("runs/fq7/agentrft.db", "baseline"),  # the stopped first try's baseline eval (sampling seed 7919)
    "finqa-l3": ("runs/l3_60.db", "l3-60-hf_runs_fq8_policy-step8"),  # the step-8 checkpoint, exported
    "finqa-l3b": ("runs/l3_60.db", "l3-60-fq9"),
    "finqa-l3c": ("runs/l3_60.db", "l3-60-fq10"),
    "finqa-l3d": ("runs/l3_60.db", "l3-60-fq11"),  # branched from the policies' own episodes (runs/fq11)
}
rates = {name: level_rates(db, run) for name, (db, run) in evals.items()}
first32 = [t.id for t in list(make_env("finqa-lite:3").tasks("held-out"))[:32]]  # what `eval --tasks 32` plays
for name, r in rates.items():
    print(f"{name}: {len(r)} tasks, pass@1 {sum(r.values()) / len(r):.3f}")
pairs = [
    ("base", "finqa-l3"),
    ("finqa-l2", "finqa-l3"),
    ("base", "finqa-l2"),
    ("base", "finqa-l3b"),
    ("finqa-l3", "finqa-l3b"),
    ("base", "finqa-l3c"),
    ("finqa-l3b", "finqa-l3c"),
    ("base", "finqa-l3d"),
    ("finqa-l3", "finqa-l3d"),
]
for a, b in pairs:
    print(f"all 60, {a} -> {b}:", paired_test(rates[a], rates[b]))
    sub_a = {t: rates[a][t] for t in first32}
    sub_b = {t: rates[b][t] for t in first32}
    print(f"first 32, {a} -> {b}:", paired_test(sub_a, sub_b))

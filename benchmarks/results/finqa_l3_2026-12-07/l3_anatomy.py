"""Where level-3 episodes fail, step by step (run from the repo root after the evals of `l3_paired.py`): of the
episodes of each eval, how many opened a gold report (the task's own company and year), wrote any or all of the gold
figures in a calculation, copied the worked example's figures, and succeeded; and how many opened any report, and
calculated before opening one. The prompt's worked example is left out (its calls are prompt messages)."""

import json
import sqlite3

from agentrft.envs.finqa.expert import report_operands
from agentrft.envs.finqa.process_grader import expression_figures
from agentrft.envs.registry import make_env

EXAMPLE_FIGURES = {12044.0, 11714.0}  # the level-3 worked example's calculation (Larch Energy's revenue)
EVALS = {
    "base": ("runs/l3_60.db", "l3-60-base"),
    "finqa-l2": ("runs/fq7/agentrft.db", "baseline"),
    "finqa-l3": ("runs/l3_60.db", "l3-60-hf_runs_fq8_policy-step8"),
    "finqa-l3b": ("runs/l3_60.db", "l3-60-fq9"),
    "finqa-l3c": ("runs/l3_60.db", "l3-60-fq10"),
    "finqa-l3d": ("runs/l3_60.db", "l3-60-fq11"),  # branched from the policies' own episodes (runs/fq11)
}


def _argument(call: dict, key: str) -> str:
    try:
        value = json.loads(call["arguments"])
    except (TypeError, ValueError):
        return ""
    return str(value.get(key, "")) if isinstance(value, dict) else ""


def anatomy(db: str, run: str, tasks: dict) -> dict[str, int]:
    keys = ("episodes", "success", "opened_any", "opened_gold", "calc_before_open", "some_figures", "all_figures")
    counts = dict.fromkeys((*keys, "example"), 0)
    conn = sqlite3.connect(db)
    (run_id,) = conn.execute("select id from runs where name = ?", (run,)).fetchone()
    for task_id, success, data in conn.execute(
        "select task_id, success, data from trajectories where run_id = ?", (run_id,)
    ):
        episode, item = json.loads(data), tasks[task_id].data
        own = episode["messages"][episode.get("n_prompt_messages") or 0 :]
        calls = [c["function"] for m in own for c in (m.get("tool_calls") or [])]
        opened = {_argument(c, "doc_id").lower() for c in calls if c["name"] == "open"}
        written: set[float] = set()
        for c in calls:
            if c["name"] == "calculate":
                written |= expression_figures(_argument(c, "expression"))
        figures = set().union(*report_operands(item))
        counts["episodes"] += 1
        counts["success"] += bool(success)
        counts["opened_any"] += bool(opened)
        counts["opened_gold"] += bool(opened & {d.lower() for d in item["doc_ids"]})
        names = [c["name"] for c in calls]
        counts["calc_before_open"] += "calculate" in names and "open" not in names[: names.index("calculate")]
        counts["some_figures"] += bool(figures & written)
        counts["all_figures"] += figures <= written
        counts["example"] += written >= EXAMPLE_FIGURES
    return counts


held_out = {t.id: t for t in make_env("finqa-lite:3").tasks("held-out")}
for name, (db, run) in EVALS.items():
    print(name, anatomy(db, run, held_out))

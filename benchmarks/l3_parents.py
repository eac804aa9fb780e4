"""Parents for branched GRPO on finqa-lite level 3 (`bash benchmarks/oracle_free.sh finqa-l3d`): the policy's own
level-3 training episodes (the stores of runs/fq8, fq9, fq10; no expert, no demonstration) whose first
error-free `open` read the task's own report, copied into one run of a new store. Each branch then continues
from the turn after that `open` (`rollout.branch.turn: after_tool:open`): the policy has the right page in front
of it and only the calculation and the answer are sampled and trained. "The task's own report" is the task's
`doc_ids`, the gold data finqa_process's `opened` milestone reads.

    .venv/bin/python benchmarks/l3_parents.py OUT_DB RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from agentrft.envs.finqa.process_grader import gold_doc_id
from agentrft.envs.registry import make_env
from agentrft.store import RUN_STORE_NAME, Store
from agentrft.types import Run, Trajectory


def opened_own_report(traj: Trajectory, doc_ids: list[str]) -> bool:
    opens = [e for e in traj.tool_calls if e.name == "open" and e.error is None]
    if not opens or not isinstance(opens[0].arguments, dict):
        return False
    return gold_doc_id(str(opens[0].arguments.get("doc_id", "")), doc_ids) is not None  # as finqa_process reads it


def main(out_db: str, run_dirs: list[str]) -> None:
    if Path(out_db).exists():
        raise SystemExit(f"{out_db} exists: remove it to select the parents again")
    tasks = {t.id: t for t in make_env("finqa-lite:3").tasks("train")}
    counts: Counter[str] = Counter()
    kept: list[Trajectory] = []
    for run_dir in run_dirs:
        with Store.open_existing(Path(run_dir) / RUN_STORE_NAME) as store:
            for run in store.list_runs():
                if run.kind != "train":
                    continue
                for traj in store.query_trajectories(run_id=run.id):
                    task = tasks.get(traj.task_id)
                    why = "kept"
                    if task is None:
                        why = "not a level-3 training task"
                    elif not opened_own_report(traj, task.data["doc_ids"]):
                        why = "first open not the task's report"
                    counts[why] += 1
                    if why == "kept":
                        kept.append(traj)
    with Store(out_db) as out:
        out.add_run(Run(id="l3-parents", name="l3-parents", kind="other", config={"from": run_dirs}))
        out.add_trajectories(t.model_copy(update={"run_id": "l3-parents"}) for t in kept)
    print(dict(counts), "distinct tasks kept:", len({t.task_id for t in kept}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

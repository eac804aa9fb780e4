"""What branched GRPO on level 3 (`bash benchmarks/oracle_free.sh finqa-l3d`, runs/fq11) answered right in training,
by the task's template and the policy version that sampled it (run from the repo root)."""

from collections import Counter

from agentrft.envs.registry import make_env
from agentrft.store import Store

templates = {t.id: t.data["template"] for t in make_env("finqa-lite:3").tasks("train")}
right: Counter[tuple[int, str]] = Counter()
played: Counter[str] = Counter()
with Store.open_existing("runs/fq11/agentrft.db") as store:
    run = store.find_run("train-fq11")
    for traj in store.query_trajectories(run_id=run.id):
        template = templates[traj.task_id]
        played[template] += 1
        if traj.grade is not None and (traj.grade.sub_rewards.get("answer") or 0.0) >= 1.0:
            right[(traj.policy_version, template)] += 1
print("episodes by template:", dict(sorted(played.items())))
print("right answers by (policy version, template):", dict(sorted(right.items())))
print("right answers in all:", sum(right.values()), "of", sum(played.values()))

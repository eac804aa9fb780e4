"""Paired test of level 2 across the whole oracle-free chain: base (fq3's baseline) vs fq3 final vs fq5 final."""

import collections
import sqlite3

from agentrft.envs import make_env
from agentrft.eval.metrics import paired_test

env = make_env("finqa-lite:1,2")
lv = {t.id: t.data.get("level") for s in ("train", "held-out") for t in env.tasks(s)}


def rates(db, name, level):
    c = sqlite3.connect(db)
    (rid,) = c.execute("select id from runs where name=?", (name,)).fetchone()
    agg = collections.defaultdict(list)
    for tid, s in c.execute("select task_id, success from trajectories where run_id=?", (rid,)):
        if lv.get(tid) == level:
            agg[tid].append(s or 0)
    return {t: sum(v) / len(v) for t, v in agg.items()}


base = rates("runs/fq3/agentrft.db", "baseline", 2)
fq3 = rates("runs/fq3/agentrft.db", "final", 2)
fq5b = rates("runs/fq5/agentrft.db", "baseline", 2)
fq5 = rates("runs/fq5/agentrft.db", "final", 2)
for a, b, na, nb in [
    (base, fq3, "base", "fq3"),
    (fq3, fq5b, "fq3 final", "fq5 baseline (same policy)"),
    (base, fq5, "base", "fq5"),
]:
    r = paired_test(a, b)
    print(na, "->", nb, len(a), len(b), round(sum(a.values()) / len(a), 3), round(sum(b.values()) / len(b), 3), r)

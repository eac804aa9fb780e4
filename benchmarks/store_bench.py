"""Trajectory store throughput and query latency at 100k trajectories.

    .venv/bin/python benchmarks/store_bench.py [--n 100000] [--db PATH] [--keep]

Each trajectory is a realistic small agent episode: 3 assistant turns with two
tool calls, ~300 tokens with log-probs, a grade with sub-rewards. Prints insert
throughput (one commit per trajectory, and batches of 500 in one transaction)
and the latency of typical queries once the store holds all of them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentrft.store import Store
from agentrft.types import (
    EnvRef,
    FinalAnswerEvent,
    Grade,
    Message,
    ModelCallEvent,
    TokenRecord,
    ToolCall,
    ToolCallEvent,
    ToolCallFunction,
    Trajectory,
    new_id,
)  # fmt: skip

RUNS = 10
TASKS = 1000
GROUP_SIZE = 4


def template(rng: random.Random, tokens_per_turn: int = 100) -> Trajectory:
    """One episode: search → open → answer, 3 turns × ~100 tokens (half prompt, half sampled)."""
    ids, mask, logprobs, turn = [], [], [], []
    for k in range(3):
        for j in range(tokens_per_turn):
            sampled = j >= tokens_per_turn // 2
            ids.append(rng.randrange(49152))
            mask.append(int(sampled))
            logprobs.append(-rng.random() * 4 if sampled else 0.0)
            turn.append(k)
    calls = [("search", {"query": "net revenue 2019", "k": 3}, "doc-12: net revenue was $4.2bn (2018: $3.9bn) ..."),
             ("open", {"doc_id": "doc-12"}, "Annual report 2019. Table 3: revenue by segment ... " * 4)]  # fmt: skip
    messages = [Message(role="system", content="You answer questions about financial reports using tools."),
                Message(role="user", content="By what percentage did net revenue grow in 2019?")]  # fmt: skip
    events: list = []
    for k, (name, args, result) in enumerate(calls):
        call_id = f"call_{k}"
        messages.append(
            Message(
                role="assistant",
                tool_calls=[ToolCall(id=call_id, function=ToolCallFunction(name=name, arguments=str(args)))],
            )
        )
        messages.append(Message(role="tool", tool_call_id=call_id, content=result))
        events.append(
            ModelCallEvent(turn=k, latency_s=0.3, prompt_tokens=400, completion_tokens=50, finish_reason="tool_calls")
        )
        events.append(ToolCallEvent(turn=k, call_id=call_id, name=name, arguments=args, result=result, latency_s=0.002))
    messages.append(Message(role="assistant", content="Net revenue grew by 7.69% in 2019."))
    events.append(FinalAnswerEvent(turn=2, text="Net revenue grew by 7.69% in 2019."))
    return Trajectory(
        env=EnvRef(name="finqa-lite", version="1", tool_schema_hash="5f3a9c"), policy="SmolLM2-135M-Instruct",
        messages=messages, events=events, tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=logprobs, turn=turn),
    )  # fmt: skip


def make(i: int, templates: list[Trajectory], rng: random.Random) -> Trajectory:
    reward = rng.random()
    grade = Grade(reward=reward, sub_rewards={"answer": reward, "format": 1.0}, success=reward > 0.5, grader="multi")
    return templates[i % len(templates)].model_copy(
        update=dict(
            id=new_id(),
            run_id=f"run-{i % RUNS}",
            task_id=f"task-{(i // GROUP_SIZE) % TASKS}",
            group_id=f"group-{i // GROUP_SIZE}",
            policy_version=i // 10_000,
            grade=grade,
            created_at=time.time(),
        )
    )


def timed(fn: Callable[[], object], repeat: int = 5) -> tuple[float, object]:
    """Median wall time of `repeat` calls (seconds) and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=5_000, help="how many of the n go in one commit each")
    parser.add_argument("--db", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database file")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="store_bench_")
    db = args.db or Path(tmp.name) / "bench.db"
    rng = random.Random(0)
    templates = [template(rng) for _ in range(16)]
    sample = make(0, templates, rng)
    print(
        f"trajectory: {len(sample.tokens.ids)} tokens, {sample.num_turns} turns, {len(sample.to_json()) / 1024:.1f} KiB JSON"
    )

    store = Store(db)
    all_ids: list[str] = []

    # --- one commit per trajectory (what a runner does as episodes finish)
    trajs = [make(i, templates, rng) for i in range(args.single)]
    start = time.perf_counter()
    for t in trajs:
        all_ids.append(store.add_trajectory(t))
    elapsed = time.perf_counter() - start
    print(
        f"insert, one commit each : {args.single / elapsed:9.0f} traj/s  ({elapsed * 1e3 / args.single:.2f} ms per commit)"
    )

    # --- batches of 500 in one transaction
    batch = 500
    elapsed = 0.0
    for lo in range(args.single, args.n, batch):
        trajs = [make(i, templates, rng) for i in range(lo, min(lo + batch, args.n))]
        start = time.perf_counter()
        all_ids += store.add_trajectories(trajs)
        elapsed += time.perf_counter() - start
    done = args.n - args.single
    print(f"insert, batches of {batch}  : {done / elapsed:9.0f} traj/s  ({done} trajectories in {elapsed:.1f} s)")

    # --- metrics: 2000 steps × 20 values for one run
    start = time.perf_counter()
    for step in range(2000):
        store.log_metrics("run-0", step, {f"m{j}": step * 0.001 * j for j in range(20)})
    elapsed = time.perf_counter() - start
    print(f"log_metrics             : {2000 / elapsed:9.0f} steps/s")

    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    print(f"\nstore: {store.count_trajectories()} trajectories, {size / 2**20:.0f} MiB on disk")
    print("query latency at that size (median of 5):")
    pick = random.Random(1)
    queries: list[tuple[str, Callable[[], object]]] = [
        ("get by id", lambda: store.get_trajectory(pick.choice(all_ids))),
        ("get by 16-char id prefix", lambda: store.get_trajectory(pick.choice(all_ids)[:16])),
        ("by task (100 rows)", lambda: store.query_trajectories(task_id=f"task-{pick.randrange(TASKS)}")),
        (
            "by group (4 rows)",
            lambda: store.query_trajectories(group_id=f"group-{pick.randrange(args.n // GROUP_SIZE)}"),
        ),
        ("by run, limit 100", lambda: store.query_trajectories(run_id="run-3", limit=100)),
        (
            "by run, last 100 (offset)",
            lambda: store.query_trajectories(run_id="run-3", limit=100, offset=args.n // RUNS - 100),
        ),
        ("count by run", lambda: store.count_trajectories(run_id="run-3")),
        ("by run, all rows", lambda: store.query_trajectories(run_id="run-3")),
        ("reward > 0.99 (~1%)", lambda: store.query_trajectories(min_reward=0.99)),
        ("count reward > 0.5", lambda: store.count_trajectories(min_reward=0.5)),
        ("by run + reward > 0.9", lambda: store.query_trajectories(run_id="run-3", min_reward=0.9)),
        ("policy version, limit 500", lambda: store.query_trajectories(policy_version=5, limit=500)),
        ("get_metrics (2000 steps)", lambda: store.get_metrics("run-0")),
    ]
    for name, fn in queries:
        seconds, result = timed(fn, repeat=3 if "all rows" in name else 5)
        rows = len(result) if isinstance(result, list) else (result if isinstance(result, int) else 1)
        print(f"  {name:28s} {seconds * 1e3:9.2f} ms   ({rows} rows)")
    store.close()
    if args.keep:
        print(f"kept {db}")
        tmp.cleanup = lambda: None  # type: ignore[method-assign]
    else:
        tmp.cleanup()


if __name__ == "__main__":
    main()

"""Grader throughput: grades/s for string_check and numeric (goal ≥ 50,000/s on one core),
and per-call latency of the sandboxed python grader.

    .venv/bin/python benchmarks/grader_bench.py [--n 50000] [--python-calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentrft.graders import Sample, load_grader


def rate(grader, pairs) -> float:  # type: ignore[no-untyped-def]
    grade = grader.grade
    t0 = time.perf_counter()
    for s, i in pairs:
        grade(s, i)
    return len(pairs) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--python-calls", type=int, default=20)
    args = ap.parse_args()
    n = args.n
    texts = [f"After checking the table, the answer is {i * 1.5:,.2f}%" for i in range(n)]
    samples = [Sample(t) for t in texts]
    items = [{"answer": f"{i * 1.5:,.2f}%", "num": i * 0.015} for i in range(n)]
    sc = load_grader(
        {
            "type": "string_check",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "operation": "like",
        }
    )
    num = load_grader({"type": "numeric", "reference": "{{ item.num }}"})
    pairs = list(zip(samples, items, strict=True))
    dict_pairs = [({"output_text": t}, i) for t, i in zip(texts, items, strict=True)]
    for name, g, p in [
        ("string_check (Sample)", sc, pairs),
        ("string_check (dict)", sc, dict_pairs),
        ("numeric (Sample)", num, pairs),
        ("numeric (dict)", num, dict_pairs),
    ]:
        rate(g, p[:2000])  # warm-up
        print(f"{name:<24} {rate(g, p):>10,.0f} grades/s  (n={len(p)})")
    assert all(num.grade(s, i).reward == 1.0 for s, i in pairs[:1000])
    py = load_grader(
        {"type": "python", "source": "def grade(sample, item):\n    return float(len(sample['output_text']) > 3)\n"}
    )
    lat = []
    for _ in range(args.python_calls):
        t0 = time.perf_counter()
        py.grade(samples[0], items[0])
        lat.append(time.perf_counter() - t0)
    lat.sort()
    print(
        f"python grader latency   median {statistics.median(lat) * 1000:.1f} ms  "
        f"p90 {lat[int(0.9 * (len(lat) - 1))] * 1000:.1f} ms  (n={len(lat)}, isolation={py.last_isolation})"
    )


if __name__ == "__main__":
    main()

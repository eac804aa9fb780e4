"""Evaluation metrics: pass@k, pass^k, bootstrap intervals, Wilson intervals, paired tests.

* pass@k — Chen et al. 2021 (Codex), unbiased estimator from n samples with c
  correct: ``1 - C(n-c, k) / C(n, k)``, the chance that at least one of k draws
  (without replacement) from the n samples succeeds.
* pass^k — Yao et al. 2024 (τ-bench): ``C(c, k) / C(n, k)``, the chance that all
  k draws succeed (reliability).

Both are computed as running products rather than with binomials, because
``C(n, k)`` overflows floats for the n used in large evals while the ratio stays
in [0, 1]. Both are per task; the dataset figure is the unweighted mean over
tasks (every task counts the same whatever its number of samples) and is only
reported for k ≤ the smallest n of any task.

Intervals and tests resample *tasks*, not samples: samples of one task are
correlated, so treating them as independent would make intervals too narrow.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from agentrft.inputs import InputError


def _check(n: int, c: int, k: int) -> None:
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n (n={n}), got k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k)/C(n, k), as the stable product 1 - Π_{i=n-c+1..n} (1 - k/i)."""
    _check(n, c, k)
    if n - c < k:  # every k-subset contains a success
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k = C(c, k)/C(n, k) = Π_{i=0..k-1} (c-i)/(n-i)  (τ-bench reliability)."""
    _check(n, c, k)
    if c < k:
        return 0.0
    prod = 1.0
    for i in range(k):
        prod *= (c - i) / (n - i)
    return prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int, *, hat: bool = False) -> float:
    """Mean over tasks of pass@k (or pass^k with ``hat=True``); ``counts`` holds (n, c) per task."""
    if not counts:
        raise ValueError("no tasks to aggregate")
    fn = pass_hat_k if hat else pass_at_k
    return sum(fn(n, c, k) for n, c in counts) / len(counts)


def pass_curves(counts: Sequence[tuple[int, int]]) -> tuple[dict[int, float], dict[int, float]]:
    """(pass@k, pass^k) for every k from 1 to the smallest n over tasks."""
    if not counts:
        return {}, {}
    k_max = min(n for n, _ in counts)
    at = {k: mean_pass_at_k(counts, k) for k in range(1, k_max + 1)}
    hat = {k: mean_pass_at_k(counts, k, hat=True) for k in range(1, k_max + 1)}
    return at, hat


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of an already sorted sequence."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(
    values: Sequence[float], *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` (one value per task), seeded.

    With a single value (or all values equal) the interval collapses to that value.
    """
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return _percentile(means, alpha / 2), _percentile(means, 1 - alpha / 2)


def wilson_interval(successes: int, n: int, *, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when n == 0."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be in 0..n={n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


class PairedComparison(BaseModel):
    """B minus A on the tasks both runs share.

    ``diff`` is the mean over shared tasks of (rate_B - rate_A); ``ci`` a paired
    percentile bootstrap over tasks; ``p_value`` a two-sided paired permutation
    (sign-flip) test of "no difference": exact over all 2^m sign patterns of the
    m non-zero differences when m ≤ ``exact_max``, Monte Carlo otherwise.
    """

    model_config = ConfigDict(extra="forbid")

    n_tasks: int
    mean_a: float
    mean_b: float
    diff: float
    ci: tuple[float, float]
    p_value: float
    wins_b: int
    wins_a: int
    ties: int
    method: str
    only_in_a: int = 0
    only_in_b: int = 0


def paired_test(
    rates_a: Mapping[str, float],
    rates_b: Mapping[str, float],
    *,
    n_boot: int = 2000,
    n_perm: int = 20000,
    exact_max: int = 16,
    alpha: float = 0.05,
    seed: int = 0,
) -> PairedComparison:
    """Compare two runs on shared tasks from their per-task success rates (or mean rewards)."""
    shared = sorted(set(rates_a) & set(rates_b))
    if not shared:
        raise InputError("the two runs share no task; a paired comparison needs the same tasks")
    diffs = [rates_b[t] - rates_a[t] for t in shared]
    m = len(diffs)
    observed = sum(diffs) / m
    ci = bootstrap_ci(diffs, n_boot=n_boot, alpha=alpha, seed=seed)
    nonzero = [d for d in diffs if d != 0]
    # Compare |mean| with a tiny slack so float noise in re-summed patterns does not flip ties.
    target = abs(sum(nonzero)) - 1e-12
    if not nonzero:
        p, method = 1.0, "paired sign-flip permutation (no non-zero difference)"
    elif len(nonzero) <= exact_max:
        hits = sum(
            1
            for signs in itertools.product((1, -1), repeat=len(nonzero))
            if abs(sum(s * d for s, d in zip(signs, nonzero, strict=True))) >= target
        )
        p, method = hits / 2 ** len(nonzero), "paired sign-flip permutation (exact)"
    else:
        rng = random.Random(seed)
        hits = sum(1 for _ in range(n_perm) if abs(sum(d if rng.random() < 0.5 else -d for d in nonzero)) >= target)
        # +1 in numerator and denominator: the observed pattern is one of the permutations.
        p, method = (hits + 1) / (n_perm + 1), f"paired sign-flip permutation (Monte Carlo, {n_perm} draws)"
    return PairedComparison(
        n_tasks=m,
        mean_a=sum(rates_a[t] for t in shared) / m,
        mean_b=sum(rates_b[t] for t in shared) / m,
        diff=observed,
        ci=ci,
        p_value=min(1.0, p),
        wins_b=sum(1 for d in diffs if d > 0),
        wins_a=sum(1 for d in diffs if d < 0),
        ties=sum(1 for d in diffs if d == 0),
        method=method,
        only_in_a=len(set(rates_a) - set(rates_b)),
        only_in_b=len(set(rates_b) - set(rates_a)),
    )

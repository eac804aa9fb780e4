"""Hand-computed checks of pass@k, pass^k, intervals and the paired test."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from agentrft.eval.metrics import (
    bootstrap_ci,
    mean_pass_at_k,
    paired_test,
    pass_at_k,
    pass_curves,
    pass_hat_k,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # n - c < k
        (5, 0, 3, 0.0),
        (10, 3, 1, 0.3),
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.1),  # C(2,2)/C(5,2)
        (5, 2, 3, 0.0),
        (4, 3, 2, 0.5),  # C(3,2)/C(4,2) = 3/6
        (5, 5, 5, 1.0),
        (6, 0, 1, 0.0),
    ],
)
def test_pass_hat_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_hat_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_exact_binomials_and_stays_stable_for_large_n() -> None:
    for n, c, k in [(20, 7, 5), (50, 1, 10), (2000, 10, 100), (3000, 2900, 40)]:
        exact_at = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        exact_hat = Fraction(math.comb(c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_at), rel=1e-9, abs=1e-15)
        assert pass_hat_k(n, c, k) == pytest.approx(float(exact_hat), rel=1e-9, abs=1e-300)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001, rel=1e-12)


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_hat_k(3, 4, 1)


def test_mean_over_tasks_and_curves_stop_at_smallest_n() -> None:
    assert mean_pass_at_k([(5, 2), (5, 0)], 2) == pytest.approx(0.35)
    assert mean_pass_at_k([(5, 2), (4, 3)], 2, hat=True) == pytest.approx((0.1 + 0.5) / 2)
    at, hat = pass_curves([(5, 2), (3, 3)])
    assert sorted(at) == [1, 2, 3]
    assert at[1] == pytest.approx((0.4 + 1.0) / 2)
    assert hat[3] == pytest.approx((0.0 + 1.0) / 2)


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.236593, abs=1e-5), pytest.approx(0.763407, abs=1e-5))
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.277533, abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    values = [0.0, 0.25, 0.5, 1.0, 1.0, 0.0, 0.75]
    a = bootstrap_ci(values, seed=3)
    assert a == bootstrap_ci(values, seed=3)
    assert a[0] < sum(values) / len(values) < a[1]
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)


def test_paired_test_exact_sign_flip() -> None:
    a = {"t1": 0.0, "t2": 0.0, "t3": 0.5, "t4": 1.0, "only_a": 1.0}
    b = {"t1": 1.0, "t2": 1.0, "t3": 0.5, "t4": 0.5}
    res = paired_test(a, b)
    # non-zero diffs (1, 1, -0.5): of 8 sign patterns |sum| >= 1.5 for 4 of them.
    assert res.p_value == pytest.approx(0.5)
    assert res.diff == pytest.approx(1.5 / 4)
    assert (res.wins_b, res.wins_a, res.ties, res.n_tasks, res.only_in_a) == (2, 1, 1, 4, 1)
    assert "exact" in res.method
    all_up = paired_test({f"t{i}": 0.0 for i in range(5)}, {f"t{i}": 1.0 for i in range(5)})
    assert all_up.p_value == pytest.approx(2 / 32)
    assert all_up.ci == (1.0, 1.0)


def test_paired_test_monte_carlo_and_no_shared_tasks() -> None:
    a = {f"t{i}": 0.0 for i in range(30)}
    b = {f"t{i}": (1.0 if i < 25 else 0.0) for i in range(30)}
    res = paired_test(a, b, exact_max=10, n_perm=5000)
    assert "Monte Carlo" in res.method and res.p_value < 0.001
    same = paired_test(a, a)
    assert same.p_value == 1.0 and same.diff == 0.0
    with pytest.raises(ValueError, match="share no task"):
        paired_test({"x": 1.0}, {"y": 1.0})

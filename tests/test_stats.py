"""Confidence intervals (``a2c_ppo_acktr.common.stats``) against closed forms and published tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from a2c_ppo_acktr.common import stats

# Two-sided 95% t quantiles (t_{0.975, df}) from the standard table (e.g. NIST/SEMATECH e-Handbook, 1.3.6.7.2).
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    9: 2.262,
    10: 2.228,
    20: 2.086,
    29: 2.045,
    30: 2.042,
    60: 2.000,
    120: 1.980,
}


@pytest.mark.parametrize("df,expected", sorted(T_975.items()))
def test_t_quantile_matches_the_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)


def test_t_quantile_other_levels_symmetry_and_large_df():
    assert stats.t_quantile(0.995, 1) == pytest.approx(63.657, abs=1e-3)
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.132, abs=1e-3)
    assert stats.t_quantile(0.995, 10) == pytest.approx(3.169, abs=1e-3)
    assert stats.t_quantile(0.025, 5) == pytest.approx(-stats.t_quantile(0.975, 5))
    assert stats.t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)
    # Cauchy (df=1) has a closed-form quantile; a huge df is the normal distribution.
    assert stats.t_quantile(0.9, 1) == pytest.approx(math.tan(math.pi * 0.4), rel=1e-9)
    assert stats.t_quantile(0.975, 10**7) == pytest.approx(1.959964, abs=1e-6)
    # The exact sum and the expansion agree where they hand over.
    assert stats.t_quantile(0.975, 1000) == pytest.approx(stats.t_quantile(0.975, 1001), abs=1e-4)
    # df=2 has a closed-form CDF: F(t) = 1/2 + t / (2 sqrt(t^2 + 2)).
    for t in (-3.0, 0.3, 2.5):
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), rel=1e-12)


def test_mean_ci_on_known_data():
    # mean 5, sample sd sqrt(10/4) = 1.5811, sem 0.7071, t_{0.975,4} = 2.7764 -> half width 1.9632.
    mean, half = stats.mean_ci([3.0, 4.0, 5.0, 6.0, 7.0])
    assert mean == pytest.approx(5.0)
    assert half == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-5)
    assert half == pytest.approx(1.9632, abs=1e-4)
    # Three seeds at 90%: t_{0.95,2} = 2.919986, sd 1 -> 2.919986 / sqrt(3).
    mean, half = stats.mean_ci([1.0, 2.0, 3.0], confidence=0.90)
    assert (mean, half) == pytest.approx((2.0, 2.919986 / math.sqrt(3)), rel=1e-6)
    mean, half = stats.mean_ci([0.25, 0.25, 0.25])
    assert (mean, half) == (0.25, 0.0)


def test_mean_ci_single_run_and_errors():
    mean, half = stats.mean_ci([0.7])
    assert mean == 0.7 and math.isnan(half)
    with pytest.raises(ValueError, match="at least one"):
        stats.mean_ci([])
    with pytest.raises(ValueError, match="non-finite"):
        stats.mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        stats.mean_ci([1.0, 2.0], confidence=95)


def test_mean_ci_covers_the_true_mean_at_its_nominal_rate():
    rng = np.random.default_rng(0)
    hits = 0
    trials = 2000
    for _ in range(trials):
        mean, half = stats.mean_ci(rng.normal(1.0, 2.0, size=3))
        hits += abs(mean - 1.0) <= half
    # Binomial(2000, 0.95) has sd 0.0049; 1.96 (normal) instead of 4.30 (t, df=2) would cover ~76%.
    assert hits / trials == pytest.approx(0.95, abs=0.02)


def test_bootstrap_of_a_constant_difference_is_a_point():
    a = np.linspace(0.0, 1.0, 17)
    ci = stats.paired_bootstrap_ci(a + 0.25, a, n_boot=500)
    assert ci == {"diff": 0.25, "low": 0.25, "high": 0.25, "n": 17}


def test_bootstrap_ci_of_normal_differences_matches_the_normal_interval():
    rng = np.random.default_rng(1)
    n = 4000
    b = rng.uniform(0.0, 1.0, size=n)
    a = b + rng.normal(0.5, 1.0, size=n)
    ci = stats.paired_bootstrap_ci(a, b, n_boot=4000, seed=3)
    d = a - b
    assert ci["n"] == n and ci["diff"] == pytest.approx(d.mean())
    assert ci["low"] < 0.5 < ci["high"]
    half = 1.96 * d.std(ddof=1) / math.sqrt(n)  # ~0.031
    # a 2.5% quantile of 4000 resamples has a standard error of 0.042 bootstrap sd: 0.15 * half is 7 of them
    assert ci["low"] == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert ci["high"] == pytest.approx(d.mean() + half, abs=0.15 * half)
    narrower = stats.paired_bootstrap_ci(a, b, n_boot=4000, seed=3, confidence=0.5)
    assert ci["low"] < narrower["low"] < narrower["high"] < ci["high"]


def test_bootstrap_pairs_are_resampled_together():
    # A large shared per-question component cancels in the paired difference: the interval stays tight.
    rng = np.random.default_rng(2)
    difficulty = rng.uniform(0.0, 100.0, size=200)
    ci = stats.paired_bootstrap_ci(difficulty + 1.0 + rng.normal(0, 0.1, 200), difficulty)
    assert ci["high"] - ci["low"] < 0.1


def test_bootstrap_is_deterministic_by_seed():
    rng = np.random.default_rng(4)
    a, b = rng.random(50), rng.random(50)
    assert stats.paired_bootstrap_ci(a, b, n_boot=300, seed=7) == stats.paired_bootstrap_ci(
        list(a), list(b), n_boot=300, seed=7
    )
    assert stats.paired_bootstrap_ci(a, b, n_boot=300, seed=7) != stats.paired_bootstrap_ci(a, b, n_boot=300, seed=8)


def test_bootstrap_errors():
    with pytest.raises(ValueError, match="3 values in a and 2 in b"):
        stats.paired_bootstrap_ci([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="empty"):
        stats.paired_bootstrap_ci([], [])
    with pytest.raises(ValueError, match="non-finite"):
        stats.paired_bootstrap_ci([1.0, float("inf")], [0.0, 0.0])
    with pytest.raises(ValueError, match="n_boot"):
        stats.paired_bootstrap_ci([1.0], [0.0], n_boot=0)


def test_stratified_bootstrap_keeps_each_stratum_size():
    # Differences constant within each stratum but not across: only the strata's mix can vary, and
    # stratified resampling fixes it, so the interval is a point; pooled resampling varies the mix.
    d = np.array([1.0] * 5 + [3.0] * 3)
    labels = ["x"] * 5 + ["y"] * 3
    ci = stats.paired_bootstrap_ci(d, np.zeros(8), n_boot=500, strata=labels)
    assert (ci["low"], ci["high"]) == pytest.approx((1.75, 1.75)) and ci["diff"] == pytest.approx(1.75)
    pooled = stats.paired_bootstrap_ci(d, np.zeros(8), n_boot=500)
    assert pooled["low"] < 1.75 < pooled["high"]
    with pytest.raises(ValueError, match="strata has 2 labels for 8 pairs"):
        stats.paired_bootstrap_ci(d, np.zeros(8), strata=["x", "y"])


def test_stratified_bootstrap_spread_matches_the_stratified_standard_error():
    rng = np.random.default_rng(5)
    sizes = {"a": 800, "b": 200}
    d = np.concatenate([rng.normal(0.0, 1.0, sizes["a"]), rng.normal(2.0, 3.0, sizes["b"])])
    labels = ["a"] * sizes["a"] + ["b"] * sizes["b"]
    ci = stats.paired_bootstrap_ci(d, np.zeros(d.size), n_boot=4000, seed=1, strata=labels)
    # Var(mean) = sum_h (n_h/n)^2 s_h^2 / n_h over strata.
    se = math.sqrt(
        sum(
            (len(d[[l == h for l in labels]]) / d.size) ** 2 * d[[l == h for l in labels]].var(ddof=1) / n
            for h, n in sizes.items()
        )
    )
    # each 4000-resample tail quantile has sd 0.042 se, the half-width ~0.03 se: 0.1 * 1.96 se is 6.6 of them
    assert (ci["high"] - ci["low"]) / 2 == pytest.approx(1.96 * se, rel=0.1)


def test_stratified_bootstrap_sums_keep_stratum_sizes_and_are_seeded():
    # Stratum "a" (values 0 and 1, two items): a resample's sum is 0, 1 or 2 with probability 1/4, 1/2, 1/4.
    # Stratum "b" holds one value: every resample draws it, so its sum never moves.
    values, strata = [0.0, 1.0, 7.0], ["a", "a", "b"]
    sums = stats.stratified_bootstrap_sums(values, strata, n_boot=40000, seed=3)
    assert list(sums) == ["a", "b"] and sums["a"].shape == (40000,)
    assert (sums["b"] == 7.0).all()
    freq = [float(np.mean(sums["a"] == k)) for k in (0, 1, 2)]
    assert freq == pytest.approx([0.25, 0.5, 0.25], abs=0.01)  # binomial sd over 40000 draws <= 0.0025: 4 sd
    again = stats.stratified_bootstrap_sums(values, strata, n_boot=40000, seed=3)
    assert all(np.array_equal(sums[k], again[k]) for k in sums)
    assert not np.array_equal(sums["a"], stats.stratified_bootstrap_sums(values, strata, n_boot=40000, seed=4)["a"])
    # The percentile interval of that three-point distribution is its whole support at 95%.
    assert stats.percentile_interval(sums["a"] / 2, 0.95) == (0.0, 1.0)
    with pytest.raises(ValueError, match="one label per value"):
        stats.stratified_bootstrap_sums(values, ["a"], n_boot=10)
    with pytest.raises(ValueError, match="non-finite"):
        stats.stratified_bootstrap_sums([1.0, float("nan")], n_boot=10)

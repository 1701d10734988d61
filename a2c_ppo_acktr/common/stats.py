"""Confidence intervals for comparing runs: over seeds (Student t) and over paired questions (bootstrap).

* :func:`mean_ci`: the mean of independent runs (one value per seed) and the half-width of its
  Student-t interval. Seeds are few (3-10), so the t quantile matters: with 3 seeds the 95% interval
  is 4.30 standard errors wide on each side, not 1.96.
* :func:`paired_bootstrap_ci`: the mean difference of two systems scored on the same questions, with a
  percentile bootstrap interval that resamples question pairs (optionally within strata, such as
  question types), so per-question difficulty cancels.
* :func:`stratified_bootstrap_sums` and :func:`percentile_interval`: the resampling both use, for
  intervals of other statistics of the same resamples (a report's per-task and Overall scores).

The t distribution is scipy's; the bootstraps are written here, since they resample within strata
(question types) and weight the strata as the benchmark's Overall does, which ``scipy.stats.bootstrap``
does not.
"""

from __future__ import annotations

import math
from typing import Hashable, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

# Bootstrap resamples are drawn in blocks of at most this many indices, so memory stays bounded.
_BOOT_BLOCK_ELEMENTS = 1 << 20


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1), e.g. 0.95 for a 95% interval")


def t_cdf(t: float, df: int) -> float:
    """CDF of Student's t distribution with integer ``df`` degrees of freedom (``scipy.stats.t``).

    Args:
        t: The point at which to evaluate.
        df: Degrees of freedom, ``>= 1``.
    """
    _check_df(df)
    return float(scipy_stats.t.cdf(t, int(df)))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_quantile(0.975, 2)`` = 4.303).

    Args:
        p: Probability in (0, 1).
        df: Degrees of freedom, ``>= 1``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p!r} must be in (0, 1)")
    _check_df(df)
    return float(scipy_stats.t.ppf(p, int(df)))


def _check_df(df: int) -> None:
    if df < 1 or int(df) != df:
        raise ValueError(f"df={df!r} must be a positive integer")


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean of independent runs and the half-width of its Student-t confidence interval.

    The interval is ``mean +- t_{(1+confidence)/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (ddof=1). It assumes the values are independent (one per seed), not iterations of one run.

    Args:
        values: One finite value per run, shape ``(n,)``.
        confidence: Coverage of the interval, in (0, 1).

    Returns:
        ``(mean, half_width)``; ``half_width`` is ``nan`` for a single run (no spread to estimate).

    Raises:
        ValueError: If ``values`` is empty or holds a non-finite value, or ``confidence`` is outside (0, 1).
    """
    _check_confidence(confidence)
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value (one per run)")
    if not np.isfinite(x).all():
        raise ValueError(f"mean_ci got non-finite values {x.tolist()}; drop runs without a value first")
    mean = float(x.mean())
    if x.size == 1:
        return mean, float("nan")
    sem = float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, t_quantile(0.5 + confidence / 2, x.size - 1) * sem


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    n_boot: int = 10000,
    seed: int = 0,
    confidence: float = 0.95,
    strata: Optional[Sequence[Hashable]] = None,
) -> dict[str, float]:
    """Percentile bootstrap interval of the mean paired difference ``mean(a - b)``.

    Each resample draws ``n`` pairs ``(a_i, b_i)`` with replacement (Efron and Tibshirani 1993, ch. 13),
    so what both systems find hard or easy cancels in the difference. With ``strata``, pairs are
    drawn within each stratum and every stratum keeps its size: the resamples then have the
    composition a stratified design fixed (e.g. so many questions of each type). A stratum of one
    pair adds no spread, so the interval is too narrow when strata are that small.

    Args:
        a: Scores of system A, shape ``(n,)``; ``a[i]`` and ``b[i]`` belong to the same question.
        b: Scores of system B, shape ``(n,)``.
        n_boot: Number of bootstrap resamples.
        seed: Seed of the resampling (the same seed gives the same interval).
        confidence: Coverage of the interval, in (0, 1).
        strata: Optional stratum label of each pair, shape ``(n,)``; None resamples all pairs together.

    Returns:
        ``{"diff": mean(a - b), "low": ..., "high": ..., "n": n}``.

    Raises:
        ValueError: If ``a``, ``b`` (and ``strata``) differ in length, are empty or hold non-finite
            values, or ``n_boot``/``confidence`` are out of range.
    """
    _check_confidence(confidence)
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot} must be >= 1")
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.size != y.size:
        raise ValueError(
            f"paired_bootstrap_ci needs one b per a: got {x.size} values in a and {y.size} in b; pair them by question "
            "first"
        )
    if x.size == 0:
        raise ValueError("paired_bootstrap_ci got no pairs (a and b are empty)")
    d = x - y
    if not np.isfinite(d).all():
        raise ValueError("paired_bootstrap_ci got non-finite scores; every pair must hold two finite numbers")
    n = d.size
    if strata is not None and len(strata) != n:
        raise ValueError(f"strata has {len(strata)} labels for {n} pairs; give one label per pair")
    sums = np.zeros(n_boot)
    for group_sums in stratified_bootstrap_sums(d, strata, n_boot=n_boot, seed=seed).values():
        sums += group_sums
    low, high = percentile_interval(sums / n, confidence)
    return {"diff": float(d.mean()), "low": float(low), "high": float(high), "n": int(n)}


def stratified_bootstrap_sums(
    values: Sequence[float],
    strata: Optional[Sequence[Hashable]] = None,
    n_boot: int = 10000,
    seed: int = 0,
) -> dict[Hashable, np.ndarray]:
    """Per stratum, the sum of each bootstrap resample drawn with replacement within that stratum.

    Every stratum keeps its size in every resample (the stratified design of
    :func:`paired_bootstrap_ci`). Strata are drawn in the order of their first label in ``strata``
    from one generator seeded by ``seed``, so the same inputs give the same resamples; dividing a
    stratum's sums by its size gives its resampled means.

    Args:
        values: One finite value per item, shape ``(n,)``.
        strata: Stratum label of each item, shape ``(n,)``; None puts every item in one stratum
            (key ``None``).
        n_boot: Number of resamples.
        seed: Seed of the resampling.

    Returns:
        ``{label: sums}``, each ``sums`` of shape ``(n_boot,)``, in first-appearance order of the labels.

    Raises:
        ValueError: If ``values`` is empty or non-finite, ``strata`` has another length, or ``n_boot < 1``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot} must be >= 1")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("stratified_bootstrap_sums got no values to resample")
    if not np.isfinite(x).all():
        raise ValueError("stratified_bootstrap_sums got non-finite values; every item must hold a finite number")
    groups: dict[Hashable, list[int]] = {}
    if strata is None:
        groups[None] = list(range(x.size))
    else:
        if len(strata) != x.size:
            raise ValueError(f"strata has {len(strata)} labels for {x.size} values; give one label per value")
        for i, label in enumerate(strata):
            groups.setdefault(label, []).append(i)
    rng = np.random.default_rng(seed)
    out: dict[Hashable, np.ndarray] = {}
    for label, members in groups.items():
        xg = x[members]
        sums = np.zeros(n_boot)
        block = max(1, _BOOT_BLOCK_ELEMENTS // xg.size)
        for start in range(0, n_boot, block):
            stop = min(start + block, n_boot)
            sums[start:stop] = xg[rng.integers(0, xg.size, size=(stop - start, xg.size))].sum(axis=1)
        out[label] = sums
    return out


def percentile_interval(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of bootstrap samples (Efron and Tibshirani 1993, ch. 13).

    Args:
        samples: Bootstrap replicates of a statistic, shape ``(n_boot,)``.
        confidence: Coverage, in (0, 1).

    Returns:
        ``(low, high)``: the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles.
    """
    _check_confidence(confidence)
    alpha = 1.0 - confidence
    low, high = np.quantile(np.asarray(samples, dtype=np.float64), [alpha / 2, 1.0 - alpha / 2])
    return float(low), float(high)

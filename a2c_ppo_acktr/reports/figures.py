"""Figures: per-task bars with their intervals and learning curves from ``metrics.jsonl``.

matplotlib's object-oriented API on the Agg canvas (no pyplot, no global backend switch), so the
figures work headless and leave the caller's matplotlib state alone.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.run.logger import read_metrics
from a2c_ppo_acktr.reports.records import (
    CI_CONFIDENCE,
    SHORT_TASK_NAMES,
    VSI_KIND,
    game_task_order,
    is_number,
    report_kind,
    split_kinds,
)
from a2c_ppo_acktr.reports.vsi import report_counts

logger = logging.getLogger(__name__)


class NoCurvesError(ValueError, UserError):
    """A metrics file with nothing to draw."""


def _new_figure(width_px: int, height_px: int, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def task_bars_figure(
    rows: Sequence[tuple[str, dict[str, Any]]],
    *,
    width_px: int = 1000,
    height_px: int = 450,
    dpi: int = 100,
):
    """The bar chart of :func:`plot_task_bars` as a matplotlib Figure (tests read its Axes).

    Every bar carries its value as text above it (above its error bar when it has one), so a
    score of 0 still shows as ``0.0`` and a short stroke in the bar's colour at the baseline; a
    task without questions shows ``n/a``. Error bars are the report's ``ci95`` intervals (none for
    a report without them). Tick labels give each column's number of questions, ``n=12``, or one
    per report, ``n=12/10``, when the reports differ.

    Game reports (:func:`_bar_columns`) have one column per task, success rate x100, with Wilson
    error bars (and an ``All`` column first when a report has several tasks); with reports of both
    kinds the game columns follow the VSI ones, and a report shows ``n/a`` in the other kind's columns.
    """
    if not rows:
        raise ValueError("plot_task_bars needs at least one (name, report) row")
    columns, ylabel, title = _bar_columns(rows)
    fig = _new_figure(width_px, height_px, dpi)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(columns))
    width = 0.8 / len(rows)
    # Side by side, more than two value labels per group would overlap unless turned upright.
    rotation = 90 if len(rows) > 2 else 0
    label_size = 7 if len(rows) > 1 else 8
    counts = []
    for i, (name, report) in enumerate(rows):
        bars_of = _report_bars(report, columns)
        values = [np.nan if v is None else float(v) for v, _, _ in bars_of]
        intervals = [iv for _, iv, _ in bars_of]
        counts.append([k for _, _, k in bars_of])
        xs = x - 0.4 + width * (i + 0.5)
        bars = ax.bar(xs, values, width, label=name)
        colour = bars.patches[0].get_facecolor()
        for xi, v, iv in zip(xs, values, intervals):
            if math.isnan(v):
                ax.text(xi, 1.0, "n/a", ha="center", va="bottom", fontsize=label_size, color="gray", rotation=rotation)
                continue
            top = v
            if iv is not None and None not in iv:
                ax.errorbar(
                    [xi],
                    [v],
                    yerr=[[max(v - iv[0], 0.0)], [max(iv[1] - v, 0.0)]],
                    fmt="none",
                    ecolor="black",
                    elinewidth=0.8,
                    capsize=min(3.0, 60.0 * width),
                    zorder=3,
                )
                top = max(v, iv[1])
            if v == 0.0:
                # A zero-height bar is invisible: a stroke at the baseline shows the bar is there.
                ax.plot(
                    [xi - width / 2, xi + width / 2],
                    [0.0, 0.0],
                    color=colour,
                    linewidth=3,
                    solid_capstyle="butt",
                    clip_on=False,
                    zorder=4,
                )
            ax.text(xi, top + 1.0, f"{v:.1f}", ha="center", va="bottom", fontsize=label_size, rotation=rotation)
    ticks = []
    for j, col in enumerate(columns):
        ns = [row[j] for row in counts]
        ticks.append(f"{col}\nn={ns[0]}" if len(set(ns)) == 1 else f"{col}\nn={'/'.join(str(k) for k in ns)}")
    ax.set_xticks(x)
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_ylabel(ylabel)
    # Room above 100 for the value labels of bars that reach it.
    ax.set_ylim(0, 100 + (18 if rotation else 8))
    ax.set_yticks(np.arange(0, 101, 20))
    ax.grid(axis="y", alpha=0.3)
    if any(r.get("ci95") for _, r in rows):
        level = next(r["ci95"].get("confidence", CI_CONFIDENCE) for _, r in rows if r.get("ci95"))
        ax.set_title(f"error bars: {100 * level:g}% {title}", fontsize=8)
    # Outside the axes: bars reach 100 and a legend inside would hide them.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


_VSI_BAR_COLUMNS = ("Overall", *SHORT_TASK_NAMES.values())


_VSI_ERRORBAR_TITLE = "bootstrap interval (questions resampled within each type)"


_GAME_ERRORBAR_TITLE = "Wilson score interval of the success rate"


# The column of a game report's pooled success rate, shown when a report has several tasks.
_GAME_ALL_COLUMN = "All"


def _bar_columns(rows: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[str], str, str]:
    """``(columns, y label, error-bar title)`` of the bar chart of ``rows``.

    VSI reports only: Overall and the 8 tasks, "score (x100)". Game reports only: ``All`` (when a
    report has several tasks) and the tasks of all reports (:func:`game_task_order`), "success rate
    (%)". Both kinds: the VSI columns, then the game columns.
    """
    vsi, games = split_kinds(rows)
    if not games:
        return list(_VSI_BAR_COLUMNS), "score (x100)", _VSI_ERRORBAR_TITLE
    tasks = game_task_order([t for _, r in games for t in (r.get("table") or {})])
    several = any(len(r.get("table") or {}) > 1 for _, r in games)
    game_columns = ([_GAME_ALL_COLUMN] if several else []) + [t for t in tasks if t not in _VSI_BAR_COLUMNS]
    if not vsi:
        return game_columns, "success rate (%)", _GAME_ERRORBAR_TITLE
    return (
        [*_VSI_BAR_COLUMNS, *[c for c in game_columns if c != _GAME_ALL_COLUMN]],
        "VSI score / game success (x100)",
        "interval (VSI: bootstrap; games: Wilson)",
    )


def _report_bars(
    report: dict[str, Any], columns: Sequence[str]
) -> list[tuple[Optional[float], Optional[Sequence[float]], int]]:
    """``(value x100 or None, interval or None, n)`` of each of ``columns`` for one report (None, None, 0
    for a column the report does not have)."""
    ci = report.get("ci95") or {}
    ci_table = ci.get("table") or {}
    table = report.get("table") or {}
    n = report_counts(report)
    if report_kind(report) == VSI_KIND:
        own = {"Overall": (report["overall"], ci.get("overall"), sum(n.values()))}
        own.update({c: (table.get(c), ci_table.get(c), n[c]) for c in SHORT_TASK_NAMES.values()})
    else:
        own = {t: (v, ci_table.get(t), n.get(t, 0)) for t, v in table.items()}
        # A game report's overall is its success rate: the "All" column (or "Overall" beside VSI reports).
        for column in (_GAME_ALL_COLUMN, "Overall"):
            own[column] = (report["overall"], ci.get("overall"), sum(n.values()))
    return [own.get(c, (None, None, 0)) for c in columns]


def plot_task_bars(
    rows: Sequence[tuple[str, dict[str, Any]]],
    path: str | os.PathLike,
    *,
    width_px: int = 1000,
    height_px: int = 450,
    dpi: int = 100,
) -> Path:
    """Grouped bar chart of Overall and the 8 task scores (x100), one bar colour per report, with
    value labels, 95% interval error bars and the number of questions per task
    (:func:`task_bars_figure`).

    Args:
        rows: ``(name, report)`` pairs; several give side-by-side bars.
        path: Output PNG; written at exactly ``width_px x height_px``.
    """
    fig = task_bars_figure(rows, width_px=width_px, height_px=height_px, dpi=dpi)
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path


# Learning-curve panels, in display order: the first key of each group found in metrics.jsonl.
_CURVE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("rollout/episode_score_mean", "charts/episode_score", "score"),
    ("rollout/episode_reward_mean", "charts/episode_reward", "reward"),
    ("rollout/valid_action_rate", "valid_action_rate"),
    ("rollout/mean_turns", "mean_turns"),
    ("charts/temperature_mean", "temperature"),
    ("losses/policy_loss", "policy_loss"),
    ("losses/value_loss", "value_loss"),
    ("losses/approx_kl", "approx_kl"),
    ("losses/entropy", "entropy"),
    ("losses/clipfrac", "clipfrac"),
    ("losses/kl_ref", "kl_ref"),
)


_STEP_KEYS = ("iteration", "global_step", "step", "epoch")


def curve_keys(rows: Sequence[dict[str, Any]], max_panels: int = 9) -> list[str]:
    """Metrics to plot: the known groups first, then other numeric keys, at most ``max_panels``."""
    numeric = [
        k
        for k in dict.fromkeys(k for r in rows for k in r)
        if k not in _STEP_KEYS and any(is_number(r.get(k)) for r in rows)
    ]
    chosen = [next(k for k in group if k in numeric) for group in _CURVE_GROUPS if any(k in numeric for k in group)]
    # Timings and counters say little about learning; other unknown metrics fill the free panels.
    chosen += [
        k for k in numeric if k not in chosen and not k.startswith(("time/", "charts/turns", "rollout/episodes"))
    ]
    return chosen[:max_panels]


def ema_smooth(values: Sequence[float], weight: float) -> np.ndarray:
    """Debiased exponential moving average, TensorBoard's "smoothing" slider.

    ``m_t = weight * m_{t-1} + (1 - weight) * x_t`` from ``m_{-1} = 0``, divided by
    ``1 - weight^(t+1)`` so the first points are not pulled toward 0 (Kingma and Ba 2015, Adam's
    bias correction). ``weight = 0`` returns the values; a constant series stays constant.

    Args:
        values: The raw curve, shape ``(T,)``.
        weight: Smoothing in [0, 1); larger is smoother.

    Returns:
        The smoothed curve, shape ``(T,)``.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight={weight!r} must be in [0, 1) (0 = raw curve, 0.9 = strong smoothing)")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    out = np.empty_like(x)
    m = 0.0
    for t, v in enumerate(x):
        m = weight * m + (1.0 - weight) * v
        out[t] = m / (1.0 - weight ** (t + 1))
    return out


def learning_curves_figure(
    rows: Sequence[dict[str, Any]],
    *,
    smoothing: float = 0.0,
    width_px: int = 1200,
    height_px: int = 900,
    dpi: int = 100,
    source: str = "metrics",
):
    """The panels of :func:`plot_learning_curves` as a matplotlib Figure (tests read its Axes).

    Args:
        rows: Rows of a training ``metrics.jsonl``.
        smoothing: :func:`ema_smooth` weight; above 0 the smoothed curve is drawn over the raw one
            (kept, faded, so nothing is hidden).
        source: Names the rows in the error message.

    Raises:
        NoCurvesError: If the rows hold no finite numeric metric.
        ValueError: If ``smoothing`` is outside [0, 1).
    """
    from matplotlib.ticker import MaxNLocator

    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing!r} must be in [0, 1) (0 = raw curves, 0.9 = strong smoothing)")
    keys = curve_keys(rows)
    if not keys:
        raise NoCurvesError(
            f"{source} holds no finite numeric metric to plot ({len(rows)} row(s); every value is missing, NaN, "
            "infinite or not a "
            "number); pass the metrics.jsonl of a run whose iterations logged numbers"
        )
    step_key = next((k for k in _STEP_KEYS if any(is_number(r.get(k)) for r in rows)), None)
    ncols = 3
    nrows = math.ceil(len(keys) / ncols)
    fig = _new_figure(width_px, height_px, dpi)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = [((r.get(step_key) if step_key else j), r[key]) for j, r in enumerate(rows) if is_number(r.get(key))]
        xs, ys = zip(*pts)
        if smoothing > 0:
            ax.plot(xs, ys, marker="o", markersize=2, linewidth=1, alpha=0.3, color="C0", label="raw")
            ax.plot(xs, ema_smooth(ys, smoothing), linewidth=1.5, color="C0", label=f"EMA {smoothing:g}")
        else:
            ax.plot(xs, ys, marker="o", markersize=2, linewidth=1, color="C0")
        if all(is_number(v) and float(v).is_integer() for v in xs):
            # Iterations are whole numbers: no 0.5 ticks on a short run.
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i >= len(keys) - ncols:
            ax.set_xlabel(step_key or "log line", fontsize=8)
        if smoothing > 0 and i == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_learning_curves(
    metrics_path: str | os.PathLike,
    path: str | os.PathLike,
    *,
    smoothing: float = 0.0,
    width_px: int = 1200,
    height_px: int = 900,
    dpi: int = 100,
) -> Path:
    """Learning curves from a training ``metrics.jsonl``: one panel per metric, x = iteration
    (integer ticks), optionally smoothed (:func:`learning_curves_figure`).

    Args:
        metrics_path: The JSONL written by training (``iteration``/``global_step``/``step`` is the x
            axis when present, else the line index).
        path: Output PNG, exactly ``width_px x height_px``.
        smoothing: :func:`ema_smooth` weight in [0, 1) (``eval_vsi.py --smooth``); 0 draws the raw curves only.

    Raises:
        NoCurvesError: If the file holds no finite numeric metric.
    """
    rows = read_metrics(metrics_path)
    fig = learning_curves_figure(
        rows, smoothing=smoothing, width_px=width_px, height_px=height_px, dpi=dpi, source=str(metrics_path)
    )
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path

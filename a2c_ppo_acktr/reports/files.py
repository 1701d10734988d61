"""Reading and writing reports: ``report.json`` (atomically, NaN as null), ``report.md``, ``tasks.png``;
a report loaded from disk gets the intervals of a report written before they existed.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from a2c_ppo_acktr.common import atomic, scoring
from a2c_ppo_acktr.common.jsonl import JsonlError
from a2c_ppo_acktr.reports.figures import plot_task_bars
from a2c_ppo_acktr.reports.games import game_intervals
from a2c_ppo_acktr.reports.markdown import report_markdown
from a2c_ppo_acktr.reports.records import GAME_KIND, is_number, is_success, report_kind
from a2c_ppo_acktr.reports.vsi import score_intervals


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    """Write JSON atomically (temp file then rename), NaN written as ``null``."""
    return atomic.write_json(_nan_to_none(obj), path, default=str)


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    if isinstance(obj, np.generic):
        return _nan_to_none(obj.item())
    return obj


def write_report(report: dict[str, Any], out_dir: str | os.PathLike, *, plots: bool = True) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and (with ``plots``) ``tasks.png`` into ``out_dir``.

    Returns:
        The written paths by kind (``json``, ``md``, ``tasks_png``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(report, out / "report.json")}
    (out / "report.md").write_text(report_markdown(report), encoding="utf-8")
    paths["md"] = out / "report.md"
    if plots:
        paths["tasks_png"] = plot_task_bars([(report["name"], report)], out / "tasks.png")
    return paths


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``report.json`` (a directory holding one is accepted too)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"report {str(path)!r} does not exist; pass a report.json written by eval_vsi.py")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise JsonlError(f"{path} is not a report.json written by eval_vsi.py (not JSON: {e})") from e
    for key in ("overall", "table"):
        if not isinstance(report, dict) or key not in report:
            raise JsonlError(f"{path} has no {key!r}: it is not a report.json written by eval_vsi.py")
    if report["overall"] is None:
        report["overall"] = float("nan")
    if not report.get("ci95"):
        if report_kind(report) == GAME_KIND:
            outcomes = _records_outcomes(report.get("records") or [])
            if outcomes:
                report["ci95"] = game_intervals(outcomes)
            return report
        # Written before reports held intervals: the records give the same numbers (fixed seed).
        scored = _records_scored(report.get("records") or [])
        if scored:
            report["ci95"] = score_intervals(scored)
    return report


def _records_outcomes(records: Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
    """``(task, won)`` of every game record; [] when a record lacks either (no interval then)."""
    outcomes = []
    for r in records:
        if not isinstance(r, dict) or not isinstance(r.get("question_type"), str) or not is_number(r.get("score")):
            return []
        outcomes.append((r["question_type"], is_success(r["score"])))
    return outcomes


def _records_scored(records: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    """``(question_type, score)`` of every record; [] when a record lacks either (no interval then)."""
    scored = []
    for r in records:
        qtype, score = r.get("question_type"), r.get("score")
        if qtype not in scoring.TASKS or not is_number(score):
            return []
        scored.append((qtype, float(score)))
    return scored

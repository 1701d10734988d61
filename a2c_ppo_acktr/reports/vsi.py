"""VSI-Bench reports: the benchmark's table from scored episodes (:func:`build_report`) or from a
score file of predictions (:func:`score_file`), with bootstrap intervals resampled within question
types. Every number comes from :mod:`a2c_ppo_acktr.common.scoring`, the one scorer the env reward also uses.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import scoring, stats
from a2c_ppo_acktr.common.jsonl import JsonlError, decode_line
from a2c_ppo_acktr.reports.games import build_game_report
from a2c_ppo_acktr.reports.records import (
    CI_CONFIDENCE,
    CI_RESAMPLES,
    CI_SEED,
    EpisodeRecord,
    GAME_KIND,
    MALFORMED_KEY,
    SHORT_TASK_NAMES,
    VSI_KIND,
    agent_metrics,
    is_game_type,
    report_kind,
)

logger = logging.getLogger(__name__)


def task_table(agg: dict[str, Any]) -> dict[str, Optional[float]]:
    """The 8 task columns in table order, x100, ``None`` for tasks without questions.

    Args:
        agg: The output of :func:`scoring.aggregate`.
    """
    return {
        SHORT_TASK_NAMES[task]: (100.0 * agg["per_task"][task] if task in agg["per_task"] else None)
        for task in scoring.TASK_NAMES
    }


def table_counts(counts: dict[str, int]) -> dict[str, int]:
    """Questions per table column (short task name), 0 for a task without questions.

    Args:
        counts: Questions per raw question type (``report["counts"]``; other keys are ignored).
    """
    n = {short: 0 for short in SHORT_TASK_NAMES.values()}
    for qtype, count in counts.items():
        if qtype in scoring.TASKS:
            n[SHORT_TASK_NAMES[scoring.TASKS[qtype]]] += int(count)
    return n


def score_intervals(
    scored: Sequence[tuple[str, float]],
    *,
    n_boot: int = CI_RESAMPLES,
    seed: int = CI_SEED,
    confidence: float = CI_CONFIDENCE,
) -> dict[str, Any]:
    """Percentile bootstrap intervals of a report's Overall and task scores (points, x100).

    The scheme of :func:`paired_overall_ci`: each resample draws every question type's questions
    with replacement within that type (the number per type is fixed by the question set's design),
    and aggregates the resample as :func:`scoring.aggregate` does (mean per type, Relative Direction
    the mean of its types, Overall the mean of the tasks present). All intervals come from the same
    resamples. A type with a single question adds no spread (``single_question_types``).

    Args:
        scored: ``(question_type, score)`` of every question, scores in [0, 1].
        n_boot: Resamples; ``seed`` seeds them; ``confidence`` is the coverage.

    Returns:
        ``{"confidence", "n_boot", "seed", "scheme", "overall": [low, high], "table": {column: [low, high]
        or None}, "single_question_types"}``.

    Raises:
        ValueError: If ``scored`` is empty or holds an unknown question type.
    """
    scored = list(scored)
    if not scored:
        raise ValueError("score_intervals needs at least one (question_type, score) pair")
    types = [str(t) for t, _ in scored]
    unknown = sorted(set(types) - set(scoring.TASKS))
    if unknown:
        raise ValueError(f"unknown question types {unknown}; known types: {list(scoring.TASKS)}")
    sums = stats.stratified_bootstrap_sums([100.0 * float(s) for _, s in scored], types, n_boot=n_boot, seed=seed)
    counts = {t: types.count(t) for t in sums}
    by_task: dict[str, list[np.ndarray]] = {}
    for qtype, type_sums in sums.items():
        by_task.setdefault(scoring.TASKS[qtype], []).append(type_sums / counts[qtype])
    task_samples = {task: np.mean(by_task[task], axis=0) for task in scoring.TASK_NAMES if task in by_task}
    overall = np.mean(list(task_samples.values()), axis=0)
    return {
        "confidence": confidence,
        "n_boot": n_boot,
        "seed": seed,
        "scheme": "percentile bootstrap; questions resampled with replacement within each question type",
        "overall": list(stats.percentile_interval(overall, confidence)),
        "table": {
            SHORT_TASK_NAMES[task]: (
                list(stats.percentile_interval(task_samples[task], confidence)) if task in task_samples else None
            )
            for task in scoring.TASK_NAMES
        },
        "single_question_types": sum(1 for c in counts.values() if c == 1),
    }


def score_summary(scored: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """What a VSI report holds about ``(question_type, score)`` pairs: :func:`scoring.aggregate`'s
    fields, the benchmark table with its per-task counts, and the 95% intervals."""
    agg = scoring.aggregate(scored)
    return {
        **agg,
        "table": task_table(agg),
        "table_n": table_counts(agg["counts"]),
        "ci95": score_intervals(scored),
    }


def build_report(
    records: Sequence[EpisodeRecord], *, name: str, meta: Optional[dict[str, Any]] = None
) -> dict[str, Any]:
    """Aggregate evaluated episodes into the report dict (see the module docstring).

    Records whose types are all VSI-Bench types (:data:`scoring.TASKS`) give a VSI report (``kind``
    ``"vsi"``); any other type makes it a game report (:func:`build_game_report`).

    Args:
        records: Evaluated episodes (at least one).
        name: Row name in tables (e.g. ``sft`` or ``oracle``).
        meta: What was evaluated and how (model, adapter, config...), stored as is.
    """
    agent = agent_metrics(records)  # first: it says what to do about an empty evaluation
    if any(is_game_type(r.question_type) for r in records):
        return build_game_report(records, name=name, meta=meta)
    return {
        "name": name,
        "mode": "episodes",
        "kind": VSI_KIND,
        "meta": dict(meta or {}),
        **score_summary([(r.question_type, r.score) for r in records]),
        "agent": agent,
        "records": [r.to_dict() for r in records],
    }


def _score_line(
    raw: str, rule: str = scoring.DEFAULT_SCORING_RULE
) -> tuple[Optional[str], Optional[float], Optional[str], dict[str, Any]]:
    """Score one JSONL line. Returns ``(question_type or None, score, error or None, fields)``."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as e:
        return None, None, f"not valid JSON ({e.msg} at column {e.colno})", {}
    except RecursionError:
        return None, None, "not valid JSON here (nested too deeply)", {}
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        return None, None, f"not valid JSON here ({str(e).split(';')[0]})", {}
    if not isinstance(row, dict):
        return None, None, f"expected a JSON object, got {type(row).__name__}", {}
    fields = {k: row.get(k) for k in ("id", "question_type", "prediction", "ground_truth")}
    qtype = row.get("question_type")
    if not isinstance(qtype, str) or qtype not in scoring.TASKS:
        return None, None, f"question_type {qtype!r} is missing or unknown; known types: {list(scoring.TASKS)}", fields
    for key in ("prediction", "ground_truth"):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # A bare JSON number is still a readable answer; score its text form.
            fields[key] = value = str(value)
        if not isinstance(value, str):
            return qtype, 0.0, f"{key} is {'missing' if key not in row else repr(value)}; expected a string", fields
    try:
        return (
            qtype,
            scoring.score_prediction(qtype, fields["prediction"], fields["ground_truth"], rule=rule),
            None,
            fields,
        )
    except ValueError as e:
        return qtype, 0.0, str(e), fields


def score_file(
    path: str | os.PathLike, *, name: Optional[str] = None, rule: str = scoring.DEFAULT_SCORING_RULE
) -> dict[str, Any]:
    """Score a JSONL file of predictions through :mod:`scoring` and build a report.

    Each non-blank line is a JSON object with ``question_type``, ``prediction`` (the raw model text)
    and ``ground_truth``, optionally ``id``. A line that cannot be scored is never skipped
    silently: it is listed under ``malformed.lines`` with its 1-based line number and error. If
    its question type is known it counts as a failure (score 0) of that type; otherwise it belongs
    to no task and is counted only in ``malformed.unknown_type`` (and ``counts["malformed"]``), so it
    does not enter ``overall``, which is the mean over the 8 tasks. Blank lines are ignored.

    Args:
        path: The JSONL file.
        name: Row name in tables (default: the file's stem).
        rule: How numerical predictions are read, one of :data:`scoring.SCORING_RULES`.

    Returns:
        The report dict (``overall``, ``per_type``, ``per_task``, ``counts``, ``table``, ``malformed``,
        ``records``).

    Ids (``id``) seen on more than one line are scored each time, warned about and listed under
    ``duplicate_ids``. The file must be UTF-8 (a byte-order mark is accepted).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        JsonlError: The file is not UTF-8, or no line could be attributed to a question type.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"score file {str(path)!r} does not exist; pass a JSONL of predictions to --score-file")
    scored: list[tuple[str, float]] = []
    records: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    unknown_type = 0
    seen_ids: dict[str, list[int]] = {}
    # Lines split on \n only (a JSON string may hold U+2028, which str.splitlines would cut); each is
    # decoded as UTF-8 by the JSONL reader's rule (a BOM on line 1 dropped; otherwise an error naming the line).
    for lineno, raw_bytes in enumerate(path.read_bytes().split(b"\n"), start=1):
        raw = decode_line(raw_bytes, path, lineno, "save the score file as UTF-8")
        if not raw.strip():
            continue
        qtype, score, error, fields = _score_line(raw, rule)
        if fields.get("id") is not None:
            seen_ids.setdefault(str(fields["id"]), []).append(lineno)
        if error is not None:
            bad.append({"line": lineno, "error": error})
        if qtype is None:
            unknown_type += 1
            continue
        scored.append((qtype, score))
        records.append({"line": lineno, **fields, "question_type": qtype, "score": score, "error": error})
    if not scored:
        raise JsonlError(
            f"no line of {str(path)!r} could be scored ({unknown_type} malformed; first: "
            f"{bad[0] if bad else 'file is empty'}); "
            "each line must be a JSON object with question_type, prediction and ground_truth"
        )
    summary = score_summary(scored)
    counts = dict(summary["counts"])
    if unknown_type:
        counts[MALFORMED_KEY] = unknown_type
    duplicates = {i: ls for i, ls in seen_ids.items() if len(ls) > 1}
    if duplicates:
        first = next(iter(duplicates.items()))
        logger.warning(
            "score file %s: %d id(s) appear more than once and each occurrence is scored (first: id %s on lines %s)",
            path,
            len(duplicates),
            first[0],
            first[1],
        )
    return {
        "name": name or path.stem,
        "mode": "score_file",
        "kind": VSI_KIND,
        "meta": {"score_file": str(path), "scoring_rule": rule},
        **summary,
        "counts": counts,
        "malformed": {
            "count": len(bad),
            "unknown_type": unknown_type,
            "lines": bad,
            "overall_treatment": "lines with a known question_type score 0 in that type; lines with a missing or "
            "unknown question_type belong to no task and are left out of overall (mean of the 8 tasks)",
        },
        "duplicate_ids": {"count": len(duplicates), "lines": duplicates},
        "records": records,
    }


def report_counts(report: dict[str, Any]) -> dict[str, int]:
    """Questions per table column of a report (``table_n``, or from ``counts`` for reports written before it;
    a game report's: episodes per task)."""
    if report_kind(report) == GAME_KIND:
        return {str(k): int(v) for k, v in (report.get("table_n") or report.get("counts") or {}).items()}
    return dict(report.get("table_n") or table_counts(report.get("counts") or {}))

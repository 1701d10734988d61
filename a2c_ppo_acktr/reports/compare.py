"""Comparing reports: side-by-side tables and bars of several runs, and paired question-by-question
differences with bootstrap intervals (the same questions, two agents).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import atomic, scoring, stats
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.reports.figures import plot_task_bars
from a2c_ppo_acktr.reports.files import load_report
from a2c_ppo_acktr.reports.markdown import (
    agent_metrics_markdown,
    ci_table_markdown,
    game_table_markdown,
    game_table_note,
    paired_markdown,
    table_markdown,
)
from a2c_ppo_acktr.reports.records import VSI_KIND, is_game_type, is_success, report_kind, split_kinds
from a2c_ppo_acktr.reports.vsi import score_summary


class CompareError(ValueError, UserError):
    """Reports that cannot be compared as asked (names, pairs, questions); the message says why."""


def compare_reports(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    names: Optional[Sequence[str]] = None,
    paired: Optional[Sequence[tuple[str, str]]] = None,
    best_constant: bool = False,
) -> dict[str, Path]:
    """Side-by-side comparison of several reports: ``compare.md`` and ``compare.png`` in ``out_dir``.

    VSI reports get the benchmark table, the intervals table and the agent metrics; game reports the
    game table (:func:`game_table_markdown`: success rate with its interval, mean return, mean
    episode length, invalid-output and truncation rates), under "## Games" when both kinds are given.
    ``--paired`` rows of game reports compare success rates on the same episodes.

    Args:
        paths: ``report.json`` files (or directories holding one).
        names: Row names (default: each report's ``name``; duplicates get their directory's name).
        paired: ``(A, B)`` row names: for each, ``compare.md`` also gets Overall(A) - Overall(B) on
            their common questions with a paired bootstrap 95% interval (:func:`paired_overall_ci`).
        best_constant: Add the row :data:`BEST_CONSTANT_ROW` (:func:`best_constant_report`) on the first VSI
            report's questions, after the given rows; ``paired`` may name it.

    Raises:
        CompareError: If names repeat or a paired name is not a row, or the two rows were not evaluated on the same
        questions.
    """
    if not paths:
        raise CompareError("compare needs at least one report.json")
    reports = [load_report(p) for p in paths]
    if names is None:
        names = [r.get("name") or Path(p).parent.name for r, p in zip(reports, paths)]
        if len(set(names)) < len(names):
            names = [f"{n} ({Path(p).resolve().parent.name})" for n, p in zip(names, paths)]
        if len(set(names)) < len(names):  # the same directory twice: number the rows
            names = [f"{n} #{k}" for k, n in enumerate(names, 1)]
    elif len(names) != len(reports):
        raise CompareError(f"got {len(names)} names for {len(reports)} reports; give --names one name per report")
    elif len(set(names)) < len(names):
        repeated = sorted({n for n in names if list(names).count(n) > 1})
        raise CompareError(
            f"--names repeats {repeated}: each row needs its own name (rows and --paired refer to them by name)"
        )
    rows = list(zip(names, reports))
    if best_constant:
        first_vsi = next((r for r in reports if report_kind(r) == VSI_KIND), None)
        if first_vsi is None:
            raise CompareError(
                "--best-constant needs a VSI report among the compared ones; game reports have no constant row"
            )
        if BEST_CONSTANT_ROW in names:
            raise CompareError(f"a row is already named {BEST_CONSTANT_ROW!r}; rename it to add the best-constant row")
        rows.append((BEST_CONSTANT_ROW, best_constant_report(first_vsi)))
    by_name = dict(rows)
    differences = []
    for a, b in paired or ():
        unknown = [n for n in (a, b) if n not in by_name]
        if unknown:
            raise CompareError(
                f"--paired names {unknown} are not rows of the comparison; rows: {list(names)} (set them with --names "
                "or --name)"
            )
        differences.append(paired_overall_ci(by_name[a], by_name[b], names=(a, b)))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vsi, games = split_kinds(rows)
    title = (
        "# VSI evaluation: comparison"
        if not games
        else "# Game evaluation: comparison"
        if not vsi
        else "# Evaluation: comparison"
    )
    md = [title, ""]
    if vsi:
        md += [table_markdown(vsi), ""]
        md += ["## Scores with 95% intervals", "", ci_table_markdown(vsi), ""]
    if games:
        md += (["## Games", ""] if vsi else []) + [game_table_markdown(games), "", game_table_note(games), ""]
    if differences:
        md += ["## Paired differences", "", paired_markdown(differences), ""]
    agent = agent_metrics_markdown(rows)
    if agent:
        md += ["## Agent metrics", "", agent, ""]
    missing = [(n, r["tasks_missing"]) for n, r in rows if r.get("tasks_missing")]
    for n, tasks in missing:
        md.append(f"- {n}: no questions for {', '.join(tasks)} (overall over the tasks present)")
    md += ["", "Sources:", ""] + [f"- {n}: {p}" for n, p in zip(names, paths)]
    if best_constant:
        answers = ", ".join(f"{t} {a}" for t, a in rows[-1][1]["meta"]["best_constant"].items())
        md.append(
            f"- {BEST_CONSTANT_ROW}: the one answer per question type that scores best on these questions ({answers})"
        )
    md.append("")
    atomic.write_text(out / "compare.md", "\n".join(md))
    png = plot_task_bars(rows, out / "compare.png")
    return {"md": out / "compare.md", "png": png}


BEST_CONSTANT_ROW = "best constant (hindsight)"


def best_constant_report(report: dict[str, Any], name: str = BEST_CONSTANT_ROW) -> dict[str, Any]:
    """A row that gives each question type's best constant answer (:func:`scoring.best_constant`) to every
    question of ``report``, chosen in hindsight on these very questions: what no policy can beat by
    ignoring the frames and the question's details. Its records keep the questions' ids, so it pairs
    with any row evaluated on the same questions.

    Raises:
        CompareError: ``report`` is a game report or has no per-question records.
    """
    records = report.get("records") or []
    if not records or report_kind(report) != VSI_KIND:
        raise CompareError(
            "a best-constant row needs a VSI report with per-question records (a report.json written by eval_vsi.py)"
        )
    truths: dict[str, list[str]] = {}
    for r in records:
        truths.setdefault(r["question_type"], []).append(str(r["ground_truth"]))
    answers = {t: scoring.best_constant(t, gts)[0] for t, gts in truths.items()}
    rows = []
    for r in records:
        answer = answers[r["question_type"]]
        score = scoring.score_prediction(r["question_type"], answer, str(r["ground_truth"]))
        rows.append(
            {**{k: r.get(k) for k in _QUESTION_FIELDS}, "episode_id": question_key(r), "answer": answer, "score": score}
        )
    return {
        "name": name,
        "mode": "constant",
        "kind": VSI_KIND,
        "meta": {"best_constant": answers, "chosen_on": "the questions of the row it was built from"},
        **score_summary([(r["question_type"], r["score"]) for r in rows]),
        "records": rows,
    }


# What must agree for two records with the same key to be the same question (absent fields read None).
_QUESTION_FIELDS = ("scene_id", "question_type", "question", "options", "ground_truth")


def question_key(record: dict[str, Any]) -> str:
    """The id that names a record's question across reports: ``episode_id`` (episodes) or ``id`` (score files).

    Raises:
        ValueError: If the record has neither (a score-file line without ``id``).
    """
    key = record.get("episode_id", record.get("id"))
    if key is None:
        where = f" (line {record['line']})" if "line" in record else ""
        raise CompareError(
            f'a record{where} has no episode_id or id, so it cannot be paired; give every score-file line an "id"'
        )
    return str(key)


def paired_records(
    a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Records of two reports matched by :func:`question_key`, in ``a``'s order.

    Args:
        a: A report dict (``records`` as written by :func:`build_report` or :func:`score_file`).
        b: Another report of the same questions.
        names: How the two are called in error messages.

    Raises:
        ValueError: If a report has no records or duplicate keys, the key sets differ, or a key names
            a different question in the two reports (e.g. other ``eval.seed`` or ``env.question_types``).
    """
    keyed = []
    for name, report in zip(names, (a, b)):
        records = report.get("records") or []
        if not records:
            raise CompareError(f"{name} has no per-question records to pair; use a report.json written by eval_vsi.py")
        by_key = {question_key(r): r for r in records}
        if len(by_key) < len(records):
            raise CompareError(
                f"{name} holds {len(records) - len(by_key)} duplicate question id(s); each question must appear once "
                "to be paired"
            )
        keyed.append(by_key)
    only_a, only_b = keyed[0].keys() - keyed[1].keys(), keyed[1].keys() - keyed[0].keys()
    if only_a or only_b:
        raise CompareError(
            f"{names[0]} and {names[1]} were not evaluated on the same questions: {len(only_a)} only in {names[0]} "
            f"(e.g. {sorted(only_a)[:3]}), {len(only_b)} only in {names[1]} (e.g. {sorted(only_b)[:3]}); evaluate both "
            "with the same eval.num_episodes, eval.seed and env.question_types (or the same VSI-Bench rows)"
        )
    pairs = []
    for key, ra in keyed[0].items():
        rb = keyed[1][key]
        diff = [f for f in _QUESTION_FIELDS if ra.get(f) != rb.get(f)]
        if diff:
            f = diff[0]
            raise CompareError(
                f"question {key!r} differs between {names[0]} and {names[1]} ({f}: {ra.get(f)!r} vs {rb.get(f)!r}): "
                "the reports "
                "use the same ids for different questions; evaluate both with the same eval.seed, env.question_types "
                "and env settings"
            )
        pairs.append((ra, rb))
    return pairs


def overall_weights(question_types: Sequence[str]) -> np.ndarray:
    """Weights ``w`` with ``100 * sum(w * scores)`` equal to :func:`scoring.aggregate`'s ``overall``.

    ``overall`` is the mean over the tasks present of the mean over a task's types of the mean over
    a type's questions, so a question of type ``t`` in task ``T`` weighs
    ``1 / (num tasks * num types of T present * num questions of t)``.

    With a game task among the types (a game report, whose ``overall`` is the pooled success
    rate) every episode weighs ``1 / n``.

    Args:
        question_types: The type of each question, shape ``(n,)``.

    Returns:
        Weights, shape ``(n,)``, summing to 1.
    """
    if any(is_game_type(t) for t in question_types):
        return np.full(len(question_types), 1.0 / max(len(question_types), 1))
    counts: dict[str, int] = {}
    for t in question_types:
        counts[t] = counts.get(t, 0) + 1
    types_per_task: dict[str, int] = {}
    for t in counts:
        types_per_task[scoring.TASKS[t]] = types_per_task.get(scoring.TASKS[t], 0) + 1
    num_tasks = len(types_per_task)
    return np.array([1.0 / (num_tasks * types_per_task[scoring.TASKS[t]] * counts[t]) for t in question_types])


def paired_overall_ci(
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    names: tuple[str, str] = ("A", "B"),
    n_boot: int = 10000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Overall(a) - Overall(b) in points (x100) on the same questions, with a paired bootstrap interval.

    Overall is task-balanced (:func:`overall_weights`), so each question's score difference is scaled
    by ``n * weight`` and :func:`stats.paired_bootstrap_ci` resamples questions within their type:
    the number of questions per type is fixed by the question set's design, not sampled, and every
    resample's mean is then the Overall difference on that resample (``diff`` is exactly the
    difference of the two reports' Overall). A type with a single question adds no spread
    (``single_question_types`` counts them): evaluate more episodes for an honest interval.

    Game reports (their records' types are game tasks): the difference of success rates (x100, each
    episode won when :func:`is_success`) on the same episodes, paired by episode id, resampled within
    each task; the result then also holds ``"measure": "success"``.

    Args:
        a: Report of system A; ``b`` of system B, on the same questions (:func:`paired_records`).
        names: Row names ``(A, B)``, kept in the result and used in error messages.
        n_boot: Bootstrap resamples; ``seed`` seeds them; ``confidence`` is the interval's coverage.

    Returns:
        ``{"a", "b", "diff", "low", "high", "n", "confidence", "n_boot", "single_question_types"}``
        (``diff``/``low``/``high`` in points).
    """
    pairs = paired_records(a, b, names)
    types = [ra["question_type"] for ra, _ in pairs]
    game = any(is_game_type(t) for t in types)
    weights = len(pairs) * overall_weights(types)
    value = (lambda r: float(is_success(r["score"]))) if game else (lambda r: float(r["score"]))
    score_a = 100.0 * weights * np.array([value(ra) for ra, _ in pairs])
    score_b = 100.0 * weights * np.array([value(rb) for _, rb in pairs])
    ci = stats.paired_bootstrap_ci(score_a, score_b, n_boot=n_boot, seed=seed, confidence=confidence, strata=types)
    single = sum(1 for t in set(types) if types.count(t) == 1)
    out = {
        "a": names[0],
        "b": names[1],
        **ci,
        "confidence": confidence,
        "n_boot": n_boot,
        "single_question_types": single,
    }
    if game:
        out["measure"] = "success"
    return out

"""Markdown of reports: the benchmark's table, the interval table, agent metrics, game tables, a
report's page (``report.md``) and the paired comparison.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional, Sequence

from a2c_ppo_acktr.reports.records import GAME_KIND, SHORT_TASK_NAMES, VSI_KIND, report_kind, split_kinds
from a2c_ppo_acktr.reports.vsi import report_counts


def fmt(value: Optional[float], digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def table_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The benchmark's table: one row per report, Overall first, then the 8 task columns (x100).

    Game reports get the game table instead (:func:`game_table_markdown`); rows of both kinds give
    the VSI table of the VSI rows, a blank line, then the game table of the game rows.

    Args:
        rows: ``(row name, report)`` pairs.
    """
    vsi, games = split_kinds(rows)
    if games:
        return "\n\n".join(([table_markdown(vsi)] if vsi else []) + [game_table_markdown(games)])
    header = ["Method", "Overall", *SHORT_TASK_NAMES.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for name, report in rows:
        cells = [name, fmt(report["overall"])] + [fmt(report["table"].get(c)) for c in SHORT_TASK_NAMES.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ci_cell(value: Optional[float], interval: Optional[Sequence[float]], n: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"- n={n}"
    text = fmt(value)
    if interval is not None and None not in interval:
        text += f" [{interval[0]:.1f}, {interval[1]:.1f}]"
    return f"{text} n={n}"


def ci_table_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Scores (x100) with their bootstrap intervals and question counts, one row per report.

    Cells read ``34.6 [24.1, 45.0] n=12`` (score, ``ci95`` interval, questions); ``- n=0`` for a task
    without questions; a report without ``ci95`` (and no records to compute it) shows no interval.
    A line above the table says how the intervals were computed; one below names the reports with
    single-question types (whose intervals are too narrow).

    Game reports show their game table (:func:`game_table_markdown`, whose success rates carry their
    intervals), after the VSI rows' table when both kinds are given.

    Args:
        rows: ``(row name, report)`` pairs.
    """
    vsi, games = split_kinds(rows)
    if games:
        return "\n\n".join(([ci_table_markdown(vsi)] if vsi else []) + [game_table_markdown(games)])
    ci = next((r["ci95"] for _, r in rows if r.get("ci95")), None)
    if ci is not None:
        intro = (
            f"Score (x100) [{100 * ci['confidence']:g}% percentile bootstrap interval, {ci['n_boot']} resamples of the "
            "questions within each question type] and n, the number of questions."
        )
    else:
        intro = "Score (x100) and n, the number of questions (these reports hold no intervals)."
    header = ["Method", "Overall", *SHORT_TASK_NAMES.values()]
    lines = [intro, "", "| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    single = []
    for name, report in rows:
        n = report_counts(report)
        interval = report.get("ci95") or {}
        cells = [cell(name), _ci_cell(report["overall"], interval.get("overall"), sum(n.values()))]
        cells += [
            _ci_cell(report["table"].get(c), (interval.get("table") or {}).get(c), n[c])
            for c in SHORT_TASK_NAMES.values()
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if interval.get("single_question_types"):
            single.append(f"{name} ({interval['single_question_types']})")
    if single:
        lines += [
            "",
            "**Question types with a single question** (no spread, so the intervals are too narrow): "
            f"{', '.join(single)}; "
            "evaluate more episodes (eval.num_episodes) for honest ones.",
        ]
    return "\n".join(lines)


_AGENT_METRIC_LABELS = {
    "success_rate": "success rate (score >= 0.5)",
    "answer_rate": "answer rate",
    "mean_score": "mean score (per episode)",
    "mean_turns": "mean turns",
    "invalid_output_rate": "invalid-output rate (per turn)",
    "mean_reward": "mean episode reward",
    "num_episodes": "episodes",
}


def agent_metrics_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A table of agent metrics, one row per VSI report that has them ("" when none has).

    Game reports are left out: their game table (:func:`game_table_markdown`) holds their metrics.
    """
    rows = [(n, r) for n, r in rows if "agent" in r and report_kind(r) == VSI_KIND]
    if not rows:
        return ""
    keys = list(_AGENT_METRIC_LABELS)
    lines = [
        "| Method | " + " | ".join(_AGENT_METRIC_LABELS[k] for k in keys) + " |",
        "|---" + "|---:" * len(keys) + "|",
    ]
    for name, r in rows:
        cells = [str(r["agent"][k]) if k == "num_episodes" else fmt(r["agent"][k], 3) for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The game table's header; :func:`game_table_note` says what each column is.
GAME_TABLE_HEADER = (
    "Method",
    "Task",
    "n",
    "Success (%) [95% CI]",
    "Mean return",
    "Mean length (turns)",
    "Invalid outputs (%)",
    "Truncated (%)",
)


def _game_task_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(task, figures)`` of a game report: one per task, then ``all`` when it has several tasks.

    ``figures``: ``n``, ``success`` (x100), ``interval`` ([low, high] or None), ``mean_reward``,
    ``mean_turns``, ``invalid`` and ``truncated`` (x100); None where the report lacks the number.
    """
    metrics = report.get("task_metrics") or {}
    ci = report.get("ci95") or {}
    table = report.get("table") or {}
    counts = report_counts(report)
    tasks = list(table) or list(metrics)
    out = []
    for task in tasks:
        m = metrics.get(task) or {}
        out.append(
            (
                task,
                {
                    "n": counts.get(task, m.get("num_episodes", 0)),
                    "success": table.get(task),
                    "interval": (ci.get("table") or {}).get(task),
                    "mean_reward": m.get("mean_reward"),
                    "mean_turns": m.get("mean_turns"),
                    "invalid": None if m.get("invalid_output_rate") is None else 100.0 * m["invalid_output_rate"],
                    "truncated": None if m.get("truncation_rate") is None else 100.0 * m["truncation_rate"],
                },
            )
        )
    if len(tasks) > 1:
        agent = report.get("agent") or {}
        n_all = sum(f["n"] for _, f in out)
        truncated = None
        if n_all and all(f["truncated"] is not None for _, f in out):
            truncated = sum(f["truncated"] * f["n"] for _, f in out) / n_all
        out.append(
            (
                "all",
                {
                    "n": n_all,
                    "success": report.get("overall"),
                    "interval": ci.get("overall"),
                    "mean_reward": agent.get("mean_reward"),
                    "mean_turns": agent.get("mean_turns"),
                    "invalid": None
                    if agent.get("invalid_output_rate") is None
                    else 100.0 * agent["invalid_output_rate"],
                    "truncated": truncated,
                },
            )
        )
    return out


def game_table_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The game table: one line per report and task (plus an ``all`` line for a report of several tasks).

    Columns (:data:`GAME_TABLE_HEADER`): method, task, episodes, success rate x100 with its 95% Wilson
    interval (``70.0 [39.7, 89.2]``), mean return, mean episode length in turns, invalid-output rate
    (invalid turns / all turns, x100) and truncation rate (episodes that hit the turn limit, x100).
    ``-`` for a number the report lacks.

    Args:
        rows: ``(row name, game report)`` pairs.
    """
    header = list(GAME_TABLE_HEADER)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|"]
    for name, report in rows:
        for task, f in _game_task_rows(report):
            success = fmt(f["success"])
            iv = f["interval"]
            if success != "-" and iv is not None and None not in iv:
                success += f" [{iv[0]:.1f}, {iv[1]:.1f}]"
            cells = [
                cell(name),
                cell(task),
                str(f["n"]),
                success,
                fmt(f["mean_reward"], 2),
                fmt(f["mean_turns"], 2),
                fmt(f["invalid"]),
                fmt(f["truncated"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def game_table_note(rows: Sequence[tuple[str, dict[str, Any]]] = ()) -> str:
    """The line under a game table that says what its columns are."""
    ci = next((r["ci95"] for _, r in rows if r.get("ci95")), None)
    level = f"{100 * ci['confidence']:g}%" if ci and "confidence" in ci else "95%"
    return (
        f"Success: episodes won or solved / episodes (x100), with its {level} Wilson score interval. "
        "Mean return: the episode's summed rewards, averaged over episodes. Mean length: turns per episode. "
        "Invalid outputs: turns whose text did not parse as an action / all turns (x100). "
        "Truncated: episodes that hit the turn limit (x100)."
    )


def game_report_markdown(report: dict[str, Any]) -> str:
    """``report.md`` of a game report: the game table, the most frequent invalid outputs, the setup."""
    rows = [(report["name"], report)]
    out = [f"# Game evaluation: {report['name']}", "", game_table_markdown(rows), "", game_table_note(rows), ""]
    skipped = report.get("meta", {}).get("num_skipped")
    if skipped:
        out += [f"**{skipped} episode(s) skipped**; see `meta.skipped` in report.json.", ""]
    out += _invalid_markdown(report)
    if report.get("meta"):
        out += ["## Setup", "", "```json", json.dumps(report["meta"], indent=2, default=str), "```", ""]
    return "\n".join(out)


def _invalid_markdown(report: dict[str, Any]) -> list[str]:
    invalid = invalid_summary(report.get("records", []))
    if not invalid:
        return []
    out = ["## Most frequent invalid outputs", "", "| turns | reason | example output |", "|---:|---|---|"]
    out += [f"| {n} | {cell(reason)} | `{cell(example[:120])}` |" for reason, n, example in invalid]
    out.append("")
    return out


def report_markdown(report: dict[str, Any]) -> str:
    """``report.md``: the benchmark table, per-type scores, agent metrics and warnings
    (a game report's: :func:`game_report_markdown`)."""
    if report_kind(report) == GAME_KIND:
        return game_report_markdown(report)
    out = [f"# VSI evaluation: {report['name']}", "", table_markdown([(report["name"], report)]), ""]
    out += ["## Scores with 95% intervals", "", ci_table_markdown([(report["name"], report)]), ""]
    if report.get("tasks_missing"):
        out += [
            f"**Tasks without questions:** {', '.join(report['tasks_missing'])}. Overall is the mean over the "
            f"{len(report['tasks_present'])} tasks present and is not comparable with 8-task numbers.",
            "",
        ]
    skipped = report.get("meta", {}).get("num_skipped")
    if skipped:
        out += [
            f"**{skipped} question(s) skipped** (scene not available locally); see `meta.skipped` in report.json.",
            "",
        ]
    out += ["## Per question type", "", "| question_type | n | score (x100) |", "|---|---:|---:|"]
    for qtype, mean in report["per_type"].items():
        out.append(f"| {qtype} | {report['counts'][qtype]} | {fmt(100.0 * mean)} |")
    out.append("")
    agent = agent_metrics_markdown([(report["name"], report)])
    if agent:
        out += ["## Agent metrics", "", agent, ""]
    out += _invalid_markdown(report)
    mal = report.get("malformed")
    if mal and mal["count"]:
        out += [
            "## Malformed lines",
            "",
            f"{mal['count']} line(s) could not be scored ({mal['overall_treatment']}):",
            "",
        ]
        out += [f"- line {b['line']}: {b['error']}" for b in mal["lines"][:50]]
        if mal["count"] > 50:
            out.append(f"- ... and {mal['count'] - 50} more (see report.json)")
        out.append("")
    if report.get("meta"):
        out += ["## Setup", "", "```json", json.dumps(report["meta"], indent=2, default=str), "```", ""]
    return "\n".join(out)


def invalid_summary(records: Sequence[dict[str, Any]], top: int = 5) -> list[tuple[str, int, str]]:
    """The ``top`` most frequent reasons of invalid turns: ``(reason, count, one raw output)``."""
    counts: dict[str, list] = {}
    for rec in records:
        for step in rec.get("steps", ()):
            if not step.get("valid", True):
                reason = step["action"].removeprefix("invalid(").removesuffix(")")
                entry = counts.setdefault(reason, [0, step["text"]])
                entry[0] += 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1][0])[:top]
    return [(reason, n, example) for reason, (n, example) in ranked]


def cell(text: str) -> str:
    """Text safe inside a markdown table cell (one line, no pipes or backticks)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("`", "'")


def paired_markdown(differences: Sequence[dict[str, Any]]) -> str:
    """A table of :func:`paired_overall_ci` results, with a line saying how they were computed (one
    table for VSI differences, one for game success-rate differences)."""
    vsi = [d for d in differences if d.get("measure") != "success"]
    games = [d for d in differences if d.get("measure") == "success"]
    if games:
        return "\n\n".join(([paired_markdown(vsi)] if vsi else []) + [_paired_game_markdown(games)])
    first = differences[0]
    level = f"{100 * first['confidence']:g}%"
    lines = [
        f"Overall (x100) of A minus B on the same questions, paired by question id, with a {level} percentile "
        f"bootstrap interval ({first['n_boot']} resamples of the questions within each question type). An interval "
        "that excludes 0 is a difference this question set resolves.",
        "",
        f"| A - B | questions | Overall diff | {level} CI |",
        "|---|---:|---:|---|",
    ]
    for d in differences:
        lines.append(
            f"| {cell(d['a'])} - {cell(d['b'])} | {d['n']} | {d['diff']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] |"
        )
    single = max(d["single_question_types"] for d in differences)
    if single:
        lines += [
            "",
            f"**{single} question type(s) have a single question**: they add no spread, so the interval is too "
            "narrow; evaluate more episodes (eval.num_episodes) for an honest one.",
        ]
    return "\n".join(lines)


def _paired_game_markdown(differences: Sequence[dict[str, Any]]) -> str:
    """:func:`paired_markdown`'s table of game success-rate differences."""
    first = differences[0]
    level = f"{100 * first['confidence']:g}%"
    lines = [
        f"Success rate (%) of A minus B on the same episodes, paired by episode id, with a {level} percentile "
        f"bootstrap interval ({first['n_boot']} resamples of the episodes within each task). An interval that "
        "excludes 0 is a difference these episodes resolve.",
        "",
        f"| A - B | episodes | Success diff | {level} CI |",
        "|---|---:|---:|---|",
    ]
    for d in differences:
        lines.append(
            f"| {cell(d['a'])} - {cell(d['b'])} | {d['n']} | {d['diff']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] |"
        )
    return "\n".join(lines)

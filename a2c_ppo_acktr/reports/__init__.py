"""Evaluation reports: ``report.json``, ``report.md``, comparison tables, plots and trajectory pictures.

Every VSI number here comes from :mod:`a2c_ppo_acktr.common.scoring` (the one scorer the env reward also
uses); this module only arranges records into the benchmark's table and draws them. Reports come in
two kinds (``kind``): ``"vsi"`` (VSI-Bench questions, below) and ``"game"`` (episodes of a game env:
gym-cards, MiniGrid, Sokoban; see "Game reports" below). A record whose ``question_type`` is not a
VSI-Bench type (:data:`scoring.TASKS`) is a game episode, its ``question_type`` the game's task name.

Report layout (``report.json``) of a VSI report (``kind`` ``"vsi"``; a report without ``kind``,
written before games existed, is one):

* ``name``, ``mode`` (``"episodes"`` or ``"score_file"``), ``kind``, ``meta`` (what was evaluated and how);
* the benchmark aggregation from :func:`scoring.aggregate`: ``overall`` (x100), ``per_type`` and
  ``per_task`` (in [0, 1]), ``counts``, ``tasks_present``, ``tasks_missing``; plus ``table``: the
  8 task columns in the benchmark's order, x100, ``null`` for a task with no questions; ``table_n``:
  the number of questions of each column (0 for a task with none);
* ``ci95``: bootstrap 95% intervals of ``overall`` and of each ``table`` column (:func:`score_intervals`:
  ``overall`` and ``table`` as ``[low, high]`` in points, ``null`` for a task without questions, plus
  ``confidence``, ``n_boot``, ``seed``, ``scheme``, ``single_question_types``). Reports written before
  it existed get it computed from their ``records`` when loaded (:func:`load_report`);
* ``agent`` (episode mode): the agent metrics of :func:`agent_metrics`;
* ``malformed`` (score-file mode): lines that could not be scored, with their line numbers;
* ``records``: one entry per episode (or per scored line). ``episode_id`` (score files: ``id``) names
  the question, so two reports of the same question set can be compared question by question
  (:func:`paired_overall_ci`).

Game reports (``kind`` ``"game"``, :func:`build_game_report`; episode mode only) keep the same keys
with game meanings, so the comparison tooling that reads ``overall``/``table``/``ci95`` works on them:

* ``overall``: 100 x the success rate over all episodes (pooled: episodes won or solved / episodes,
  a win being ``score >= SUCCESS_THRESHOLD``, i.e. score 1; equal to ``100 * agent["success_rate"]``);
* ``per_type`` = ``per_task`` (task -> success rate in [0, 1]), ``counts`` (task -> episodes),
  ``tasks_present`` (the tasks, :data:`GAME_TASKS` order first), ``tasks_missing`` (always ``[]``);
* ``table``: task -> success x100; ``table_n``: task -> episodes;
* ``ci95``: Wilson score intervals of the success rates in points (:func:`game_intervals`):
  ``overall`` and ``table`` as ``[low, high]``, plus ``confidence`` and ``scheme``;
* ``agent``: :func:`agent_metrics` of all episodes (``answer_rate`` is 0 for games: they end without
  an answer); ``task_metrics``: task -> :func:`game_metrics` (success rate, mean return, mean episode
  length, invalid-output rate, truncation rate, episodes);
* ``records``: as for VSI (``answer``/``options`` null, ``ground_truth`` ``""``, turn ``pose`` null).

The package's modules, each importable on its own (``from a2c_ppo_acktr.reports.records import
sample_table`` loads neither matplotlib nor PIL); this facade names them all and imports a module on
first use of one of its names:

* :mod:`~a2c_ppo_acktr.reports.records`: episode and turn records, shared definitions, agent metrics;
* :mod:`~a2c_ppo_acktr.reports.vsi`: VSI-Bench reports from episodes or a score file;
* :mod:`~a2c_ppo_acktr.reports.games`: game reports;
* :mod:`~a2c_ppo_acktr.reports.markdown`: tables and ``report.md``;
* :mod:`~a2c_ppo_acktr.reports.figures`: task bars and learning curves (matplotlib, Agg canvas);
* :mod:`~a2c_ppo_acktr.reports.pictures`: trajectory pictures (PIL);
* :mod:`~a2c_ppo_acktr.reports.files`: ``report.json`` / ``report.md`` / ``tasks.png`` on disk;
* :mod:`~a2c_ppo_acktr.reports.compare`: comparisons of reports, paired intervals.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "compare": (
        "compare_reports",
        "question_key",
        "paired_records",
        "overall_weights",
        "paired_overall_ci",
        "best_constant_report",
        "BEST_CONSTANT_ROW",
    ),
    "figures": (
        "task_bars_figure",
        "plot_task_bars",
        "curve_keys",
        "ema_smooth",
        "learning_curves_figure",
        "plot_learning_curves",
    ),
    "files": (
        "write_json",
        "write_report",
        "load_report",
    ),
    "games": (
        "wilson_interval",
        "game_metrics",
        "game_intervals",
        "build_game_report",
    ),
    "markdown": (
        "fmt",
        "table_markdown",
        "ci_table_markdown",
        "agent_metrics_markdown",
        "GAME_TABLE_HEADER",
        "game_table_markdown",
        "game_table_note",
        "game_report_markdown",
        "report_markdown",
        "invalid_summary",
        "cell",
        "paired_markdown",
    ),
    "pictures": (
        "PictureLayout",
        "turn_caption",
        "picture_header",
        "trajectory_picture",
    ),
    "records": (
        "SHORT_TASK_NAMES",
        "SUCCESS_THRESHOLD",
        "GAME_TASKS",
        "VSI_KIND",
        "GAME_KIND",
        "MALFORMED_KEY",
        "CI_RESAMPLES",
        "CI_SEED",
        "CI_CONFIDENCE",
        "TurnRecord",
        "EpisodeRecord",
        "agent_metrics",
        "is_game_type",
        "report_kind",
        "game_task_order",
        "is_success",
        "split_kinds",
        "is_number",
        "SAMPLE_COLUMNS",
        "sample_table",
    ),
    "vsi": (
        "task_table",
        "table_counts",
        "score_intervals",
        "build_report",
        "score_file",
        "report_counts",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""Evaluation reports: ``report.json``, ``report.md``, comparison tables, plots and trajectory pictures.

Every VSI number here comes from :mod:`a2c_ppo_acktr.scoring` (the one scorer the env reward also
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

Plots use matplotlib's object-oriented API on the Agg canvas (no pyplot, no global backend switch),
so they work headless and leave the caller's matplotlib state alone.
"""
from __future__ import annotations

import json
import logging
import math
import os
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr import scoring, stats
from a2c_ppo_acktr.jsonl import JsonlError, decode_line
from a2c_ppo_acktr.logger import read_metrics

logger = logging.getLogger(__name__)

# Short column labels of the benchmark's table, keyed by scoring's task names, in table order.
SHORT_TASK_NAMES: dict[str, str] = {
    "Object Count": "Obj. Count",
    "Absolute Distance": "Abs. Dist.",
    "Object Size": "Obj. Size",
    "Room Size": "Room Size",
    "Relative Distance": "Rel. Dist.",
    "Relative Direction": "Rel. Dir.",
    "Route Plan": "Route Plan",
    "Appearance Order": "Appr. Order",
}

# An episode "succeeds" when its benchmark score is at least this: for multiple choice that is a
# correct letter; for MRA it means the relative error passed at least 5 of the 10 thresholds
# (error <= 0.25). A reporting convention, documented in docs/EVAL.md, not a training signal.
SUCCESS_THRESHOLD = 0.5

# Task names of the game envs (the ``question_type`` of their records), in the order reports list
# them; a task not named here follows them, in the order of first appearance.
GAME_TASKS: tuple[str, ...] = ("numberline", "ezpoints", "points24", "blackjack", "minigrid", "sokoban")

# ``report["kind"]`` values.
VSI_KIND = "vsi"
GAME_KIND = "game"

# Score-file lines whose question type is unknown belong to no task; they are counted here.
MALFORMED_KEY = "malformed"

# A report's intervals (``ci95``): resamples and seed are fixed, as :func:`paired_overall_ci`'s
# defaults, so the intervals follow from the records alone and a report loaded later recomputes
# the very same numbers.
CI_RESAMPLES = 10000
CI_SEED = 0
CI_CONFIDENCE = 0.95


# ----------------------------------------------------------------------------------------- records
@dataclass
class TurnRecord:
    """One turn of an episode, as the report keeps it.

    Attributes:
        turn: 1-based turn number.
        text: The agent's raw output text.
        thoughts: The thoughts the agent wrote ("" when none could be read).
        action: A short description of the parsed action (``move(rot=30, fwd=1.0)``, ``answer(B)``,
            ``invalid(reason)``).
        valid: Whether the text parsed as a legal action.
        reward: The env's reward for this turn.
        pose: The agent's pose ``(x, y, yaw_deg)`` after the turn; ``None`` where the env has no
            pose (the game envs).
    """

    turn: int
    text: str
    thoughts: str
    action: str
    valid: bool
    reward: float
    pose: Optional[tuple[float, float, float]] = None


@dataclass
class EpisodeRecord:
    """Everything a report keeps about one evaluated episode.

    Attributes:
        episode_id: Stable id (``proc-<index>`` or ``vsibench-<row id>``).
        scene_id: The scene's id; ``dataset`` its source (``procedural``, ``scannet``, ...).
        question_type: Raw VSI-Bench type; ``question``, ``options``, ``ground_truth`` as asked. For a
            game episode, the game's task name (:data:`GAME_TASKS`; any type not in
            :data:`scoring.TASKS` is one), with ``options`` None and ``ground_truth`` ``""``.
        answer: The final answer text, or ``None`` when the episode ended without one (truncated;
            always for games).
        score: Benchmark score of the answer in [0, 1] (0 without an answer); for a game, 1.0 if the
            episode was won or solved, else 0.0.
        turns: Turns taken; ``num_invalid`` of them did not parse as an action.
        reward: Sum of the env's rewards (score plus shaping; for a game, the episode return).
        truncated: Whether the episode hit the turn limit without an answer (games: without ending).
        object_ids: Objects the question is about (highlighted in trajectory pictures).
        steps: Per-turn records.
    """

    episode_id: str
    scene_id: str
    dataset: str
    question_type: str
    question: str
    options: Optional[list[str]]
    ground_truth: str
    answer: Optional[str] = None
    score: float = 0.0
    turns: int = 0
    num_invalid: int = 0
    reward: float = 0.0
    truncated: bool = False
    object_ids: list[int] = field(default_factory=list)
    steps: list[TurnRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``records`` entries of ``report.json``)."""
        d = asdict(self)
        d["actions"] = [s["action"] for s in d["steps"]]
        return d


# ----------------------------------------------------------------------------------------- metrics
def agent_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Agent-level metrics over episodes (definitions in docs/EVAL.md).

    Args:
        records: Evaluated episodes.

    Returns:
        ``success_rate`` (fraction with score >= :data:`SUCCESS_THRESHOLD`), ``answer_rate``
        (fraction that ended with an answer), ``mean_score`` (plain mean over episodes, in [0, 1],
        not the benchmark's task-balanced overall), ``mean_turns``, ``invalid_output_rate``
        (invalid turns / all turns), ``mean_reward`` (mean episode return) and ``num_episodes``.

    Raises:
        ValueError: If ``records`` is empty.
    """
    if not records:
        raise ValueError("agent_metrics needs at least one episode record; evaluate with eval.num_episodes >= 1")
    n = len(records)
    total_turns = sum(r.turns for r in records)
    return {
        "num_episodes": n,
        "success_rate": sum(r.score >= SUCCESS_THRESHOLD for r in records) / n,
        "answer_rate": sum(r.answer is not None for r in records) / n,
        "mean_score": float(np.mean([r.score for r in records])),
        "mean_turns": total_turns / n,
        "invalid_output_rate": (sum(r.num_invalid for r in records) / total_turns) if total_turns else 0.0,
        "mean_reward": float(np.mean([r.reward for r in records])),
    }


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
            SHORT_TASK_NAMES[task]: (list(stats.percentile_interval(task_samples[task], confidence)) if task in task_samples else None)
            for task in scoring.TASK_NAMES
        },
        "single_question_types": sum(1 for c in counts.values() if c == 1),
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
    scored = [(r.question_type, r.score) for r in records]
    agg = scoring.aggregate(scored)
    return {
        "name": name,
        "mode": "episodes",
        "kind": VSI_KIND,
        "meta": dict(meta or {}),
        **agg,
        "table": task_table(agg),
        "table_n": table_counts(agg["counts"]),
        "ci95": score_intervals(scored),
        "agent": agent,
        "records": [r.to_dict() for r in records],
    }


# ------------------------------------------------------------------------------------------ games
def is_game_type(question_type: Any) -> bool:
    """Whether a record's ``question_type`` names a game task (anything not a VSI-Bench type)."""
    return question_type not in scoring.TASKS


def report_kind(report: dict[str, Any]) -> str:
    """``"game"`` for a game report, else ``"vsi"`` (also for reports written before ``kind`` existed)."""
    return GAME_KIND if report.get("kind") == GAME_KIND else VSI_KIND


def game_task_order(tasks: Sequence[str]) -> list[str]:
    """Distinct task names: those of :data:`GAME_TASKS` in its order, then the others as first seen."""
    seen = list(dict.fromkeys(str(t) for t in tasks))
    return [t for t in GAME_TASKS if t in seen] + [t for t in seen if t not in GAME_TASKS]


def is_success(score: float) -> bool:
    """Whether an episode counts as won/solved: ``score >= SUCCESS_THRESHOLD`` (a game's score is 1 or 0)."""
    return float(score) >= SUCCESS_THRESHOLD


def wilson_interval(successes: int, n: int, confidence: float = CI_CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927), as fractions in [0, 1].

    ``(p + z^2/(2n) -+ z * sqrt(p(1-p)/n + z^2/(4n^2))) / (1 + z^2/n)`` with ``p = successes / n``
    and ``z`` the normal ``(1 + confidence) / 2`` quantile (1.95996 for 95%). Unlike a bootstrap of
    0/1 outcomes it is not empty when every episode is won (or lost): 10 of 10 gives [0.722, 1].

    Raises:
        ValueError: If ``n < 1``, ``successes`` is outside ``[0, n]``, or ``confidence`` outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1), e.g. 0.95 for a 95% interval")
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1 (got {successes} of {n})")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def game_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """What a game report shows per task (definitions in docs/EVAL.md).

    Returns:
        ``num_episodes``; ``success_rate`` (episodes won or solved, :func:`is_success`, / episodes);
        ``mean_reward`` (mean episode return); ``mean_turns`` (mean episode length in turns);
        ``invalid_output_rate`` (invalid turns / all turns, 0 without turns); ``truncation_rate``
        (episodes that hit the turn limit / episodes).

    Raises:
        ValueError: If ``records`` is empty.
    """
    agent = agent_metrics(records)  # success is is_success(score): the same threshold
    keys = ("num_episodes", "success_rate", "mean_reward", "mean_turns", "invalid_output_rate")
    return {**{k: agent[k] for k in keys}, "truncation_rate": sum(bool(r.truncated) for r in records) / len(records)}


def game_intervals(outcomes: Sequence[tuple[str, bool]], *, confidence: float = CI_CONFIDENCE) -> dict[str, Any]:
    """Wilson score intervals (:func:`wilson_interval`) of a game report's success rates, in points (x100).

    Args:
        outcomes: ``(task, won)`` of every episode.

    Returns:
        ``{"confidence", "scheme", "overall": [low, high], "table": {task: [low, high]}}``: ``overall``
        over all episodes pooled (as the report's ``overall``), ``table`` per task.

    Raises:
        ValueError: If ``outcomes`` is empty.
    """
    outcomes = [(str(t), bool(w)) for t, w in outcomes]
    if not outcomes:
        raise ValueError("game_intervals needs at least one (task, won) pair")

    def points(wins: int, n: int) -> list[float]:
        low, high = wilson_interval(wins, n, confidence)
        return [100.0 * low, 100.0 * high]

    table = {}
    for task in game_task_order([t for t, _ in outcomes]):
        won = [w for t, w in outcomes if t == task]
        table[task] = points(sum(won), len(won))
    return {
        "confidence": confidence,
        "scheme": "Wilson score interval of the success rate (binomial), per task and over all episodes",
        "overall": points(sum(w for _, w in outcomes), len(outcomes)),
        "table": table,
    }


def build_game_report(
    records: Sequence[EpisodeRecord], *, name: str, meta: Optional[dict[str, Any]] = None
) -> dict[str, Any]:
    """The report of game episodes (``kind`` ``"game"``; layout in the module docstring).

    Every ``question_type`` is a task, VSI-Bench types included if mixed in (then their success is
    ``score >= SUCCESS_THRESHOLD``, and a warning says the report mixes them). ``overall`` is the
    success rate of all episodes pooled, x100; ``table`` the success rate of each task, x100.

    Args:
        records: Evaluated episodes (at least one); ``score`` 1 for a won/solved episode, else 0.
        name: Row name in tables.
        meta: What was evaluated and how, stored as is.

    Raises:
        ValueError: If ``records`` is empty or a score is outside [0, 1].
    """
    agent = agent_metrics(records)
    for r in records:
        if not 0.0 <= float(r.score) <= 1.0:
            raise ValueError(f"score {r.score!r} of episode {r.episode_id} ({r.question_type}) is outside [0, 1]; "
                             "a game episode scores 1.0 when won or solved, else 0.0")
    tasks = game_task_order([r.question_type for r in records])
    vsi = [t for t in tasks if not is_game_type(t)]
    if vsi:
        logger.warning("report %s mixes VSI-Bench question types %s with game tasks; each type is reported as a task "
                       "by its success rate (score >= %s)", name, vsi, SUCCESS_THRESHOLD)
    by_task = {t: [r for r in records if str(r.question_type) == t] for t in tasks}
    task_metrics = {t: game_metrics(rs) for t, rs in by_task.items()}
    per_task = {t: m["success_rate"] for t, m in task_metrics.items()}
    return {
        "name": name,
        "mode": "episodes",
        "kind": GAME_KIND,
        "meta": dict(meta or {}),
        "per_type": dict(per_task),
        "per_task": per_task,
        "overall": 100.0 * agent["success_rate"],
        "counts": {t: len(rs) for t, rs in by_task.items()},
        "tasks_present": list(tasks),
        "tasks_missing": [],
        "table": {t: 100.0 * v for t, v in per_task.items()},
        "table_n": {t: len(rs) for t, rs in by_task.items()},
        "ci95": game_intervals([(r.question_type, is_success(r.score)) for r in records]),
        "agent": agent,
        "task_metrics": task_metrics,
        "records": [r.to_dict() for r in records],
    }


# -------------------------------------------------------------------------------- score-file mode
def _score_line(raw: str, rule: str = scoring.DEFAULT_SCORING_RULE) -> tuple[Optional[str], Optional[float], Optional[str], dict[str, Any]]:
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
        return qtype, scoring.score_prediction(qtype, fields["prediction"], fields["ground_truth"], rule=rule), None, fields
    except ValueError as e:
        return qtype, 0.0, str(e), fields


def score_file(path: str | os.PathLike, *, name: Optional[str] = None, rule: str = scoring.DEFAULT_SCORING_RULE) -> dict[str, Any]:
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
            f"no line of {str(path)!r} could be scored ({unknown_type} malformed; first: {bad[0] if bad else 'file is empty'}); "
            "each line must be a JSON object with question_type, prediction and ground_truth"
        )
    agg = scoring.aggregate(scored)
    counts = dict(agg["counts"])
    if unknown_type:
        counts[MALFORMED_KEY] = unknown_type
    duplicates = {i: ls for i, ls in seen_ids.items() if len(ls) > 1}
    if duplicates:
        first = next(iter(duplicates.items()))
        logger.warning("score file %s: %d id(s) appear more than once and each occurrence is scored (first: id %s on lines %s)",
                       path, len(duplicates), first[0], first[1])
    return {
        "name": name or path.stem,
        "mode": "score_file",
        "kind": VSI_KIND,
        "meta": {"score_file": str(path), "scoring_rule": rule},
        **agg,
        "counts": counts,
        "table": task_table(agg),
        "table_n": table_counts(agg["counts"]),
        "ci95": score_intervals(scored),
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


# ------------------------------------------------------------------------------------- markdown
def _fmt(value: Optional[float], digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _split_kinds(rows: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list, list]:
    """``(VSI rows, game rows)`` of ``(name, report)`` pairs, each in the given order."""
    vsi = [(n, r) for n, r in rows if report_kind(r) == VSI_KIND]
    games = [(n, r) for n, r in rows if report_kind(r) == GAME_KIND]
    return vsi, games


def table_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The benchmark's table: one row per report, Overall first, then the 8 task columns (x100).

    Game reports get the game table instead (:func:`game_table_markdown`); rows of both kinds give
    the VSI table of the VSI rows, a blank line, then the game table of the game rows.

    Args:
        rows: ``(row name, report)`` pairs.
    """
    vsi, games = _split_kinds(rows)
    if games:
        return "\n\n".join(([table_markdown(vsi)] if vsi else []) + [game_table_markdown(games)])
    header = ["Method", "Overall", *SHORT_TASK_NAMES.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for name, report in rows:
        cells = [name, _fmt(report["overall"])] + [_fmt(report["table"].get(c)) for c in SHORT_TASK_NAMES.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_counts(report: dict[str, Any]) -> dict[str, int]:
    """Questions per table column of a report (``table_n``, or from ``counts`` for reports written before it;
    a game report's: episodes per task)."""
    if report_kind(report) == GAME_KIND:
        return {str(k): int(v) for k, v in (report.get("table_n") or report.get("counts") or {}).items()}
    return dict(report.get("table_n") or table_counts(report.get("counts") or {}))


def _ci_cell(value: Optional[float], interval: Optional[Sequence[float]], n: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"- n={n}"
    text = _fmt(value)
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
    vsi, games = _split_kinds(rows)
    if games:
        return "\n\n".join(([ci_table_markdown(vsi)] if vsi else []) + [game_table_markdown(games)])
    ci = next((r["ci95"] for _, r in rows if r.get("ci95")), None)
    if ci is not None:
        intro = (f"Score (x100) [{100 * ci['confidence']:g}% percentile bootstrap interval, {ci['n_boot']} resamples of the "
                 "questions within each question type] and n, the number of questions.")
    else:
        intro = "Score (x100) and n, the number of questions (these reports hold no intervals)."
    header = ["Method", "Overall", *SHORT_TASK_NAMES.values()]
    lines = [intro, "", "| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    single = []
    for name, report in rows:
        n = report_counts(report)
        interval = report.get("ci95") or {}
        cells = [_cell(name), _ci_cell(report["overall"], interval.get("overall"), sum(n.values()))]
        cells += [_ci_cell(report["table"].get(c), (interval.get("table") or {}).get(c), n[c]) for c in SHORT_TASK_NAMES.values()]
        lines.append("| " + " | ".join(cells) + " |")
        if interval.get("single_question_types"):
            single.append(f"{name} ({interval['single_question_types']})")
    if single:
        lines += ["", f"**Question types with a single question** (no spread, so the intervals are too narrow): {', '.join(single)}; "
                  "evaluate more episodes (eval.num_episodes) for honest ones."]
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
    lines = ["| Method | " + " | ".join(_AGENT_METRIC_LABELS[k] for k in keys) + " |", "|---" + "|---:" * len(keys) + "|"]
    for name, r in rows:
        cells = [str(r["agent"][k]) if k == "num_episodes" else _fmt(r["agent"][k], 3) for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The game table's header; :func:`game_table_note` says what each column is.
GAME_TABLE_HEADER = ("Method", "Task", "n", "Success (%) [95% CI]", "Mean return", "Mean length (turns)",
                     "Invalid outputs (%)", "Truncated (%)")


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
        out.append((task, {
            "n": counts.get(task, m.get("num_episodes", 0)),
            "success": table.get(task),
            "interval": (ci.get("table") or {}).get(task),
            "mean_reward": m.get("mean_reward"),
            "mean_turns": m.get("mean_turns"),
            "invalid": None if m.get("invalid_output_rate") is None else 100.0 * m["invalid_output_rate"],
            "truncated": None if m.get("truncation_rate") is None else 100.0 * m["truncation_rate"],
        }))
    if len(tasks) > 1:
        agent = report.get("agent") or {}
        n_all = sum(f["n"] for _, f in out)
        truncated = None
        if n_all and all(f["truncated"] is not None for _, f in out):
            truncated = sum(f["truncated"] * f["n"] for _, f in out) / n_all
        out.append(("all", {
            "n": n_all,
            "success": report.get("overall"),
            "interval": ci.get("overall"),
            "mean_reward": agent.get("mean_reward"),
            "mean_turns": agent.get("mean_turns"),
            "invalid": None if agent.get("invalid_output_rate") is None else 100.0 * agent["invalid_output_rate"],
            "truncated": truncated,
        }))
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
            success = _fmt(f["success"])
            iv = f["interval"]
            if success != "-" and iv is not None and None not in iv:
                success += f" [{iv[0]:.1f}, {iv[1]:.1f}]"
            cells = [_cell(name), _cell(task), str(f["n"]), success, _fmt(f["mean_reward"], 2), _fmt(f["mean_turns"], 2),
                     _fmt(f["invalid"]), _fmt(f["truncated"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def game_table_note(rows: Sequence[tuple[str, dict[str, Any]]] = ()) -> str:
    """The line under a game table that says what its columns are."""
    ci = next((r["ci95"] for _, r in rows if r.get("ci95")), None)
    level = f"{100 * ci['confidence']:g}%" if ci and "confidence" in ci else "95%"
    return (f"Success: episodes won or solved / episodes (x100), with its {level} Wilson score interval. "
            "Mean return: the episode's summed rewards, averaged over episodes. Mean length: turns per episode. "
            "Invalid outputs: turns whose text did not parse as an action / all turns (x100). "
            "Truncated: episodes that hit the turn limit (x100).")


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
    out += [f"| {n} | {_cell(reason)} | `{_cell(example[:120])}` |" for reason, n, example in invalid]
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
        out += [f"**{skipped} question(s) skipped** (scene not available locally); see `meta.skipped` in report.json.", ""]
    out += ["## Per question type", "", "| question_type | n | score (x100) |", "|---|---:|---:|"]
    for qtype, mean in report["per_type"].items():
        out.append(f"| {qtype} | {report['counts'][qtype]} | {_fmt(100.0 * mean)} |")
    out.append("")
    agent = agent_metrics_markdown([(report["name"], report)])
    if agent:
        out += ["## Agent metrics", "", agent, ""]
    out += _invalid_markdown(report)
    mal = report.get("malformed")
    if mal and mal["count"]:
        out += ["## Malformed lines", "", f"{mal['count']} line(s) could not be scored ({mal['overall_treatment']}):", ""]
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


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (one line, no pipes or backticks)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("`", "'")


# ----------------------------------------------------------------------------------------- plots
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
                ax.errorbar([xi], [v], yerr=[[max(v - iv[0], 0.0)], [max(iv[1] - v, 0.0)]], fmt="none", ecolor="black",
                            elinewidth=0.8, capsize=min(3.0, 60.0 * width), zorder=3)
                top = max(v, iv[1])
            if v == 0.0:
                # A zero-height bar is invisible: a stroke at the baseline shows the bar is there.
                ax.plot([xi - width / 2, xi + width / 2], [0.0, 0.0], color=colour, linewidth=3, solid_capstyle="butt",
                        clip_on=False, zorder=4)
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
    vsi, games = _split_kinds(rows)
    if not games:
        return list(_VSI_BAR_COLUMNS), "score (x100)", _VSI_ERRORBAR_TITLE
    tasks = game_task_order([t for _, r in games for t in (r.get("table") or {})])
    several = any(len(r.get("table") or {}) > 1 for _, r in games)
    game_columns = ([_GAME_ALL_COLUMN] if several else []) + [t for t in tasks if t not in _VSI_BAR_COLUMNS]
    if not vsi:
        return game_columns, "success rate (%)", _GAME_ERRORBAR_TITLE
    return ([*_VSI_BAR_COLUMNS, *[c for c in game_columns if c != _GAME_ALL_COLUMN]], "VSI score / game success (x100)",
            "interval (VSI: bootstrap; games: Wilson)")


def _report_bars(report: dict[str, Any], columns: Sequence[str]) -> list[tuple[Optional[float], Optional[Sequence[float]], int]]:
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
    numeric = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in _STEP_KEYS and any(_is_number(r.get(k)) for r in rows)]
    chosen = [next(k for k in group if k in numeric) for group in _CURVE_GROUPS if any(k in numeric for k in group)]
    # Timings and counters say little about learning; other unknown metrics fill the free panels.
    chosen += [k for k in numeric if k not in chosen and not k.startswith(("time/", "charts/turns", "rollout/episodes"))]
    return chosen[:max_panels]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
        ValueError: If the rows hold no numeric metric, or ``smoothing`` is outside [0, 1).
    """
    from matplotlib.ticker import MaxNLocator

    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing!r} must be in [0, 1) (0 = raw curves, 0.9 = strong smoothing)")
    keys = curve_keys(rows)
    if not keys:
        raise ValueError(f"{source} holds no numeric metrics to plot")
    step_key = next((k for k in _STEP_KEYS if any(_is_number(r.get(k)) for r in rows)), None)
    ncols = 3
    nrows = math.ceil(len(keys) / ncols)
    fig = _new_figure(width_px, height_px, dpi)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = [((r.get(step_key) if step_key else j), r[key]) for j, r in enumerate(rows) if _is_number(r.get(key))]
        xs, ys = zip(*pts)
        if smoothing > 0:
            ax.plot(xs, ys, marker="o", markersize=2, linewidth=1, alpha=0.3, color="C0", label="raw")
            ax.plot(xs, ema_smooth(ys, smoothing), linewidth=1.5, color="C0", label=f"EMA {smoothing:g}")
        else:
            ax.plot(xs, ys, marker="o", markersize=2, linewidth=1, color="C0")
        if all(_is_number(v) and float(v).is_integer() for v in xs):
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
        ValueError: If the file holds no numeric metric.
    """
    rows = read_metrics(metrics_path)
    fig = learning_curves_figure(rows, smoothing=smoothing, width_px=width_px, height_px=height_px, dpi=dpi, source=str(metrics_path))
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path


# --------------------------------------------------------------------------- trajectory pictures
@dataclass(frozen=True)
class PictureLayout:
    """Pixel layout of a trajectory picture.

    The picture is ``header`` pixels of question text on top; below it, left to right, one tile per
    turn (``tile`` square, with ``caption`` pixels of text under it) and the top-down map
    (``map_size`` square). Width = ``max(turns, 1) * tile + map_size``; height = ``header +
    max(tile + caption, map_size)``. An invalid turn's caption shows at most ``raw_chars``
    characters of the model's raw output (JSON-escaped, so newlines and quotes are visible).
    """

    tile: int = 192
    caption: int = 150
    map_size: int = 384
    header: int = 56
    raw_chars: int = 240

    def size(self, num_turns: int) -> tuple[int, int]:
        """``(width, height)`` of the picture of an episode with ``num_turns`` turns."""
        return max(num_turns, 1) * self.tile + self.map_size, self.header + max(self.tile + self.caption, self.map_size)


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _wrap(text: str, width_chars: int, max_lines: int) -> list[str]:
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        lines += textwrap.wrap(para, width_chars) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: max(width_chars - 3, 0)] + "..."
    return lines


def _to_tile(image: np.ndarray, tile: int):
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    scale = tile / max(img.size)
    new = (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale)))
    # Nearest keeps small rendered frames crisp when blown up.
    return img.resize(new, Image.NEAREST)


def _caption_geometry(layout: PictureLayout) -> tuple[int, int]:
    """``(characters per line, lines)`` of a turn's caption under its tile."""
    return max(8, layout.tile // 6), max(1, (layout.caption - 4) // 13)


def turn_caption(step: TurnRecord, layout: PictureLayout = PictureLayout()) -> list[str]:
    """The lines drawn under a turn's tile: ``turn: action``, then the thoughts.

    An invalid turn shows, after its parse reason (at most 3 lines), the model's raw output as
    ``raw: "..."``: JSON-escaped (a newline reads ``\\n``; the default bitmap font has no glyph for
    control or non-ASCII characters), cut at ``layout.raw_chars`` characters and wrapped; the
    thoughts follow if lines are left.
    """
    chars, max_lines = _caption_geometry(layout)
    if step.valid:
        return _wrap(f"{step.turn}: {step.action}\n{step.thoughts}", chars, max_lines)
    lines = _wrap(f"{step.turn}: {step.action}", chars, min(3, max_lines))
    raw = json.dumps(step.text)
    if len(raw) > layout.raw_chars:
        raw = raw[: max(layout.raw_chars - 3, 0)] + "..."
    if max_lines > len(lines):
        lines += _wrap(f"raw: {raw}", chars, max_lines - len(lines))
    if step.thoughts and max_lines > len(lines):
        lines += _wrap(step.thoughts, chars, max_lines - len(lines))
    return lines


def picture_header(record: EpisodeRecord) -> tuple[str, str]:
    """``(heading, status line)`` on top of a trajectory picture.

    VSI: ``[type] question options`` and ``answer: ...   ground truth: ...   score: ...   turns: ...``.
    Game: ``[task] question`` and ``won``/``lost``/``lost (turn limit)``, ``return``, ``turns`` and
    ``invalid`` (turns); answers, options and ground truth are not shown.
    """
    if is_game_type(record.question_type):
        outcome = "won" if is_success(record.score) else ("lost (turn limit)" if record.truncated else "lost")
        return (f"[{record.question_type}] {record.question or ''}".rstrip(),
                f"{outcome}   return: {record.reward:.2f}   turns: {record.turns}   invalid: {record.num_invalid}")
    answer = record.answer if record.answer is not None else "(no answer)"
    opts = "  ".join(record.options) if record.options else ""
    return (f"[{record.question_type}] {record.question} {opts}",
            f"answer: {answer}   ground truth: {record.ground_truth}   score: {record.score:.2f}   turns: {record.turns}")


def trajectory_picture(
    record: EpisodeRecord,
    frames: Sequence[np.ndarray],
    topdown: np.ndarray,
    path: str | os.PathLike,
    layout: PictureLayout = PictureLayout(),
) -> Path:
    """Draw one episode: question header, per-turn frames captioned with thoughts and action
    (:func:`turn_caption`; an invalid turn in red with the model's raw output), map.

    A game episode (``question_type`` a game task) gets the header ``[task] <question>`` and
    ``won``/``lost`` (``lost (turn limit)`` when truncated) with its return, turns and invalid
    turns; no answer, ground truth or options are shown, and no turn's ``pose`` is read. Its
    ``topdown`` is the game's full-state image at the end of the episode; a picture that is not
    square is fitted into the map square keeping its aspect ratio (pixel art scaled up by nearest
    neighbour, so it stays crisp).

    Args:
        record: The evaluated episode (its ``steps`` give the captions).
        frames: The view the agent had when deciding each turn, one per step (uint8 HxWx3).
        topdown: The top-down map (uint8 HxWx3), e.g. from ``topdown.render_topdown`` with the path,
            the objects asked about and the answer; for a game, its full-state image.
        path: Output PNG; its size is ``layout.size(len(record.steps))``.
    """
    from PIL import Image, ImageDraw

    if len(frames) != len(record.steps):
        raise ValueError(f"trajectory_picture got {len(frames)} frames for {len(record.steps)} turns; pass one frame per turn")
    width, height = layout.size(len(record.steps))
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    small, tiny = _font(13), _font(11)
    game = is_game_type(record.question_type)
    head, status = picture_header(record)
    head_lines = _wrap(head, max(20, width // 7), 2) + [status]
    for i, line in enumerate(head_lines):
        draw.text((6, 3 + 17 * i), line, fill="black", font=small)
    top = layout.header
    for i, (step, frame) in enumerate(zip(record.steps, frames)):
        x0 = i * layout.tile
        tile = _to_tile(frame, layout.tile)
        canvas.paste(tile, (x0 + (layout.tile - tile.size[0]) // 2, top + (layout.tile - tile.size[1]) // 2))
        colour = "black" if step.valid else "firebrick"
        for j, line in enumerate(turn_caption(step, layout)):
            draw.text((x0 + 3, top + layout.tile + 2 + 13 * j), line, fill=colour, font=tiny)
    tmap = Image.fromarray(np.ascontiguousarray(topdown, dtype=np.uint8)).convert("RGB")
    if game:
        scale = layout.map_size / max(tmap.size)
        size = (max(1, round(tmap.size[0] * scale)), max(1, round(tmap.size[1] * scale)))
        tmap = tmap.resize(size, Image.NEAREST if scale >= 1 else Image.BILINEAR)
        canvas.paste(tmap, (width - layout.map_size + (layout.map_size - size[0]) // 2, top + (layout.map_size - size[1]) // 2))
    else:
        tmap = tmap.resize((layout.map_size, layout.map_size), Image.BILINEAR)
        canvas.paste(tmap, (width - layout.map_size, top))
    path = Path(path)
    canvas.save(path, format="PNG")
    return path


# ------------------------------------------------------------------------------ logged samples
SAMPLE_COLUMNS = ("episode", "question_type", "question", "reply", "answer", "ground_truth", "score", "reward", "turns")


def sample_table(records: Sequence[EpisodeRecord], reply_chars: int = 300) -> tuple[list[str], list[list[Any]]]:
    """Episodes as a text table for TensorBoard/wandb (:meth:`RunLogger.log_text_table`).

    One row per episode: its id, type, question (with options), the model's last reply (raw text,
    cut at ``reply_chars``), the answer read from it (``None`` without one), the ground truth, the
    score, the episode reward and the number of turns.

    Returns:
        ``(columns, rows)``; ``columns`` is :data:`SAMPLE_COLUMNS`.
    """
    rows = []
    for r in records:
        reply = r.steps[-1].text if r.steps else ""
        if len(reply) > reply_chars:
            reply = reply[: max(reply_chars - 3, 0)] + "..."
        question = r.question + (" " + " ".join(r.options) if r.options else "")
        rows.append([r.episode_id, r.question_type, question, reply, r.answer, r.ground_truth, round(float(r.score), 4),
                     round(float(r.reward), 4), r.turns])
    return list(SAMPLE_COLUMNS), rows


# ------------------------------------------------------------------------------------ writing
def write_json(obj: Any, path: str | os.PathLike) -> Path:
    """Write JSON atomically (temp file then rename), NaN written as ``null``."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_nan_to_none(obj), indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


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
        if not isinstance(r, dict) or not isinstance(r.get("question_type"), str) or not _is_number(r.get("score")):
            return []
        outcomes.append((r["question_type"], is_success(r["score"])))
    return outcomes


def _records_scored(records: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    """``(question_type, score)`` of every record; [] when a record lacks either (no interval then)."""
    scored = []
    for r in records:
        qtype, score = r.get("question_type"), r.get("score")
        if qtype not in scoring.TASKS or not _is_number(score):
            return []
        scored.append((qtype, float(score)))
    return scored


def compare_reports(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    names: Optional[Sequence[str]] = None,
    paired: Optional[Sequence[tuple[str, str]]] = None,
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

    Raises:
        ValueError: If a paired name is not a row, or the two rows were not evaluated on the same questions.
    """
    if not paths:
        raise ValueError("compare needs at least one report.json")
    reports = [load_report(p) for p in paths]
    if names is None:
        names = [r.get("name") or Path(p).parent.name for r, p in zip(reports, paths)]
        if len(set(names)) < len(names):
            names = [f"{n} ({Path(p).resolve().parent.name})" for n, p in zip(names, paths)]
    elif len(names) != len(reports):
        raise ValueError(f"got {len(names)} names for {len(reports)} reports")
    rows = list(zip(names, reports))
    by_name = dict(rows)
    differences = []
    for a, b in paired or ():
        unknown = [n for n in (a, b) if n not in by_name]
        if unknown:
            raise ValueError(f"--paired names {unknown} are not rows of the comparison; rows: {list(names)} (set them with --names or --name)")
        differences.append(paired_overall_ci(by_name[a], by_name[b], names=(a, b)))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vsi, games = _split_kinds(rows)
    title = "# VSI evaluation: comparison" if not games else "# Game evaluation: comparison" if not vsi else "# Evaluation: comparison"
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
    md += ["", "Sources:", ""] + [f"- {n}: {p}" for n, p in zip(names, paths)] + [""]
    (out / "compare.md").write_text("\n".join(md), encoding="utf-8")
    png = plot_task_bars(rows, out / "compare.png")
    return {"md": out / "compare.md", "png": png}


# ------------------------------------------------------------------------------ paired comparison
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
        raise ValueError(f"a record{where} has no episode_id or id, so it cannot be paired; give every score-file line an \"id\"")
    return str(key)


def paired_records(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> list[tuple[dict[str, Any], dict[str, Any]]]:
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
            raise ValueError(f"{name} has no per-question records to pair; use a report.json written by eval_vsi.py")
        by_key = {question_key(r): r for r in records}
        if len(by_key) < len(records):
            raise ValueError(f"{name} holds {len(records) - len(by_key)} duplicate question id(s); each question must appear once to be paired")
        keyed.append(by_key)
    only_a, only_b = keyed[0].keys() - keyed[1].keys(), keyed[1].keys() - keyed[0].keys()
    if only_a or only_b:
        raise ValueError(
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
            raise ValueError(
                f"question {key!r} differs between {names[0]} and {names[1]} ({f}: {ra.get(f)!r} vs {rb.get(f)!r}): the reports "
                "use the same ids for different questions; evaluate both with the same eval.seed, env.question_types and env settings"
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
    out = {"a": names[0], "b": names[1], **ci, "confidence": confidence, "n_boot": n_boot, "single_question_types": single}
    if game:
        out["measure"] = "success"
    return out


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
        lines.append(f"| {_cell(d['a'])} - {_cell(d['b'])} | {d['n']} | {d['diff']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] |")
    single = max(d["single_question_types"] for d in differences)
    if single:
        lines += ["", f"**{single} question type(s) have a single question**: they add no spread, so the interval is too "
                  "narrow; evaluate more episodes (eval.num_episodes) for an honest one."]
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
        lines.append(f"| {_cell(d['a'])} - {_cell(d['b'])} | {d['n']} | {d['diff']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] |")
    return "\n".join(lines)

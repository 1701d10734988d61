"""Game reports (gym-cards, MiniGrid, Sokoban episodes): success rates with Wilson score intervals,
per-task return, length, invalid-output and truncation rates.
"""

from __future__ import annotations

import logging
import math
from statistics import NormalDist
from typing import Any, Optional, Sequence

from a2c_ppo_acktr.reports.records import (
    CI_CONFIDENCE,
    EpisodeRecord,
    GAME_KIND,
    SUCCESS_THRESHOLD,
    agent_metrics,
    game_task_order,
    is_game_type,
    is_success,
)

logger = logging.getLogger(__name__)


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
            raise ValueError(
                f"score {r.score!r} of episode {r.episode_id} ({r.question_type}) is outside [0, 1]; "
                "a game episode scores 1.0 when won or solved, else 0.0"
            )
    tasks = game_task_order([r.question_type for r in records])
    vsi = [t for t in tasks if not is_game_type(t)]
    if vsi:
        logger.warning(
            "report %s mixes VSI-Bench question types %s with game tasks; each type is reported as a task "
            "by its success rate (score >= %s)",
            name,
            vsi,
            SUCCESS_THRESHOLD,
        )
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

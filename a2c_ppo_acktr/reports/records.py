"""Report records and the definitions every report shares: the benchmark's column names, what counts
as a success, the two report kinds (VSI questions, game episodes), the per-episode agent metrics
and the logged-samples table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import scoring


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


def split_kinds(rows: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list, list]:
    """``(VSI rows, game rows)`` of ``(name, report)`` pairs, each in the given order."""
    vsi = [(n, r) for n, r in rows if report_kind(r) == VSI_KIND]
    games = [(n, r) for n, r in rows if report_kind(r) == GAME_KIND]
    return vsi, games


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
        rows.append(
            [
                r.episode_id,
                r.question_type,
                question,
                reply,
                r.answer,
                r.ground_truth,
                round(float(r.score), 4),
                round(float(r.reward), 4),
                r.turns,
            ]
        )
    return list(SAMPLE_COLUMNS), rows

"""VSI-Bench scoring: the one implementation used by the env reward and by every eval report.

Two rules are in use for numerical answers, named by :data:`SCORING_RULES`:

* ``thinking-in-space`` (the default): the reference evaluation of VSI-Bench ("Thinking in Space",
  Yang et al., 2024), reproduced exactly: the first space-separated word, read with ``float``. A reply
  "3 chairs" scores as 3, "There are 3 chairs." and "three" as no number (0).
* ``lmms-eval-0.7``: lmms-eval 0.7's vsibench task, through which many recent numbers are reported:
  the first number anywhere in the reply, digits or English number words ("three", "twenty-one",
  "three hundred and twenty-one"), whichever comes first (:func:`first_number`). "There are 3
  chairs." and "three" both score as 3.

Multiple-choice scoring is the same under both rules. The rules in detail (docs/EVAL.md):

* answer extraction: split the prediction on the single space character and keep the first piece,
  remove trailing ``.`` characters, then strip surrounding whitespace (so ``"C.\\n"`` stays ``"C."``);
* multiple choice: 1 if the extracted word equals the ground-truth letter ignoring case, else 0;
* numerical: Mean Relative Accuracy (MRA) over the thresholds ``numpy.linspace(0.5, 0.95, 10)``,
  counting a threshold ``t`` when the relative error ``e <= 1 - t`` in floating point. Because
  ``linspace`` gives ``0.8999999999999999`` and ``0.55`` exactly, ``1 - t`` is
  ``0.10000000000000009`` (so ``e = 0.1`` passes) but ``0.44999999999999996`` (so ``e = 0.45`` fails);
  such boundary results are the reference's and are kept on purpose.
* aggregation: mean per raw question type; Relative Direction is the unweighted mean of its easy,
  medium and hard means; Overall is the unweighted mean of the 8 task scores, times 100.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

# Raw ``question_type`` -> reported task, in the benchmark's table order.
TASKS: dict[str, str] = {
    "object_counting": "Object Count",
    "object_abs_distance": "Absolute Distance",
    "object_size_estimation": "Object Size",
    "room_size_estimation": "Room Size",
    "object_rel_distance": "Relative Distance",
    "object_rel_direction_easy": "Relative Direction",
    "object_rel_direction_medium": "Relative Direction",
    "object_rel_direction_hard": "Relative Direction",
    "route_planning": "Route Plan",
    "obj_appearance_order": "Appearance Order",
}
TASK_NAMES: tuple[str, ...] = tuple(dict.fromkeys(TASKS.values()))

MULTIPLE_CHOICE_TYPES: frozenset[str] = frozenset(
    {
        "object_rel_distance",
        "object_rel_direction_easy",
        "object_rel_direction_medium",
        "object_rel_direction_hard",
        "route_planning",
        "obj_appearance_order",
    }
)
NUMERICAL_TYPES: frozenset[str] = frozenset(
    {"object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation"}
)

# The reference's thresholds, kept as numpy float64 values so boundary cases match it bit for bit.
MRA_THRESHOLDS: np.ndarray = np.linspace(0.5, 0.95, 10)


def _check_type(question_type: str) -> None:
    if question_type not in TASKS:
        raise ValueError(f"unknown question_type {question_type!r}; known types: {list(TASKS)}")


def is_multiple_choice(question_type: str) -> bool:
    """Whether ``question_type`` is scored by option-letter accuracy (else by MRA)."""
    _check_type(question_type)
    return question_type in MULTIPLE_CHOICE_TYPES


def extract_answer(prediction: str) -> str:
    """The word VSI-Bench scores: first space-separated piece, trailing dots removed, then stripped.

    Args:
        prediction: The model's raw answer text.

    Returns:
        The extracted answer word (may be empty).
    """
    return prediction.split(" ")[0].rstrip(".").strip()


def _to_float(word: str) -> float | None:
    try:
        return float(word)
    except (ValueError, OverflowError):
        return None


def mean_relative_accuracy(pred: float, gt: float) -> float:
    """Mean Relative Accuracy of a numerical prediction.

    Args:
        pred: The predicted number; ``nan`` or ``inf`` score 0.
        gt: The ground truth; must be finite and > 0 (the relative error divides by it).

    Returns:
        The fraction of the 10 thresholds ``t`` with ``|pred - gt| / gt <= 1 - t``.

    Raises:
        ValueError: If ``gt`` is not a finite positive number (a data error, not a model error).
    """
    gt = float(gt)
    if not math.isfinite(gt) or gt <= 0:
        raise ValueError(
            f"ground truth {gt!r} must be a finite number > 0 for the relative error |pred-gt|/gt; fix the question "
            "data"
        )
    pred = float(pred)
    if not math.isfinite(pred):
        return 0.0
    rel_error = abs(pred - gt) / gt
    return float(np.mean(rel_error <= 1 - MRA_THRESHOLDS))


SCORING_RULES: tuple[str, ...] = ("thinking-in-space", "lmms-eval-0.7")
DEFAULT_SCORING_RULE = "thinking-in-space"

# English number words and their values (the lmms-eval-0.7 rule reads runs of them).
NUMBER_WORDS: dict[str, int] = {
    **{
        w: i
        for i, w in enumerate(
            "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
            "fifteen sixteen seventeen eighteen nineteen".split()
        )
    },
    **{w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())},
    "hundred": 100,
    "thousand": 1000,
}
_DIGITS = re.compile(r"-?\d+(?:\.\d+)?")
_LETTERS = re.compile(r"[a-z]+")


def first_number(text: str) -> float | None:
    """The first number in ``text``, digits or English words, as lmms-eval 0.7 reads a numerical reply.

    Lower-cased; the earliest of the first digit group (``-?d+(.d+)?``) and the first number word
    wins. A word run goes on through number words and ``and`` (hyphens and spaces between them are
    not letters, so "twenty-one" is a run) and ends at any other word; within it, ``hundred``
    multiplies what came before (at least 1) and ``thousand`` closes a group:
    "three hundred and twenty-one" is 321, "a thousand" reads from "thousand": 1000.

    Returns:
        The number, or None when there is none.
    """
    s = str(text).strip().lower()
    digits = _DIGITS.search(s)
    run: list[str] = []
    run_start = None
    for m in _LETTERS.finditer(s):
        word = m.group(0)
        if run_start is None:
            if word in NUMBER_WORDS:
                run_start = m.start()
                run.append(word)
        elif word in NUMBER_WORDS:
            run.append(word)
        elif word != "and":
            break
    if digits is not None and (run_start is None or digits.start() < run_start):
        return float(digits.group(0))
    if run_start is None:
        return None
    total = current = 0
    for word in run:
        value = NUMBER_WORDS[word]
        if value == 100:
            current = max(current, 1) * 100
        elif value == 1000:
            total += max(current, 1) * 1000
            current = 0
        else:
            current += value
    return float(total + current)


def check_scoring_rule(rule: str) -> str:
    """``rule`` if it is one of :data:`SCORING_RULES`, else ValueError naming them."""
    if rule not in SCORING_RULES:
        raise ValueError(f"unknown scoring rule {rule!r}; use one of {list(SCORING_RULES)}")
    return rule


def score_prediction(question_type: str, prediction: str, ground_truth: str, rule: str = DEFAULT_SCORING_RULE) -> float:
    """Score one answer as VSI-Bench does.

    Args:
        question_type: One of the 10 raw types in :data:`TASKS`.
        prediction: The answer text (e.g. ``"B"`` or ``"3.2"``); extraction is applied here.
        ground_truth: An option letter (multiple choice) or a number as a string.
        rule: One of :data:`SCORING_RULES`: how a numerical answer is read from the prediction.

    Returns:
        A score in [0, 1]: accuracy for multiple choice, MRA for numerical questions.

    Raises:
        ValueError: On an unknown question type or a numerical ground truth that is not a number > 0.
    """
    _check_type(question_type)
    check_scoring_rule(rule)
    word = extract_answer(prediction)
    if question_type in MULTIPLE_CHOICE_TYPES:
        # The ground truth is compared as stored, lower-cased but not stripped (the official rule):
        # a stored " c " matches no answer.
        return 1.0 if word.lower() == ground_truth.lower() else 0.0
    gt = _to_float(ground_truth)
    if gt is None:
        raise ValueError(
            f"numerical ground truth {ground_truth!r} of a {question_type} question is not a number; fix the question "
            "data"
        )
    pred = _to_float(word) if rule == "thinking-in-space" else first_number(prediction)
    if pred is None:
        return 0.0
    return mean_relative_accuracy(pred, gt)


def best_constant(question_type: str, ground_truths: Sequence[str], grid: int = 400) -> tuple[str, float]:
    """The one answer that scores best on every question of ``question_type`` at once, and its mean score.

    What a policy that ignores the frames and the question's details can reach on these questions when
    the answer is chosen in hindsight. Numerical types: the candidates are every ground truth and
    ``grid`` log-spaced values between the smallest and the largest (MRA is a step function of the
    answer, so a fine grid finds its maximum), written with 6 significant digits. Multiple choice: the
    option letters that occur as a ground truth (a letter that never does scores 0).

    Returns:
        ``(answer, mean score)``; the earliest candidate wins a tie.

    Raises:
        ValueError: No ground truths, an unknown type, or a numerical ground truth that is not a number > 0.
    """
    _check_type(question_type)
    if not ground_truths:
        raise ValueError(f"best_constant needs ground truths; got none for {question_type}")
    if question_type in MULTIPLE_CHOICE_TYPES:
        candidates = sorted({g.strip().upper() for g in ground_truths})
    else:
        values = np.array([_to_float(g) or float("nan") for g in ground_truths])
        if not (values > 0).all():
            raise ValueError(
                f"best_constant needs positive numerical ground truths for {question_type}, got "
                f"{list(ground_truths)[:5]}..."
            )
        grid_values = np.geomspace(values.min(), values.max(), grid)
        candidates = [f"{c:.6g}" for c in np.unique(np.concatenate([values, grid_values]))]
    best = ("", -1.0)
    for answer in candidates:
        score = float(np.mean([score_prediction(question_type, answer, g) for g in ground_truths]))
        if score > best[1]:
            best = (answer, score)
    return best


def aggregate(records: Iterable[tuple[str, float]]) -> dict:
    """Aggregate per-question scores into the benchmark's table.

    Missing types and tasks are left out rather than counted as 0: Relative Direction is the mean
    of whichever of easy/medium/hard are present, and ``overall`` is the mean over the tasks
    present (``tasks_present`` lists them, ``tasks_missing`` the others). An overall computed
    with tasks missing is therefore not comparable with the published 8-task numbers; reports
    should show ``tasks_missing``.

    Args:
        records: ``(question_type, score)`` pairs, scores in [0, 1].

    Returns:
        A dict with ``per_type`` (type -> mean score in [0, 1]), ``per_task`` (task -> score in
        [0, 1]), ``overall`` (mean task score x 100, ``nan`` when there are no records),
        ``counts`` (type -> number of records), ``tasks_present`` and ``tasks_missing``
        (task names in table order).

    Raises:
        ValueError: On an unknown question type or a score outside [0, 1].
    """
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for question_type, score in records:
        _check_type(question_type)
        score = float(score)
        if not 0.0 <= score <= 1.0:
            raise ValueError(
                f"score {score!r} for {question_type} is outside [0, 1]; pass per-question scores from score_prediction"
            )
        sums[question_type] += score
        counts[question_type] += 1
    per_type = {t: sums[t] / counts[t] for t in TASKS if counts[t] > 0}
    by_task: dict[str, list[float]] = defaultdict(list)
    for t, mean in per_type.items():
        by_task[TASKS[t]].append(mean)
    per_task = {task: float(np.mean(by_task[task])) for task in TASK_NAMES if task in by_task}
    overall = 100.0 * float(np.mean(list(per_task.values()))) if per_task else float("nan")
    return {
        "per_type": per_type,
        "per_task": per_task,
        "overall": overall,
        "counts": {t: counts[t] for t in TASKS if counts[t] > 0},
        "tasks_present": [t for t in TASK_NAMES if t in per_task],
        "tasks_missing": [t for t in TASK_NAMES if t not in per_task],
    }

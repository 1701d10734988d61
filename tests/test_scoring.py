"""VSI-Bench scoring against hand-computed values, including every MRA threshold boundary."""

import math

import numpy as np
import pytest

from a2c_ppo_acktr.common import scoring
from a2c_ppo_acktr.config.arguments import QUESTION_TYPES
from a2c_ppo_acktr.common.scoring import aggregate, extract_answer, mean_relative_accuracy, score_prediction


def test_tasks_cover_the_ten_raw_types_and_eight_tasks():
    assert set(scoring.TASKS) == set(QUESTION_TYPES)
    assert len(scoring.TASK_NAMES) == 8
    assert scoring.MULTIPLE_CHOICE_TYPES | scoring.NUMERICAL_TYPES == set(QUESTION_TYPES)
    assert not scoring.MULTIPLE_CHOICE_TYPES & scoring.NUMERICAL_TYPES


@pytest.mark.parametrize(
    "prediction, expected",
    [
        ("C", "C"),
        ("C.", "C"),
        ("C...", "C"),
        ("C.\n", "C."),  # strip happens after the dot removal, so the dot survives
        ("C\n", "C"),
        ("C. sofa", "C"),
        (" C", ""),  # a leading space makes the first piece empty
        ("3.5 meters", "3.5"),
        ("", ""),
    ],
)
def test_extract_answer(prediction, expected):
    assert extract_answer(prediction) == expected


@pytest.mark.parametrize(
    "prediction, gt, expected",
    [
        ("c", "C", 1.0),
        ("C", "c", 1.0),
        ("C.", "C", 1.0),
        ("C.\n", "C", 0.0),
        ("C\n", "C", 1.0),
        ("B", "C", 0.0),
        ("C is right", "C", 1.0),
        ("(C)", "C", 0.0),
        ("", "A", 0.0),
    ],
)
def test_multiple_choice(prediction, gt, expected):
    assert score_prediction("object_rel_distance", prediction, gt) == expected


# Thresholds t = linspace(0.5, 0.95, 10); a threshold counts when e <= 1 - t in float64. The float
# values of 1 - t are 0.5, 0.44999999999999996, 0.4, 0.35, 0.30000000000000004, 0.25,
# 0.19999999999999996, 0.15000000000000002, 0.10000000000000009, 0.050000000000000044.
@pytest.mark.parametrize(
    "pred, gt, expected",
    [
        (100.0, 100.0, 1.0),
        (105.0, 100.0, 1.0),  # e = 0.05 <= 0.050000000000000044: all ten
        (105.1, 100.0, 0.9),  # just above 0.05
        (110.0, 100.0, 0.9),  # e = 0.1 <= 0.10000000000000009 (t = 0.8999999999999999)
        (110.1, 100.0, 0.8),
        (115.0, 100.0, 0.8),  # e = 0.15 <= 0.15000000000000002
        (115.1, 100.0, 0.7),
        (120.0, 100.0, 0.6),  # e = 0.2 > 0.19999999999999996: the t = 0.8 threshold is missed
        (119.9, 100.0, 0.7),
        (125.0, 100.0, 0.6),  # e = 0.25 <= 0.25
        (125.1, 100.0, 0.5),
        (130.0, 100.0, 0.5),  # e = 0.3 <= 0.30000000000000004
        (130.1, 100.0, 0.4),
        (135.0, 100.0, 0.4),  # e = 0.35 <= 0.35
        (135.1, 100.0, 0.3),
        (140.0, 100.0, 0.3),  # e = 0.4 <= 0.4
        (140.1, 100.0, 0.2),
        (145.0, 100.0, 0.1),  # e = 0.45 > 0.44999999999999996: only t = 0.5 counts
        (144.9, 100.0, 0.2),
        (150.0, 100.0, 0.1),  # e = 0.5 <= 0.5
        (150.1, 100.0, 0.0),
        (50.0, 100.0, 0.1),  # below the truth: e = 0.5
        (0.0, 100.0, 0.0),
        (-100.0, 100.0, 0.0),
        (2.0, 2.0, 1.0),
        (3.0, 2.0, 0.1),  # e = 0.5
    ],
)
def test_mra_boundaries(pred, gt, expected):
    assert mean_relative_accuracy(pred, gt) == pytest.approx(expected, abs=1e-12)
    assert score_prediction("object_size_estimation", repr(pred), repr(gt)) == pytest.approx(expected, abs=1e-12)


def test_mra_counts_thresholds_like_a_loop():
    # An independent, loop-based reading of the definition over many random errors.
    rng = np.random.default_rng(0)
    thresholds = [0.5 + 0.05 * i for i in range(10)]
    for _ in range(500):
        gt = float(rng.uniform(0.1, 50))
        pred = gt * float(rng.uniform(0.3, 1.7))
        e = abs(pred - gt) / gt
        # Away from boundaries the literal thresholds and linspace agree.
        if min(abs(e - (1 - t)) for t in thresholds) < 1e-9:
            continue
        expected = sum(1 for t in thresholds if e <= 1 - t) / 10
        assert mean_relative_accuracy(pred, gt) == pytest.approx(expected)


@pytest.mark.parametrize("prediction", ["abc", "", "nan", "NaN", "inf", "-inf", "1e999", "3,5", "..", "three"])
def test_malformed_numbers_score_zero(prediction):
    assert score_prediction("object_counting", prediction, "3") == 0.0


def test_numeric_extraction_rules():
    assert score_prediction("object_counting", "3.", "3") == 1.0
    assert score_prediction("object_counting", "3 chairs", "3") == 1.0
    assert score_prediction("object_counting", "3\n", "3") == 1.0
    assert score_prediction("room_size_estimation", "20.0", "20") == 1.0


def test_bad_ground_truth_and_type_raise():
    with pytest.raises(ValueError, match="ground truth"):
        score_prediction("object_counting", "3", "x")
    with pytest.raises(ValueError, match="> 0"):
        mean_relative_accuracy(1.0, 0.0)
    with pytest.raises(ValueError, match="unknown question_type"):
        score_prediction("object_color", "3", "3")


def test_aggregate_relative_direction_is_unweighted_mean_of_levels():
    records = [("object_rel_direction_easy", 1.0)] * 3 + [("object_rel_direction_easy", 0.0)]  # 0.75
    records += [("object_rel_direction_medium", 0.0)] * 10  # 0.0
    records += [("object_rel_direction_hard", 1.0)]  # 1.0
    out = aggregate(records)
    assert out["per_type"]["object_rel_direction_easy"] == pytest.approx(0.75)
    assert out["per_task"]["Relative Direction"] == pytest.approx((0.75 + 0.0 + 1.0) / 3)
    # A pooled mean would give 4/15; the benchmark averages the three levels.
    assert out["per_task"]["Relative Direction"] != pytest.approx(4 / 15)
    assert out["counts"] == {
        "object_rel_direction_easy": 4,
        "object_rel_direction_medium": 10,
        "object_rel_direction_hard": 1,
    }
    assert out["tasks_present"] == ["Relative Direction"]
    assert out["overall"] == pytest.approx(100 * (0.75 + 0.0 + 1.0) / 3)


def test_aggregate_overall_is_mean_of_eight_tasks_times_100():
    task_scores = {
        "object_counting": 0.2,
        "object_abs_distance": 0.3,
        "object_size_estimation": 0.4,
        "room_size_estimation": 0.5,
        "object_rel_distance": 0.6,
        "route_planning": 0.7,
        "obj_appearance_order": 0.8,
    }
    records = [(t, s) for t, s in task_scores.items()]
    records += [("object_counting", 0.4)]  # Object Count mean becomes 0.3
    records += [
        ("object_rel_direction_easy", 1.0),
        ("object_rel_direction_medium", 0.5),
        ("object_rel_direction_hard", 0.0),
    ]
    out = aggregate(records)
    expected_tasks = [0.3, 0.3, 0.4, 0.5, 0.6, 0.5, 0.7, 0.8]
    assert out["overall"] == pytest.approx(100 * sum(expected_tasks) / 8)
    assert out["tasks_missing"] == []
    assert list(out["per_task"]) == list(scoring.TASK_NAMES)


def test_aggregate_missing_tasks_and_validation():
    out = aggregate([("object_counting", 1.0), ("route_planning", 0.0)])
    assert out["overall"] == pytest.approx(50.0)
    assert set(out["tasks_missing"]) == set(scoring.TASK_NAMES) - {"Object Count", "Route Plan"}
    assert math.isnan(aggregate([])["overall"])
    with pytest.raises(ValueError, match="outside"):
        aggregate([("object_counting", 1.5)])


def test_best_constant_by_hand():
    """The best constant answer and its mean score, worked out by hand."""
    # 10 against 10 and 20: 1.0 and MRA(10, 20) = 0.1 (e = 0.5); 20 scores 0.0 against 10 (e = 1).
    assert scoring.best_constant("room_size_estimation", ["10", "20"]) == ("10", pytest.approx(0.55))
    assert scoring.best_constant("object_size_estimation", ["36", "36", "36"]) == ("36", 1.0)
    # 10 against 14 is 29% off (MRA 0.5), so 10 scores 0.75; 12, 20% and 14% off the two, scores 0.6 and 0.8:
    # 0.7; 14 is 40% off 10 (0.3): 0.65. The order of the ground truths does not matter.
    assert scoring.best_constant("room_size_estimation", ["10", "14"]) == ("10", pytest.approx(0.75))
    assert scoring.best_constant("room_size_estimation", ["14", "10"]) == ("10", pytest.approx(0.75))
    # Multiple choice: the most frequent correct letter, whatever the case it was stored in.
    assert scoring.best_constant("route_planning", ["A", "b", "B", "C"]) == ("B", 0.5)
    with pytest.raises(ValueError, match="positive numerical ground truths"):
        scoring.best_constant("object_counting", ["3", "0"])
    with pytest.raises(ValueError, match="needs ground truths"):
        scoring.best_constant("object_counting", [])

"""Edges of ``scoring.py`` that the mutation run (scripts/mutation.sh) found untested."""
import warnings

import pytest

from a2c_ppo_acktr.scoring import aggregate, extract_answer, is_multiple_choice

# VSI-Bench's split, written out: six option-letter types, four numerical (MRA) types.
LETTER_TYPES = ["object_rel_distance", "object_rel_direction_easy", "object_rel_direction_medium",
                "object_rel_direction_hard", "route_planning", "obj_appearance_order"]
NUMBER_TYPES = ["object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation"]


def test_is_multiple_choice_splits_the_ten_types():
    assert [is_multiple_choice(t) for t in LETTER_TYPES] == [True] * 6
    assert [is_multiple_choice(t) for t in NUMBER_TYPES] == [False] * 4
    with pytest.raises(ValueError, match="unknown question_type 'counting'"):
        is_multiple_choice("counting")


@pytest.mark.parametrize("prediction, expected", [("X.", "X"), ("B..", "B"), ("XX", "XX"), ("2.5X.", "2.5X")])
def test_extract_answer_strips_only_trailing_dots(prediction, expected):
    assert extract_answer(prediction) == expected


def test_aggregate_of_nothing_is_nan_without_a_numpy_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # np.mean([]) would warn "Mean of empty slice"
        out = aggregate([])
    assert out["overall"] != out["overall"] and out["per_task"] == {}

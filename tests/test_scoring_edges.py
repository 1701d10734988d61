"""Edges of ``scoring.py`` that the mutation run (scripts/mutation.sh) found untested."""

import warnings

import pytest

from a2c_ppo_acktr.common.scoring import aggregate, extract_answer, is_multiple_choice, score_prediction

# VSI-Bench's split, written out: six option-letter types, four numerical (MRA) types.
LETTER_TYPES = [
    "object_rel_distance",
    "object_rel_direction_easy",
    "object_rel_direction_medium",
    "object_rel_direction_hard",
    "route_planning",
    "obj_appearance_order",
]
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


# ----------------------------------------------------------------------------- the two scoring rules
@pytest.mark.parametrize(
    "text, number",
    [
        ("3", 3.0),
        ("3.0", 3.0),
        ("There are 3 chairs.", 3.0),
        ("three", 3.0),
        ("Three boxes.", 3.0),
        ("about 2.5m", 2.5),
        ("Answer: 3", 3.0),
        ("-4 meters", -4.0),
        ("twenty-one", 21.0),
        ("three hundred and twenty-one", 321.0),
        ("a thousand", 1000.0),
        ("two thousand five hundred", 2500.0),
        ("one apple, room 2", 1.0),  # the earlier number wins, word or digit
        ("room 2 has one", 2.0),
        ("ninety nine", 99.0),
        ("seven. Then 4", 7.0),
        ("no idea", None),
        ("", None),
        ("and three", 3.0),
        ("1,234", 1.0),
    ],
)
def test_first_number_reads_what_lmms_eval_07_reads(text, number):
    from a2c_ppo_acktr.common.scoring import first_number

    assert first_number(text) == number


def test_the_two_rules_differ_on_numbers_only():
    from a2c_ppo_acktr.common.scoring import SCORING_RULES

    assert SCORING_RULES == ("thinking-in-space", "lmms-eval-0.7")
    for text in ("There are 3 chairs.", "three", "Answer: 3"):
        assert score_prediction("object_counting", text, "3") == 0.0
        assert score_prediction("object_counting", text, "3", rule="lmms-eval-0.7") == 1.0
    assert (
        score_prediction("object_counting", "3 chairs", "3")
        == score_prediction("object_counting", "3 chairs", "3", rule="lmms-eval-0.7")
        == 1.0
    )
    for text, gt in (("B", "B"), ("B. The sofa", "B"), ("The answer is B", "B")):  # multiple choice: the same rule
        assert score_prediction("object_rel_distance", text, gt) == score_prediction(
            "object_rel_distance", text, gt, rule="lmms-eval-0.7"
        )
    with pytest.raises(ValueError, match="unknown scoring rule 'lmms'"):
        score_prediction("object_counting", "3", "3", rule="lmms")


def test_score_file_under_each_rule_and_the_cli_flag(tmp_path, capsys):
    """The same predictions, two rules: numerical tasks move, multiple choice does not; the report says
    which rule it used; eval_vsi.py --scoring-rule reaches the score-file mode."""
    import json

    from a2c_ppo_acktr.reports import score_file

    rows = [
        ("object_abs_distance", "There are 2.5 meters.", "2.5"),
        ("object_abs_distance", "about 3", "3"),
        ("object_counting", "three", "3"),
        ("object_counting", "4", "4"),
        ("object_rel_distance", "A", "A"),
    ]
    path = tmp_path / "preds.jsonl"
    path.write_text(
        "".join(json.dumps({"question_type": t, "prediction": p, "ground_truth": g}) + "\n" for t, p, g in rows)
    )
    tis, lmms = score_file(path), score_file(path, rule="lmms-eval-0.7")
    assert (tis["meta"]["scoring_rule"], lmms["meta"]["scoring_rule"]) == ("thinking-in-space", "lmms-eval-0.7")
    assert tis["per_task"]["Absolute Distance"] == 0.0 and lmms["per_task"]["Absolute Distance"] == 1.0
    assert tis["per_task"]["Object Count"] == 0.5 and lmms["per_task"]["Object Count"] == 1.0
    assert tis["per_task"]["Relative Distance"] == lmms["per_task"]["Relative Distance"] == 1.0
    import eval_vsi

    eval_vsi.main(["--score-file", str(path), "--scoring-rule", "lmms-eval-0.7", "--out", str(tmp_path / "report")])
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["meta"]["scoring_rule"] == "lmms-eval-0.7" and report["per_task"]["Absolute Distance"] == 1.0

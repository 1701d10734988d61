"""Reports: score-file mode on hand-computed cases, the benchmark table, comparison, plots, pictures.

Expected scores are worked out by hand from VSI_BENCH.md ("Scoring, exactly"): the thresholds are
numpy.linspace(0.5, 0.95, 10), whose ``1 - t`` values are 0.5, 0.44999999999999996, 0.4, 0.35,
0.30000000000000004, 0.25, 0.19999999999999996, 0.15000000000000002, 0.10000000000000009,
0.050000000000000044; a threshold counts when the relative error is <= its ``1 - t``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from a2c_ppo_acktr import reports
from a2c_ppo_acktr.common import scoring
from a2c_ppo_acktr.run.logger import read_metrics
from a2c_ppo_acktr.reports import EpisodeRecord, PictureLayout, TurnRecord

COLUMNS = ["Obj. Count", "Abs. Dist.", "Obj. Size", "Room Size", "Rel. Dist.", "Rel. Dir.", "Route Plan", "Appr. Order"]


def _write_jsonl(path: Path, rows: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _line(qtype: str, pred: str, gt: str, **extra) -> dict:
    return {"question_type": qtype, "prediction": pred, "ground_truth": gt, **extra}


# Relative errors against a ground truth of 10 and the MRA each must get, by hand.
MRA_CASES = [
    ("10", 1.0),  # e = 0
    ("10.5", 1.0),  # e = 0.05 <= 0.050000000000000044: all 10 thresholds
    ("11", 0.9),  # e = 0.1 <= 0.10000000000000009, > 0.050000000000000044: 9
    ("12", 0.6),  # e = 0.2 > 0.19999999999999996: only the six with 1-t >= 0.25
    ("13", 0.5),  # e = 0.3 <= 0.30000000000000004: five
    ("7", 0.5),  # e = 0.3 from below: same five
    ("14", 0.3),  # e = 0.4 == 0.4: three
    ("14.5", 0.1),  # e = 0.45 > 0.44999999999999996: only t = 0.5
    ("15", 0.1),  # e = 0.5 <= 0.5: one
    ("5", 0.1),  # e = 0.5 from below
    ("15.01", 0.0),  # e = 0.501: none
    ("4.99", 0.0),
    ("1e1", 1.0),  # float("1e1") == 10
    ("10.", 1.0),  # trailing dot removed
    ("10 meters", 1.0),  # first space-separated word
    ("ten", 0.0),  # unparseable
    ("10m", 0.0),  # unparseable as a whole word
    ("nan", 0.0),
    ("inf", 0.0),
    ("", 0.0),
    (" 10", 0.0),  # split on " " keeps the empty first piece
]


def test_score_file_mra_boundaries(tmp_path):
    path = _write_jsonl(
        tmp_path / "p.jsonl", [_line("object_abs_distance", p, "10", id=i) for i, (p, _) in enumerate(MRA_CASES)]
    )
    rep = reports.score_file(path)
    got = [r["score"] for r in rep["records"]]
    want = [s for _, s in MRA_CASES]
    assert got == pytest.approx(want, abs=1e-12)
    assert [r["id"] for r in rep["records"]] == list(range(len(MRA_CASES)))
    assert rep["per_type"]["object_abs_distance"] == pytest.approx(np.mean(want))
    assert rep["counts"] == {"object_abs_distance": len(MRA_CASES)}
    # One task present: overall is that task's mean x100, and the 7 others are reported missing.
    assert rep["overall"] == pytest.approx(100 * np.mean(want))
    assert len(rep["tasks_missing"]) == 7
    assert rep["malformed"]["count"] == 0


MC_CASES = [
    ("B", "B", 1.0),
    ("b", "B", 1.0),  # case ignored
    ("B.", "B", 1.0),  # trailing dot removed
    ("B...", "B", 1.0),
    ("B. left of the sofa", "B", 1.0),  # first word, then the dot
    ("B, left", "B", 0.0),  # "B," is not "B"
    ("C.\n", "C", 0.0),  # dots removed before the strip: "C." stays
    ("C\n", "C", 1.0),  # whitespace stripped
    ("The answer is B", "B", 0.0),
    (" B", "B", 0.0),  # leading space: empty first piece
    ("A", "B", 0.0),
    ("(B)", "B", 0.0),
]


def test_score_file_multiple_choice_case_and_punctuation(tmp_path):
    path = _write_jsonl(tmp_path / "mc.jsonl", [_line("route_planning", p, g) for p, g, _ in MC_CASES])
    rep = reports.score_file(path)
    assert [r["score"] for r in rep["records"]] == [s for _, _, s in MC_CASES]
    assert rep["per_type"]["route_planning"] == pytest.approx(np.mean([s for _, _, s in MC_CASES]))
    assert rep["table"]["Route Plan"] == pytest.approx(100 * np.mean([s for _, _, s in MC_CASES]))


def test_relative_direction_is_mean_of_subtype_means_and_overall_over_tasks(tmp_path):
    rows = (
        [_line("object_rel_direction_easy", "A", "A")] * 2  # easy mean 1
        + [_line("object_rel_direction_medium", "A", "A")]
        + [_line("object_rel_direction_medium", "B", "A")] * 3  # 0.25
        + [_line("object_rel_direction_hard", "C", "A")]  # 0
        + [_line("object_counting", "4", "4"), _line("object_counting", "3", "4")]  # 1 and e=0.25 -> 0.6
    )
    rep = reports.score_file(_write_jsonl(tmp_path / "rd.jsonl", rows))
    rel_dir = (1.0 + 0.25 + 0.0) / 3  # not the pooled 3/7
    count = (1.0 + 0.6) / 2
    assert rep["per_task"]["Relative Direction"] == pytest.approx(rel_dir)
    assert rep["table"]["Rel. Dir."] == pytest.approx(100 * rel_dir)
    assert rep["table"]["Obj. Count"] == pytest.approx(100 * count)
    assert rep["overall"] == pytest.approx(100 * (rel_dir + count) / 2)
    assert rep["table"]["Route Plan"] is None


def test_malformed_lines_are_counted_with_line_numbers(tmp_path):
    rows = [
        _line("room_size_estimation", "20", "20"),  # line 1: 1.0
        "{not json",  # line 2: unknown type -> malformed, no task
        "",  # line 3: blank, ignored
        {"question_type": "room_size_estimation", "ground_truth": "20"},  # line 4: no prediction -> 0
        _line("object_countin", "3", "3"),  # line 5: unknown type
        _line("room_size_estimation", "20", "twenty"),  # line 6: bad ground truth -> 0
        "[1, 2]",  # line 7: not an object
        _line("room_size_estimation", 21, 20),  # line 8: bare numbers are read as text: e=0.05 -> 1.0
    ]
    rep = reports.score_file(_write_jsonl(tmp_path / "bad.jsonl", rows))
    mal = rep["malformed"]
    assert [b["line"] for b in mal["lines"]] == [2, 4, 5, 6, 7]
    assert mal["count"] == 5 and mal["unknown_type"] == 3
    assert "prediction" in mal["lines"][1]["error"] and "object_countin" in mal["lines"][2]["error"]
    assert rep["counts"] == {"room_size_estimation": 4, "malformed": 3}
    # The four room-size lines (1, 4, 6, 8) score 1, 0, 0, 1; the unknown-type lines enter no task.
    assert rep["per_type"]["room_size_estimation"] == pytest.approx(0.5)
    assert rep["overall"] == pytest.approx(50.0)
    md = reports.report_markdown(rep)
    assert "line 5:" in md and "Malformed" in md


def test_score_file_with_nothing_scorable_raises(tmp_path):
    with pytest.raises(ValueError, match="no line"):
        reports.score_file(_write_jsonl(tmp_path / "x.jsonl", ["garbage", "{}"]))
    with pytest.raises(FileNotFoundError):
        reports.score_file(tmp_path / "missing.jsonl")


def test_markdown_table_layout_and_values(tmp_path):
    rows = [_line("object_counting", "2", "2"), _line("obj_appearance_order", "A", "B")]
    rep = reports.score_file(_write_jsonl(tmp_path / "t.jsonl", rows), name="run")
    header, rule, row = reports.table_markdown([("run", rep)]).splitlines()
    assert [c.strip() for c in header.strip("|").split("|")] == ["Method", "Overall", *COLUMNS]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "run" and cells[1] == "50.0"
    assert cells[2] == "100.0" and cells[-1] == "0.0" and cells[3] == "-"
    assert list(reports.SHORT_TASK_NAMES) == list(
        __import__("a2c_ppo_acktr.common.scoring", fromlist=["TASK_NAMES"]).TASK_NAMES
    )


def _episode(i: int, qtype: str, score: float, turns: int, invalid: int, answered: bool = True) -> EpisodeRecord:
    steps = [
        TurnRecord(
            turn=t + 1,
            text="{}",
            thoughts=f"thinking {t}",
            action="invalid(x)" if t < invalid else "move(rot=30, fwd=0)",
            valid=t >= invalid,
            reward=-0.1 if t < invalid else 0.0,
            pose=(1.0, 1.0 + t, 0.0),
        )
        for t in range(turns)
    ]
    return EpisodeRecord(
        episode_id=f"e{i}",
        scene_id="s",
        dataset="procedural",
        question_type=qtype,
        question="How many chairs?",
        options=None,
        ground_truth="2",
        answer="2" if answered else None,
        score=score,
        turns=turns,
        num_invalid=invalid,
        reward=score - 0.1 * invalid,
        truncated=not answered,
        steps=steps,
    )


def test_agent_metrics_definitions():
    recs = [
        _episode(0, "object_counting", 1.0, 2, 0),
        _episode(1, "object_counting", 0.5, 4, 1),
        _episode(2, "object_counting", 0.4, 1, 0),
        _episode(3, "object_counting", 0.0, 3, 3, answered=False),
    ]
    m = reports.agent_metrics(recs)
    assert m["success_rate"] == pytest.approx(0.5)  # 1.0 and 0.5 reach the 0.5 threshold
    assert m["answer_rate"] == pytest.approx(0.75)
    assert m["mean_turns"] == pytest.approx(10 / 4)
    assert m["invalid_output_rate"] == pytest.approx(4 / 10)
    assert m["mean_reward"] == pytest.approx((1.0 + 0.4 + 0.4 - 0.3) / 4)
    assert m["mean_score"] == pytest.approx(1.9 / 4)
    rep = reports.build_report(recs, name="x")
    assert rep["records"][1]["actions"] == [
        "invalid(x)",
        "move(rot=30, fwd=0)",
        "move(rot=30, fwd=0)",
        "move(rot=30, fwd=0)",
    ]
    assert rep["overall"] == pytest.approx(100 * 1.9 / 4)
    assert reports.invalid_summary(rep["records"]) == [("x", 4, "{}")]
    assert "| 4 | x | `{}` |" in reports.report_markdown(rep)


def test_write_compare_and_plots_are_pngs_of_the_expected_size(tmp_path):
    a = reports.build_report(
        [_episode(0, "object_counting", 1.0, 1, 0), _episode(1, "route_planning", 0.0, 2, 1)], name="a"
    )
    b = reports.build_report([_episode(0, "object_counting", 0.2, 1, 0)], name="b")
    pa = reports.write_report(a, tmp_path / "a")
    reports.write_report(b, tmp_path / "b")
    with Image.open(pa["tasks_png"]) as im:
        assert im.size == (1000, 450)
    loaded = json.loads((tmp_path / "a" / "report.json").read_text())
    assert loaded["overall"] == pytest.approx(a["overall"]) and loaded["agent"]["num_episodes"] == 2
    out = reports.compare_reports([tmp_path / "a" / "report.json", tmp_path / "b" / "report.json"], tmp_path / "cmp")
    md = out["md"].read_text()
    assert "| a | 50.0 |" in md and "| b | 20.0 |" in md
    with Image.open(out["png"]) as im:
        assert im.format == "PNG" and im.size == (1000, 450)


def test_learning_curves_png(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write_jsonl(
        metrics,
        [
            {
                "iteration": i,
                "losses/value_loss": 1.0 / (i + 1),
                "rollout/episode_score_mean": 0.1 * i,
                "time/collect": 2.0,
                "note": "x",
            }
            for i in range(5)
        ],
    )
    path = reports.plot_learning_curves(metrics, tmp_path / "curves.png", width_px=600, height_px=400)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (600, 400)
    assert reports.curve_keys(read_metrics(metrics)) == ["rollout/episode_score_mean", "losses/value_loss"]
    metrics.write_text('{"iteration": 1}\nnot json\n')
    with pytest.raises(ValueError, match=":2"):
        read_metrics(metrics)


def test_trajectory_picture_layout(tmp_path):
    rec = _episode(0, "object_counting", 0.9, 3, 1)
    frames = [np.full((32, 32, 3), 40 * t, np.uint8) for t in range(3)]
    topdown = np.zeros((100, 100, 3), np.uint8)
    layout = PictureLayout(tile=96, caption=60, map_size=128, header=40)
    path = reports.trajectory_picture(rec, frames, topdown, tmp_path / "t.png", layout)
    with Image.open(path) as im:
        assert im.size == (3 * 96 + 128, 40 + max(96 + 60, 128))
        px = np.asarray(im.convert("RGB"))
    # The second frame (value 40) fills the middle of the second tile.
    assert (px[40 + 48, 96 + 48] == 40).all()
    with pytest.raises(ValueError, match="one frame per turn"):
        reports.trajectory_picture(rec, frames[:2], topdown, tmp_path / "u.png", layout)


def test_nan_overall_is_written_as_null(tmp_path):
    path = reports.write_json({"overall": float("nan"), "x": [np.float32(1.5)]}, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["overall"] is None and data["x"] == [1.5]


# ------------------------------------------------------------------------------ paired comparison
def _scored(i: int, qtype: str, score: float, question: str = "q") -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=f"proc-{i:04d}",
        scene_id=f"scene{i}",
        dataset="procedural",
        question_type=qtype,
        question=f"{question} {i}",
        options=None,
        ground_truth="1",
        answer="1",
        score=score,
        turns=1,
    )


# Unbalanced on purpose: 3 counting, 1 room size, 2 + 1 relative-direction subtypes, 1 route plan.
_TYPES = ["object_counting"] * 3 + [
    "room_size_estimation",
    "object_rel_direction_easy",
    "object_rel_direction_easy",
    "object_rel_direction_hard",
    "route_planning",
]


def test_overall_weights_reproduce_the_task_balanced_overall():
    rng = np.random.default_rng(0)
    scores = rng.random(len(_TYPES))
    w = reports.overall_weights(_TYPES)
    assert w.sum() == pytest.approx(1.0)
    # 4 tasks; counting: 1/(4*1*3); rel. direction easy: 1/(4*2*2), hard: 1/(4*2*1).
    assert w[0] == pytest.approx(1 / 12) and w[4] == pytest.approx(1 / 16) and w[6] == pytest.approx(1 / 8)
    expected = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, scores))], name="x")[
        "overall"
    ]
    assert 100 * float(w @ scores) == pytest.approx(expected)


def test_paired_ci_is_the_difference_of_overalls_and_pairs_by_question_id():
    rng = np.random.default_rng(1)
    sa, sb = rng.random(len(_TYPES)), rng.random(len(_TYPES))
    a = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, sa))], name="ppo")
    b = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, sb))], name="sft")
    b["records"].reverse()  # order must not matter: questions pair by id
    res = reports.paired_overall_ci(a, b, names=("ppo", "sft"), n_boot=2000)
    assert res["diff"] == pytest.approx(a["overall"] - b["overall"])
    assert res["n"] == len(_TYPES) and res["low"] < res["diff"] < res["high"]
    assert res["a"] == "ppo" and res["b"] == "sft"
    # A's per-question scores all 0.2 above B's: every resample gives +20 points.
    c = reports.build_report([_scored(i, t, s + 0.2) for i, (t, s) in enumerate(zip(_TYPES, sb * 0.5))], name="c")
    d = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, sb * 0.5))], name="d")
    res = reports.paired_overall_ci(c, d, n_boot=500)
    assert (res["diff"], res["low"], res["high"]) == pytest.approx((20.0, 20.0, 20.0))


def test_pairing_rejects_different_question_sets():
    a = reports.build_report([_scored(i, "object_counting", 0.5) for i in range(4)], name="a")
    fewer = reports.build_report([_scored(i, "object_counting", 0.5) for i in range(3)], name="b")
    with pytest.raises(
        ValueError, match=r"not evaluated on the same questions: 1 only in a \(e.g. \['proc-0003'\]\), 0 only in b"
    ):
        reports.paired_overall_ci(a, fewer, names=("a", "b"))
    other = reports.build_report([_scored(i, "object_counting", 0.5, question="what") for i in range(4)], name="c")
    with pytest.raises(ValueError, match="question 'proc-0000' differs between a and c .question: 'q 0' vs 'what 0'"):
        reports.paired_overall_ci(a, other, names=("a", "c"))
    twice = dict(a, records=a["records"] + a["records"][:1])
    with pytest.raises(ValueError, match="1 duplicate"):
        reports.paired_overall_ci(twice, a)
    with pytest.raises(ValueError, match="no episode_id or id"):
        reports.question_key({"line": 3, "question_type": "route_planning", "score": 0.0})


def test_compare_writes_the_paired_section_for_the_named_rows(tmp_path):
    sa = [1.0, 0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 1.0]
    sb = [0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.0]
    for name, scores in (("tiny + SFT + PPO", sa), ("tiny + SFT", sb)):
        reports.write_report(
            reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, scores))], name=name),
            tmp_path / name.replace(" ", ""),
            plots=False,
        )
    paths = [tmp_path / "tiny+SFT+PPO" / "report.json", tmp_path / "tiny+SFT" / "report.json"]
    md = reports.compare_reports(paths, tmp_path / "cmp", paired=[("tiny + SFT + PPO", "tiny + SFT")])["md"].read_text()
    res = reports.paired_overall_ci(*[reports.load_report(p) for p in paths])
    assert "## Paired differences" in md and "10000 resamples" in md
    # Room size, hard relative direction and route plan have one question each.
    assert res["single_question_types"] == 3 and "**3 question type(s) have a single question**" in md
    assert f"| tiny + SFT + PPO - tiny + SFT | 8 | {res['diff']:+.1f} | [{res['low']:+.1f}, {res['high']:+.1f}] |" in md
    plain = reports.compare_reports(paths, tmp_path / "cmp2")["md"].read_text()
    assert "Paired" not in plain
    with pytest.raises(
        ValueError,
        match=r"--paired names \['ppo'\] are not rows of the comparison; rows: \['tiny \+ SFT \+ PPO', 'tiny \+ SFT'\]",
    ):
        reports.compare_reports(paths, tmp_path / "cmp3", paired=[("ppo", "tiny + SFT")])


def test_score_file_integrity_bom_encoding_duplicates_and_raw_ground_truth(tmp_path, caplog):
    """A UTF-8 BOM is not part of line 1; a Latin-1 file is refused naming the line; repeated ids
    are scored, warned about and listed; a stored ground truth " c " matches nothing (the official
    rule compares it unstripped)."""
    from a2c_ppo_acktr.common.jsonl import JsonlError

    rows = [
        {"id": 1, "question_type": "object_rel_direction_easy", "prediction": "C", "ground_truth": "C"},
        {"id": 2, "question_type": "object_rel_direction_easy", "prediction": "C", "ground_truth": " c "},
        {"id": 1, "question_type": "object_rel_direction_easy", "prediction": "A", "ground_truth": "C"},
    ]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in rows).encode("utf-8") + b"\n")
    with caplog.at_level("WARNING"):
        rep = reports.score_file(path)
    assert rep["malformed"]["count"] == 0 and [r["score"] for r in rep["records"]] == [1.0, 0.0, 0.0]
    assert rep["duplicate_ids"] == {"count": 1, "lines": {"1": [1, 3]}} and "appear more than once" in caplog.text
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes((json.dumps(rows[0]) + "\n").encode() + '{"question_type": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(JsonlError, match=r"latin\.jsonl:2 is not UTF-8 \(invalid"):
        reports.score_file(latin)


# ------------------------------------------------------------------------------- report intervals
def _exact_quantile(atoms: dict, p: float) -> float:
    """Smallest value whose probability mass at or below it reaches p (a discrete distribution's quantile)."""
    total = 0.0
    for v in sorted(atoms):
        total += atoms[v]
        if total >= p - 1e-12:
            return v
    return max(atoms)


def test_ci_matches_the_exact_bootstrap_distribution():
    """A question set small enough to enumerate every resample: 3 counting x 2 route x 2 easy x 1 hard
    questions give 27 * 4 * 4 * 1 = 432 equally likely resamples, each aggregated by scoring.aggregate
    (not the code under test). The seeded Monte Carlo interval must sit within the exact 2-3% and
    97-98% quantiles, for Overall and for every task."""
    import itertools

    from a2c_ppo_acktr.common import scoring

    by_type = {
        "object_counting": [0.0, 0.5, 1.0],
        "route_planning": [0.0, 1.0],
        "object_rel_direction_easy": [1.0, 0.0],
        "object_rel_direction_hard": [0.0],
    }
    recs = [_scored(i, t, s) for i, (t, s) in enumerate((t, s) for t, ss in by_type.items() for s in ss)]
    recs = recs[::2] + recs[1::2]  # interleave the types: grouping must not depend on record order
    rep = reports.build_report(recs, name="x")
    types = list(by_type)
    draws = [list(itertools.product(by_type[t], repeat=len(by_type[t]))) for t in types]
    dist: dict[str, dict[float, float]] = {}
    for combo in itertools.product(*draws):
        agg = scoring.aggregate((t, s) for t, sample in zip(types, combo) for s in sample)
        values = {
            "overall": agg["overall"],
            **{reports.SHORT_TASK_NAMES[k]: 100 * v for k, v in agg["per_task"].items()},
        }
        for key, v in values.items():
            atoms = dist.setdefault(key, {})
            atoms[round(v, 9)] = atoms.get(round(v, 9), 0.0) + 1 / 432
    ci = rep["ci95"]
    assert ci["n_boot"] == 10000 and ci["seed"] == 0 and ci["confidence"] == 0.95
    got = {"overall": ci["overall"], **{k: v for k, v in ci["table"].items() if v is not None}}
    assert set(got) == set(dist) == {"overall", "Obj. Count", "Route Plan", "Rel. Dir."}
    for key, (low, high) in got.items():
        atoms = dist[key]
        assert _exact_quantile(atoms, 0.02) - 1e-9 <= low <= _exact_quantile(atoms, 0.03) + 1e-9, (key, low)
        assert _exact_quantile(atoms, 0.97) - 1e-9 <= high <= _exact_quantile(atoms, 0.98) + 1e-9, (key, high)
    assert ci["table"]["Abs. Dist."] is None and ci["single_question_types"] == 1
    assert rep["table_n"] == {
        "Obj. Count": 3,
        "Abs. Dist.": 0,
        "Obj. Size": 0,
        "Room Size": 0,
        "Rel. Dist.": 0,
        "Rel. Dir.": 3,
        "Route Plan": 2,
        "Appr. Order": 0,
    }


def test_ci_of_equal_scores_has_zero_width_and_overall_matches_the_paired_interval():
    # Closed form: every question of every type scores the same, so every resample gives the same numbers.
    flat = reports.build_report([_scored(i, t, 0.3) for i, t in enumerate(_TYPES)], name="flat")
    assert flat["ci95"]["overall"] == pytest.approx([30.0, 30.0])
    assert all(v == pytest.approx([30.0, 30.0]) for v in flat["ci95"]["table"].values() if v is not None)
    # Two implementations of one scheme: the report's Overall interval is the paired interval
    # against a system that scores 0 everywhere (same resamples: same seed, same strata order).
    rng = np.random.default_rng(5)
    scores = rng.random(len(_TYPES))
    a = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, scores))], name="a")
    zero = reports.build_report([_scored(i, t, 0.0) for i, t in enumerate(_TYPES)], name="zero")
    paired = reports.paired_overall_ci(a, zero)
    assert a["ci95"]["overall"] == pytest.approx([paired["low"], paired["high"]], abs=1e-9)
    assert a["ci95"]["overall"][0] < a["overall"] < a["ci95"]["overall"][1]
    # Deterministic: the same records give the same intervals.
    again = reports.build_report([_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, scores))], name="a")
    assert again["ci95"] == a["ci95"]


def test_ci_in_markdown_and_old_reports_still_load_and_compare(tmp_path):
    rng = np.random.default_rng(2)
    new = reports.build_report(
        [_scored(i, t, s) for i, (t, s) in enumerate(zip(_TYPES, rng.random(len(_TYPES))))], name="new"
    )
    reports.write_report(new, tmp_path / "new", plots=False)
    md = (tmp_path / "new" / "report.md").read_text()
    lo, hi = new["ci95"]["overall"]
    assert f"| new | {new['overall']:.1f} [{lo:.1f}, {hi:.1f}] n=8 |" in md
    cnt = new["ci95"]["table"]["Obj. Count"]
    assert f"| {new['table']['Obj. Count']:.1f} [{cnt[0]:.1f}, {cnt[1]:.1f}] n=3 |" in md and "| - n=0 |" in md
    # The main table keeps its format (docs/EVAL.md and the tests above read it).
    assert f"| new | {new['overall']:.1f} | " in md
    # A report written before intervals existed: no ci95, no table_n.
    old = json.loads((tmp_path / "new" / "report.json").read_text())
    old["name"] = "old"
    for key in ("ci95", "table_n"):
        del old[key]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps(old))
    loaded = reports.load_report(tmp_path / "old")
    assert loaded["ci95"] == new["ci95"] and reports.report_counts(loaded) == new["table_n"]
    # ... and one without records: it compares, without intervals.
    del old["records"]
    old["name"] = "bare"
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "report.json").write_text(json.dumps(old))
    out = reports.compare_reports(
        [tmp_path / "old", tmp_path / "new" / "report.json", tmp_path / "bare"], tmp_path / "cmp"
    )
    cmp_md = out["md"].read_text()
    assert f"| old | {new['overall']:.1f} [{lo:.1f}, {hi:.1f}] n=8 |" in cmp_md
    assert f"| bare | {new['overall']:.1f} n=8 |" in cmp_md
    assert "**Question types with a single question**" in cmp_md


def _numeric(i: int, qtype: str, truth: str, answer: str) -> EpisodeRecord:
    return dataclasses.replace(
        _scored(i, qtype, scoring.score_prediction(qtype, answer, truth)), ground_truth=truth, answer=answer
    )


def test_best_constant_row_scores_each_types_one_answer_on_the_same_questions(tmp_path):
    """--best-constant adds a row that answers every question of a type with that type's best constant,
    chosen on these questions; it pairs with the policies' rows by question id."""
    truths = {"room_size_estimation": ["10", "20", "10", "40"], "route_planning": ["A", "B", "B", "C"]}
    recs, k = [], 0
    for qtype, gts in truths.items():
        for gt in gts:  # the policy answers the truth on even ids and a wrong value on odd ones
            right = k % 2 == 0
            recs.append(_numeric(k, qtype, gt, gt if right else ("D" if qtype == "route_planning" else "1")))
            k += 1
    policy = reports.build_report(recs, name="policy")
    reports.write_report(policy, tmp_path / "policy", plots=False)
    row = reports.best_constant_report(policy)
    # Room size: 10 scores 1 + 0.1 + 1 + 0 = 2.1 of 4 (20 scores 0 + 1 + 0 + 0.5); route plan: B, 2 of 4.
    assert row["meta"]["best_constant"] == {"room_size_estimation": "10", "route_planning": "B"}
    assert row["per_type"] == pytest.approx({"room_size_estimation": 2.1 / 4, "route_planning": 0.5})
    assert [r["answer"] for r in row["records"]] == ["10"] * 4 + ["B"] * 4
    md = reports.compare_reports(
        [tmp_path / "policy" / "report.json"],
        tmp_path / "cmp",
        best_constant=True,
        paired=[("policy", reports.BEST_CONSTANT_ROW)],
    )["md"].read_text()
    diff = reports.paired_overall_ci(policy, row)["diff"]
    assert (
        f"| {reports.BEST_CONSTANT_ROW} |" in md and f"| policy - {reports.BEST_CONSTANT_ROW} | 8 | {diff:+.1f} |" in md
    )
    assert "(room_size_estimation 10, route_planning B)" in md
    with pytest.raises(ValueError, match="already named"):
        reports.compare_reports(
            [tmp_path / "policy" / "report.json"],
            tmp_path / "cmp2",
            names=[reports.BEST_CONSTANT_ROW],
            best_constant=True,
        )

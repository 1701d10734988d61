"""Reports of game episodes (gym-cards, MiniGrid, Sokoban): success rate with its Wilson interval, mean
return, episode length, invalid-output rate; markdown, files, comparisons, plots and pictures; and
VSI reports left as they were.

Expected numbers are worked out by hand from the hand-made episodes below.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from PIL import Image

from a2c_ppo_acktr import reports
from a2c_ppo_acktr.reports import EpisodeRecord, PictureLayout, TurnRecord

# The normal 0.975 quantile.
Z95 = 1.959963984540054


def _game(
    i: int, task: str, won: bool, turns: int, invalid: int, ret: float, truncated: bool = False, prefix: str = "game"
) -> EpisodeRecord:
    """A game episode as evaluation records it: no answer, options, ground truth or pose."""
    steps = [
        TurnRecord(
            turn=t + 1,
            text="{}" if t < invalid else '{"action": "+"}',
            thoughts="",
            action="invalid(no JSON object)" if t < invalid else "+",
            valid=t >= invalid,
            reward=0.0,
            pose=None,
        )
        for t in range(turns)
    ]
    return EpisodeRecord(
        episode_id=f"{prefix}-{i:04d}",
        scene_id=f"seed-{i}",
        dataset=task,
        question_type=task,
        question="Move the current number to the target.",
        options=None,
        ground_truth="",
        answer=None,
        score=1.0 if won else 0.0,
        turns=turns,
        num_invalid=invalid,
        reward=ret,
        truncated=truncated,
        object_ids=[],
        steps=steps,
    )


def _numberline(prefix: str = "game", won: int = 7) -> list[EpisodeRecord]:
    """10 NumberLine episodes: ``won`` of them won in 2 turns (return 1.0; the first with 1 invalid
    turn), the others lost in 5 turns (return -0.5; two with 1 invalid turn, the last truncated)."""
    recs = []
    for i in range(10):
        if i < won:
            recs.append(_game(i, "numberline", True, 2, int(i == 0), 1.0, prefix=prefix))
        else:
            recs.append(_game(i, "numberline", False, 5, int(i < won + 2), -0.5, truncated=i == 9, prefix=prefix))
    return recs


def _wilson(k: int, n: int) -> list[float]:
    """The Wilson score interval in points, written out once more in the test."""
    p = k / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 / (1 + Z95**2 / n) * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n))
    return [100 * max(0.0, centre - half), 100 * min(1.0, centre + half)]


# ------------------------------------------------------------------------------------ the numbers
def test_wilson_interval_matches_published_values():
    # Wilson (1927); the values every textbook table gives for 95%.
    assert reports.wilson_interval(7, 10) == pytest.approx((0.3968, 0.8922), abs=5e-5)
    assert reports.wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)
    assert reports.wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert reports.wilson_interval(1, 2) == pytest.approx((0.0945, 0.9055), abs=5e-5)
    for k, n in ((0, 1), (3, 7), (50, 100)):
        assert [100 * v for v in reports.wilson_interval(k, n)] == pytest.approx(_wilson(k, n), abs=1e-9)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        reports.wilson_interval(3, 2)


def test_game_report_numbers_in_closed_form():
    rep = reports.build_report(_numberline(), name="ppo", meta={"env": "gym_cards/NumberLine-v0"})
    assert rep["mode"] == "episodes" and rep["kind"] == "game" and rep["meta"] == {"env": "gym_cards/NumberLine-v0"}
    # 7 of 10 won.
    assert rep["overall"] == pytest.approx(70.0)
    assert rep["per_type"] == rep["per_task"] == {"numberline": pytest.approx(0.7)}
    assert rep["counts"] == rep["table_n"] == {"numberline": 10}
    assert rep["table"] == {"numberline": pytest.approx(70.0)}
    assert rep["tasks_present"] == ["numberline"] and rep["tasks_missing"] == []
    ci = rep["ci95"]
    assert ci["confidence"] == 0.95 and "Wilson" in ci["scheme"]
    assert ci["overall"] == pytest.approx(_wilson(7, 10), abs=1e-9) == ci["table"]["numberline"]
    assert ci["overall"] == pytest.approx([39.68, 89.22], abs=5e-3)
    # Turns: 7 x 2 + 3 x 5 = 29; invalid turns 1 + 2 = 3; return (7 x 1.0 - 3 x 0.5) / 10 = 0.55.
    m = rep["task_metrics"]["numberline"]
    assert m == {
        "num_episodes": 10,
        "success_rate": pytest.approx(0.7),
        "mean_reward": pytest.approx(0.55),
        "mean_turns": pytest.approx(2.9),
        "invalid_output_rate": pytest.approx(3 / 29),
        "truncation_rate": pytest.approx(0.1),
    }
    agent = rep["agent"]
    assert agent == reports.agent_metrics(_numberline())
    assert (
        agent["success_rate"] == pytest.approx(0.7)
        and agent["answer_rate"] == 0.0
        and agent["mean_reward"] == pytest.approx(0.55)
    )
    assert rep["overall"] == pytest.approx(100 * agent["success_rate"])
    # Records keep the game's fields as given: no answer, no options, no pose.
    rec = rep["records"][0]
    assert (
        rec["answer"] is None
        and rec["options"] is None
        and rec["ground_truth"] == ""
        and rec["steps"][0]["pose"] is None
    )
    assert rec["actions"] == ["invalid(no JSON object)", "+"]


def test_several_tasks_pool_the_overall_and_list_tasks_in_game_order():
    # Blackjack first on purpose: tasks are listed in GAME_TASKS order (numberline before blackjack).
    bj = [_game(100 + i, "blackjack", i < 1, 1, 0, 1.0 if i < 1 else -1.0) for i in range(4)]  # 1 of 4 won
    rep = reports.build_report(bj + _numberline(), name="mix")
    assert rep["tasks_present"] == ["numberline", "blackjack"] and list(rep["table"]) == ["numberline", "blackjack"]
    # Pooled: (7 + 1) / 14, not the task mean (0.7 + 0.25) / 2.
    assert rep["overall"] == pytest.approx(100 * 8 / 14)
    assert rep["table"]["blackjack"] == pytest.approx(25.0)
    assert rep["ci95"]["overall"] == pytest.approx(_wilson(8, 14), abs=1e-9)
    assert rep["ci95"]["table"]["blackjack"] == pytest.approx(_wilson(1, 4), abs=1e-9)
    assert rep["task_metrics"]["blackjack"]["mean_reward"] == pytest.approx(-0.5)
    # The table gets an "all" line: 14 episodes, mean return (5.5 - 2) / 14, turns (29 + 4) / 14,
    # invalid 3 / 33, truncated 1 / 14.
    md = reports.report_markdown(rep)
    lo, hi = _wilson(8, 14)
    assert (
        f"| mix | all | 14 | {100 * 8 / 14:.1f} [{lo:.1f}, {hi:.1f}] | {3.5 / 14:.2f} | {33 / 14:.2f} | "
        f"{100 * 3 / 33:.1f} | {100 / 14:.1f} |" in md
    )
    lo, hi = _wilson(1, 4)
    assert f"| mix | blackjack | 4 | 25.0 [{lo:.1f}, {hi:.1f}] | -0.50 | 1.00 | 0.0 | 0.0 |" in md
    # Weights of the paired difference reproduce the pooled overall.
    w = reports.overall_weights([r["question_type"] for r in rep["records"]])
    assert w == pytest.approx(np.full(14, 1 / 14))


def test_a_mix_of_vsi_and_game_records_makes_a_game_report(caplog):
    vsi = EpisodeRecord(
        episode_id="proc-0000",
        scene_id="s",
        dataset="procedural",
        question_type="route_planning",
        question="q",
        options=["A. x", "B. y"],
        ground_truth="A",
        answer="A",
        score=1.0,
        turns=1,
    )
    with caplog.at_level(logging.WARNING):
        rep = reports.build_report([vsi, *_numberline()], name="odd")
    assert rep["kind"] == "game" and "mixes VSI-Bench question types" in caplog.text
    assert rep["table"] == {"numberline": pytest.approx(70.0), "route_planning": pytest.approx(100.0)}
    assert rep["overall"] == pytest.approx(100 * 8 / 11)
    assert "| odd | route_planning | 1 | 100.0" in reports.report_markdown(rep)


def test_game_scores_outside_0_1_are_refused():
    bad = _game(0, "sokoban", True, 3, 0, 10.0)
    bad.score = 10.0
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        reports.build_report([bad], name="x")


# ----------------------------------------------------------------------------------- markdown
def test_game_markdown_shows_success_ci_return_length_and_invalid_rate():
    rep = reports.build_report(_numberline(), name="ppo")
    md = reports.report_markdown(rep)
    assert md.startswith("# Game evaluation: ppo\n")
    assert (
        "| Method | Task | n | Success (%) [95% CI] | Mean return | Mean length (turns) | Invalid outputs (%) | "
        "Truncated (%) |" in md
    )
    # 70.0 [39.7, 89.2]; return 0.55; 2.90 turns; 3 / 29 = 10.3% invalid; 1 of 10 truncated.
    assert "| ppo | numberline | 10 | 70.0 [39.7, 89.2] | 0.55 | 2.90 | 10.3 | 10.0 |" in md
    assert "Wilson score interval" in md
    # Invalid outputs are listed as for VSI; nothing VSI-specific is shown.
    assert "| 3 | no JSON object | `{}` |" in md
    for vsi_only in ("Obj. Count", "Overall", "answer rate", "question_type", "Per question type"):
        assert vsi_only not in md, vsi_only
    # What eval_vsi prints after a run: the game table, and no VSI agent table.
    assert (
        reports.table_markdown([("ppo", rep)]).splitlines()[2]
        == "| ppo | numberline | 10 | 70.0 [39.7, 89.2] | 0.55 | 2.90 | 10.3 | 10.0 |"
    )
    assert reports.agent_metrics_markdown([("ppo", rep)]) == ""
    assert reports.ci_table_markdown([("ppo", rep)]) == reports.game_table_markdown([("ppo", rep)])


# -------------------------------------------------------------------------------- files, plots
def test_write_report_writes_the_game_files_and_load_report_reads_them(tmp_path):
    rep = reports.build_report(_numberline(), name="ppo")
    paths = reports.write_report(rep, tmp_path / "ppo")
    assert set(paths) == {"json", "md", "tasks_png"}
    loaded = reports.load_report(tmp_path / "ppo")
    assert loaded["kind"] == "game" and loaded["overall"] == pytest.approx(70.0) and loaded["ci95"] == rep["ci95"]
    assert loaded["records"][3]["steps"][0]["pose"] is None
    assert (tmp_path / "ppo" / "report.md").read_text() == reports.report_markdown(rep)
    with Image.open(paths["tasks_png"]) as im:
        assert im.format == "PNG" and im.size == (1000, 450)
    # A game report.json without ci95 gets the same intervals back from its records.
    data = json.loads((tmp_path / "ppo" / "report.json").read_text())
    del data["ci95"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps(data))
    assert reports.load_report(tmp_path / "old")["ci95"] == rep["ci95"]


def test_game_bar_chart_has_one_bar_per_task_with_wilson_error_bars():
    rep = reports.build_report(_numberline(), name="ppo")
    ax = reports.task_bars_figure([("ppo", rep)]).axes[0]
    assert [t.get_text() for t in ax.texts] == ["70.0"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["numberline\nn=10"]
    assert ax.get_ylabel() == "success rate (%)" and "Wilson" in ax.get_title()
    segs = [c.lines[2][0].get_segments()[0] for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    lo, hi = _wilson(7, 10)
    assert len(segs) == 1 and segs[0][0][1] == pytest.approx(lo) and segs[0][1][1] == pytest.approx(hi)
    # Two reports of other games: the union of the tasks, "n/a" where a report has no episodes of a task.
    lost = reports.build_report([_game(i, "sokoban", False, 3, 0, -1.0) for i in range(3)], name="sokoban")
    ax2 = reports.task_bars_figure([("ppo", rep), ("sokoban", lost)]).axes[0]
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["numberline\nn=10/0", "sokoban\nn=0/3"]
    assert sorted(t.get_text() for t in ax2.texts) == ["0.0", "70.0", "n/a", "n/a"]
    # A report of several tasks gets an "All" column first.
    mix = reports.build_report(_numberline() + [_game(99, "sokoban", True, 3, 0, 10.0)], name="mix")
    ax3 = reports.task_bars_figure([("mix", mix)]).axes[0]
    assert [t.get_text() for t in ax3.get_xticklabels()] == ["All\nn=11", "numberline\nn=10", "sokoban\nn=1"]


# --------------------------------------------------------------------------------- comparison
def test_comparison_of_two_game_reports(tmp_path):
    ppo = reports.build_report(_numberline(won=7), name="ppo")
    sft = reports.build_report(_numberline(won=4), name="sft")  # the same 10 episodes, 4 won
    for r in (ppo, sft):
        reports.write_report(r, tmp_path / r["name"])
    out = reports.compare_reports([tmp_path / "ppo", tmp_path / "sft"], tmp_path / "cmp", paired=[("ppo", "sft")])
    md = out["md"].read_text()
    assert md.startswith("# Game evaluation: comparison\n")
    assert "| ppo | numberline | 10 | 70.0 [39.7, 89.2] |" in md
    lo, hi = _wilson(4, 10)
    # sft: 4 won in 2 turns, 6 lost in 5: return (4 - 3) / 10, turns 38 / 10, invalid 3 / 38.
    assert f"| sft | numberline | 10 | 40.0 [{lo:.1f}, {hi:.1f}] | 0.10 | 3.80 | {300 / 38:.1f} | 10.0 |" in md
    assert "Obj. Count" not in md and "Agent metrics" not in md
    # Paired by episode id: episodes 4, 5 and 6 are won by ppo only, so the difference is exactly +30
    # and every resample's difference lies in [0, 100].
    res = reports.paired_overall_ci(ppo, sft, names=("ppo", "sft"))
    assert (
        res["diff"] == pytest.approx(30.0) and res["measure"] == "success" and 0.0 <= res["low"] <= 30.0 <= res["high"]
    )
    assert f"| ppo - sft | 10 | +30.0 | [{res['low']:+.1f}, {res['high']:+.1f}] |" in md and "Success diff" in md
    with Image.open(out["png"]) as im:
        assert im.format == "PNG" and im.size == (1000, 450)


def test_comparison_of_a_vsi_and_a_game_report_shows_both(tmp_path):
    vsi = reports.build_report(
        [
            EpisodeRecord(
                episode_id="proc-0000",
                scene_id="s",
                dataset="procedural",
                question_type="object_counting",
                question="How many chairs?",
                options=None,
                ground_truth="2",
                answer="2",
                score=1.0,
                turns=1,
            )
        ],
        name="vsi",
    )
    game = reports.build_report(_numberline(), name="game")
    reports.write_report(vsi, tmp_path / "vsi", plots=False)
    reports.write_report(game, tmp_path / "game", plots=False)
    out = reports.compare_reports([tmp_path / "vsi", tmp_path / "game"], tmp_path / "cmp")
    md = out["md"].read_text()
    assert md.startswith("# Evaluation: comparison\n") and "| vsi | 100.0 |" in md and "## Games" in md
    assert "| game | numberline | 10 | 70.0 [39.7, 89.2] |" in md and "| game | 70.0 |" not in md
    ax = reports.task_bars_figure([("vsi", vsi), ("game", game)]).axes[0]
    ticks = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    assert ticks == ["Overall", *reports.SHORT_TASK_NAMES.values(), "numberline"]


# --------------------------------------------------------------------------------- VSI unchanged
def test_vsi_reports_keep_their_keys_and_format():
    recs = [
        EpisodeRecord(
            episode_id=f"proc-{i:04d}",
            scene_id="s",
            dataset="procedural",
            question_type=t,
            question="q",
            options=None,
            ground_truth="2",
            answer="2",
            score=s,
            turns=1,
            steps=[TurnRecord(1, "{}", "", "answer(2)", True, s, (0.0, 1.0, 90.0))],
        )
        for i, (t, s) in enumerate([("object_counting", 1.0), ("route_planning", 0.0)])
    ]
    rep = reports.build_report(recs, name="v")
    assert list(rep) == [
        "name",
        "mode",
        "kind",
        "meta",
        "per_type",
        "per_task",
        "overall",
        "counts",
        "tasks_present",
        "tasks_missing",
        "table",
        "table_n",
        "ci95",
        "agent",
        "records",
    ]
    assert rep["kind"] == "vsi" and reports.report_kind(rep) == "vsi" and "task_metrics" not in rep
    assert reports.report_kind({k: v for k, v in rep.items() if k != "kind"}) == "vsi"  # older reports
    assert list(rep["table"]) == list(reports.SHORT_TASK_NAMES.values()) and rep["overall"] == pytest.approx(50.0)
    assert rep["records"][0]["steps"][0]["pose"] == (0.0, 1.0, 90.0)
    md = reports.report_markdown(rep)
    assert md.startswith("# VSI evaluation: v\n") and "| v | 50.0 | 100.0 |" in md and "Success (%)" not in md
    assert "## Agent metrics" in md and reports.agent_metrics_markdown([("v", rep)])
    ax = reports.task_bars_figure([("v", rep)]).axes[0]
    assert ax.get_ylabel() == "score (x100)" and "bootstrap" in ax.get_title()
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == [
        "Overall",
        *reports.SHORT_TASK_NAMES.values(),
    ]
    assert "measure" not in reports.paired_overall_ci(rep, rep, n_boot=10)


# ----------------------------------------------------------------------------------- pictures
def test_game_picture_with_no_pose_renders_the_state_image_and_says_won_or_lost(tmp_path):
    rec = _numberline()[9]  # lost on the turn limit, 5 turns, none invalid
    assert all(s.pose is None for s in rec.steps)
    assert reports.picture_header(rec) == (
        "[numberline] Move the current number to the target.",
        "lost (turn limit)   return: -0.50   turns: 5   invalid: 0",
    )
    assert reports.picture_header(_numberline()[0])[1] == "won   return: 1.00   turns: 2   invalid: 1"
    assert (
        reports.picture_header(_game(0, "sokoban", False, 2, 0, -0.2))[1]
        == "lost   return: -0.20   turns: 2   invalid: 0"
    )
    layout = PictureLayout(tile=64, caption=40, map_size=128, header=40)
    frames = [np.full((20, 20, 3), 30 * t, np.uint8) for t in range(5)]
    state = np.zeros((10, 20, 3), np.uint8)
    state[..., 0] = 200  # a red 20x10 state image: fitted to 128x64, centred in the 128 square
    path = reports.trajectory_picture(rec, frames, state, tmp_path / "g.png", layout)
    with Image.open(path) as im:
        assert im.size == layout.size(5) == (5 * 64 + 128, 40 + 128)
        px = np.asarray(im.convert("RGB"))
    x0 = 5 * 64
    assert tuple(px[40 + 64, x0 + 64]) == (200, 0, 0)  # centre of the map square: the state image
    assert tuple(px[40 + 5, x0 + 64]) == (255, 255, 255)  # above it: the white margin
    assert tuple(px[40 + 32, x0 + 1]) == (200, 0, 0) and tuple(px[40 + 95, x0 + 126]) == (200, 0, 0)
    # The logged samples table copes with a game episode too.
    cols, rows = reports.sample_table([rec])
    assert rows[0][cols.index("answer")] is None and rows[0][cols.index("question_type")] == "numberline"

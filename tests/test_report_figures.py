"""What people read: bar charts with values, n and intervals; integer learning-curve ticks and
smoothing; top-down labels that never overlap; invalid turns' raw text; pictures and tables in
tensorboard and wandb (issue: "reports people read")."""

from __future__ import annotations

import itertools
import json
import sys
import types

import numpy as np
import pytest

from a2c_ppo_acktr import reports
from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.envs import topdown
from a2c_ppo_acktr.envs.renderer import Pose
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject
from a2c_ppo_acktr.run.logger import RunLogger
from a2c_ppo_acktr.reports import EpisodeRecord, PictureLayout, TurnRecord


def _rec(i: int, qtype: str, score: float, steps=()) -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=f"proc-{i:04d}",
        scene_id=f"s{i}",
        dataset="procedural",
        question_type=qtype,
        question=f"q {i}",
        options=None,
        ground_truth="1",
        answer="1",
        score=score,
        turns=max(len(steps), 1),
        steps=list(steps),
    )


# ------------------------------------------------------------------------------------ bar charts
def test_task_bars_carry_values_n_intervals_and_show_zero_bars():
    # a: 4 counting questions (mean 0.5), 2 route-plan questions both wrong (an all-zero bar).
    a = reports.build_report(
        [_rec(i, "object_counting", s) for i, s in enumerate([1.0, 0.0, 1.0, 0.0])]
        + [_rec(10 + i, "route_planning", 0.0) for i in range(2)],
        name="a",
    )
    # b: the same counting questions, one route-plan question.
    b = reports.build_report(
        [_rec(i, "object_counting", 0.25) for i in range(4)] + [_rec(10, "route_planning", 1.0)], name="b"
    )
    ax = reports.task_bars_figure([("a", a)]).axes[0]
    texts = [t.get_text() for t in ax.texts]
    # Overall 25.0, Obj. Count 50.0, Route Plan 0.0, and "n/a" for the 6 tasks without questions.
    assert sorted(texts) == sorted(["25.0", "50.0", "0.0"] + ["n/a"] * 6)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert (
        ticks[0] == "Overall\nn=6"
        and ticks[1] == "Obj. Count\nn=4"
        and ticks[7] == "Route Plan\nn=2"
        and ticks[2] == "Abs. Dist.\nn=0"
    )
    # The zero bar is drawn as a stroke at the baseline, in the bar's colour, the width of the bar.
    strokes = [ln for ln in ax.lines if list(ln.get_ydata()) == [0.0, 0.0]]
    assert len(strokes) == 1 and np.ptp(strokes[0].get_xdata()) == pytest.approx(0.8)
    # Error bars: one per bar with an interval (Overall, Obj. Count, Route Plan), spanning ci95.
    segs = [c.lines[2][0].get_segments()[0] for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(segs) == 3
    lo, hi = a["ci95"]["table"]["Obj. Count"]
    assert any(seg[0][1] == pytest.approx(lo) and seg[1][1] == pytest.approx(hi) for seg in segs)
    # Two reports that differ in n: one count per report; several rows keep every value label.
    ax2 = reports.task_bars_figure([("a", a), ("b", b)]).axes[0]
    assert [t.get_text() for t in ax2.get_xticklabels()][7] == "Route Plan\nn=2/1"
    assert sum(t.get_text() != "n/a" for t in ax2.texts) == 6


# ------------------------------------------------------------------------------- learning curves
def test_learning_curves_have_integer_ticks_and_optional_ema():
    rows = [{"iteration": i, "rollout/episode_score_mean": float(i % 2), "losses/value_loss": 1.0} for i in range(1, 5)]
    # Two iterations: matplotlib's default locator would tick 1.0, 1.5, 2.0.
    fig = reports.learning_curves_figure(rows[:2])
    fig.canvas.draw()
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    smooth = reports.learning_curves_figure(rows, smoothing=0.5, width_px=600, height_px=400)
    raw, ema = smooth.axes[0].lines
    # Debiased EMA by hand, weight 0.5 on 1, 0, 1, 0: m = 0.5, 0.25, 0.625, 0.3125 over 1 - 0.5^(t+1).
    expected = [0.5 / 0.5, 0.25 / 0.75, 0.625 / 0.875, 0.3125 / 0.9375]
    assert list(raw.get_ydata()) == [1.0, 0.0, 1.0, 0.0] and np.allclose(ema.get_ydata(), expected)
    assert np.allclose(reports.ema_smooth([3.0] * 6, 0.9), 3.0)  # a constant stays constant (bias corrected)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        reports.learning_curves_figure(rows, smoothing=1.0)


# ----------------------------------------------------------------------------- label placement
def _assert_disjoint(boxes):
    for p, q in itertools.combinations(boxes, 2):
        assert not p.intersects(q), (p, q)


def test_place_labels_never_overlap_and_drop_only_when_full():
    rng = np.random.default_rng(0)
    anchors = [tuple(v) for v in 200 + 30 * rng.standard_normal((60, 2))]  # a crowded cluster
    variants = [[("long label", 60.0, 10.0), ("ab", 14.0, 10.0)] for _ in anchors]
    bounds = topdown.LabelBox(0, 0, 400, 400)
    placed = topdown.place_labels(anchors, variants, bounds)
    boxes = [p.box for p in placed if p.box is not None]
    _assert_disjoint(boxes)
    assert all(b.inside(bounds) for b in boxes)
    assert placed[0].text == "long label" and not placed[0].displaced  # the first label sits on its anchor
    assert any(p.displaced for p in placed) and len(boxes) >= 40
    # Every label at one point in a small box: the few that fit are placed, the rest dropped.
    tiny = topdown.place_labels([(50.0, 50.0)] * 30, [[("x", 20.0, 10.0)]] * 30, topdown.LabelBox(0, 0, 100, 100))
    kept = [p.box for p in tiny if p.box is not None]
    _assert_disjoint(kept)
    assert 1 < len(kept) < 30 and all(p.text is None for p in tiny if p.box is None)


def _crowded_scene(n: int = 24) -> Scene:
    poly = np.array([[0, 0], [4, 0], [4, 4], [0, 4]], dtype=float)
    mb = MeshBuilder()
    mb.add_flat_polygon(poly, 0.0, (0.6, 0.6, 0.6))
    rng = np.random.default_rng(1)
    objs = [
        SceneObject.upright(
            i,
            ("chair", "trash can", "bookshelf")[i % 3],
            (1.6 + 0.8 * rng.random(), 1.6 + 0.8 * rng.random(), 0.4),
            (0.15, 0.15, 0.8),
        )
        for i in range(n)
    ]
    for o in objs:
        mb.add_object_box(o, (0.5, 0.3, 0.2))
    v, t, c, i = mb.build()
    return Scene("crowd", "procedural", v, t, c, i, objs, poly, 3.0)


def test_topdown_labels_of_a_crowded_scene_do_not_overlap():
    scene = _crowded_scene()
    fig, placements = topdown.topdown_figure(scene, path=[Pose(0.5, 0.5, 45.0)], highlight_ids=[5], size=384)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # Read the drawn labels back from the figure (their background boxes, as matplotlib rendered them).
    drawn = [t for t in fig.axes[0].texts]
    assert len(drawn) == sum(p.box is not None for p in placements) >= 12
    extents = [t.get_bbox_patch().get_window_extent(renderer) for t in drawn]
    _assert_disjoint([topdown.LabelBox(e.x0, e.y0, e.x1, e.y1) for e in extents])
    # The question's object is labelled first, in full, on its own spot.
    assert placements[0].index == 5 and placements[0].text == "bookshelf 5" and not placements[0].displaced
    assert topdown.render_topdown(scene, size=128).shape == (128, 128, 3)


# ------------------------------------------------------------------------- invalid turns' raw text
def test_invalid_turn_caption_shows_the_raw_output_wrapped_and_cut():
    layout = PictureLayout(tile=192, caption=150)
    raw = 'I will move\nleft "now" ' + "blah " * 80
    bad = TurnRecord(
        turn=2, text=raw, thoughts="", action="invalid(no JSON object)", valid=False, reward=-0.1, pose=(0.0, 0.0, 0.0)
    )
    lines = reports.turn_caption(bad, layout)
    chars, max_lines = 192 // 6, (150 - 4) // 13
    assert lines[0] == "2: invalid(no JSON object)" and len(lines) <= max_lines and all(len(s) <= chars for s in lines)
    shown = " ".join(lines[1:])
    # JSON-escaped (newline and quotes visible), cut with "...".
    assert shown.startswith('raw: "I will move\\nleft \\"now\\" blah') and shown.endswith("...")
    ok = TurnRecord(
        turn=1,
        text="{}",
        thoughts="look left",
        action="move(rot=30, fwd=0)",
        valid=True,
        reward=0.0,
        pose=(0.0, 0.0, 0.0),
    )
    assert reports.turn_caption(ok, layout) == ["1: move(rot=30, fwd=0)", "look left"]
    empty = TurnRecord(
        turn=3, text="", thoughts="", action="invalid(empty)", valid=False, reward=-0.1, pose=(0.0, 0.0, 0.0)
    )
    assert reports.turn_caption(empty, layout) == ["3: invalid(empty)", 'raw: ""']


# ---------------------------------------------------------------------------- tensorboard, wandb
def test_logger_writes_images_and_text_tables_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = RunConfig.from_dict({"log": {"output_dir": str(tmp_path), "tensorboard": True}})
    log = RunLogger(cfg, tmp_path)
    assert log.wants_media
    log.log_images("val/trajectory", [np.full((20, 30, 3), 200, np.uint8)], step=4)
    cols, rows = reports.sample_table(
        [_rec(0, "route_planning", 1.0, [TurnRecord(1, 'a|b\n{"answer": "B"}', "", "answer(B)", True, 1.0, (0, 0, 0))])]
    )
    log.log_text_table("val/samples", cols, rows, step=4)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    image = acc.Images("val/trajectory")[0]
    assert (image.step, image.width, image.height) == (4, 30, 20)
    text = acc.Tensors("val/samples/text_summary")[0]
    md = text.tensor_proto.string_val[0].decode()
    assert text.step == 4 and md.splitlines()[0] == "| " + " | ".join(reports.SAMPLE_COLUMNS) + " |"
    assert '| proc-0000 | route_planning | q 0 | a\\|b {"answer": "B"} | 1 | 1 | 1.0 | 0.0 | 1 |' in md
    off = RunLogger(
        RunConfig.from_dict({"log": {"output_dir": str(tmp_path / "off"), "tensorboard": False}}), tmp_path / "off"
    )
    assert not off.wants_media  # callers skip drawing pictures nobody receives


def test_logger_sends_images_and_tables_to_wandb(tmp_path, monkeypatch):
    logged = []

    class FakeRun:
        id = "run-1"

        def log(self, data, step):
            logged.append((data, step))

        def finish(self):
            pass

    fake = types.SimpleNamespace(
        init=lambda **kw: FakeRun(),
        Image=lambda arr: ("image", arr.shape),
        Table=lambda columns, data: ("table", tuple(columns), data),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = RunConfig.from_dict({"log": {"output_dir": str(tmp_path), "tensorboard": False, "wandb_mode": "offline"}})
    log = RunLogger(cfg, tmp_path)
    log.log_images("val/trajectory", [np.zeros((8, 9, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)], step=2)
    log.log_text_table("val/samples", ["question", "reward"], [["how many?", 0.5]], step=2)
    log.close()
    assert logged == [
        ({"val/trajectory": [("image", (8, 9, 3)), ("image", (4, 5, 3))]}, 2),
        ({"val/samples": ("table", ("question", "reward"), [["how many?", 0.5]])}, 2),
    ]
    with pytest.raises(ValueError, match="a row has 1 cells for 2 columns"):
        RunLogger(cfg, tmp_path).log_text_table("t", ["a", "b"], [["x"]], step=1)


@pytest.mark.slow
def test_training_logs_the_validation_picture_and_table_to_tensorboard(tmp_path):
    """End to end (about 7 s): one PPO iteration with validation writes, at that iteration, the first
    validation episode's trajectory picture and the table of validation episodes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.rl.train import run_training

    over = {
        "log.output_dir": str(tmp_path),
        "log.progress_bar": "false",
        "log.tensorboard": "true",
        "ppo.num_iterations": "1",
        "log.val_interval": "1",
        "log.val_episodes": "2",
    }
    run_training(load_config(preset="debug", overrides=[f"{k}={v}" for k, v in over.items()]))
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    image = acc.Images("val/trajectory")[0]
    layout = PictureLayout()
    assert image.step == 1 and image.height == layout.size(1)[1] and (image.width - layout.map_size) % layout.tile == 0
    md = acc.Tensors("val/samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert md.count("| proc-") == 2 and "| object_counting |" in md
    best = json.loads((tmp_path / "best" / "val.json").read_text())
    assert "records" not in best and "pictures" not in best  # the samples stay out of the best policy's record


def test_eval_cli_smooth_flag(tmp_path, capsys):
    import eval_vsi

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(json.dumps({"iteration": i, "rollout/episode_score_mean": 0.1 * i}) + "\n" for i in range(1, 6))
    )
    assert eval_vsi.main(["--metrics", str(metrics), "--smooth", "0.6", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "learning_curves.png").is_file()
    for argv, message in (
        (["--metrics", str(metrics), "--smooth", "1"], "must be in [0, 1)"),
        (["--smooth", "0.5"], "pass --metrics too"),
    ):
        with pytest.raises(SystemExit):
            eval_vsi.main([*argv, "--out", str(tmp_path / "x")])
        assert message in capsys.readouterr().err


def _wandb_history(path) -> list[tuple[str, str]]:
    """``(key, value_json)`` of every history item in an offline run's ``.wandb`` file.

    The file is wandb's record log: a 7-byte header, then LevelDB-log framing (32 KiB blocks; each
    chunk a 7-byte header of checksum, length and type FULL/FIRST/MIDDLE/LAST) around serialized
    ``wandb_internal_pb2.Record`` messages. Checksums are not verified: a test reader."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, i = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", f"{path} is not a wandb record log"
    records, pending = [], b""
    while i + 7 <= len(data):
        left = block - i % block
        if left < 7:
            i += left
            continue
        _, length, kind = struct.unpack("<IHB", data[i : i + 7])
        if length == 0 and kind == 0:  # block padding
            i += left
            continue
        chunk, i = data[i + 7 : i + 7 + length], i + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
            if kind == 4:
                records.append(pending)
    items = []
    for raw in records:
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items += [(item.key or "/".join(item.nested_key), item.value_json) for item in record.history.item]
    return items


@pytest.mark.slow
def test_a_training_run_logs_to_the_real_wandb_client_offline(tmp_path, monkeypatch):
    """The real wandb client (no fake module), offline, its files inside the run directory: the
    run's record log holds every iteration's scalars with metrics.jsonl's values, and the validation
    picture and sample table are logged with their media files written."""
    pytest.importorskip("wandb")
    import math

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.rl.train import run_training

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    out = tmp_path / "run"
    cfg = load_config(
        preset="debug",
        overrides=[
            f"log.output_dir={out}",
            "log.progress_bar=false",
            "log.tensorboard=false",
            "log.wandb_mode=offline",
            "ppo.num_iterations=2",
            "log.val_interval=2",
            "log.val_episodes=2",
            "model.max_new_tokens=16",
        ],
    )
    run_training(cfg)
    logs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, list((out / "wandb").glob("*"))
    history = _wandb_history(logs[0])
    rows = read_metrics(out / "metrics.jsonl")
    logged = [float(v) for k, v in history if k == "losses/value_loss"]
    want = [r["losses/value_loss"] for r in rows]
    assert len(logged) == 2 and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(logged, want))
    keys = {k for k, _ in history}
    assert {"rollout/episode_score_mean", "val/score", "val/trajectory/filenames", "val/samples/path"} <= keys
    files = logs[0].parent / "files" / "media"
    assert list(files.glob("images/val/trajectory_*.png")) and list(files.glob("table/val/samples_*.table.json"))

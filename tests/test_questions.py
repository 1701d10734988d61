"""Ground truth of every question type on tiny hand-built scenes with known answers."""

import itertools
import re

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import QUESTION_TYPES
from a2c_ppo_acktr.envs.questions import (
    GENERATORS,
    QuestionUnavailable,
    _direction_label,
    appearance_from_frames,
    box_distance,
    generate_question,
    route_turn,
    signed_angle_deg,
)
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject


def make_scene(objects, width=6.0, depth=4.0, scene_id="hand"):
    builder = MeshBuilder()
    floor = np.array([[0, 0], [width, 0], [width, depth], [0, depth]], dtype=float)
    builder.add_flat_polygon(floor, 0.0, (0.5, 0.5, 0.5))
    for obj in objects:
        builder.add_object_box(obj, (0.8, 0.2, 0.2))
    v, t, c, ids = builder.build()
    return Scene(scene_id, "procedural", v, t, c, ids, list(objects), floor, 2.5)


def box(oid, label, center, extent, rotation=None):
    return SceneObject(
        oid, label, np.asarray(center, float), np.asarray(extent, float), np.eye(3) if rotation is None else rotation
    )


def rot_x(deg):
    a = np.deg2rad(deg)
    return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])


def rot_y(deg):
    a = np.deg2rad(deg)
    return np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])


def rot_z(deg):
    a = np.deg2rad(deg)
    return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])


def aabb_distance(a, b):
    """Independent distance of axis-aligned boxes: norm of the per-axis gaps."""
    gap = np.maximum(0.0, np.maximum(a.aabb_min - b.aabb_max, b.aabb_min - a.aabb_max))
    return float(np.linalg.norm(gap))


# Room 6 x 4 m. Unique: bed, sofa, tv, table; two chairs.
ROOM_OBJECTS = [
    box(0, "bed", (1.0, 1.0, 0.3), (2.0, 1.6, 0.6)),
    box(1, "sofa", (5.0, 1.0, 0.4), (2.0, 0.9, 0.8)),
    box(2, "tv", (5.0, 3.5, 1.2), (1.2, 0.1, 0.7)),
    box(3, "chair", (2.5, 3.0, 0.45), (0.5, 0.5, 0.9)),
    box(4, "chair", (3.5, 3.0, 0.45), (0.5, 0.5, 0.9)),
    box(5, "table", (3.0, 2.2, 0.375), (1.2, 0.8, 0.75)),
]
SIZES_CM = {"bed": "200", "sofa": "200", "tv": "120", "table": "120"}


@pytest.fixture(scope="module")
def room():
    return make_scene(ROOM_OBJECTS)


def _option_text(q):
    letters = [o.split(". ", 1)[0] for o in q.options]
    assert q.ground_truth in letters
    return q.options[letters.index(q.ground_truth)].split(". ", 1)[1]


# ------------------------------------------------------------------ box distance
def test_box_distance_hand_cases():
    a = box(0, "a", (0, 0, 0), (1, 1, 1))
    assert box_distance(a, box(1, "b", (3, 0, 0), (1, 1, 1))) == pytest.approx(2.0)
    assert box_distance(a, box(1, "b", (2, 2, 0), (1, 1, 1))) == pytest.approx(np.sqrt(2))
    assert box_distance(a, box(1, "b", (2, 2, 2), (1, 1, 1))) == pytest.approx(np.sqrt(3))
    assert box_distance(a, box(1, "b", (0, 0, 1.5), (1, 1, 1))) == pytest.approx(0.5)
    assert box_distance(a, box(1, "b", (0.5, 0.2, 0), (1, 1, 1))) == 0.0  # overlapping
    assert box_distance(a, box(1, "b", (0, 0, 0), (0.2, 0.2, 0.2))) == 0.0  # contained
    assert box_distance(a, box(1, "b", (1.0, 0, 0), (1, 1, 1))) == 0.0  # touching faces
    # Vertex of a 45-degree-turned cube towards a face: x - sqrt(2)/2 - 1/2.
    assert box_distance(a, box(1, "b", (3, 0, 0), (1, 1, 1), rot_z(45))) == pytest.approx(3 - np.sqrt(2) / 2 - 0.5)
    # Skew edges only: A tilted about y (top edge along y at z = sqrt2/2), B tilted about x (bottom
    # edge along x at z = 3 - sqrt2/2); the crossing edges are closest, at 3 - sqrt2.
    a_t = box(0, "a", (0, 0, 0), (1, 1, 1), rot_y(45))
    b_t = box(1, "b", (0, 0, 3), (1, 1, 1), rot_x(45))
    assert box_distance(a_t, b_t) == pytest.approx(3 - np.sqrt(2))
    assert box_distance(b_t, a_t) == pytest.approx(3 - np.sqrt(2))
    # A flat (zero-height) box still has a distance.
    assert box_distance(a, box(1, "b", (0, 0, 2), (1, 1, 0))) == pytest.approx(1.5)


def test_box_distance_matches_aabb_formula():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = box(0, "a", rng.uniform(-3, 3, 3), rng.uniform(0.1, 2, 3))
        b = box(1, "b", rng.uniform(-3, 3, 3), rng.uniform(0.1, 2, 3))
        assert box_distance(a, b) == pytest.approx(aabb_distance(a, b), abs=1e-9)


def _surface_samples(obj, n=12):
    g = (np.arange(n) + 0.5) / n - 0.5
    uu, vv = np.meshgrid(g, g)
    pts = []
    for axis in range(3):
        others = [i for i in range(3) if i != axis]
        for sign in (-0.5, 0.5):
            local = np.zeros((n * n, 3))
            local[:, axis] = sign
            local[:, others[0]] = uu.ravel()
            local[:, others[1]] = vv.ravel()
            pts.append(local)
    local = np.concatenate(pts) * obj.extent
    return obj.center + local @ obj.rotation.T


def test_box_distance_bounded_by_surface_sampling():
    rng = np.random.default_rng(1)
    n = 12
    for _ in range(15):
        rots = []
        for _ in range(2):
            q, _r = np.linalg.qr(rng.normal(size=(3, 3)))
            rots.append(q * np.sign(np.linalg.det(q)))
        a = box(0, "a", rng.uniform(-2, 2, 3), rng.uniform(0.3, 1.5, 3), rots[0])
        b = box(1, "b", rng.uniform(-2, 2, 3), rng.uniform(0.3, 1.5, 3), rots[1])
        d = box_distance(a, b)
        pa, pb = _surface_samples(a, n), _surface_samples(b, n)
        sampled = np.sqrt(((pa[:, None, :] - pb[None]) ** 2).sum(-1)).min()
        slack = (a.extent.max() + b.extent.max()) / n  # each sample is within extent/n of any surface point
        assert d <= sampled + 1e-9
        if d > 0:
            assert sampled <= d + slack


# ------------------------------------------------------------------ numerical types
def test_counting_room_size_and_sizes(room):
    for seed in range(10):
        rng = np.random.default_rng(seed)
        q = generate_question(room, "object_counting", rng)
        assert q.question == "How many chair(s) are in this room?" and q.ground_truth == "2" and q.options is None
        assert sorted(q.object_ids) == [3, 4]
        q = generate_question(room, "room_size_estimation", rng)
        assert q.ground_truth == "24.0" and q.question.startswith("What is the size of this room (in square meters)?")
        q = generate_question(room, "object_size_estimation", rng)
        label = re.search(r"of the (\w+), measured in centimeters", q.question).group(1)
        assert q.ground_truth == SIZES_CM[label]  # never a chair: two instances


def test_abs_distance_ground_truth(room):
    labels_seen = set()
    for seed in range(40):
        q = generate_question(room, "object_abs_distance", np.random.default_rng(seed))
        a, b = re.search(r"between the (\w+) and the (\w+) \(in meters\)", q.question).groups()
        assert "chair" not in (a, b)
        oa, ob = room.objects_by_label(a)[0], room.objects_by_label(b)[0]
        assert q.ground_truth == f"{aabb_distance(oa, ob):.1f}"
        labels_seen.add(frozenset((a, b)))
    # Hand value: bed x in [0, 2], sofa x in [4, 6], overlapping in y and z: 2.0 m.
    assert room.objects_by_label("bed")[0] and box_distance(ROOM_OBJECTS[0], ROOM_OBJECTS[1]) == pytest.approx(2.0)
    assert len(labels_seen) >= 4


def test_unavailable_types_raise():
    lonely = make_scene([box(0, "bed", (1, 1, 0.3), (1, 1, 0.6))])
    for qtype in (
        "object_counting",
        "object_abs_distance",
        "object_rel_distance",
        "object_rel_direction_easy",
        "route_planning",
    ):
        with pytest.raises(QuestionUnavailable):
            generate_question(lonely, qtype, np.random.default_rng(0))
    with pytest.raises(QuestionUnavailable):
        generate_question(lonely, "obj_appearance_order", np.random.default_rng(0))  # no sweep order given
    with pytest.raises(ValueError, match="unknown question_type"):
        generate_question(lonely, "object_color", np.random.default_rng(0))


# ------------------------------------------------------------------ relative distance
def test_rel_distance_ground_truth(room):
    for seed in range(30):
        q = generate_question(room, "object_rel_distance", np.random.default_rng(seed))
        cands_text, target = re.search(
            r"which of these objects \((.*)\) is the closest to the (\w+)\?", q.question
        ).groups()
        cands = cands_text.split(", ")
        assert target != "chair" and len(cands) == 4 and target not in cands
        t = room.objects_by_label(target)[0]
        dist = {c: min(aabb_distance(t, o) for o in room.objects_by_label(c)) for c in cands}
        best = min(dist, key=dist.get)
        assert _option_text(q) == best
        assert sorted(o.split(". ", 1)[1] for o in q.options) == sorted(cands)
        ranked = sorted(dist.values())
        assert ranked[1] - ranked[0] >= 0.15


# ------------------------------------------------------------------ relative direction
# Three unique objects: bed (1, 1), sofa (5, 1), table (3, 3). Hand-computed angle for
# (standing by, facing, target) and the expected easy / medium / hard answers (None = ambiguous).
TRIANGLE = [
    box(0, "bed", (1, 1, 0.3), (1, 1, 0.6)),
    box(1, "sofa", (5, 1, 0.4), (1, 1, 0.8)),
    box(2, "table", (3, 3, 0.4), (1, 1, 0.8)),
]
DIRECTIONS = {
    ("bed", "sofa", "table"): ("left", "left", "front-left"),  # +45
    ("bed", "table", "sofa"): ("right", "right", "front-right"),  # -45
    ("sofa", "bed", "table"): ("right", "right", "front-right"),  # -45
    ("sofa", "table", "bed"): ("left", "left", "front-left"),  # +45
    ("table", "bed", "sofa"): ("left", "left", None),  # +90: on the quadrant boundary
    ("table", "sofa", "bed"): ("right", "right", None),  # -90
}


@pytest.mark.parametrize("level_index, level", [(0, "easy"), (1, "medium"), (2, "hard")])
def test_rel_direction_hand_answers(level_index, level):
    scene = make_scene(TRIANGLE)
    seen = set()
    for seed in range(40):
        q = generate_question(scene, f"object_rel_direction_{level}", np.random.default_rng(seed))
        a, b, c = re.search(r"standing by the (\w+) and facing the (\w+), is the (\w+) to my", q.question).groups()
        expected = DIRECTIONS[(a, b, c)][level_index]
        assert expected is not None
        assert _option_text(q) == expected
        seen.add((a, b, c))
    assert len(seen) >= 3


def test_direction_sectors_and_angles():
    assert signed_angle_deg(np.array([1.0, 0]), np.array([0, 1.0])) == pytest.approx(90)
    assert signed_angle_deg(np.array([1.0, 0]), np.array([1.0, -1.0])) == pytest.approx(-45)
    assert _direction_label(160, "medium") == "back" and _direction_label(-155, "medium") == "back"
    assert _direction_label(130, "medium") is None  # within 15 degrees of the 135 boundary
    assert _direction_label(100, "medium") == "left" and _direction_label(-100, "easy") == "right"
    assert _direction_label(170, "easy") is None and _direction_label(5, "easy") is None
    assert _direction_label(120, "hard") == "back-left" and _direction_label(-60, "hard") == "front-right"
    assert _direction_label(-150, "hard") == "back-right"
    assert route_turn(90) == "Turn Left" and route_turn(-60) == "Turn Right"
    assert route_turn(170) == "Turn Back" and route_turn(-155) == "Turn Back"
    assert route_turn(10) is None and route_turn(140) is None


# ------------------------------------------------------------------ route planning
def test_route_planning_hand_answers():
    # Only two routes have unambiguous turns in the triangle scene (see the angles above):
    # bed -> table -> sofa turns -90 (right); sofa -> table -> bed turns +90 (left).
    scene = make_scene(TRIANGLE)
    seen = set()
    for seed in range(20):
        q = generate_question(scene, "route_planning", np.random.default_rng(seed))
        start, facing, goal = re.search(
            r"beginning at the (\w+) facing the (\w+)\. You want to navigate to the (\w+)\.", q.question
        ).groups()
        expected = {("bed", "table", "sofa"): "Turn Right", ("sofa", "table", "bed"): "Turn Left"}[
            (start, facing, goal)
        ]
        assert _option_text(q) == expected
        assert "1. Go forward until the table 2. [please fill in] 3. Go forward until the" in q.question
        assert sorted(o.split(". ", 1)[1] for o in q.options) == ["Turn Back", "Turn Left", "Turn Right"]
        seen.add(start)
    assert seen == {"bed", "sofa"}


def test_route_planning_two_turns_are_consistent(room):
    for seed in range(20):
        q = generate_question(room, "route_planning", np.random.default_rng(seed))
        labels = q.meta["labels"]
        pts = [room.objects_by_label(lab)[0].center[:2] for lab in labels]
        legs = [pts[i + 1] - pts[i] for i in range(len(pts) - 1)]
        turns = [route_turn(signed_angle_deg(legs[i], legs[i + 1])) for i in range(len(legs) - 1)]
        assert _option_text(q) == ", ".join(turns)
        assert len(set(q.options)) == len(q.options) and all(len(o.split(", ")) == len(turns) for o in q.options)


# ------------------------------------------------------------------ appearance order
def test_appearance_order_ground_truth(room):
    # Sweep frames: tv in frame 0, chair and bed both first in frame 1, table 3, sofa 5.
    order, frames = [2, 3, 0, 4, 5, 1], [0, 1, 1, 2, 3, 5]
    answers = set()
    for seed in range(30):
        q = generate_question(
            room, "obj_appearance_order", np.random.default_rng(seed), appearance_order=order, appearance_frames=frames
        )
        answer = _option_text(q)
        assert answer in ("tv, chair, table, sofa", "tv, bed, table, sofa")
        listed = re.search(r"in the video: (.*)\?", q.question).group(1).split(", ")
        assert sorted(listed) == sorted(answer.split(", "))
        assert len(q.options) == 4 and len(set(q.options)) == 4
        answers.add(answer)
    assert len(answers) == 2
    with pytest.raises(QuestionUnavailable):
        generate_question(
            room,
            "obj_appearance_order",
            np.random.default_rng(0),
            appearance_order=[2, 3, 0],
            appearance_frames=[0, 1, 1],
        )


def test_appearance_from_frames():
    f0 = np.full((4, 4), -1)
    f0[0, :3] = 7  # 3 pixels of object 7
    f1 = np.full((4, 4), -1)
    f1[0] = 7
    f1[1:3] = 2  # 8 pixels of 2
    f1[3, :2] = 5  # 2 pixels of 5
    ids, frames = appearance_from_frames([f0, f1], min_pixels=2)
    assert ids == [7, 2, 5] and frames == [0, 1, 1]
    ids, frames = appearance_from_frames([f0, f1], min_pixels=3)
    assert ids == [7, 2] and frames == [0, 1]


# ------------------------------------------------------------------ all types
def test_every_type_has_a_generator_and_options_are_shuffled(room):
    assert set(GENERATORS) == set(QUESTION_TYPES)
    letters = {t: set() for t in ("object_rel_distance", "object_rel_direction_easy", "route_planning")}
    for seed, qtype in itertools.product(range(30), letters):
        q = generate_question(room, qtype, np.random.default_rng(seed))
        letters[qtype].add(q.ground_truth)
    assert letters["object_rel_distance"] == set("ABCD")
    assert letters["object_rel_direction_easy"] == set("AB")


def test_same_seed_same_question(room):
    for qtype in QUESTION_TYPES:
        kw = {"appearance_order": [2, 3, 0, 5, 1], "appearance_frames": [0, 1, 2, 3, 4]}
        q1 = generate_question(room, qtype, np.random.default_rng(7), **kw)
        q2 = generate_question(room, qtype, np.random.default_rng(7), **kw)
        assert q1 == q2


# ------------------------------------------------------------------ real VSI-Bench rows
from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows, question_from_row  # noqa: E402
from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError, scene_for_row  # noqa: E402

ROWS = [
    {
        "id": 1,
        "dataset": "scannet",
        "scene_name": "scene0011_00",
        "question_type": "object_counting",
        "question": "How many chair(s) are in this room?",
        "options": None,
        "ground_truth": "4",
    },
    {
        "id": 2,
        "dataset": "arkitscenes",
        "scene_name": "41069025",
        "question_type": "object_rel_direction_easy",
        "question": "If I am standing by the bed and facing the tv, is the door to my left or right?",
        "options": ["A. left", "B. right"],
        "ground_truth": "B",
    },
]


def test_rows_load_from_json_jsonl_and_parquet(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    for name in ("rows.json", "rows.jsonl", "rows.parquet"):
        rows = load_vsibench_rows(tmp_path / name)
        assert (
            [r["id"] for r in rows] == [1, 2]
            and rows[1]["options"] == ["A. left", "B. right"]
            and rows[0]["options"] is None
        )
        q = question_from_row(rows[1])
        assert (
            q.question_type == "object_rel_direction_easy"
            and q.ground_truth == "B"
            and q.options == ["A. left", "B. right"]
        )
        assert q.meta["scene_name"] == "41069025"


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"question_type": "object_color"}, "question_type"),
        ({"dataset": "hm3d"}, "dataset"),
        ({"ground_truth": "C"}, "option letters"),
        ({"options": None}, "options"),
        ({"scene_name": ""}, "scene_name"),
        ({"id": "x"}, "id must be an integer"),
    ],
)
def test_bad_rows_are_named(tmp_path, change, fragment):
    import json

    rows = [ROWS[0], {**ROWS[1], **change}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    with pytest.raises(VSIBenchRowError, match=fragment) as err:
        load_vsibench_rows(tmp_path / "rows.json")
    assert "row 1" in str(err.value)


def test_bad_numeric_ground_truth_and_missing_fields():
    with pytest.raises(VSIBenchRowError, match="must be a number"):
        question_from_row({**ROWS[0], "ground_truth": "four"})
    with pytest.raises(VSIBenchRowError, match="> 0"):
        question_from_row({**ROWS[0], "ground_truth": "0"})
    with pytest.raises(VSIBenchRowError, match="missing fields"):
        question_from_row({k: v for k, v in ROWS[0].items() if k != "question"})
    with pytest.raises(FileNotFoundError, match="vsibench_path"):
        load_vsibench_rows("/nonexistent/rows.parquet")


def test_row_whose_scene_is_missing_names_it(tmp_path):
    from a2c_ppo_acktr.envs.real_scans import SceneLoadError

    with pytest.raises(SceneLoadError, match="scene0011_00"):
        scene_for_row(ROWS[0], tmp_path)

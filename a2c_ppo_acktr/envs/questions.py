"""VSI-Bench questions generated from scene geometry, with exact ground truth.

All 10 raw VSI-Bench question types are generated, phrased like the benchmark ("Thinking in Space",
Yang et al., 2024), with its units (counts, meters, centimeters, square meters) and, for multiple
choice, options ``"A. ..."`` shuffled by the caller's generator and the ground-truth letter.

Geometry follows the benchmark's meta information: objects are oriented boxes, "distance between
objects" is measured between their closest points (:func:`box_distance`, exact), object size is the
longest side of the box, room size is the floor area. Where a question names a category to identify
one object (``the sofa``) only categories with a single instance in the scene are used, as the
benchmark does. A scene that cannot support a type (too few such objects, every candidate ambiguous)
raises :class:`QuestionUnavailable`, so the env draws another.

Directions (relative direction, route planning) use object centers projected on the floor: "standing
by A facing B" puts the observer at A's center looking at B's center; a signed angle is counter-
clockwise positive, i.e. positive = to the left. Candidates closer than a margin to a direction
boundary are rejected as ambiguous. Rounding of ground truths follows the benchmark's habit: meters
and square meters to one decimal, centimeters and counts to integers; ``meta`` keeps exact values.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import scoring
from a2c_ppo_acktr.common.choices import check_registry

from a2c_ppo_acktr.envs.renderer import Pose
from a2c_ppo_acktr.envs.scene import Scene, SceneObject

LETTERS = "ABCDEFGH"

# Margins that keep ground truths unambiguous (part of the question definitions, not training knobs).
MIN_DISTANCE_M = 0.2  # abs distance: pairs closer than this (touching, stacked) are not asked
REL_DISTANCE_MARGIN_M = 0.15  # rel distance: the closest candidate must win by this much
DIRECTION_MARGIN_DEG = 15.0  # rel direction / route: stay this far from every sector boundary
MIN_FACING_DISTANCE_M = 0.5  # "standing by A facing B": A and B centers at least this far apart
MIN_COUNT = 2  # counting asks about categories with at least this many instances
NUM_REL_DISTANCE_CANDIDATES = 4
NUM_APPEARANCE_CATEGORIES = 4
NUM_ORDER_OPTIONS = 4
MAX_ROUTE_TURNS = 2
_TRIES = 64  # random draws of object combinations before giving up on a type

ROOM_SIZE_QUESTION = (
    "What is the size of this room (in square meters)? "
    "If multiple rooms are shown, estimate the size of the combined space."
)


class QuestionUnavailable(ValueError):
    """The scene cannot support this question type (the env then draws another type or scene)."""


@dataclass(frozen=True)
class Question:
    """One question.

    Attributes:
        question_type: Raw VSI-Bench type (see ``scoring.TASKS``).
        question: The question text.
        options: ``["A. left", "B. right"]`` for multiple choice, None for numerical questions.
        ground_truth: The option letter, or the number as a string.
        object_ids: Ids of the objects the question is about (first = the main one), for teachers
            and reports; empty for room size.
        meta: Exact values behind the ground truth (distances, angles, labels, ...).
    """

    question_type: str
    question: str
    options: Optional[list[str]]
    ground_truth: str
    object_ids: list[int] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------
# Edges of a box as pairs of corner indices into SceneObject.corners (bottom 0-3, top 4-7).
_BOX_EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4], [0, 4], [1, 5], [2, 6], [3, 7]])


def _point_box_distance(points: np.ndarray, box: SceneObject) -> np.ndarray:
    """Euclidean distance from points (N, 3) to the solid box (0 inside): clamp in the box frame."""
    local = (points - box.center) @ box.rotation
    half = box.extent / 2.0
    return np.linalg.norm(local - np.clip(local, -half, half), axis=1)


def _segment_segment_distance(p0: np.ndarray, p1: np.ndarray, q0: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """Distances between segment pairs p (N, 3) x q (M, 3) -> (N, M).

    Closed form of the closest points of two segments (Ericson, Real-Time Collision Detection,
    5.1.9): unconstrained line parameters, clamped to [0, 1], then the other parameter recomputed
    and clamped. Degenerate (zero-length) segments give ``inf``; callers cover points separately.
    """
    d1 = (p1 - p0)[:, None, :]
    d2 = (q1 - q0)[None, :, :]
    r = p0[:, None, :] - q0[None, :, :]
    a = (d1 * d1).sum(-1)
    e = (d2 * d2).sum(-1)
    b = (d1 * d2).sum(-1)
    c = (d1 * r).sum(-1)
    f = (d2 * r).sum(-1)
    a, e = np.broadcast_arrays(a, e)
    ok = (a > 1e-18) & (e > 1e-18)
    a_safe = np.where(ok, a, 1.0)
    e_safe = np.where(ok, e, 1.0)
    denom = a_safe * e_safe - b * b
    # Parallel segments (denom ~ 0): any s works for the line problem; s = 0 then clamps t.
    s = np.where(
        denom > 1e-12 * a_safe * e_safe, np.clip((b * f - c * e_safe) / np.where(denom > 0, denom, 1.0), 0.0, 1.0), 0.0
    )
    t = (b * s + f) / e_safe
    s = np.where(t < 0, np.clip(-c / a_safe, 0.0, 1.0), np.where(t > 1, np.clip((b - c) / a_safe, 0.0, 1.0), s))
    t = np.clip(t, 0.0, 1.0)
    diff = r + s[..., None] * d1 - t[..., None] * d2
    dist = np.linalg.norm(diff, axis=-1)
    return np.where(ok, dist, np.inf)


def _boxes_overlap(a: SceneObject, b: SceneObject) -> bool:
    """Separating-axis test of two oriented boxes (touching counts as overlapping)."""
    axes = [a.rotation[:, i] for i in range(3)] + [b.rotation[:, j] for j in range(3)]
    for i in range(3):
        for j in range(3):
            axis = np.cross(a.rotation[:, i], b.rotation[:, j])
            if np.linalg.norm(axis) > 1e-9:  # parallel edge pairs are covered by the face axes
                axes.append(axis)
    ca, cb = a.corners, b.corners
    for axis in axes:
        pa, pb = ca @ axis, cb @ axis
        if pa.max() < pb.min() or pb.max() < pa.min():
            return False
    return True


def box_distance(a: SceneObject, b: SceneObject) -> float:
    """Exact Euclidean distance between the closest points of two oriented boxes (0 if they touch).

    Method: boxes that overlap (separating-axis test over the 15 candidate axes) are at distance 0.
    For disjoint convex polytopes a closest pair can always be chosen with a vertex of one on the
    other, or with both points on edges (the closest-pair set is a convex polygon whose vertices are
    of those kinds), so the distance is the minimum of the 16 vertex-to-box distances and the 144
    edge-to-edge distances, each in closed form.
    """
    if _boxes_overlap(a, b):
        return 0.0
    ca, cb = a.corners, b.corners
    vertex = min(_point_box_distance(ca, b).min(), _point_box_distance(cb, a).min())
    ea0, ea1 = ca[_BOX_EDGES[:, 0]], ca[_BOX_EDGES[:, 1]]
    eb0, eb1 = cb[_BOX_EDGES[:, 0]], cb[_BOX_EDGES[:, 1]]
    edge = _segment_segment_distance(ea0, ea1, eb0, eb1).min()
    return float(min(vertex, edge))


def signed_angle_deg(forward: np.ndarray, to_target: np.ndarray) -> float:
    """Counter-clockwise angle in (-180, 180] from 2D vector ``forward`` to ``to_target`` (positive = left)."""
    cross = forward[0] * to_target[1] - forward[1] * to_target[0]
    dot = forward[0] * to_target[0] + forward[1] * to_target[1]
    return float(np.degrees(np.arctan2(cross, dot)))


def _xy(obj: SceneObject) -> np.ndarray:
    return np.asarray(obj.center[:2], dtype=np.float64)


def unique_objects(scene: Scene) -> list[SceneObject]:
    """Objects whose category has exactly one instance in the scene (usable as ``the <label>``), by id."""
    counts = scene.label_counts()
    return sorted((o for o in scene.objects if counts[o.label] == 1), key=lambda o: o.object_id)


# ---------------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------------
def _fmt(x: float, decimals: int) -> str:
    return str(int(round(x))) if decimals == 0 else f"{x:.{decimals}f}"


def _multiple_choice(rng: np.random.Generator, correct: str, distractors: Sequence[str]) -> tuple[list[str], str]:
    """Shuffle ``correct`` among ``distractors``; returns (``["A. ...", ...]``, ground-truth letter)."""
    choices = [correct, *distractors]
    if len(set(choices)) != len(choices):
        raise ValueError(f"options must be distinct, got {choices}")
    order = rng.permutation(len(choices))
    options = [f"{LETTERS[k]}. {choices[i]}" for k, i in enumerate(order)]
    letter = LETTERS[int(np.flatnonzero(order == 0)[0])]
    return options, letter


def _pick(rng: np.random.Generator, items: Sequence, k: int) -> list:
    idx = rng.choice(len(items), size=k, replace=False)
    return [items[int(i)] for i in idx]


# ---------------------------------------------------------------------------------------------
# Generators, one per raw type
# ---------------------------------------------------------------------------------------------
def _object_counting(scene: Scene, rng: np.random.Generator, **_) -> Question:
    counts = scene.label_counts()
    labels = sorted(label for label, n in counts.items() if n >= MIN_COUNT)
    if not labels:
        raise QuestionUnavailable(f"scene {scene.scene_id!r} has no category with >= {MIN_COUNT} instances to count")
    label = labels[int(rng.integers(len(labels)))]
    ids = [o.object_id for o in scene.objects_by_label(label)]
    return Question(
        "object_counting",
        f"How many {label}(s) are in this room?",
        None,
        str(counts[label]),
        ids,
        {"label": label, "count": counts[label]},
    )


def _object_abs_distance(scene: Scene, rng: np.random.Generator, **_) -> Question:
    uniq = unique_objects(scene)
    pairs = [(a, b) for a, b in itertools.combinations(uniq, 2)]
    order = rng.permutation(len(pairs))
    for i in order:
        a, b = pairs[int(i)]
        d = box_distance(a, b)
        if d >= MIN_DISTANCE_M:
            if rng.random() < 0.5:
                a, b = b, a
            return Question(
                "object_abs_distance",
                f"Measuring from the closest point of each object, what is the direct distance between the {a.label} "
                f"and the {b.label} (in meters)?",
                None,
                _fmt(d, 1),
                [a.object_id, b.object_id],
                {"distance_m": d, "labels": [a.label, b.label]},
            )
    raise QuestionUnavailable(
        f"scene {scene.scene_id!r} has no pair of unique objects at least {MIN_DISTANCE_M} m apart"
    )


def _object_size_estimation(scene: Scene, rng: np.random.Generator, **_) -> Question:
    uniq = [o for o in unique_objects(scene) if o.longest_side * 100 >= 0.5]  # an integer cm ground truth > 0
    if not uniq:
        raise QuestionUnavailable(f"scene {scene.scene_id!r} has no category with a single instance")
    obj = uniq[int(rng.integers(len(uniq)))]
    cm = obj.longest_side * 100.0
    return Question(
        "object_size_estimation",
        f"What is the length of the longest dimension (length, width, or height) of the {obj.label}, measured in "
        "centimeters?",
        None,
        _fmt(cm, 0),
        [obj.object_id],
        {"longest_side_cm": cm, "label": obj.label},
    )


def _room_size_estimation(scene: Scene, rng: np.random.Generator, **_) -> Question:
    area = scene.room_area
    if area < 0.05:
        raise QuestionUnavailable(f"scene {scene.scene_id!r} has a degenerate floor polygon (area {area:.3f} m^2)")
    return Question("room_size_estimation", ROOM_SIZE_QUESTION, None, _fmt(area, 1), [], {"area_m2": area})


def _object_rel_distance(scene: Scene, rng: np.random.Generator, **_) -> Question:
    uniq = unique_objects(scene)
    if not uniq:
        raise QuestionUnavailable(f"scene {scene.scene_id!r} has no category with a single instance")
    labels = sorted(scene.label_counts())
    for _ in range(_TRIES):
        target = uniq[int(rng.integers(len(uniq)))]
        others = [lab for lab in labels if lab != target.label]
        if len(others) < NUM_REL_DISTANCE_CANDIDATES:
            raise QuestionUnavailable(
                f"scene {scene.scene_id!r} has {len(others) + 1} categories; relative distance needs "
                f"{NUM_REL_DISTANCE_CANDIDATES + 1}"
            )
        cands = _pick(rng, others, NUM_REL_DISTANCE_CANDIDATES)
        # A category's distance is that of its closest instance.
        dists = {lab: min(box_distance(target, o) for o in scene.objects_by_label(lab)) for lab in cands}
        ranked = sorted(cands, key=lambda lab: dists[lab])
        if dists[ranked[1]] - dists[ranked[0]] < REL_DISTANCE_MARGIN_M:
            continue
        question = (
            "Measuring from the closest point of each object, which of these objects "
            f"({', '.join(cands)}) is the closest to the {target.label}?"
        )
        options, letter = _multiple_choice(rng, ranked[0], [lab for lab in cands if lab != ranked[0]])
        closest_ids = [min(scene.objects_by_label(ranked[0]), key=lambda o: box_distance(target, o)).object_id]
        return Question(
            "object_rel_distance",
            question,
            options,
            letter,
            [target.object_id, *closest_ids],
            {"target": target.label, "distances_m": dists, "answer": ranked[0]},
        )
    raise QuestionUnavailable(f"scene {scene.scene_id!r}: no unambiguous relative-distance question in {_TRIES} draws")


def _direction_label(angle: float, level: str) -> Optional[str]:
    """Sector of a signed angle (positive = left) for a difficulty level; None when too near a boundary."""
    m = DIRECTION_MARGIN_DEG
    a = abs(angle)
    if level == "easy":  # left / right: ambiguous straight ahead or straight behind
        if a < m or a > 180 - m:
            return None
        return "left" if angle > 0 else "right"
    if level == "medium":  # back when a turn of at least 135 degrees is needed to face it
        if a < m or abs(a - 135) < m:
            return None
        if a >= 135:
            return "back"
        return "left" if angle > 0 else "right"
    # hard: quadrants, boundaries at 0, 90 and 180 degrees.
    if a < m or abs(a - 90) < m or a > 180 - m:
        return None
    return ("front" if a < 90 else "back") + "-" + ("left" if angle > 0 else "right")


_DIRECTION_QUESTIONS = {
    "easy": ("is the {c} to my left or right?", ["left", "right"]),
    "medium": (
        "is the {c} to my left, right, or back? An object is to my back if I would have to turn at least 135 degrees "
        "in order to face it.",
        ["left", "right", "back"],
    ),
    "hard": (
        "is the {c} to my front-left, front-right, back-left, or back-right? The directions refer to the quadrants "
        "of a Cartesian plane (if I am standing at the origin and facing along the positive y-axis).",
        ["front-left", "front-right", "back-left", "back-right"],
    ),
}


def _rel_direction(level: str) -> Callable[..., Question]:
    qtype = f"object_rel_direction_{level}"

    def generate(scene: Scene, rng: np.random.Generator, **_) -> Question:
        uniq = unique_objects(scene)
        if len(uniq) < 3:
            raise QuestionUnavailable(
                f"scene {scene.scene_id!r} has {len(uniq)} single-instance categories; relative direction needs 3"
            )
        template, choices = _DIRECTION_QUESTIONS[level]
        for _ in range(_TRIES):
            a, b, c = _pick(rng, uniq, 3)
            facing = _xy(b) - _xy(a)
            to_c = _xy(c) - _xy(a)
            if np.linalg.norm(facing) < MIN_FACING_DISTANCE_M or np.linalg.norm(to_c) < MIN_FACING_DISTANCE_M:
                continue
            angle = signed_angle_deg(facing, to_c)
            answer = _direction_label(angle, level)
            if answer is None:
                continue
            question = f"If I am standing by the {a.label} and facing the {b.label}, " + template.format(c=c.label)
            options, letter = _multiple_choice(rng, answer, [x for x in choices if x != answer])
            return Question(
                qtype,
                question,
                options,
                letter,
                [c.object_id, a.object_id, b.object_id],
                {"angle_deg": angle, "answer": answer, "labels": [a.label, b.label, c.label]},
            )
        raise QuestionUnavailable(f"scene {scene.scene_id!r}: no unambiguous {qtype} question in {_TRIES} draws")

    generate.__name__ = f"_{qtype}"
    return generate


def route_turn(angle: float) -> Optional[str]:
    """The turn for a heading change of ``angle`` degrees (positive = left); None when ambiguous.

    A change of at least 135 degrees is "Turn Back"; otherwise left or right by sign. Near-straight
    continuations (no turn among the benchmark's choices fits) and angles near 135 are rejected.
    """
    m = DIRECTION_MARGIN_DEG
    a = abs(angle)
    if a < 2 * m or abs(a - 135) < m:
        return None
    if a >= 135:
        return "Turn Back"
    return "Turn Left" if angle > 0 else "Turn Right"


def _route_planning(scene: Scene, rng: np.random.Generator, **_) -> Question:
    uniq = unique_objects(scene)
    if len(uniq) < 3:
        raise QuestionUnavailable(
            f"scene {scene.scene_id!r} has {len(uniq)} single-instance categories; route planning needs 3"
        )
    turns_vocab = ["Turn Left", "Turn Right", "Turn Back"]
    for _ in range(_TRIES):
        n_turns = int(rng.integers(1, MAX_ROUTE_TURNS + 1))
        if len(uniq) < n_turns + 2:
            n_turns = len(uniq) - 2
        path = _pick(rng, uniq, n_turns + 2)
        pts = [_xy(o) for o in path]
        legs = [pts[i + 1] - pts[i] for i in range(len(pts) - 1)]
        if min(np.linalg.norm(v) for v in legs) < MIN_FACING_DISTANCE_M:
            continue
        turns = [route_turn(signed_angle_deg(legs[i], legs[i + 1])) for i in range(len(legs) - 1)]
        if any(t is None for t in turns):
            continue
        steps = [f"1. Go forward until the {path[1].label}"]
        k = 2
        for obj in path[2:]:
            steps.append(f"{k}. [please fill in]")
            steps.append(f"{k + 1}. Go forward until the {obj.label}")
            k += 2
        question = (
            f"You are a robot beginning at the {path[0].label} facing the {path[1].label}. "
            f"You want to navigate to the {path[-1].label}. You will perform the following actions "
            "(Note: for each [please fill in], choose either 'turn back,' 'turn left,' or 'turn right.'): "
            + " ".join(steps)
            + ". You have reached the final destination."
        )
        correct = ", ".join(turns)
        alternatives = [
            ", ".join(seq) for seq in itertools.product(turns_vocab, repeat=n_turns) if ", ".join(seq) != correct
        ]
        distractors = _pick(rng, alternatives, min(3, len(alternatives)))
        options, letter = _multiple_choice(rng, correct, distractors)
        return Question(
            "route_planning",
            question,
            options,
            letter,
            [o.object_id for o in path],
            {"turns": turns, "labels": [o.label for o in path]},
        )
    raise QuestionUnavailable(f"scene {scene.scene_id!r}: no unambiguous route in {_TRIES} draws")


def _obj_appearance_order(
    scene: Scene,
    rng: np.random.Generator,
    *,
    appearance_order: Optional[Sequence[int]] = None,
    appearance_frames: Optional[Sequence[int]] = None,
    **_,
) -> Question:
    if appearance_order is None:
        raise QuestionUnavailable(
            "obj_appearance_order needs the appearance order of the episode's sweep (pass appearance_order)"
        )
    frames = list(appearance_frames) if appearance_frames is not None else list(range(len(appearance_order)))
    if len(frames) != len(appearance_order):
        raise ValueError(
            f"appearance_frames has {len(frames)} entries for {len(appearance_order)} ids in appearance_order"
        )
    # First frame in which each category appears (any instance).
    first: dict[str, int] = {}
    first_id: dict[str, int] = {}
    for oid, fr in zip(appearance_order, frames):
        label = scene.object(oid).label
        if label not in first:
            first[label], first_id[label] = int(fr), int(oid)
    # Categories that first appear in the same frame have no order: keep one per frame.
    by_frame: dict[int, list[str]] = {}
    for label, fr in first.items():
        by_frame.setdefault(fr, []).append(label)
    if len(by_frame) < NUM_APPEARANCE_CATEGORIES:
        raise QuestionUnavailable(
            f"scene {scene.scene_id!r}: categories first appear in only {len(by_frame)} distinct sweep frames; "
            f"appearance order needs {NUM_APPEARANCE_CATEGORIES}"
        )
    chosen_frames = sorted(_pick(rng, sorted(by_frame), NUM_APPEARANCE_CATEGORIES))
    ordered = [sorted(by_frame[f])[int(rng.integers(len(by_frame[f])))] for f in chosen_frames]
    listed = _pick(rng, ordered, len(ordered))  # the question lists them in random order
    correct = ", ".join(ordered)
    perms = [", ".join(p) for p in itertools.permutations(ordered) if ", ".join(p) != correct]
    options, letter = _multiple_choice(rng, correct, _pick(rng, perms, NUM_ORDER_OPTIONS - 1))
    return Question(
        "obj_appearance_order",
        f"What will be the first-time appearance order of the following categories in the video: {', '.join(listed)}?",
        options,
        letter,
        [first_id[label] for label in ordered],
        {"order": ordered, "first_frames": [first[label] for label in ordered]},
    )


GENERATORS: dict[str, Callable[..., Question]] = {
    "object_counting": _object_counting,
    "object_abs_distance": _object_abs_distance,
    "object_size_estimation": _object_size_estimation,
    "room_size_estimation": _room_size_estimation,
    "object_rel_distance": _object_rel_distance,
    "object_rel_direction_easy": _rel_direction("easy"),
    "object_rel_direction_medium": _rel_direction("medium"),
    "object_rel_direction_hard": _rel_direction("hard"),
    "route_planning": _route_planning,
    "obj_appearance_order": _obj_appearance_order,
}
check_registry("env.question_types", GENERATORS, scoring.TASKS)


def generate_question(
    scene: Scene,
    question_type: str,
    rng: np.random.Generator,
    *,
    start_pose: Optional[Pose] = None,
    appearance_order: Optional[Sequence[int]] = None,
    appearance_frames: Optional[Sequence[int]] = None,
) -> Question:
    """Generate one question of a raw VSI-Bench type about ``scene``.

    Args:
        scene: The scene.
        question_type: One of the 10 raw types.
        rng: All randomness (which objects, option order) comes from it.
        start_pose: The episode's start pose (recorded in ``meta``; the questions themselves are
            about the scene, as in the benchmark).
        appearance_order: Object ids in order of first appearance in the episode's initial sweep
            (needed by ``obj_appearance_order``).
        appearance_frames: For each id in ``appearance_order``, the sweep frame where it first
            appears; categories first seen in the same frame are never ordered against each other.
            When None, every id is taken to appear in its own frame.

    Returns:
        The question with its exact ground truth.

    Raises:
        QuestionUnavailable: When the scene cannot support the type.
        ValueError: On an unknown type.
    """
    try:
        gen = GENERATORS[question_type]
    except KeyError:
        raise ValueError(f"unknown question_type {question_type!r}; known: {list(GENERATORS)}") from None
    q = gen(scene, rng, appearance_order=appearance_order, appearance_frames=appearance_frames)
    if start_pose is not None:
        q.meta["start_pose"] = (start_pose.x, start_pose.y, start_pose.yaw_deg)
    q.meta["scene_id"] = scene.scene_id
    return q


def appearance_from_frames(object_id_maps: Sequence[np.ndarray], min_pixels: int = 20) -> tuple[list[int], list[int]]:
    """First-appearance order of objects over frames (e.g. the sweep).

    Args:
        object_id_maps: Per frame, the (H, W) int object-id map from the renderer.
        min_pixels: Pixels an object must cover in a frame to count as seen there.

    Returns:
        ``(ids, frames)``: object ids in order of first appearance, and the frame of each. Within a
        frame, ids are ordered by pixel count (largest first), then id.
    """
    seen: set[int] = set()
    ids: list[int] = []
    frames: list[int] = []
    for k, id_map in enumerate(object_id_maps):
        vals = id_map[id_map >= 0]
        if vals.size == 0:
            continue
        counts = np.bincount(vals)
        new = [int(i) for i in np.flatnonzero(counts >= max(1, min_pixels)) if int(i) not in seen]
        new.sort(key=lambda i: (-counts[i], i))
        for i in new:
            seen.add(i)
            ids.append(i)
            frames.append(k)
    return ids, frames

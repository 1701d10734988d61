"""The procedural generator's scalar fast paths (scene.py) agree exactly with the public numpy predicates."""

import numpy as np
import pytest

from a2c_ppo_acktr.envs import scene
from a2c_ppo_acktr.envs.procedural import _room_polygon
from a2c_ppo_acktr.envs.scene import (
    SceneObject,
    _convex_overlap_fast,
    _footprint_fast,
    _outline,
    _polygon_inside_polygon_fast,
    convex_polygons_overlap,
    polygon_inside_polygon,
    yaw_rotation,
)
from test_scene import L_SHAPE, RECT


def _rect(rng, center, yaw=None):
    w, d = rng.uniform(0.02, 2.0, size=2)
    yaw = rng.uniform(-180, 180) if yaw is None else yaw
    return SceneObject.upright(0, "x", (center[0], center[1], 0.5), (w, d, 1.0), yaw).footprint


def _convex(rng, center):
    """A random convex polygon (3-7 vertices on an ellipse), either orientation."""
    ang = np.sort(rng.uniform(0, 2 * np.pi, size=int(rng.integers(3, 8))))
    pts = np.asarray(center) + np.stack([np.cos(ang), np.sin(ang) * rng.uniform(0.3, 1.0)], 1) * rng.uniform(0.1, 2)
    return pts if rng.random() < 0.5 else pts[::-1].copy()


_RANDOM_PAIRS = 1000


def _pairs(rng):
    """Pairs of convex polygons: random ones, and rectangles touching, nearly touching or a margin apart."""
    for _ in range(_RANDOM_PAIRS):
        a = _rect(rng, rng.uniform(0, 3, size=2)) if rng.random() < 0.6 else _convex(rng, rng.uniform(0, 3, 2))
        b = _rect(rng, rng.uniform(0, 3, size=2)) if rng.random() < 0.6 else _convex(rng, rng.uniform(0, 3, 2))
        yield a, b
    for _ in range(500):
        yaw = float(rng.choice([0.0, 90.0, 180.0, -90.0, 30.0, rng.uniform(-180, 180)]))
        a = _rect(rng, rng.uniform(0, 5, size=2), yaw)
        edge = a[1] - a[0]  # shift b along the first edge by exactly its length, plus a little
        shift = edge * (1.0 + float(rng.choice([0.0, 1e-15, -1e-15, 1e-12, -1e-12, 1e-9, 0.05 / np.hypot(*edge)])))
        yield a, a + shift
        yield a, (a + shift)[::-1].copy()


@pytest.mark.parametrize("margin", [0.0, 0.05, -0.01, 1e-12])
def test_convex_overlap_fast_matches_numpy(monkeypatch, margin):
    rng = np.random.default_rng(0)
    fallbacks = []

    def counted(a, b, margin=0.0):
        fallbacks.append(1)
        return convex_polygons_overlap(a, b, margin=margin)

    monkeypatch.setattr(scene, "convex_polygons_overlap", counted)
    results = []
    for i, (a, b) in enumerate(_pairs(rng)):
        if i == _RANDOM_PAIRS:  # the scalar test decides most random pairs itself (touching ones go to numpy)
            assert len(fallbacks) < 0.1 * _RANDOM_PAIRS
        fast = _convex_overlap_fast(_outline(a), _outline(b), margin)
        assert fast == convex_polygons_overlap(a, b, margin=margin), (a.tolist(), b.tolist(), margin)
        results.append(fast)
    assert 0.05 < np.mean(results) < 0.95  # both answers are exercised


def test_polygon_inside_fast_matches_numpy():
    rng = np.random.default_rng(1)
    rooms = [RECT, L_SHAPE] + [_room_polygon(rng, 3.0, 10.0) for _ in range(20)]
    checked = []
    for room in rooms:
        lo, hi = room.min(axis=0), room.max(axis=0)
        outer = _outline(room)
        for _ in range(80):
            candidates = [_rect(rng, rng.uniform(lo - 0.5, hi + 0.5)), _convex(rng, rng.uniform(lo, hi))]
            # against a wall: one side on the wall line or a hair inside / outside
            k = int(rng.integers(len(room)))
            p0, p1 = room[k], room[(k + 1) % len(room)]
            e = (p1 - p0) / np.linalg.norm(p1 - p0)
            n = np.array([-e[1], e[0]])
            t = rng.uniform(0, np.linalg.norm(p1 - p0))
            off = float(rng.choice([0.0, 1e-12, -1e-12, 0.005]))
            w, d = rng.uniform(0.05, 1.5, size=2)
            base = p0 + t * e + n * off
            candidates.append(np.array([base, base + w * e, base + w * e + d * n, base + d * n]))
            candidates.append(room[[0, 1, 2]])  # vertices on the room's own corners
            for inner in candidates:
                fast = _polygon_inside_polygon_fast(_outline(inner), outer)
                assert fast == polygon_inside_polygon(inner, room), (inner.tolist(), room.tolist())
                checked.append(fast)
    assert 0.1 < np.mean(checked) < 0.9


def test_footprint_fast_is_the_objects_footprint():
    rng = np.random.default_rng(2)
    flip = np.diag([1.0, -1.0, 1.0])  # a reflection: the raw footprint comes out clockwise and is reversed
    tilt = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])  # local y is up
    for i in range(3000):
        yaw = float(rng.choice([0.0, 90.0, -90.0, 180.0, rng.uniform(-360, 360)]))
        extent = rng.uniform(0.0 if i % 50 == 0 else 0.01, 3.0, size=3)
        center = rng.uniform(-12, 12, size=3)
        rotation = yaw_rotation(yaw)
        if i % 3 == 1:
            rotation = rotation @ flip
        elif i % 3 == 2:
            rotation = rotation @ tilt
        expected = SceneObject(0, "x", center, extent, rotation).footprint
        got = _footprint_fast(float(center[0]), float(center[1]), extent, rotation)
        assert got.array.tobytes() == expected.tobytes(), (yaw, extent, center)
        assert got.xy == [tuple(p) for p in expected.tolist()]
        assert got.box == (*expected.min(axis=0).tolist(), *expected.max(axis=0).tolist())


def test_fast_paths_defer_to_numpy_on_non_finite_coordinates():
    a = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    for bad in (np.nan, np.inf, -np.inf):
        b = a + [5.0, 0.0]
        b[2, 0] = bad
        for p, q in ((a, b), (b, a), (b, b)):
            with np.errstate(invalid="ignore"):  # numpy's own warnings about the nan it makes
                for margin in (0.0, 0.05):
                    fast = _convex_overlap_fast(_outline(p), _outline(q), margin)
                    assert fast == convex_polygons_overlap(p, q, margin)
                fast = _polygon_inside_polygon_fast(_outline(p), _outline(L_SHAPE))
                assert fast == polygon_inside_polygon(p, L_SHAPE)
                assert _polygon_inside_polygon_fast(_outline(a), _outline(q)) == polygon_inside_polygon(a, q)

"""Scene model: box geometry, polygon area/containment, validation."""

import numpy as np
import pytest

from a2c_ppo_acktr.envs.scene import (
    MeshBuilder,
    Scene,
    SceneObject,
    convex_polygons_overlap,
    polygon_inside_polygon,
    triangulate_polygon,
)

RECT = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 3.0], [0.0, 3.0]])
# L-shape: 6 x 5 bounding box minus the 3 x 2 notch at the top right -> 30 - 6 = 24 m^2.
L_SHAPE = np.array([[0.0, 0.0], [6.0, 0.0], [6.0, 3.0], [3.0, 3.0], [3.0, 5.0], [0.0, 5.0]])


def _scene(polygon, objects=(), builder=None):
    mb = builder or MeshBuilder()
    if builder is None:
        mb.add_flat_polygon(polygon, 0.0, (0.5, 0.5, 0.5))
    v, t, c, i = mb.build()
    return Scene("s", "procedural", v, t, c, i, list(objects), polygon, 2.5)


def test_upright_box_geometry_closed_form():
    obj = SceneObject.upright(3, "sofa", (1.0, 2.0, 0.4), (2.0, 1.0, 0.8), yaw_deg=90.0)
    # Turned by 90 degrees the 2 m side runs along y.
    np.testing.assert_allclose(obj.aabb_min, [0.5, 1.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(obj.aabb_max, [1.5, 3.0, 0.8], atol=1e-9)
    assert obj.longest_side == pytest.approx(2.0)
    fp = obj.footprint
    assert fp.shape == (4, 2)
    x, y = fp[:, 0], fp[:, 1]
    area = 0.5 * (np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))
    assert area == pytest.approx(2.0)  # counter-clockwise, 2 m x 1 m


def test_rotated_footprint_of_square_is_diamond():
    obj = SceneObject.upright(0, "table", (0.0, 0.0, 0.5), (1.0, 1.0, 1.0), yaw_deg=45.0)
    r = np.sqrt(0.5)
    np.testing.assert_allclose(np.sort(np.abs(obj.footprint).max(axis=0)), [r, r], atol=1e-9)
    assert len(obj.corners) == 8


def test_room_area_rectangle_and_l_shape():
    assert _scene(RECT).room_area == pytest.approx(12.0)
    assert _scene(L_SHAPE).room_area == pytest.approx(30.0 - 6.0)


def test_clockwise_polygon_is_reversed_and_contains():
    s = _scene(L_SHAPE[::-1].copy())
    x, y = s.floor_polygon[:, 0], s.floor_polygon[:, 1]
    assert 0.5 * (np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y)) > 0
    assert s.contains_xy(1.0, 4.0) and s.contains_xy(5.0, 1.0)
    assert not s.contains_xy(5.0, 4.0)  # inside the notch
    np.testing.assert_array_equal(s.contains_xy(np.array([1.0, 5.0, 7.0]), np.array([1.0, 4.0, 1.0])), [True, False, False])


def test_room_center_of_rectangle():
    np.testing.assert_allclose(_scene(RECT).room_center, [2.0, 1.5, 1.25])


def test_triangulation_covers_polygon():
    tris = triangulate_polygon(L_SHAPE)
    assert tris.shape == (4, 3)
    p = L_SHAPE[tris]
    e1, e2 = p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]
    areas = 0.5 * np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])
    assert areas.sum() == pytest.approx(24.0)


def test_overlap_and_containment_helpers():
    a = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], dtype=float)
    assert convex_polygons_overlap(a, a + [0.5, 0.5])
    assert not convex_polygons_overlap(a, a + [1.2, 0.0])
    assert convex_polygons_overlap(a, a + [1.2, 0.0], margin=0.3)  # within the required gap
    # A rectangle spanning the notch of the L: all corners inside, yet it leaves the room.
    spanning = np.array([[2.0, 2.5], [4.0, 2.5], [4.0, 2.9], [2.0, 2.9]])
    assert polygon_inside_polygon(spanning, L_SHAPE)
    crossing = np.array([[2.5, 2.5], [3.5, 2.5], [3.5, 3.5], [2.5, 3.5]])
    assert not polygon_inside_polygon(crossing, L_SHAPE)


def test_lookup_helpers():
    objs = [SceneObject.upright(i, lab, (1, 1, 0.5), (0.5, 0.5, 1.0)) for i, lab in enumerate(["chair", "table", "chair"])]
    s = _scene(RECT, objs)
    assert s.label_counts() == {"chair": 2, "table": 1}
    assert [o.object_id for o in s.objects_by_label("chair")] == [0, 2]
    assert s.object(1).label == "table"
    with pytest.raises(KeyError, match="no object 7"):
        s.object(7)


def test_validation_errors():
    with pytest.raises(ValueError, match="unique"):
        _scene(RECT, [SceneObject.upright(1, "a", (0, 0, 0), (1, 1, 1)), SceneObject.upright(1, "b", (0, 0, 0), (1, 1, 1))])
    mb = MeshBuilder()
    mb.add_box((1, 1, 1), (1, 1, 1), (1, 0, 0), object_id=5)
    with pytest.raises(ValueError, match="unknown objects"):
        _scene(RECT, [], builder=mb)
    with pytest.raises(ValueError, match="orthonormal"):
        SceneObject(0, "x", np.zeros(3), np.ones(3), np.ones((3, 3)))
    with pytest.raises(ValueError, match="-1 is reserved"):
        SceneObject(-1, "x", np.zeros(3), np.ones(3))


def test_occupancy_grid_disk_query():
    from a2c_ppo_acktr.envs.scene import OccupancyGrid

    blocked = np.zeros((20, 20), dtype=bool)
    blocked[10, 10] = True  # the cell [1.0, 1.1) x [1.0, 1.1) with cell 0.1 and origin 0
    g = OccupancyGrid(np.zeros(2), 0.1, blocked)
    pts = np.array([[1.05, 1.05], [1.05 + 0.22, 1.05], [1.05 + 0.35, 1.05], [1.05, 1.05 - 0.35], [-0.5, 1.0], [5.0, 5.0]])
    np.testing.assert_array_equal(g.blocked_within(pts, 0.2), [True, True, False, False, True, True])

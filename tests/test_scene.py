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
    np.testing.assert_array_equal(
        s.contains_xy(np.array([1.0, 5.0, 7.0]), np.array([1.0, 4.0, 1.0])), [True, False, False]
    )


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
    objs = [
        SceneObject.upright(i, lab, (1, 1, 0.5), (0.5, 0.5, 1.0)) for i, lab in enumerate(["chair", "table", "chair"])
    ]
    s = _scene(RECT, objs)
    assert s.label_counts() == {"chair": 2, "table": 1}
    assert [o.object_id for o in s.objects_by_label("chair")] == [0, 2]
    assert s.object(1).label == "table"
    with pytest.raises(KeyError, match="no object 7"):
        s.object(7)


def test_validation_errors():
    with pytest.raises(ValueError, match="unique"):
        _scene(
            RECT, [SceneObject.upright(1, "a", (0, 0, 0), (1, 1, 1)), SceneObject.upright(1, "b", (0, 0, 0), (1, 1, 1))]
        )
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
    pts = np.array(
        [[1.05, 1.05], [1.05 + 0.22, 1.05], [1.05 + 0.35, 1.05], [1.05, 1.05 - 0.35], [-0.5, 1.0], [5.0, 5.0]]
    )
    np.testing.assert_array_equal(g.blocked_within(pts, 0.2), [True, True, False, False, True, True])


def _random_rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def test_closed_primitives_are_wound_outward_and_inscribed_in_their_box():
    """Boxes, cylinders and frusta along each axis, (super)ellipsoids: each triangle's normal points
    away from the primitive's center, and the vertices fill the given box exactly (touch all faces)."""
    rng = np.random.default_rng(5)
    mb = MeshBuilder()
    specs = []
    for k in range(12):
        center, extent, rot = rng.uniform(-3, 3, 3), rng.uniform(0.02, 1.5, 3), _random_rotation(rng)
        kind = ["box", "cylinder", "frustum", "ellipsoid"][k % 4]
        if kind == "box":
            mb.add_box(center, extent, (1, 0, 0), 1, rot)
        elif kind == "cylinder":
            mb.add_cylinder(center, extent, (1, 0, 0), 1, rot, axis=k % 3, segments=16)
        elif kind == "frustum":
            mb.add_frustum(center, extent, (1, 0, 0), 1, rot, axis=k % 3, scales=(1.0, 0.4), segments=12)
        else:
            mb.add_ellipsoid(center, extent, (1, 0, 0), 1, rot, squareness=(1.0, 1.0) if k % 8 == 3 else (0.3, 0.5))
        specs.append((center, extent, rot))
    v, t, _, _ = mb.build()
    v = v.astype(np.float64)
    assert len(mb.primitives) == len(specs) and sum(n for _, n, _ in mb.primitives) == len(t)
    for (first, n, center), (c, extent, rot) in zip(mb.primitives, specs):
        np.testing.assert_allclose(center, c)
        tri = t[first : first + n]
        a, b, cc = v[tri[:, 0]], v[tri[:, 1]], v[tri[:, 2]]
        normal = np.cross(b - a, cc - a)
        assert np.all(np.einsum("ij,ij->i", normal, (a + b + cc) / 3 - center) > 0)
        assert np.all(np.linalg.norm(normal, axis=1) > 0)  # no degenerate triangles
        local = (v[np.unique(tri)] - c) @ rot
        np.testing.assert_allclose(local.max(axis=0), extent / 2, atol=1e-5)
        np.testing.assert_allclose(local.min(axis=0), -extent / 2, atol=1e-5)


def test_primitive_triangle_counts_and_bad_arguments():
    mb = MeshBuilder()
    mb.add_cylinder((0, 0, 0), (1, 1, 1), (1, 1, 1), segments=16)
    mb.add_ellipsoid((0, 0, 0), (1, 1, 1), (1, 1, 1), segments=12, rings=6)
    assert [n for _, n, _ in mb.primitives] == [4 * 16 - 4, 2 * 12 * 5]
    assert mb.num_triangles == 60 + 120
    with pytest.raises(ValueError, match="scales"):
        mb.add_frustum((0, 0, 0), (1, 1, 1), (1, 1, 1), scales=(0.0, 1.0))
    with pytest.raises(ValueError, match="squareness"):
        mb.add_ellipsoid((0, 0, 0), (1, 1, 1), (1, 1, 1), squareness=(2.0, 1.0))
    with pytest.raises(ValueError, match="facing"):
        mb.add_flat_polygon(RECT, 0.0, (1, 1, 1), facing="sideways")


def test_structure_faces_into_the_room():
    """Floor normals +z, ceiling -z (``facing="down"``), walls along a counter-clockwise outline
    toward the inside (a point 1 cm along each wall's normal is in the room)."""
    mb = MeshBuilder()
    mb.add_flat_polygon(L_SHAPE, 0.0, (0.5, 0.5, 0.5))
    mb.add_flat_polygon(L_SHAPE[::-1], 2.5, (0.9, 0.9, 0.9), facing="down")  # either orientation in
    for k in range(len(L_SHAPE)):
        mb.add_wall(L_SHAPE[k], L_SHAPE[(k + 1) % len(L_SHAPE)], 2.5, (0.8, 0.8, 0.8))
    scene = _scene(L_SHAPE, builder=mb)
    n = scene.triangle_normals()
    z = scene.vertices[scene.triangles][:, :, 2]
    floor, ceiling = np.all(z == 0.0, axis=1), np.all(z == 2.5, axis=1)
    walls = ~floor & ~ceiling
    assert floor.sum() == 4 and ceiling.sum() == 4 and walls.sum() == 12
    assert np.all(n[floor, 2] > 0.999) and np.all(n[ceiling, 2] < -0.999)
    probe = scene.vertices[scene.triangles[walls]].mean(axis=1)[:, :2] + 0.01 * n[walls, :2]
    assert scene.contains_xy(probe[:, 0], probe[:, 1]).all()

"""Renderer (depth, color, id map against pinhole closed forms) and the top-down map."""

import numpy as np
import pytest

from a2c_ppo_acktr.envs.renderer import Camera, Pose, Renderer, visible_objects
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject
from a2c_ppo_acktr.envs.topdown import render_topdown

W_ROOM, D_ROOM, H_ROOM = 4.0, 6.0, 3.0
GRAY = (0.6, 0.6, 0.6)


def _room(objects=(), colors=()):
    """A 4 x 6 x 3 m box room; objects are added as plain boxes with the given colors."""
    mb = MeshBuilder()
    poly = np.array([[0, 0], [W_ROOM, 0], [W_ROOM, D_ROOM], [0, D_ROOM]], dtype=float)
    mb.add_flat_polygon(poly, 0.0, GRAY)
    mb.add_flat_polygon(poly, H_ROOM, GRAY)
    for k in range(4):
        mb.add_wall(poly[k], poly[(k + 1) % 4], H_ROOM, GRAY)
    for obj, color in zip(objects, colors):
        mb.add_object_box(obj, color)
    v, t, c, i = mb.build()
    return Scene("room", "procedural", v, t, c, i, list(objects), poly, H_ROOM)


CAM = Camera(width=64, height=48, fov_deg=90.0, eye_height=1.5)
F = (64 / 2) / np.tan(np.deg2rad(45.0))  # focal length in pixels


def _project(pose, point):
    """Independent pinhole projection for yaw 0 or 90 (optical axis +x or +y), pixel centers at +0.5."""
    dx, dy, dz = point[0] - pose.x, point[1] - pose.y, point[2] - CAM.eye_height
    if pose.yaw_deg == 0:
        fwd, right = dx, -dy
    elif pose.yaw_deg == 90:
        fwd, right = dy, dx
    else:
        raise AssertionError("test helper handles yaw 0 and 90 only")
    return CAM.width / 2 + F * right / fwd, CAM.height / 2 - F * dz / fwd


def test_depth_of_facing_wall_is_its_distance():
    r = Renderer(_room(), CAM)
    frame = r.render(Pose(1.0, 3.0, 0.0))  # looking along +x at the wall x = 4, 3 m away
    # A wall perpendicular to the optical axis has the same z-depth at every pixel on it.
    center = frame.depth[18:30, 20:44]
    # Embree intersects float32 rays in float32: ~1e-6 m here. The 0.01 m of these tests is far above
    # that and far below a wrong depth convention or a ray half a pixel off (0.04 m on the floor row).
    np.testing.assert_allclose(center, 3.0, atol=0.01)
    assert frame.depth.dtype == np.float32 and frame.rgb.dtype == np.uint8 and frame.object_ids.dtype == np.int32
    assert frame.rgb.shape == (48, 64, 3)
    assert (frame.object_ids == -1).all()


def test_floor_depth_closed_form():
    r = Renderer(_room(), CAM)
    frame = r.render(Pose(0.5, 3.0, 0.0))
    # Row v (pixel centre v + 0.5) below the horizon sees the floor at z-depth eye * f / dv.
    v = 47
    dv = v + 0.5 - CAM.height / 2
    expected = CAM.eye_height * F / dv
    assert expected < 3.5  # the floor is hit before the far wall
    assert frame.depth[v, 32] == pytest.approx(expected, abs=0.01)


def test_pitch_down_centre_ray_hits_floor():
    cam = Camera(width=33, height=33, fov_deg=60.0, eye_height=1.5, pitch_deg=30.0)
    frame = Renderer(_room(), cam).render(Pose(0.5, 3.0, 0.0))
    # The centre ray leaves at 30 degrees down and meets the floor after 1.5 / sin(30) = 3 m.
    assert frame.depth[16, 16] == pytest.approx(3.0, abs=0.01)


@pytest.mark.parametrize("yaw", [0.0, 90.0])
def test_object_color_and_id_at_projected_center(yaw):
    red = SceneObject.upright(0, "box", (3.0, 3.0, 1.5), (0.4, 0.4, 0.4))
    green = SceneObject.upright(1, "box", (3.0, 4.2, 1.2), (0.4, 0.4, 0.4))
    blue = SceneObject.upright(2, "box", (1.0, 5.0, 1.5), (0.4, 0.4, 0.4))
    scene = _room([red, green, blue], [(1, 0, 0), (0, 1, 0), (0, 0, 1)])
    pose = Pose(1.0, 3.0, yaw)
    frame = Renderer(scene, CAM).render(pose)
    visible = [red, green] if yaw == 0 else [blue]
    for obj in visible:
        u, v = _project(pose, obj.center)
        px = frame.rgb[int(v), int(u)].astype(int)
        channel = obj.object_id
        assert px[channel] > 60 and px[channel] > 3 * max(np.delete(px, channel)), (obj.object_id, px)
        assert frame.object_ids[int(v), int(u)] == obj.object_id
    assert visible_objects(frame, min_pixels=5) == [o.object_id for o in visible]


def test_id_map_area_matches_projected_face():
    box = SceneObject.upright(0, "box", (3.2, 3.0, 1.5), (0.4, 0.6, 0.4))
    frame = Renderer(_room([box], [(1, 0, 0)]), CAM).render(Pose(1.0, 3.0, 0.0))
    # Seen head-on, only the near face (x = 3.0, 0.6 m wide, 0.4 m tall) is visible, 2 m away.
    expected = (F * 0.6 / 2.0) * (F * 0.4 / 2.0)
    count = int((frame.object_ids == 0).sum())
    assert abs(count - expected) <= 0.15 * expected
    ys, xs = np.nonzero(frame.object_ids == 0)
    u0, _ = _project(Pose(1.0, 3.0, 0.0), (3.0, 3.3, 1.5))
    u1, _ = _project(Pose(1.0, 3.0, 0.0), (3.0, 2.7, 1.5))
    assert xs.min() >= int(u0) and xs.max() <= int(u1)
    np.testing.assert_allclose(frame.depth[frame.object_ids == 0], 2.0, atol=0.01)


def test_render_is_deterministic_and_batch_equals_single():
    box = SceneObject.upright(0, "box", (3.0, 2.0, 0.5), (0.5, 0.5, 1.0), yaw_deg=30.0)
    r = Renderer(_room([box], [(0.2, 0.4, 0.9)]), CAM)
    poses = [Pose(1.0, 1.0 + 0.5 * k, 37.0 * k) for k in range(5)]
    batch = r.render_many(poses)
    again = r.render_many(poses)
    for p, a, b in zip(poses, batch, again):
        single = r.render(p)
        for f in (b, single):
            np.testing.assert_array_equal(a.rgb, f.rgb)
            np.testing.assert_array_equal(a.depth, f.depth)
            np.testing.assert_array_equal(a.object_ids, f.object_ids)
    assert r.render_many([]) == []
    # Batches beyond max_rays_per_cast are split into several casts with identical results.
    chunked = Renderer(r.scene, CAM, max_rays_per_cast=2 * CAM.width * CAM.height).render_many(poses)
    for a, b in zip(batch, chunked):
        np.testing.assert_array_equal(a.rgb, b.rgb)
        np.testing.assert_array_equal(a.object_ids, b.object_ids)


def test_rays_that_miss_give_inf_and_no_id():
    mb = MeshBuilder()
    mb.add_box((5.0, 0.0, 1.5), (0.2, 0.2, 0.2), (1, 1, 1), object_id=0)
    v, t, c, i = mb.build()
    scene = Scene(
        "open",
        "procedural",
        v,
        t,
        c,
        i,
        [SceneObject.upright(0, "box", (5, 0, 1.5), (0.2, 0.2, 0.2))],
        np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=float),
        3.0,
    )
    frame = Renderer(scene, CAM).render(Pose(0.0, 0.0, 180.0))  # looking away from the only box
    assert np.isinf(frame.depth).all()
    assert (frame.object_ids == -1).all() and (frame.rgb == 0).all()


def test_topdown_is_uint8_of_requested_size_and_highlights():
    box = SceneObject.upright(0, "chair", (1.0, 1.0, 0.5), (0.5, 0.5, 1.0))
    scene = _room([box], [(0.2, 0.8, 0.2)])
    plain = render_topdown(scene, size=160)
    assert plain.shape == (160, 160, 3) and plain.dtype == np.uint8
    marked = render_topdown(scene, path=[Pose(2, 2, 0), Pose(2, 4, 90)], highlight_ids=[0], caption="Q?", size=160)
    assert marked.shape == (160, 160, 3)
    reddish = lambda img: int(((img[..., 0] > 180) & (img[..., 1] < 90) & (img[..., 2] < 90)).sum())  # noqa: E731
    assert reddish(marked) > reddish(plain) + 20

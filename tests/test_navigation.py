"""Navigation: collisions stop the agent's disk at the contact point; free-pose sampling."""

import numpy as np
import pytest

from a2c_ppo_acktr.envs.navigation import is_free, sample_free_pose, try_move
from a2c_ppo_acktr.envs.renderer import Pose
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject

R = 0.2


def _room(objects=()):
    poly = np.array([[0, 0], [5, 0], [5, 4], [0, 4]], dtype=float)
    mb = MeshBuilder()
    mb.add_flat_polygon(poly, 0.0, (0.5, 0.5, 0.5))
    for o in objects:
        mb.add_object_box(o, (1, 0, 0))
    v, t, c, i = mb.build()
    return Scene("nav", "procedural", v, t, c, i, list(objects), poly, 2.5)


def test_free_walk_reaches_target_exactly():
    pose, collided = try_move(_room(), Pose(1.0, 1.0, 0.0), 90.0, 2.0, R)
    assert not collided
    assert (pose.x, pose.y, pose.yaw_deg) == pytest.approx((1.0, 3.0, 90.0))


def test_walking_into_wall_stops_radius_before_it():
    pose, collided = try_move(_room(), Pose(1.0, 2.0, 0.0), 0.0, 10.0, R)
    assert collided
    # the contact is bisected 14 times inside a 0.05 m step (3e-6 m); 2e-3 m is far below a wrong radius
    assert pose.x == pytest.approx(5.0 - R, abs=2e-3) and pose.x <= 5.0 - R + 1e-9
    assert pose.y == pytest.approx(2.0)


def test_walking_into_object_stops_radius_before_its_face():
    table = SceneObject.upright(0, "table", (3.0, 2.0, 0.4), (1.0, 1.0, 0.8))
    pose, collided = try_move(_room([table]), Pose(0.5, 2.0, 0.0), 0.0, 3.0, R)
    assert collided
    assert pose.x == pytest.approx(2.5 - R, abs=2e-3)


def test_turn_then_walk_backwards_and_yaw_wraps():
    pose, collided = try_move(_room(), Pose(2.0, 2.0, 350.0), 30.0, -1.0, R)
    assert not collided
    assert pose.yaw_deg == pytest.approx(20.0)
    np.testing.assert_allclose([pose.x, pose.y], [2.0 - np.cos(np.deg2rad(20)), 2.0 - np.sin(np.deg2rad(20))])
    turned, collided = try_move(_room(), Pose(0.2, 0.2, 0.0), -450.0, 0.0, R)
    assert not collided and turned.yaw_deg == pytest.approx(270.0)


def test_disk_against_a_box_corner_uses_true_distance():
    box = SceneObject.upright(0, "cabinet", (2.5, 2.0, 0.5), (1.0, 1.0, 1.0))  # corner at (3.0, 2.5)
    scene = _room([box])
    d = R / np.sqrt(2.0)
    # Diagonal from the corner: the bounding square of the disk overlaps the box, the disk may not.
    assert not is_free(scene, 3.0 + 0.9 * d, 2.5 + 0.9 * d, R)  # 0.9 R from the corner
    assert is_free(scene, 3.0 + 1.1 * d, 2.5 + 1.1 * d, R)  # 1.1 R: free, though inside the inflated square
    assert not is_free(scene, 2.5, 2.0, R)  # inside the box


def test_high_mounted_objects_do_not_block():
    tv = SceneObject.upright(0, "tv", (2.5, 3.95, 1.6), (1.0, 0.1, 0.6))
    assert is_free(_room([tv]), 2.5, 3.75, R)
    low = SceneObject.upright(0, "cabinet", (2.5, 3.95, 0.4), (1.0, 0.1, 0.8))
    assert not is_free(_room([low]), 2.5, 3.75, R)


def test_start_in_collision_does_not_move():
    box = SceneObject.upright(0, "box", (2.5, 2.0, 0.5), (1.0, 1.0, 1.0))
    pose, collided = try_move(_room([box]), Pose(2.5, 2.0, 0.0), 0.0, 1.0, R)
    assert collided and (pose.x, pose.y) == (2.5, 2.0)


def test_sample_free_pose_is_free_and_seeded():
    box = SceneObject.upright(0, "box", (2.5, 2.0, 0.5), (3.0, 2.0, 1.0))
    scene = _room([box])
    poses = [sample_free_pose(scene, np.random.default_rng(7), R) for _ in range(2)]
    assert poses[0] == poses[1]
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = sample_free_pose(scene, rng, R)
        assert is_free(scene, p.x, p.y, R) and 0.0 <= p.yaw_deg < 360.0
    with pytest.raises(ValueError, match="no free pose"):
        sample_free_pose(scene, rng, radius=2.5, max_tries=300)

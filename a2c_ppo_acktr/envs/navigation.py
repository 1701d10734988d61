"""Agent motion on the floor: turn, then walk straight, with the agent's disk kept off walls and objects.

The agent is a disk of radius ``radius`` on the floor plane. A position is free when

* the disk lies inside the floor polygon (its center inside and at least ``radius`` from every edge), and
* the disk does not touch the footprint of any *obstacle*: an object whose bottom is below
  ``obstacle_max_bottom`` (default 0.8 m). Objects standing on the floor (furniture, appliances,
  doors) are obstacles; things mounted higher (a TV or picture on a wall, a wall cabinet above 0.8 m,
  a window whose sill is above 0.8 m) are not, and small items resting on furniture lie inside their
  support's footprint anyway.
* for real scans, which carry an occupancy raster (``Scene.occupancy``), the disk also stays off
  cells with no scanned floor or with scanned surface between knee and body height (walls between
  rooms, unlabelled clutter), at the raster's resolution (5 cm).

Moves are checked by sampling the straight segment every ``min(0.05, radius / 2)`` m (an obstacle
inflated by the disk is at least ``2 * radius`` wide, so no obstacle can be stepped over), then
bisecting between the last free and the first blocked sample: the agent stops within a millimetre of
the contact point. Headings are wrapped to ``[0, 360)`` degrees.
"""

from __future__ import annotations

import weakref

import numpy as np

from a2c_ppo_acktr.envs.renderer import Pose
from a2c_ppo_acktr.envs.scene import Scene, points_in_polygon

DEFAULT_OBSTACLE_MAX_BOTTOM = 0.8
_BISECT_STEPS = 14


class _NavGeometry:
    """Per-scene arrays for the free-space test (built once per scene and radius-independent)."""

    def __init__(self, scene: Scene, obstacle_max_bottom: float) -> None:
        poly = scene.floor_polygon
        self.wall_a = poly
        self.wall_b = np.roll(poly, -1, axis=0)
        fps = [o.footprint for o in scene.objects if o.aabb_min[2] < obstacle_max_bottom]
        self.footprints = np.asarray(fps, dtype=np.float64).reshape(-1, 4, 2)  # (K, 4, 2), CCW
        self.polygon = poly


_CACHE: "weakref.WeakKeyDictionary[Scene, dict[float, _NavGeometry]]" = weakref.WeakKeyDictionary()


def _geometry(scene: Scene, obstacle_max_bottom: float) -> _NavGeometry:
    per_scene = _CACHE.setdefault(scene, {})
    if obstacle_max_bottom not in per_scene:
        per_scene[obstacle_max_bottom] = _NavGeometry(scene, obstacle_max_bottom)
    return per_scene[obstacle_max_bottom]


def _segment_distance(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from points (M, 2) to segments a, b (..., 2); returns (M, ...)."""
    p = points.reshape((points.shape[0],) + (1,) * (a.ndim - 1) + (2,))
    ab = b - a
    denom = np.maximum((ab * ab).sum(-1), 1e-18)
    t = np.clip(((p - a) * ab).sum(-1) / denom, 0.0, 1.0)
    closest = a + t[..., None] * ab
    return np.linalg.norm(p - closest, axis=-1)


def free_mask(
    scene: Scene, points: np.ndarray, radius: float, obstacle_max_bottom: float = DEFAULT_OBSTACLE_MAX_BOTTOM
) -> np.ndarray:
    """Vectorised free-space test of floor points (M, 2) for a disk of ``radius``; returns bool (M,)."""
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    g = _geometry(scene, obstacle_max_bottom)
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    inside = points_in_polygon(pts, g.polygon)
    wall_dist = _segment_distance(pts, g.wall_a, g.wall_b).min(axis=1)
    free = inside & (wall_dist >= radius)
    if len(g.footprints) and free.any():
        a = g.footprints
        b = np.roll(a, -1, axis=1)
        d = _segment_distance(pts, a, b).min(axis=2)  # (M, K)
        # Inside a CCW convex footprint: left of (or on) every edge.
        edge = b - a
        rel = pts[:, None, None, :] - a[None]
        cross = edge[None, ..., 0] * rel[..., 1] - edge[None, ..., 1] * rel[..., 0]
        inside_fp = (cross >= 0).all(axis=2)
        hit = inside_fp | (d < radius)
        free &= ~hit.any(axis=1)
    if scene.occupancy is not None and free.any():
        free &= ~scene.occupancy.blocked_within(pts, radius)
    return free


def is_free(
    scene: Scene, x: float, y: float, radius: float, obstacle_max_bottom: float = DEFAULT_OBSTACLE_MAX_BOTTOM
) -> bool:
    """Whether the agent's disk centred at ``(x, y)`` touches no wall and no obstacle."""
    return bool(free_mask(scene, np.array([[x, y]]), radius, obstacle_max_bottom)[0])


def try_move(
    scene: Scene,
    pose: Pose,
    rotation_deg: float,
    forward_m: float,
    radius: float,
    obstacle_max_bottom: float = DEFAULT_OBSTACLE_MAX_BOTTOM,
) -> tuple[Pose, bool]:
    """Turn by ``rotation_deg`` (CCW positive), then walk ``forward_m`` along the new heading.

    A negative ``forward_m`` walks backwards. When the path is blocked the agent stops at the last
    free point before the contact and ``collided`` is True; a turn alone never collides.

    Returns:
        ``(new_pose, collided)``.
    """
    yaw = float((pose.yaw_deg + rotation_deg) % 360.0)
    if forward_m == 0:
        return Pose(pose.x, pose.y, yaw), False
    heading = np.array([np.cos(np.deg2rad(yaw)), np.sin(np.deg2rad(yaw))])
    start = np.array([pose.x, pose.y], dtype=np.float64)
    step = min(0.05, radius / 2.0) if radius > 0 else 0.01
    n = int(np.ceil(abs(forward_m) / step))
    s = np.linspace(0.0, forward_m, n + 1)[1:]
    free = free_mask(scene, start + s[:, None] * heading, radius, obstacle_max_bottom)
    if free.all():
        end = start + forward_m * heading
        return Pose(float(end[0]), float(end[1]), yaw), False
    k = int(np.argmin(free))  # first blocked sample
    lo = s[k - 1] if k > 0 else 0.0
    hi = s[k]
    if k == 0 and not is_free(scene, pose.x, pose.y, radius, obstacle_max_bottom):
        return Pose(pose.x, pose.y, yaw), True  # started in collision: refuse to move at all
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        p = start + mid * heading
        if is_free(scene, p[0], p[1], radius, obstacle_max_bottom):
            lo = mid
        else:
            hi = mid
    end = start + lo * heading
    return Pose(float(end[0]), float(end[1]), yaw), True


def sample_free_pose(
    scene: Scene,
    rng: np.random.Generator,
    radius: float,
    max_tries: int = 2000,
    obstacle_max_bottom: float = DEFAULT_OBSTACLE_MAX_BOTTOM,
) -> Pose:
    """A uniformly random free position (rejection sampling in the floor's bounding box) and yaw.

    Raises:
        ValueError: when no free position was found in ``max_tries`` draws (room too cluttered or
            ``radius`` too large for it).
    """
    lo = scene.floor_polygon.min(axis=0)
    hi = scene.floor_polygon.max(axis=0)
    batch = 256
    tried = 0
    while tried < max_tries:
        m = min(batch, max_tries - tried)
        pts = rng.uniform(lo, hi, size=(m, 2))
        yaws = rng.uniform(0.0, 360.0, size=m)
        ok = np.flatnonzero(free_mask(scene, pts, radius, obstacle_max_bottom))
        if len(ok):
            i = ok[0]
            return Pose(float(pts[i, 0]), float(pts[i, 1]), float(yaws[i]))
        tried += m
    raise ValueError(
        f"no free pose for an agent of radius {radius} m in scene {scene.scene_id!r} after {max_tries} draws; "
        "use a smaller env.agent_radius or a less cluttered scene"
    )


# A walk-through of a room (the mini benchmark's videos, the env's video_qa mode): a turn in place
# over the first WALK_SWEEP_FRACTION of the frames, then a collision-checked walk toward waypoints.
WALK_SWEEP_FRACTION = 0.5  # share of the frames spent on the 360-degree turn at the start
WALK_MAX_TURN_DEG = 30.0  # walk phase: largest turn toward the waypoint per frame
WALK_STEP_M = 0.3  # walk phase: forward step per frame
WALK_BLOCKED_TURN_DEG = 90.0  # walk phase: turn when a step is blocked
WALK_WAYPOINT_REACHED_M = 0.5


def walkthrough_poses(
    scene: Scene, rng: np.random.Generator, num_frames: int, radius: float, start: Pose | None = None
) -> list[Pose]:
    """Poses of a walk-through: a 360-degree turn in place, then a collision-checked walk.

    From ``start`` (else a free pose drawn from ``rng``) the camera turns left in
    ``round(num_frames * WALK_SWEEP_FRACTION)`` even steps (at least one frame), then walks: each
    frame turns up to :data:`WALK_MAX_TURN_DEG` toward a waypoint and steps :data:`WALK_STEP_M`
    forward (:func:`try_move`); a blocked step turns :data:`WALK_BLOCKED_TURN_DEG` left in place
    instead, and a reached waypoint is replaced by a new free point drawn from ``rng``.

    Args:
        scene: The room.
        rng: Randomness of the start pose and the waypoints.
        num_frames: Number of poses (one per frame), >= 1.
        radius: The agent's disk radius (``env.agent_radius``).
        start: The first pose; None draws one.

    Returns:
        ``num_frames`` poses, in walking order; the first is ``start``.
    """
    if num_frames < 1:
        raise ValueError(f"a walk-through needs num_frames >= 1, got {num_frames}")
    if start is None:
        start = sample_free_pose(scene, rng, radius)
    n_sweep = min(num_frames, max(1, int(round(num_frames * WALK_SWEEP_FRACTION))))
    poses = [Pose(start.x, start.y, (start.yaw_deg + k * 360.0 / n_sweep) % 360.0) for k in range(n_sweep)]
    pose = poses[-1]
    waypoint = sample_free_pose(scene, rng, radius)
    while len(poses) < num_frames:
        to = np.array([waypoint.x - pose.x, waypoint.y - pose.y])
        if np.linalg.norm(to) < WALK_WAYPOINT_REACHED_M:
            waypoint = sample_free_pose(scene, rng, radius)
            continue
        angle = (np.degrees(np.arctan2(to[1], to[0])) - pose.yaw_deg + 180.0) % 360.0 - 180.0
        turn = float(np.clip(angle, -WALK_MAX_TURN_DEG, WALK_MAX_TURN_DEG))
        moved, collided = try_move(scene, pose, turn, WALK_STEP_M, radius)
        if collided:
            moved, _ = try_move(scene, pose, WALK_BLOCKED_TURN_DEG, 0.0, radius)
        pose = moved
        poses.append(pose)
    return poses

"""The scene model shared by procedural rooms, real-scan loaders, the renderer and the questions.

Conventions (the same everywhere in the package):

* Units are meters; the world frame is right-handed with **z up** and the floor at ``z = 0``.
* A yaw angle is in degrees, counter-clockwise about +z starting from +x (yaw 0 looks along +x,
  yaw 90 along +y).
* A scene is a triangle soup: ``vertices (V, 3) float32``, ``triangles (F, 3) int32``, one RGB color in
  ``[0, 1]`` per triangle and one object id per triangle (``-1`` for structure: floor, walls, ceiling).
* Every object is an oriented box (:class:`SceneObject`): ``center``, full side lengths ``extent``
  along its own axes, and ``rotation`` whose columns are those axes in the world frame. This is the
  same description VSI-Bench's meta information uses (centroid, axis lengths, normalized axes).
* The room outline is ``floor_polygon (P, 2)``, counter-clockwise (a clockwise input is reversed on
  construction), and the room is ``ceiling_height`` tall.

:class:`MeshBuilder` accumulates boxes and polygons into the arrays a :class:`Scene` needs; the
procedural generator and the tests build scenes with it.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.envs.materials import MATERIALS, material_id

# Corner signs of a unit box, ordered bottom face (z-) then top face (z+), each counter-clockwise
# seen from above so that ``corners[:4]`` is a valid footprint polygon for an upright box.
_BOX_SIGNS = np.array(
    [
        [-1, -1, -1],
        [1, -1, -1],
        [1, 1, -1],
        [-1, 1, -1],
        [-1, -1, 1],
        [1, -1, 1],
        [1, 1, 1],
        [-1, 1, 1],
    ],
    dtype=np.float64,
)
# Twelve triangles of a box over the corner order above (two per face).
_BOX_TRIANGLES = np.array(
    [
        [0, 2, 1],
        [0, 3, 2],  # bottom
        [4, 5, 6],
        [4, 6, 7],  # top
        [0, 1, 5],
        [0, 5, 4],  # -y side
        [1, 2, 6],
        [1, 6, 5],  # +x side
        [2, 3, 7],
        [2, 7, 6],  # +y side
        [3, 0, 4],
        [3, 4, 7],  # -x side
    ],
    dtype=np.int32,
)


def yaw_rotation(yaw_deg: float) -> np.ndarray:
    """Rotation matrix (3, 3) about +z by ``yaw_deg`` degrees, counter-clockwise."""
    a = np.deg2rad(yaw_deg)
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def polygon_area(polygon: np.ndarray) -> float:
    """Signed shoelace area of a polygon (P, 2): positive when counter-clockwise."""
    p = np.asarray(polygon, dtype=np.float64)
    x, y = p[:, 0], p[:, 1]
    return float(0.5 * (np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y)))


def polygon_centroid(polygon: np.ndarray) -> np.ndarray:
    """Area centroid (2,) of a simple polygon (P, 2)."""
    p = np.asarray(polygon, dtype=np.float64)
    x, y = p[:, 0], p[:, 1]
    xn, yn = np.roll(x, -1), np.roll(y, -1)
    cross = x * yn - xn * y
    a = cross.sum() / 2.0
    if abs(a) < 1e-12:
        return p.mean(axis=0)
    return np.array([((x + xn) * cross).sum(), ((y + yn) * cross).sum()]) / (6.0 * a)


def points_in_polygon(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """Even-odd test of points (..., 2) against a simple polygon (P, 2); returns bool (...).

    Points exactly on the boundary may fall either way; callers that need a margin use distances.
    """
    pts = np.asarray(points, dtype=np.float64)
    poly = np.asarray(polygon, dtype=np.float64)
    x = pts[..., 0][..., None]
    y = pts[..., 1][..., None]
    x0, y0 = poly[:, 0], poly[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    straddles = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    crossings = straddles & (x < x_cross)
    return (crossings.sum(axis=-1) % 2) == 1


def convex_polygons_overlap(a: np.ndarray, b: np.ndarray, margin: float = 0.0) -> bool:
    """Separating-axis test of two convex polygons (Pa, 2) and (Pb, 2).

    Args:
        a: First convex polygon, any orientation.
        b: Second convex polygon.
        margin: Polygons closer than this (along every edge normal) count as overlapping; use a
            small negative value to let touching polygons pass.

    Returns:
        True when no edge normal of either polygon separates them by more than ``margin``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    # Bounding boxes apart by >= margin: the polygons are at least that far apart (cheap early out).
    if np.any(b.min(axis=0) - a.max(axis=0) >= margin) or np.any(a.min(axis=0) - b.max(axis=0) >= margin):
        return False
    for poly in (a, b):
        edges = poly[np.r_[1 : len(poly), 0]] - poly
        normals = np.stack([-edges[:, 1], edges[:, 0]], axis=1)
        lengths = np.linalg.norm(normals, axis=1)
        keep = lengths > 1e-12
        normals = normals[keep] / lengths[keep, None]
        pa = a @ normals.T
        pb = b @ normals.T
        gap = np.maximum(pb.min(axis=0) - pa.max(axis=0), pa.min(axis=0) - pb.max(axis=0))
        if np.any(gap >= margin):
            return False
    return True


def segments_intersect(p0: np.ndarray, p1: np.ndarray, q0: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """Proper intersection of segment sets p (N, 2) and q (M, 2); returns bool (N, M).

    Touching at an endpoint or collinear overlap does not count, which is what containment tests
    of a footprint resting against a wall need.
    """
    p0, p1, q0, q1 = (np.asarray(v, dtype=np.float64) for v in (p0, p1, q0, q1))
    d = p1 - p0  # (N, 2)
    e = q1 - q0  # (M, 2)

    def cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]

    # Orientation of q endpoints relative to each p segment, and of p endpoints relative to q.
    o1 = cross(d[:, None, :], q0[None, :, :] - p0[:, None, :])
    o2 = cross(d[:, None, :], q1[None, :, :] - p0[:, None, :])
    o3 = cross(e[None, :, :], p0[:, None, :] - q0[None, :, :])
    o4 = cross(e[None, :, :], p1[:, None, :] - q0[None, :, :])
    eps = 1e-9
    return (o1 * o2 < -eps) & (o3 * o4 < -eps)


def polygon_inside_polygon(inner: np.ndarray, outer: np.ndarray) -> bool:
    """Whether polygon ``inner`` (convex or not) lies inside simple polygon ``outer``.

    All vertices of ``inner`` must be inside ``outer`` and no edges may cross properly; the second
    check catches a rectangle spanning the notch of an L- or U-shaped room.
    """
    inner = np.asarray(inner, dtype=np.float64)
    outer = np.asarray(outer, dtype=np.float64)
    if not np.all(points_in_polygon(inner, outer)):
        return False
    crossing = segments_intersect(inner, np.roll(inner, -1, axis=0), outer, np.roll(outer, -1, axis=0))
    return not bool(crossing.any())


# ---------------------------------------------------------------------------------------------------------------
# Scalar fast paths for the procedural generator, which runs the predicates above tens of thousands of times on
# 4-6 vertex polygons, where numpy's per-call overhead dominates. Each one returns exactly what its numpy
# counterpart returns: it either repeats the same elementwise IEEE operations in the same order on Python floats
# (which round identically), or decides only the cases that are provably decided the same way and hands the rest
# to the numpy function. tests/test_scene_fast_paths.py checks them against the public functions.

_XY = list[tuple[float, float]]
_Box = tuple[float, float, float, float]  # min x, min y, max x, max y


class _Outline(NamedTuple):
    """A polygon prepared for the fast predicates: the (P, 2) float64 array, its vertices as Python floats (the
    same values), its bounding box (min and max are exact: numpy's give the same numbers, up to the sign of a
    zero, which no comparison below sees), the sum of its coordinates' magnitudes (inf or nan when a coordinate
    is not finite; then the box is meaningless and the fast paths defer to numpy)."""

    array: np.ndarray
    xy: _XY
    box: _Box
    size: float


def _outline(polygon: np.ndarray, xy: Optional[_XY] = None) -> _Outline:
    """The outline of a (P, 2) polygon; ``xy``, when given, must be its vertices (saves the conversion)."""
    array = np.asarray(polygon, dtype=np.float64)
    if xy is None:
        xy = [(x, y) for x, y in array.tolist()]
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    size = sum(abs(v) for v in xs) + sum(abs(v) for v in ys)
    return _Outline(array, xy, (min(xs), min(ys), max(xs), max(ys)), size)


def _convex_overlap_fast(a: _Outline, b: _Outline, margin: float) -> bool:
    """:func:`convex_polygons_overlap` (a, b, margin).

    The bounding-box early out repeats numpy's subtractions. The separating-axis test computes the same unit
    normals (elementwise), but numpy projects with a matrix product, whose rounding (summation order, fused
    multiply-adds) a scalar loop need not reproduce; the two projections differ by a few ulps of the coordinates.
    So a gap decides here only when it is farther than ``tol`` (orders of magnitude above that) from ``margin``;
    a pair with a gap that close, or with non-finite coordinates, goes to the numpy function.
    """
    size = a.size + b.size
    if not math.isfinite(size) or not math.isfinite(margin):
        return convex_polygons_overlap(a.array, b.array, margin=margin)
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a.box, b.box
    if bx0 - ax1 >= margin or by0 - ay1 >= margin or ax0 - bx1 >= margin or ay0 - by1 >= margin:
        return False
    tol = 1e-9 * (1.0 + size)
    unsure = False
    for poly in (a.xy, b.xy):
        n = len(poly)
        for i in range(n):
            (x0, y0), (x1, y1) = poly[i], poly[(i + 1) % n]
            nx, ny = -(y1 - y0), x1 - x0
            length = math.sqrt(nx * nx + ny * ny)
            if length < 1e-9:
                # numpy drops edges up to 1e-12 long; rather than argue about which ones, leave such
                # (never procedural) polygons to it.
                return convex_polygons_overlap(a.array, b.array, margin=margin)
            nx, ny = nx / length, ny / length
            pa = [x * nx + y * ny for x, y in a.xy]
            pb = [x * nx + y * ny for x, y in b.xy]
            gap = max(min(pb) - max(pa), min(pa) - max(pb))
            if gap >= margin + tol:
                return False  # numpy's gap on this axis is >= margin as well
            if gap > margin - tol:
                unsure = True
    if unsure:
        return convex_polygons_overlap(a.array, b.array, margin=margin)
    return True


def _points_in_polygon_fast(points: _XY, polygon: _XY) -> bool:
    """``points_in_polygon(points, polygon).all()`` with the same crossing test per point and edge."""
    n = len(polygon)
    for x, y in points:
        inside = False
        for i in range(n):
            x0, y0 = polygon[i]
            x1, y1 = polygon[(i + 1) % n]
            # numpy computes x_cross for every edge (inf/nan on horizontal ones) but only uses it on edges that
            # straddle y, where y1 != y0.
            if (y0 > y) != (y1 > y) and x < x0 + (y - y0) * (x1 - x0) / (y1 - y0):
                inside = not inside
        if not inside:
            return False
    return True


def _segments_cross_fast(p: _XY, q: _XY) -> bool:
    """``segments_intersect`` over the closed edge loops of ``p`` and ``q``, ``.any()``, same arithmetic."""
    eps = 1e-9
    np_, nq = len(p), len(q)
    for i in range(np_):
        p0x, p0y = p[i]
        p1x, p1y = p[(i + 1) % np_]
        dx, dy = p1x - p0x, p1y - p0y
        for j in range(nq):
            q0x, q0y = q[j]
            q1x, q1y = q[(j + 1) % nq]
            ex, ey = q1x - q0x, q1y - q0y
            o1 = dx * (q0y - p0y) - dy * (q0x - p0x)
            o2 = dx * (q1y - p0y) - dy * (q1x - p0x)
            if not o1 * o2 < -eps:
                continue
            o3 = ex * (p0y - q0y) - ey * (p0x - q0x)
            o4 = ex * (p1y - q0y) - ey * (p1x - q0x)
            if o3 * o4 < -eps:
                return True
    return False


def _polygon_inside_polygon_fast(inner: _Outline, outer: _Outline) -> bool:
    """:func:`polygon_inside_polygon` (inner, outer)."""
    return _points_in_polygon_fast(inner.xy, outer.xy) and not _segments_cross_fast(inner.xy, outer.xy)


def _footprint_fast(cx: float, cy: float, extent: Sequence[float], rotation: np.ndarray) -> _Outline:
    """The outline of ``SceneObject(..., center=(cx, cy, z), extent, rotation).footprint`` without building the
    object (which validates its rotation with ``np.allclose``): the same elementwise arithmetic."""
    r = rotation.tolist()
    up_row = [abs(v) for v in r[2]]
    if all(math.isfinite(v) for v in up_row):
        up = up_row.index(max(up_row))  # np.argmax: the first maximum
    else:
        up = int(np.argmax(up_row))  # which picks the first nan
    a, b = [i for i in range(3) if i != up]
    ea, eb = float(extent[a]), float(extent[b])
    uax, uay = r[0][a] * ea / 2.0, r[1][a] * ea / 2.0
    ubx, uby = r[0][b] * eb / 2.0, r[1][b] * eb / 2.0
    xy = [
        (cx - uax - ubx, cy - uay - uby),
        (cx + uax - ubx, cy + uay - uby),
        (cx + uax + ubx, cy + uay + uby),
        (cx - uax + ubx, cy - uay + uby),
    ]
    # The footprint is reversed when polygon_area (np.dot sums) is negative. A scalar shoelace decides the sign
    # when it is clear of both sums' rounding (a few ulps of the terms' magnitude); near zero numpy decides.
    terms = [xy[k][0] * xy[(k + 1) % 4][1] - xy[(k + 1) % 4][0] * xy[k][1] for k in range(4)]
    scale = sum(abs(xy[k][0] * xy[(k + 1) % 4][1]) + abs(xy[(k + 1) % 4][0] * xy[k][1]) for k in range(4))
    area2 = sum(terms)
    if area2 < 0 if abs(area2) > 1e-9 * (1.0 + scale) else polygon_area(np.array(xy)) < 0:
        xy = xy[::-1]
    return _outline(np.array(xy), xy)


@dataclass(eq=False)
class SceneObject:
    """An object as an oriented box.

    Attributes:
        object_id: Id used by ``Scene.triangle_object_ids`` and the renderer's id map (>= 0).
        label: Category name, lower case (``"chair"``, ``"trash can"``).
        center: Box center (3,) in meters.
        extent: Full side lengths (3,) along the box's own axes.
        rotation: (3, 3) matrix whose columns are the box axes in the world frame.
    """

    object_id: int
    label: str
    center: np.ndarray
    extent: np.ndarray
    rotation: np.ndarray = field(default_factory=lambda: np.eye(3))

    def __post_init__(self) -> None:
        self.center = np.asarray(self.center, dtype=np.float64).reshape(3)
        self.extent = np.asarray(self.extent, dtype=np.float64).reshape(3)
        self.rotation = np.asarray(self.rotation, dtype=np.float64).reshape(3, 3)
        if self.object_id < 0:
            raise ValueError(
                f"SceneObject {self.label!r}: object_id must be >= 0 (-1 is reserved for structure), got "
                f"{self.object_id}"
            )
        if np.any(self.extent < 0) or not np.all(np.isfinite(self.extent)):
            raise ValueError(
                f"SceneObject {self.object_id} ({self.label!r}): extent must be finite and >= 0, got {self.extent}"
            )
        if not np.allclose(self.rotation.T @ self.rotation, np.eye(3), atol=1e-4):
            raise ValueError(
                f"SceneObject {self.object_id} ({self.label!r}): rotation must be orthonormal (columns = box axes), "
                f"got {self.rotation}"
            )

    @classmethod
    def upright(
        cls, object_id: int, label: str, center: Sequence[float], extent: Sequence[float], yaw_deg: float = 0.0
    ) -> "SceneObject":
        """A box standing upright and turned by ``yaw_deg`` about +z (its local x axis at that yaw)."""
        return cls(object_id, label, np.asarray(center), np.asarray(extent), yaw_rotation(yaw_deg))

    @property
    def corners(self) -> np.ndarray:
        """The 8 corners (8, 3): bottom face then top face in the box's own frame."""
        return self.center + (_BOX_SIGNS * (self.extent / 2.0)) @ self.rotation.T

    @property
    def aabb_min(self) -> np.ndarray:
        """Lower corner (3,) of the world axis-aligned bounding box."""
        return self.corners.min(axis=0)

    @property
    def aabb_max(self) -> np.ndarray:
        """Upper corner (3,) of the world axis-aligned bounding box."""
        return self.corners.max(axis=0)

    @property
    def longest_side(self) -> float:
        """Longest side of the oriented box in meters (VSI-Bench's object size)."""
        return float(self.extent.max())

    @property
    def yaw_deg(self) -> float:
        """Heading in degrees of the box's local x axis seen from above (the yaw of an upright box)."""
        axis = self.rotation[:, 0]
        return float(np.rad2deg(np.arctan2(axis[1], axis[0])))

    @property
    def footprint(self) -> np.ndarray:
        """The box's outline on the floor (4, 2), counter-clockwise.

        The box axis closest to vertical is taken as "up"; the other two axes, projected onto the
        floor, span the footprint. For upright boxes (all procedural objects, ARKitScenes' gravity-
        aligned boxes, ScanNet's axis-aligned boxes) this is exactly the bottom rectangle.
        """
        up = int(np.argmax(np.abs(self.rotation[2, :])))
        a, b = [i for i in range(3) if i != up]
        ua = self.rotation[:2, a] * self.extent[a] / 2.0
        ub = self.rotation[:2, b] * self.extent[b] / 2.0
        c = self.center[:2]
        fp = np.array([c - ua - ub, c + ua - ub, c + ua + ub, c - ua + ub])
        if polygon_area(fp) < 0:
            fp = fp[::-1].copy()
        return fp


@dataclass(eq=False)
class OccupancyGrid:
    """Walkability raster of a scanned room (real scans only; procedural rooms are exact without it).

    Attributes:
        origin: (2,) world xy of the corner of cell ``[0, 0]``.
        cell: Cell size in meters.
        blocked: (ny, nx) bool, ``blocked[j, i]`` covers x in ``origin[0] + [i, i + 1) * cell`` and
            y in ``origin[1] + [j, j + 1) * cell``; True where no floor was scanned or the scan has
            surface between the floor clearance and body height (walls, furniture, clutter).
    """

    origin: np.ndarray
    cell: float
    blocked: np.ndarray

    def __post_init__(self) -> None:
        self.origin = np.asarray(self.origin, dtype=np.float64).reshape(2)
        self.blocked = np.asarray(self.blocked, dtype=bool)
        if self.blocked.ndim != 2 or self.cell <= 0:
            raise ValueError(
                f"OccupancyGrid needs a 2-D blocked mask and cell > 0, got {self.blocked.shape}, {self.cell}"
            )
        self._dilated: dict[float, np.ndarray] = {}

    def _dilate(self, radius: float) -> np.ndarray:
        """Cells whose center is within ``radius`` (+ half a cell) of a blocked cell's center."""
        if radius not in self._dilated:
            k = int(np.ceil(radius / self.cell))
            out = self.blocked.copy()
            ny, nx = out.shape
            for dj in range(-k, k + 1):
                for di in range(-k, k + 1):
                    if (di * di + dj * dj) * self.cell**2 > (radius + 0.5 * self.cell) ** 2 or (di == 0 and dj == 0):
                        continue
                    src = self.blocked[max(0, -dj) : ny - max(0, dj), max(0, -di) : nx - max(0, di)]
                    out[max(0, dj) : ny - max(0, -dj), max(0, di) : nx - max(0, -di)] |= src
            self._dilated[radius] = out
        return self._dilated[radius]

    def blocked_within(self, points: np.ndarray, radius: float) -> np.ndarray:
        """Whether a disk of ``radius`` at each point (M, 2) touches a blocked cell (outside = blocked)."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        ij = np.floor((pts - self.origin) / self.cell).astype(np.int64)
        ny, nx = self.blocked.shape
        inside = (ij[:, 0] >= 0) & (ij[:, 0] < nx) & (ij[:, 1] >= 0) & (ij[:, 1] < ny)
        out = np.ones(len(pts), dtype=bool)
        grid = self._dilate(float(radius))
        out[inside] = grid[ij[inside, 1], ij[inside, 0]]
        return out


@dataclass(eq=False)
class Scene:
    """A room: a colored, labelled triangle mesh plus object boxes and the floor outline.

    Attributes:
        scene_id: Name (``"proc_00042"``, ``"scene0011_00"``, ARKit video id).
        dataset: ``"procedural"``, ``"scannet"`` or ``"arkitscenes"``.
        vertices: (V, 3) float32 positions in meters.
        triangles: (F, 3) int32 vertex indices.
        triangle_colors: (F, 3) float32 RGB in [0, 1].
        triangle_object_ids: (F,) int32; -1 for structure (floor, walls, ceiling, unlabelled).
        objects: The labelled objects; ids are unique.
        floor_polygon: (P, 2) room outline at z = 0, stored counter-clockwise.
        ceiling_height: Room height in meters.
        occupancy: Optional walkability raster (real scans), also consulted by navigation.
        triangle_materials: (F,) int16 material id per triangle (index into
            ``materials.MATERIALS``); None means ``plain`` everywhere (stored as zeros).
        excluded_labels: Raw annotation label -> number of objects left out of ``objects`` because the
            label has no VSI-Bench category (real scans; their geometry stays, with id -1).
    """

    scene_id: str
    dataset: str
    vertices: np.ndarray
    triangles: np.ndarray
    triangle_colors: np.ndarray
    triangle_object_ids: np.ndarray
    objects: list[SceneObject]
    floor_polygon: np.ndarray
    ceiling_height: float
    occupancy: Optional[OccupancyGrid] = None
    triangle_materials: Optional[np.ndarray] = None
    excluded_labels: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vertices = np.ascontiguousarray(self.vertices, dtype=np.float32)
        self.triangles = np.ascontiguousarray(self.triangles, dtype=np.int32)
        self.triangle_colors = np.ascontiguousarray(self.triangle_colors, dtype=np.float32)
        self.triangle_object_ids = np.ascontiguousarray(self.triangle_object_ids, dtype=np.int32)
        self.floor_polygon = np.asarray(self.floor_polygon, dtype=np.float64)
        self.objects = list(self.objects)
        name = f"scene {self.scene_id!r}"
        if self.vertices.ndim != 2 or self.vertices.shape[1] != 3:
            raise ValueError(f"{name}: vertices must be (V, 3), got {self.vertices.shape}")
        if self.triangles.ndim != 2 or self.triangles.shape[1] != 3:
            raise ValueError(f"{name}: triangles must be (F, 3), got {self.triangles.shape}")
        f = len(self.triangles)
        if f and (self.triangles.min() < 0 or self.triangles.max() >= len(self.vertices)):
            raise ValueError(
                f"{name}: triangle indices must lie in [0, {len(self.vertices)}), got [{self.triangles.min()}, "
                f"{self.triangles.max()}]"
            )
        if self.triangle_colors.shape != (f, 3):
            raise ValueError(f"{name}: triangle_colors must be ({f}, 3), got {self.triangle_colors.shape}")
        if self.triangle_object_ids.shape != (f,):
            raise ValueError(f"{name}: triangle_object_ids must be ({f},), got {self.triangle_object_ids.shape}")
        if self.triangle_materials is None:
            self.triangle_materials = np.zeros(f, dtype=np.int16)
        self.triangle_materials = np.ascontiguousarray(self.triangle_materials, dtype=np.int16)
        if self.triangle_materials.shape != (f,):
            raise ValueError(f"{name}: triangle_materials must be ({f},), got {self.triangle_materials.shape}")
        if f and (self.triangle_materials.min() < 0 or self.triangle_materials.max() >= len(MATERIALS)):
            raise ValueError(
                f"{name}: triangle_materials must be material ids in [0, {len(MATERIALS)}), see envs/materials.py"
            )
        if self.floor_polygon.ndim != 2 or self.floor_polygon.shape[1] != 2 or len(self.floor_polygon) < 3:
            raise ValueError(f"{name}: floor_polygon must be (P >= 3, 2), got {self.floor_polygon.shape}")
        if polygon_area(self.floor_polygon) < 0:
            # Accept either orientation from loaders; the contract promises counter-clockwise.
            self.floor_polygon = self.floor_polygon[::-1].copy()
        ids = [o.object_id for o in self.objects]
        if len(set(ids)) != len(ids):
            dup = [i for i, n in Counter(ids).items() if n > 1]
            raise ValueError(f"{name}: object ids must be unique, duplicated: {dup}")
        known = set(ids) | {-1}
        used = set(np.unique(self.triangle_object_ids).tolist())
        if not used <= known:
            raise ValueError(f"{name}: triangle_object_ids refer to unknown objects {sorted(used - known)}")
        if not self.ceiling_height > 0:
            raise ValueError(f"{name}: ceiling_height must be > 0, got {self.ceiling_height}")
        self.ceiling_height = float(self.ceiling_height)
        self._by_id = {o.object_id: o for o in self.objects}

    @property
    def num_triangles(self) -> int:
        return int(len(self.triangles))

    @property
    def room_area(self) -> float:
        """Floor area in m^2 (shoelace formula over ``floor_polygon``)."""
        return abs(polygon_area(self.floor_polygon))

    @property
    def room_center(self) -> np.ndarray:
        """(3,): area centroid of the floor polygon at half the ceiling height."""
        c = polygon_centroid(self.floor_polygon)
        return np.array([c[0], c[1], self.ceiling_height / 2.0])

    def object(self, object_id: int) -> SceneObject:
        """The object with this id; raises ``KeyError`` listing the known ids."""
        try:
            return self._by_id[int(object_id)]
        except KeyError:
            raise KeyError(f"scene {self.scene_id!r} has no object {object_id}; ids: {sorted(self._by_id)}") from None

    def objects_by_label(self, label: str) -> list[SceneObject]:
        """All objects of a category, in id order."""
        return sorted((o for o in self.objects if o.label == label), key=lambda o: o.object_id)

    def label_counts(self) -> dict[str, int]:
        """Number of objects per label."""
        return dict(Counter(o.label for o in self.objects))

    def contains_xy(self, x: float | np.ndarray, y: float | np.ndarray) -> bool | np.ndarray:
        """Whether floor points lie inside the room outline (scalars give a bool, arrays an array)."""
        pts = np.stack(np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)), axis=-1)
        inside = points_in_polygon(pts, self.floor_polygon)
        return bool(inside) if inside.ndim == 0 else inside

    def triangle_normals(self) -> np.ndarray:
        """Unit geometric normals (F, 3) float32 (winding-dependent sign; shading uses |n . l|)."""
        v = self.vertices.astype(np.float64)
        t = self.triangles
        n = np.cross(v[t[:, 1]] - v[t[:, 0]], v[t[:, 2]] - v[t[:, 0]])
        norm = np.linalg.norm(n, axis=1, keepdims=True)
        return (n / np.maximum(norm, 1e-12)).astype(np.float32)


class MeshBuilder:
    """Collects closed primitives (boxes, cylinders, frusta, ellipsoids) and room structure
    (floor, ceiling, walls) into triangle arrays for a :class:`Scene`.

    Winding: every closed primitive has outward-facing triangle normals (right-hand rule,
    ``(b - a) x (c - a)`` points out of the solid); ``add_flat_polygon`` faces +z (``facing="up"``,
    a floor) or -z (``facing="down"``, a ceiling); ``add_wall`` faces the left side of ``p0 -> p1``,
    which is the inside of a counter-clockwise room. ``primitives`` records, for every closed
    primitive, its triangle range and its center, so tests can check the winding part by part.

    Round primitives are inscribed in a box given like :meth:`add_box` (center, full extent,
    rotation); with ``segments`` a multiple of 4 their polygon touches the box's four side faces, so
    the box stays the primitive's exact envelope.
    """

    def __init__(self) -> None:
        self._vertices: list[np.ndarray] = []
        self._triangles: list[np.ndarray] = []
        # One color, id and material per added primitive, with its triangle count: the per-triangle arrays are
        # expanded once in build() rather than for each of the thousands of parts of a room.
        self._colors: list[np.ndarray] = []
        self._ids: list[int] = []
        self._materials: list[int] = []
        self._counts: list[int] = []
        self._count = 0
        self._num_triangles = 0
        # (first triangle, number of triangles, center (3,)) of every closed primitive.
        self.primitives: list[tuple[int, int, np.ndarray]] = []

    @property
    def num_triangles(self) -> int:
        """Triangles added so far."""
        return self._num_triangles

    def _add(
        self,
        vertices: np.ndarray,
        triangles: np.ndarray,
        color: Sequence[float],
        object_id: int,
        material: str = "plain",
    ) -> None:
        self._colors.append(np.array(color, dtype=np.float32).reshape(3))  # a copy: clipped in build()
        self._ids.append(object_id)
        self._materials.append(material_id(material))
        self._counts.append(len(triangles))
        self._vertices.append(np.asarray(vertices, dtype=np.float64))
        self._triangles.append(np.asarray(triangles, dtype=np.int64) + self._count)
        self._count += len(vertices)
        self._num_triangles += len(triangles)

    def _add_closed(
        self, center: np.ndarray, vertices: np.ndarray, triangles: np.ndarray, color, object_id: int, material: str
    ) -> None:
        self.primitives.append((self._num_triangles, len(triangles), np.asarray(center, dtype=np.float64).copy()))
        self._add(vertices, triangles, color, object_id, material)

    def add_box(
        self,
        center: Sequence[float],
        extent: Sequence[float],
        color: Sequence[float],
        object_id: int = -1,
        rotation: np.ndarray | None = None,
        material: str = "plain",
    ) -> None:
        """Add a closed box (12 triangles, normals outward)."""
        rot = np.eye(3) if rotation is None else np.asarray(rotation, dtype=np.float64)
        center = np.asarray(center, dtype=np.float64)
        corners = center + (_BOX_SIGNS * (np.asarray(extent, dtype=np.float64) / 2.0)) @ rot.T
        self._add_closed(center, corners, _BOX_TRIANGLES, color, object_id, material)

    def add_object_box(self, obj: SceneObject, color: Sequence[float], material: str = "plain") -> None:
        """Add the full oriented box of ``obj`` with its id."""
        self.add_box(obj.center, obj.extent, color, obj.object_id, obj.rotation, material)

    def add_frustum(
        self,
        center: Sequence[float],
        extent: Sequence[float],
        color: Sequence[float],
        object_id: int = -1,
        rotation: np.ndarray | None = None,
        axis: int = 2,
        scales: tuple[float, float] = (1.0, 1.0),
        segments: int = 16,
        material: str = "plain",
    ) -> None:
        """Add a closed (elliptic) frustum running along the box's local ``axis``.

        The cross-section is the ellipse inscribed in the box's other two sides, scaled by
        ``scales[0]`` at the ``-axis`` end and ``scales[1]`` at the ``+axis`` end (each in (0, 1]);
        ``4 * segments - 4`` triangles (side quads plus two fan caps).
        """
        s0, s1 = (float(v) for v in scales)
        if not (0.0 < s0 <= 1.0 and 0.0 < s1 <= 1.0) or segments < 3 or axis not in (0, 1, 2):
            raise ValueError(
                f"add_frustum: need scales in (0, 1], segments >= 3, axis in 0..2; got {scales}, {segments}, {axis}"
            )
        ext = np.asarray(extent, dtype=np.float64) / 2.0
        u_ax, v_ax = (axis + 1) % 3, (axis + 2) % 3  # cyclic, so (u, v, axis) is right-handed
        cos, sin, triangles = _frustum_unit(segments)
        local = np.zeros((2 * segments, 3))
        for k, (sign, s) in enumerate(((-1.0, s0), (1.0, s1))):
            ring = local[k * segments : (k + 1) * segments]
            ring[:, axis] = sign * ext[axis]
            ring[:, u_ax] = s * ext[u_ax] * cos
            ring[:, v_ax] = s * ext[v_ax] * sin
        self._add_rotated(center, local, triangles, rotation, color, object_id, material)

    def add_cylinder(
        self,
        center: Sequence[float],
        extent: Sequence[float],
        color: Sequence[float],
        object_id: int = -1,
        rotation: np.ndarray | None = None,
        axis: int = 2,
        segments: int = 16,
        material: str = "plain",
    ) -> None:
        """Add a closed (elliptic) cylinder inscribed in a box, running along its local ``axis``."""
        self.add_frustum(center, extent, color, object_id, rotation, axis, (1.0, 1.0), segments, material)

    def add_ellipsoid(
        self,
        center: Sequence[float],
        extent: Sequence[float],
        color: Sequence[float],
        object_id: int = -1,
        rotation: np.ndarray | None = None,
        segments: int = 12,
        rings: int = 6,
        squareness: tuple[float, float] = (1.0, 1.0),
        material: str = "plain",
    ) -> None:
        """Add a closed low-poly (super)ellipsoid inscribed in a box (axis z is the pole axis).

        ``squareness = (horizontal, vertical)`` exponents: 1 gives an ellipsoid, smaller values a
        rounded box (pillows, cushions; convex for exponents in (0, 1]). ``2 * segments * (rings - 1)``
        triangles; with ``rings`` even and ``segments`` a multiple of 4 it touches all six box faces.
        """
        eh, ev = (float(v) for v in squareness)
        if not (0.0 < eh <= 1.0 and 0.0 < ev <= 1.0) or segments < 3 or rings < 2:
            raise ValueError(
                f"add_ellipsoid: need squareness in (0, 1], segments >= 3, rings >= 2; got {squareness}, {segments}, "
                f"{rings}"
            )

        ext = np.asarray(extent, dtype=np.float64) / 2.0
        scale, x, y, z, triangles = _ellipsoid_unit(segments, rings, eh, ev)
        ring_pts = np.zeros((rings - 1, segments, 3))
        ring_pts[..., 0] = scale * ext[0] * x
        ring_pts[..., 1] = scale * ext[1] * y
        ring_pts[..., 2] = (ext[2] * z)[:, None]
        local = np.concatenate([ring_pts.reshape(-1, 3), [[0.0, 0.0, -ext[2]], [0.0, 0.0, ext[2]]]])
        self._add_rotated(center, local, triangles, rotation, color, object_id, material)

    def _add_rotated(
        self, center, local: np.ndarray, triangles: np.ndarray, rotation, color, object_id: int, material: str
    ) -> None:
        rot = np.eye(3) if rotation is None else np.asarray(rotation, dtype=np.float64)
        center = np.asarray(center, dtype=np.float64)
        self._add_closed(center, center + local @ rot.T, triangles, color, object_id, material)

    def add_flat_polygon(
        self,
        polygon: np.ndarray,
        z: float,
        color: Sequence[float],
        object_id: int = -1,
        material: str = "plain",
        facing: str = "up",
    ) -> None:
        """Add a horizontal polygon at height ``z`` (ear-clipping triangulation; simple polygons).

        ``facing="up"`` gives normals +z (a floor), ``"down"`` normals -z (a ceiling).
        """
        if facing not in ("up", "down"):
            raise ValueError(f"add_flat_polygon: facing must be 'up' or 'down', got {facing!r}")
        poly = np.asarray(polygon, dtype=np.float64)
        if polygon_area(poly) < 0:
            poly = poly[::-1]
        tris = triangulate_polygon(poly)
        if facing == "down":
            tris = tris[:, ::-1]
        verts = np.concatenate([poly, np.full((len(poly), 1), z)], axis=1)
        self._add(verts, tris, color, object_id, material)

    def add_wall(
        self,
        p0: Sequence[float],
        p1: Sequence[float],
        height: float,
        color: Sequence[float],
        z0: float = 0.0,
        object_id: int = -1,
        material: str = "plain",
    ) -> None:
        """Add a vertical rectangle from floor point ``p0`` to ``p1`` between ``z0`` and ``z0 + height``.

        It faces left of ``p0 -> p1`` (normal ``(-dy, dx, 0)``): walls built along a counter-clockwise
        floor polygon face into the room.
        """
        (x0, y0), (x1, y1) = p0, p1
        verts = np.array([[x0, y0, z0], [x1, y1, z0], [x1, y1, z0 + height], [x0, y0, z0 + height]])
        self._add(verts, np.array([[0, 2, 1], [0, 3, 2]]), color, object_id, material)

    def triangle_materials(self) -> np.ndarray:
        """Material id per triangle (F,) int16, in the order of :meth:`build`'s triangles."""
        return np.repeat(np.array(self._materials, dtype=np.int16), self._counts)

    def build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(vertices f32, triangles i32, triangle_colors f32, triangle_object_ids i32)``."""
        if not self._vertices:
            return (
                np.zeros((0, 3), np.float32),
                np.zeros((0, 3), np.int32),
                np.zeros((0, 3), np.float32),
                np.zeros(0, np.int32),
            )
        return (
            np.concatenate(self._vertices).astype(np.float32),
            np.concatenate(self._triangles).astype(np.int32),
            # clip is elementwise: clipping the expanded colors equals clipping each primitive's color
            np.clip(np.repeat(np.stack(self._colors), self._counts, axis=0), 0.0, 1.0),
            np.repeat(np.array(self._ids, dtype=np.int32), self._counts),
        )


# The size-independent parts of the round primitives (angles, exponents, triangle indices), computed once per
# shape rather than for every cushion and knob; read-only because they are shared.
def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=None)
def _frustum_unit(segments: int) -> tuple[np.ndarray, ...]:
    """``add_frustum``'s ring cosines and sines (segments,) and its triangles."""
    ang = 2.0 * np.pi * np.arange(segments) / segments
    k = np.arange(segments)
    kn = (k + 1) % segments
    b, t = k, k + segments
    bn, tn = kn, kn + segments
    side = np.concatenate([np.stack([b, bn, tn], 1), np.stack([b, tn, t], 1)])
    j = np.arange(1, segments - 1)
    bottom = np.stack([np.zeros_like(j), j + 1, j], 1)
    top = np.stack([np.full_like(j, segments), j + segments, j + 1 + segments], 1)
    return _frozen(np.cos(ang), np.sin(ang), np.concatenate([side, bottom, top]))


def _spow(x: np.ndarray, e: float) -> np.ndarray:
    return np.sign(x) * np.abs(x) ** e


@functools.lru_cache(maxsize=None)
def _ellipsoid_unit(segments: int, rings: int, eh: float, ev: float) -> tuple[np.ndarray, ...]:
    """``add_ellipsoid``'s ring scale (rings - 1, 1), x and y factors (1, segments), z factors (rings - 1,) and
    triangles; the vertices are these times the half extents."""
    lat = -np.pi / 2 + np.pi * np.arange(1, rings) / rings  # ring latitudes, poles excluded
    lon = 2.0 * np.pi * np.arange(segments) / segments
    cl = np.where(np.abs(np.cos(lat)) < 1e-12, 0.0, np.cos(lat))
    scale = _spow(cl, ev)[:, None]
    x = _spow(np.round(np.cos(lon), 12), eh)[None]
    y = _spow(np.round(np.sin(lon), 12), eh)[None]
    z = _spow(np.round(np.sin(lat), 12), ev)
    south, north = (rings - 1) * segments, (rings - 1) * segments + 1
    k = np.arange(segments)
    kn = (k + 1) % segments
    tris = [np.stack([np.full_like(k, south), kn, k], 1)]
    for r in range(rings - 2):
        a, b = r * segments, (r + 1) * segments
        tris += [np.stack([a + k, a + kn, b + kn], 1), np.stack([a + k, b + kn, b + k], 1)]
    top = (rings - 2) * segments
    tris.append(np.stack([top + k, top + kn, np.full_like(k, north)], 1))
    return _frozen(scale, x, y, z, np.concatenate(tris))


def triangulate_polygon(polygon: np.ndarray) -> np.ndarray:
    """Ear-clipping triangulation of a simple counter-clockwise polygon (P, 2) -> (P - 2, 3) indices."""
    poly = np.asarray(polygon, dtype=np.float64)
    idx = list(range(len(poly)))
    out: list[list[int]] = []

    def cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
        return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))

    guard = 0
    while len(idx) > 3:
        guard += 1
        if guard > 10 * len(poly) ** 2:
            raise ValueError(f"cannot triangulate polygon {poly.tolist()}: is it simple and counter-clockwise?")
        n = len(idx)
        for k in range(n):
            i0, i1, i2 = idx[k - 1], idx[k], idx[(k + 1) % n]
            a, b, c = poly[i0], poly[i1], poly[i2]
            if cross(a, b, c) <= 1e-12:
                continue  # reflex or degenerate corner: not an ear
            others = [j for j in idx if j not in (i0, i1, i2)]
            if others and np.any(points_in_polygon(poly[others], np.array([a, b, c]))):
                continue
            out.append([i0, i1, i2])
            idx.pop(k)
            break
    out.append(idx)
    return np.asarray(out, dtype=np.int32)

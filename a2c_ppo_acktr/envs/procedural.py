"""Seeded procedural indoor rooms with realistically sized, plausibly placed furniture.

A room has a *theme* (bedroom, living room, kitchen, bathroom, office, studio) that decides which
categories appear and how many, and caps the room size (``THEME_MAX_SIDE``); it is a rectangle or an
L-shape (sides drawn in ``[min_side, max_side]`` m, 2.4-3.0 m high) with a floor, a ceiling and
walls, and objects placed by rejection sampling:

* ``door``: on a wall at the floor, with a free zone in front of it kept clear of furniture;
* ``wall``: standing on the floor with the back against a wall (beds, sofas, cabinets, ...);
* ``floor``: free-standing, heading a multiple of 90 degrees plus a small jitter (tables, ...);
* ``near``: free-standing beside a table/desk and facing it (chairs, stools);
* ``on``: resting on the top (or seat/mattress) of an already placed support (monitor on desk,
  pillow on bed, microwave on cabinet);
* ``mounted``: on a wall at a height range (windows, TVs, pictures, whiteboards).

Two objects may not intersect: their footprints overlapping (with a 5 cm gap for floor objects) and
their height intervals overlapping is a collision. Every footprint lies inside the floor polygon.
The floor area covered by floor objects is capped so that an agent of radius 0.2 m can walk.
Objects are built from parts by the category templates of :mod:`.furniture` (a sofa's cushions,
arms and feet; a TV's screen and stand; ...); the object's oriented box is exactly the envelope of
its parts. Every triangle has a material (:mod:`.materials`): floors ``floor_tiles`` in kitchens and
bathrooms, ``carpet`` or ``parquet`` in offices, ``parquet`` elsewhere; walls ``paint``; the ceiling
``ceiling``. The layout (theme, room, objects) comes from ``numpy.random.default_rng(seed)``; the
appearance (colors, part proportions, books on shelves, ...) from a separate
``numpy.random.default_rng([seed, 7])``, so restyling furniture never moves an object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from a2c_ppo_acktr.envs.furniture import build_object, hsv
from a2c_ppo_acktr.envs.scene import (
    MeshBuilder,
    Scene,
    SceneObject,
    _convex_overlap_fast,
    _footprint_fast,
    _outline,
    _Outline,
    _polygon_inside_polygon_fast,
    polygon_area,
    yaw_rotation,
)

Range = tuple[float, float]


@dataclass(frozen=True)
class Variant:
    """One way a category appears: its size ranges (m), placement rule and supports.

    Attributes:
        width: Side along the wall / the object's local x.
        depth: Side along the object's local y (local +y is its front).
        height: Vertical size.
        placement: ``door`` | ``wall`` | ``floor`` | ``near`` | ``on`` | ``mounted``.
        supports: Categories it may rest on (``on``) or stand beside (``near``).
        bottom: Height range of the bottom for ``mounted`` objects.
        shape: Support-surface rule for ``on`` placement: ``bed`` and ``sofa`` rest things on the
            mattress / seat (see ``_Placer._commit``), anything else on its top. The mesh comes from
            the category's template in :mod:`.furniture`.
    """

    width: Range
    depth: Range
    height: Range
    placement: str
    supports: tuple[str, ...] = ()
    bottom: Range = (0.0, 0.0)
    shape: str = "box"


def _v(
    w: Range,
    d: Range,
    h: Range,
    placement: str,
    supports: tuple[str, ...] = (),
    bottom: Range = (0.0, 0.0),
    shape: str = "box",
) -> Variant:
    return Variant(w, d, h, placement, supports, bottom, shape)


_DESKS = ("desk", "table")
_TOPS = ("table", "desk", "cabinet", "dresser", "nightstand", "tv stand", "shelf")
# label -> variants tried in order (a variant whose placement fails falls through to the next).
CATEGORIES: dict[str, tuple[Variant, ...]] = {
    "door": (_v((0.8, 0.95), (0.04, 0.06), (2.0, 2.1), "door"),),
    "window": (_v((0.8, 1.8), (0.05, 0.08), (1.0, 1.4), "mounted", bottom=(0.85, 1.0)),),
    "bed": (_v((0.9, 1.8), (1.95, 2.15), (0.9, 1.2), "wall", shape="bed"),),
    "sofa": (_v((1.6, 2.4), (0.8, 1.0), (0.75, 0.95), "wall", shape="sofa"),),
    "cabinet": (_v((0.6, 1.4), (0.4, 0.6), (0.8, 1.9), "wall"),),
    "shelf": (_v((0.6, 1.2), (0.28, 0.4), (1.2, 2.0), "wall"),),
    "dresser": (_v((0.8, 1.5), (0.45, 0.55), (0.75, 1.1), "wall"),),
    "nightstand": (_v((0.4, 0.55), (0.35, 0.45), (0.45, 0.65), "wall"),),
    "tv stand": (_v((1.0, 1.8), (0.35, 0.5), (0.4, 0.6), "wall"),),
    "refrigerator": (_v((0.6, 0.9), (0.6, 0.8), (1.6, 1.9), "wall"),),
    "oven": (_v((0.6, 0.76), (0.58, 0.68), (0.85, 0.95), "wall"),),
    "stove": (_v((0.6, 0.76), (0.58, 0.68), (0.85, 0.95), "wall"),),
    "dishwasher": (_v((0.58, 0.62), (0.58, 0.62), (0.82, 0.88), "wall"),),
    "washer": (_v((0.58, 0.62), (0.55, 0.65), (0.82, 0.9), "wall"),),
    "sink": (_v((0.45, 0.8), (0.4, 0.55), (0.8, 0.9), "wall"),),
    "toilet": (_v((0.38, 0.45), (0.6, 0.75), (0.7, 0.8), "wall", shape="toilet"),),
    "bathtub": (_v((1.5, 1.8), (0.7, 0.8), (0.5, 0.6), "wall"),),
    "desk": (_v((1.0, 1.6), (0.55, 0.8), (0.72, 0.78), "wall", shape="desk"),),
    "piano": (_v((1.4, 1.55), (0.5, 0.65), (1.0, 1.3), "wall"),),
    "fireplace": (_v((1.2, 1.8), (0.3, 0.5), (1.0, 1.2), "wall"),),
    "radiator": (_v((0.6, 1.2), (0.1, 0.15), (0.5, 0.7), "wall"),),
    "table": (_v((0.8, 1.8), (0.6, 1.0), (0.7, 0.78), "floor", shape="table"),),
    "coffee table": (_v((0.8, 1.2), (0.5, 0.7), (0.38, 0.48), "floor", shape="table"),),
    "chair": (
        _v((0.42, 0.55), (0.45, 0.55), (0.8, 1.0), "near", supports=_DESKS, shape="chair"),
        _v((0.42, 0.55), (0.45, 0.55), (0.8, 1.0), "floor", shape="chair"),
    ),
    "stool": (
        _v((0.3, 0.4), (0.3, 0.4), (0.45, 0.75), "near", supports=("table",)),
        _v((0.3, 0.4), (0.3, 0.4), (0.45, 0.75), "floor"),
    ),
    "lamp": (
        _v(
            (0.2, 0.35),
            (0.2, 0.35),
            (0.35, 0.6),
            "on",
            supports=("nightstand", "desk", "dresser", "table"),
            shape="lamp",
        ),
        _v((0.3, 0.45), (0.3, 0.45), (1.3, 1.8), "wall", shape="lamp"),
    ),
    "tv": (
        _v((0.9, 1.5), (0.08, 0.2), (0.55, 0.9), "on", supports=("tv stand", "dresser", "cabinet")),
        _v((0.9, 1.5), (0.05, 0.1), (0.55, 0.9), "mounted", bottom=(1.0, 1.4)),
    ),
    "monitor": (_v((0.5, 0.7), (0.15, 0.22), (0.35, 0.5), "on", supports=_DESKS),),
    "laptop": (_v((0.3, 0.38), (0.22, 0.26), (0.02, 0.03), "on", supports=_DESKS),),
    "keyboard": (_v((0.42, 0.46), (0.13, 0.16), (0.025, 0.04), "on", supports=("desk",)),),
    "printer": (_v((0.4, 0.5), (0.35, 0.45), (0.2, 0.3), "on", supports=("desk", "cabinet", "table")),),
    "microwave": (_v((0.45, 0.55), (0.34, 0.4), (0.26, 0.32), "on", supports=("cabinet", "table", "shelf")),),
    "pillow": (_v((0.4, 0.65), (0.3, 0.45), (0.12, 0.2), "on", supports=("bed", "sofa")),),
    "computer tower": (_v((0.18, 0.22), (0.4, 0.5), (0.38, 0.48), "wall"),),
    "plant": (
        _v((0.3, 0.6), (0.3, 0.6), (0.5, 1.5), "wall", shape="plant"),
        _v((0.15, 0.25), (0.15, 0.25), (0.2, 0.4), "on", supports=_TOPS, shape="plant"),
    ),
    "trash can": (
        _v((0.25, 0.4), (0.25, 0.4), (0.3, 0.7), "wall"),
        _v((0.25, 0.4), (0.25, 0.4), (0.3, 0.7), "floor"),
    ),
    "backpack": (
        _v((0.28, 0.35), (0.15, 0.25), (0.4, 0.5), "floor"),
        _v((0.28, 0.35), (0.15, 0.25), (0.4, 0.5), "on", supports=("bed", "sofa")),
    ),
    "suitcase": (_v((0.4, 0.5), (0.22, 0.3), (0.55, 0.75), "wall"),),
    "whiteboard": (_v((1.2, 2.4), (0.02, 0.04), (0.9, 1.2), "mounted", bottom=(0.8, 1.0)),),
    "picture": (_v((0.4, 1.0), (0.02, 0.04), (0.3, 0.8), "mounted", bottom=(1.2, 1.6)),),
    "mirror": (_v((0.4, 0.8), (0.02, 0.04), (0.6, 1.0), "mounted", bottom=(1.0, 1.3)),),
    "clock": (_v((0.25, 0.35), (0.03, 0.05), (0.25, 0.35), "mounted", bottom=(1.7, 2.0)),),
}

# theme -> (label, min count, max count, probability of appearing); listed in placement order.
THEMES: dict[str, tuple[tuple[str, int, int, float], ...]] = {
    "bedroom": (
        ("door", 1, 1, 1.0),
        ("window", 1, 2, 0.9),
        ("bed", 1, 1, 1.0),
        ("nightstand", 1, 2, 0.9),
        ("dresser", 1, 1, 0.6),
        ("cabinet", 1, 1, 0.4),
        ("desk", 1, 1, 0.4),
        ("shelf", 1, 1, 0.4),
        ("radiator", 1, 1, 0.3),
        ("chair", 1, 2, 0.6),
        ("suitcase", 1, 1, 0.4),
        ("plant", 1, 2, 0.5),
        ("trash can", 1, 1, 0.5),
        ("lamp", 1, 2, 0.8),
        ("pillow", 1, 3, 0.9),
        ("tv", 1, 1, 0.4),
        ("backpack", 1, 1, 0.4),
        ("laptop", 1, 1, 0.3),
        ("picture", 1, 2, 0.6),
        ("mirror", 1, 1, 0.4),
        ("clock", 1, 1, 0.3),
    ),
    "living room": (
        ("door", 1, 2, 1.0),
        ("window", 1, 3, 0.9),
        ("sofa", 1, 2, 1.0),
        ("tv stand", 1, 1, 0.8),
        ("shelf", 1, 2, 0.6),
        ("cabinet", 1, 1, 0.4),
        ("piano", 1, 1, 0.2),
        ("fireplace", 1, 1, 0.3),
        ("radiator", 1, 1, 0.3),
        ("coffee table", 1, 1, 0.8),
        ("table", 1, 1, 0.5),
        ("chair", 1, 4, 0.7),
        ("stool", 1, 2, 0.3),
        ("plant", 1, 3, 0.8),
        ("lamp", 1, 2, 0.7),
        ("trash can", 1, 1, 0.3),
        ("tv", 1, 1, 0.9),
        ("pillow", 1, 4, 0.8),
        ("backpack", 1, 1, 0.3),
        ("picture", 1, 3, 0.7),
        ("clock", 1, 1, 0.4),
    ),
    "kitchen": (
        ("door", 1, 2, 1.0),
        ("window", 1, 2, 0.9),
        ("refrigerator", 1, 1, 1.0),
        ("stove", 1, 1, 0.7),
        ("oven", 1, 1, 0.6),
        ("sink", 1, 1, 1.0),
        ("dishwasher", 1, 1, 0.5),
        ("cabinet", 1, 3, 1.0),
        ("washer", 1, 1, 0.3),
        ("shelf", 1, 1, 0.3),
        ("table", 1, 1, 0.8),
        ("chair", 2, 4, 0.8),
        ("stool", 1, 3, 0.4),
        ("trash can", 1, 2, 0.8),
        ("microwave", 1, 1, 0.9),
        ("plant", 1, 2, 0.5),
        ("clock", 1, 1, 0.5),
        ("picture", 1, 1, 0.3),
    ),
    "bathroom": (
        ("door", 1, 1, 1.0),
        ("window", 1, 1, 0.7),
        ("bathtub", 1, 1, 0.8),
        ("toilet", 1, 1, 1.0),
        ("sink", 1, 2, 1.0),
        ("cabinet", 1, 2, 0.7),
        ("washer", 1, 1, 0.5),
        ("shelf", 1, 1, 0.4),
        ("radiator", 1, 1, 0.4),
        ("trash can", 1, 1, 0.8),
        ("plant", 1, 1, 0.3),
        ("mirror", 1, 2, 0.9),
        ("picture", 1, 1, 0.3),
    ),
    "office": (
        ("door", 1, 2, 1.0),
        ("window", 1, 3, 0.9),
        ("desk", 1, 3, 1.0),
        ("cabinet", 1, 2, 0.7),
        ("shelf", 1, 2, 0.7),
        ("computer tower", 1, 2, 0.6),
        ("radiator", 1, 1, 0.3),
        ("table", 1, 1, 0.5),
        ("chair", 1, 4, 1.0),
        ("sofa", 1, 1, 0.3),
        ("plant", 1, 2, 0.6),
        ("trash can", 1, 2, 0.8),
        ("backpack", 1, 2, 0.6),
        ("suitcase", 1, 1, 0.2),
        ("monitor", 1, 3, 1.0),
        ("keyboard", 1, 2, 0.8),
        ("laptop", 1, 2, 0.6),
        ("printer", 1, 1, 0.5),
        ("lamp", 1, 2, 0.5),
        ("microwave", 1, 1, 0.2),
        ("whiteboard", 1, 1, 0.6),
        ("tv", 1, 1, 0.3),
        ("clock", 1, 1, 0.4),
        ("picture", 1, 1, 0.3),
    ),
    "studio": (
        ("door", 1, 2, 1.0),
        ("window", 1, 3, 0.9),
        ("bed", 1, 1, 0.9),
        ("sofa", 1, 1, 0.7),
        ("refrigerator", 1, 1, 0.8),
        ("stove", 1, 1, 0.5),
        ("sink", 1, 1, 0.7),
        ("cabinet", 1, 2, 0.7),
        ("desk", 1, 1, 0.6),
        ("nightstand", 1, 1, 0.5),
        ("tv stand", 1, 1, 0.4),
        ("table", 1, 1, 0.6),
        ("chair", 1, 3, 0.9),
        ("plant", 1, 2, 0.6),
        ("trash can", 1, 1, 0.6),
        ("lamp", 1, 2, 0.6),
        ("pillow", 1, 3, 0.8),
        ("tv", 1, 1, 0.7),
        ("monitor", 1, 1, 0.4),
        ("microwave", 1, 1, 0.5),
        ("backpack", 1, 1, 0.4),
        ("suitcase", 1, 1, 0.3),
        ("picture", 1, 2, 0.5),
        ("washer", 1, 1, 0.2),
    ),
}

# Largest room side per theme (m), applied within [min_side, max_side].
THEME_MAX_SIDE = {"bathroom": 5.0, "bedroom": 7.0, "kitchen": 7.0, "office": 10.0, "living room": 10.0, "studio": 10.0}

_FLOOR_GAP = 0.05  # min gap between floor objects' footprints (m)
_MAX_FLOOR_COVER = 0.40  # largest fraction of the floor covered by floor objects
_DOOR_CLEARANCE = 0.9  # free depth in front of a door (m)
_TRIES = 40  # placement attempts per object and variant
_ON_EPS = 1e-3  # objects resting on a surface may touch it


@dataclass
class _Placed:
    obj: SceneObject
    variant: Variant
    footprint: np.ndarray
    z0: float
    z1: float
    support_z: float  # height of the usable top surface
    support_local: tuple[float, float, float, float]  # usable top rect in local coords (x0, x1, y0, y1)
    outline: _Outline  # the footprint prepared for the collision checks


def make_procedural_scene(seed: int, min_side: float = 3.0, max_side: float = 10.0) -> Scene:
    """Build the procedural room for ``seed`` (the same seed always gives the same scene).

    Args:
        seed: Any non-negative integer.
        min_side: Smallest room side in meters (>= 2.5).
        max_side: Largest room side in meters (>= min_side).

    Returns:
        A :class:`Scene` with ``dataset="procedural"`` and ``scene_id="proc_<seed:06d>"``; its extra
        attribute ``theme`` names the room type (informational, for reports).
    """
    placer, theme = _layout(seed, min_side, max_side)
    return placer.build(f"proc_{seed:06d}", theme, np.random.default_rng([seed, 7]))


def _layout(seed: int, min_side: float = 3.0, max_side: float = 10.0) -> tuple["_Placer", str]:
    """The layout alone (theme, room, placed objects) from the layout generator of ``seed``."""
    if not 2.5 <= min_side <= max_side:
        raise ValueError(f"need 2.5 <= min_side <= max_side, got min_side={min_side}, max_side={max_side}")
    rng = np.random.default_rng(seed)
    theme_names = sorted(THEMES)
    theme = theme_names[int(rng.integers(len(theme_names)))]
    # Small room types stay small when the configured range allows it.
    polygon = _room_polygon(rng, min_side, max(min_side, min(max_side, THEME_MAX_SIDE[theme])))
    height = float(rng.uniform(2.4, 3.0))
    placer = _Placer(rng, polygon, height)
    big_room = polygon_area(polygon) > 40
    for label, lo, hi, prob in THEMES[theme]:
        if rng.random() >= prob:
            continue
        count = int(rng.integers(lo, hi + 1))
        if label in ("chair", "stool", "plant", "picture", "window") and big_room:
            count += int(rng.integers(0, 2))  # big rooms get a few more of the repeatable things
        for _ in range(count):
            placer.place(label)
    return placer, theme


def _room_polygon(rng: np.random.Generator, min_side: float, max_side: float) -> np.ndarray:
    w = float(rng.uniform(min_side, max_side))
    d = float(rng.uniform(min_side, max_side))
    rect = np.array([[0.0, 0.0], [w, 0.0], [w, d], [0.0, d]])
    if min(w, d) < 4.0 or rng.random() < 0.55:
        return rect
    # L-shape: cut a corner rectangle of 30-50 % of each side, then rotate the vertex list so the
    # notch may sit at any corner.
    cw = float(rng.uniform(0.3, 0.5)) * w
    cd = float(rng.uniform(0.3, 0.5)) * d
    poly = np.array([[0.0, 0.0], [w, 0.0], [w, d - cd], [w - cw, d - cd], [w - cw, d], [0.0, d]])
    corner = int(rng.integers(4))
    if corner:  # mirror so the notch lands at another corner, keeping counter-clockwise order
        if corner in (1, 3):
            poly[:, 0] = w - poly[:, 0]
        if corner in (2, 3):
            poly[:, 1] = d - poly[:, 1]
        if corner in (1, 2):
            poly = poly[::-1].copy()
    return poly


class _Placer:
    """Places objects one by one and keeps what is needed for collision checks.

    Candidates are tried by the thousand, so the checks use scene.py's scalar fast paths (same results as the
    public numpy predicates) and everything that depends only on the room is computed once.
    """

    def __init__(self, rng: np.random.Generator, polygon: np.ndarray, height: float) -> None:
        self.rng = rng
        self.polygon = polygon
        self.height = height
        self.placed: list[_Placed] = []
        self.keepout: list[np.ndarray] = []  # footprints floor objects must avoid (door zones)
        self.keepout_outlines: list[_Outline] = []
        self.floor_cover = 0.0
        self.area = abs(polygon_area(polygon))
        edges = np.roll(polygon, -1, axis=0) - polygon
        self.edge_len = np.linalg.norm(edges, axis=1)
        self.outline = _outline(polygon)
        self.lo, self.hi = polygon.min(axis=0), polygon.max(axis=0)
        self.wall_p = self.edge_len / self.edge_len.sum()
        self.walls: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, float, float]] = {}
        rng.random()  # kept so that layouts stay what they were (this draw was the first object's hue)

    # ------------------------------------------------------------------ sampling helpers
    def _size(self, v: Variant) -> np.ndarray:
        return np.array([self.rng.uniform(*v.width), self.rng.uniform(*v.depth), self.rng.uniform(*v.height)])

    def _wall_frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
        """A random wall: start point, unit direction, inward normal, length, yaw of the direction."""
        k = int(self.rng.choice(len(self.edge_len), p=self.wall_p))
        if k not in self.walls:
            a = self.polygon[k]
            e = (self.polygon[(k + 1) % len(self.polygon)] - a) / self.edge_len[k]
            yaw = float(np.degrees(np.arctan2(e[1], e[0])))
            self.walls[k] = a, e, np.array([-e[1], e[0]]), float(self.edge_len[k]), yaw
        return self.walls[k]

    def _fits(self, fp: _Outline, z0: float, z1: float, on: Optional[_Placed]) -> bool:
        if not _polygon_inside_polygon_fast(fp, self.outline):
            return False
        is_floor = z0 < 1e-6
        if is_floor:
            if any(_convex_overlap_fast(fp, k, 0.0) for k in self.keepout_outlines):
                return False
        for p in self.placed:
            if p is on:
                continue
            if z0 >= p.z1 - _ON_EPS or p.z0 >= z1 - _ON_EPS:
                continue  # height intervals do not overlap
            margin = _FLOOR_GAP if (is_floor and p.z0 < 1e-6) else 0.0
            if _convex_overlap_fast(fp, p.outline, margin):
                return False
        return True

    # ------------------------------------------------------------------ placement rules
    def place(self, label: str) -> bool:
        for v in CATEGORIES[label]:
            for _ in range(_TRIES):
                cand = self._candidate(label, v)
                if cand is not None:
                    self._commit(label, v, *cand)
                    return True
        return False

    def _candidate(self, label: str, v: Variant) -> Optional[tuple[SceneObject, _Outline, float, Optional[_Placed]]]:
        """One random placement of ``label`` by rule ``v``: ``(object, footprint, bottom z, support)``,
        or None when it does not fit."""
        size = self._size(v)
        w, d, h = size
        rule = v.placement
        on: Optional[_Placed] = None
        if rule in ("door", "wall", "mounted"):
            a, e, n, length, yaw = self._wall_frame()
            if w + 0.1 > length:
                return None
            t = self.rng.uniform(w / 2 + 0.05, length - w / 2 - 0.05)
            # a hair off the wall so the footprint is strictly inside the floor polygon
            gap = 0.005 if rule in ("door", "mounted") else float(self.rng.uniform(0.02, 0.08))
            xy = a + t * e + n * (gap + d / 2)
            z0 = float(self.rng.uniform(*v.bottom)) if rule == "mounted" else 0.0
            if z0 + h > self.height - 0.05:
                return None
        elif rule == "floor":
            xy = self.rng.uniform(self.lo, self.hi)
            yaw = float(90.0 * self.rng.integers(4) + self.rng.uniform(-15.0, 15.0))
            z0 = 0.0
        elif rule == "near":
            anchors = [p for p in self.placed if p.obj.label in v.supports]
            if not anchors:
                return None
            anchor = anchors[int(self.rng.integers(len(anchors)))]
            side = int(self.rng.integers(4))  # which side of the anchor, in its local frame
            ax, ay = anchor.obj.extent[0] / 2, anchor.obj.extent[1] / 2
            along = float(self.rng.uniform(-0.35, 0.35))
            off = float(self.rng.uniform(0.08, 0.2))  # gap between chair and table edge
            local = [
                (along * ax, -ay - d / 2 - off),
                (along * ax, ay + d / 2 + off),
                (-ax - d / 2 - off, along * ay),
                (ax + d / 2 + off, along * ay),
            ][side]
            xy = anchor.obj.center[:2] + anchor.obj.rotation[:2, :2] @ np.array(local)
            to_anchor = anchor.obj.center[:2] - xy
            # face the anchor: the chair's front (local +y) points at the anchor's center
            yaw = float(np.degrees(np.arctan2(to_anchor[1], to_anchor[0]))) - 90.0
            z0 = 0.0
        elif rule == "on":
            supports = [p for p in self.placed if p.obj.label in v.supports]
            if not supports:
                return None
            on = supports[int(self.rng.integers(len(supports)))]
            x0, x1, y0, y1 = on.support_local
            if w > x1 - x0 or d > y1 - y0:
                return None
            local = np.array([self.rng.uniform(x0 + w / 2, x1 - w / 2), self.rng.uniform(y0 + d / 2, y1 - d / 2)])
            xy = on.obj.center[:2] + on.obj.rotation[:2, :2] @ local
            yaw = on.obj.yaw_deg + float(self.rng.uniform(-10.0, 10.0))
            z0 = on.support_z
            if z0 + h > self.height - 0.05:
                return None
        else:  # pragma: no cover - CATEGORIES is static
            raise ValueError(f"unknown placement {rule!r} for {label!r}")
        # The footprint of SceneObject.upright(...); the object itself is only built once the candidate fits.
        fp = _footprint_fast(float(xy[0]), float(xy[1]), size, yaw_rotation(yaw))
        if not self._fits(fp, z0, z0 + h, on):
            return None
        if z0 < 1e-6 and self.floor_cover + w * d > _MAX_FLOOR_COVER * self.area and rule != "door":
            return None
        obj = SceneObject.upright(len(self.placed), label, (xy[0], xy[1], z0 + h / 2), size, yaw)
        return obj, fp, z0, on

    def _commit(self, label: str, v: Variant, obj: SceneObject, fp: _Outline, z0: float, on: Optional[_Placed]) -> None:
        w, d, h = obj.extent
        # Must agree with the furniture templates (furniture.bed / furniture.sofa build the mattress
        # and seat cushions to these heights and keep headboard, arms and back out of these rects).
        support_z, local = z0 + h, (-w / 2 + 0.03, w / 2 - 0.03, -d / 2 + 0.03, d / 2 - 0.03)
        if v.shape == "bed":
            support_z = z0 + min(0.55, h * 0.5)
            local = (-w / 2 + 0.05, w / 2 - 0.05, -d / 2 + 0.12, d / 2 - 0.05)  # keep off the headboard
        elif v.shape == "sofa":
            support_z = z0 + 0.45
            local = (-w / 2 + 0.2, w / 2 - 0.2, -d / 2 + 0.25, d / 2 - 0.05)  # between arms, off the back
        self.placed.append(_Placed(obj, v, fp.array, z0, z0 + h, support_z, local, fp))
        if z0 < 1e-6:
            self.floor_cover += w * d
        if v.placement == "door":
            n = obj.rotation[:2, 1]
            zone_center = obj.center[:2] + n * (d / 2 + _DOOR_CLEARANCE / 2)
            zone = SceneObject.upright(
                0, "zone", (zone_center[0], zone_center[1], 1.0), (w + 0.2, _DOOR_CLEARANCE, 2.0), obj.yaw_deg
            )
            self.keepout.append(zone.footprint)
            self.keepout_outlines.append(_outline(self.keepout[-1]))

    # ------------------------------------------------------------------ mesh
    def build(self, scene_id: str, theme: str, look: np.random.Generator) -> Scene:
        """The scene's mesh: structure, then every placed object from its furniture template.

        ``look`` is the appearance generator (colors, proportions); the layout generator is not
        used here, so appearance changes never move objects.
        """
        mb = MeshBuilder()
        floor_material = _floor_material(theme, look)
        mb.add_flat_polygon(self.polygon, 0.0, _floor_color(floor_material, look), material=floor_material)
        mb.add_flat_polygon(self.polygon, self.height, (0.93, 0.93, 0.9), material="ceiling", facing="down")
        wall_h, wall_s, wall_v = (
            float(look.uniform(0.0, 1.0)),
            float(look.uniform(0.03, 0.2)),
            float(look.uniform(0.8, 0.92)),
        )
        for k in range(len(self.polygon)):
            # alternate wall brightness a little so corners read in flat shading
            color = hsv(wall_h, wall_s, wall_v * (1.0 - 0.05 * (k % 2)))
            mb.add_wall(
                self.polygon[k], self.polygon[(k + 1) % len(self.polygon)], self.height, color, material="paint"
            )
        used: dict[str, list[np.ndarray]] = {}
        for p in self.placed:
            mains = used.setdefault(p.obj.label, [])
            mains.append(build_object(mb, p.obj, look, p.variant.placement, avoid=mains))
        v, t, c, ids = mb.build()
        objects = [p.obj for p in self.placed]
        scene = Scene(
            scene_id,
            "procedural",
            v,
            t,
            c,
            ids,
            objects,
            self.polygon,
            self.height,
            triangle_materials=mb.triangle_materials(),
        )
        scene.theme = theme  # informational; not part of the contract
        return scene


def _floor_material(theme: str, look: np.random.Generator) -> str:
    if theme in ("kitchen", "bathroom"):
        return "floor_tiles"
    if theme == "office":
        return "carpet" if look.random() < 0.5 else "parquet"
    return "parquet"


def _floor_color(material: str, look: np.random.Generator) -> np.ndarray:
    u = look.uniform
    if material == "parquet":
        return hsv(float(u(0.06, 0.1)), float(u(0.35, 0.6)), float(u(0.45, 0.8)))
    if material == "floor_tiles":
        return hsv(float(u(0.05, 0.12)), float(u(0.0, 0.3)), float(u(0.5, 0.9)))
    return hsv(float(u(0.0, 1.0)), float(u(0.05, 0.3)), float(u(0.3, 0.6)))  # carpet

"""Part-based furniture templates: one recognisable mesh recipe per procedural category.

Every category of :data:`procedural.CATEGORIES` has a template in :data:`TEMPLATES` that builds the
object from parts (boxes, cylinders, frusta, ellipsoids of :class:`~.scene.MeshBuilder`), each with a
material of :mod:`.materials` and a realistic color. Templates work in the object's local frame with
the origin at the *bottom center* of its box: ``x`` in ``[-w/2, w/2]`` (width), ``y`` in ``[-d/2, d/2]``
(``+y`` is the front, the back of wall objects touches the wall), ``z`` in ``[0, h]``.

Contract (checked by ``tests/test_furniture.py`` for every category and many sizes):

* every part lies inside the object's box, and the parts together touch all six faces, so the
  object's box (the ground truth of the questions) is exactly its geometry's box;
* the object's *main color* (drawn by :func:`build_object` from the category's palette, distinct
  from the other instances of the category in the room) is its area-dominant color among the
  non-glass, non-screen triangles, so two instances of a category differ where they are largest;
* support surfaces match ``procedural._Placer._commit``: the top of tables, desks, cabinets, shelves,
  ... at ``h``; a bed's mattress and duvet top at ``min(0.55, h / 2)`` clear of everything in front of
  the headboard zone (``-d/2 + 0.12``); a sofa's seat cushions at 0.45 m between arms no wider than
  0.2 m, in front of a back no deeper than 0.25 m.

All appearance randomness (colors, proportions, counts) comes from the generator handed in, never
from the layout's. Sizes are whatever the layout drew: a template adapts its proportions to them.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.envs.scene import MeshBuilder, SceneObject

Span = tuple[float, float]
Color = np.ndarray
Finish = tuple[Color, str]  # (RGB in [0, 1], material name)

# Materials whose pixels show a pane, not the body (left out of the "main color" bookkeeping).
PANE_MATERIALS = ("glass", "screen")

# ---------------------------------------------------------------------------------------- colors
BLACK = np.array([0.06, 0.06, 0.07])
SCREEN = np.array([0.03, 0.035, 0.045])
DARK_GLASS = np.array([0.09, 0.1, 0.11])
GLASS = np.array([0.68, 0.76, 0.8])  # pale blue-grey
MIRROR = np.array([0.8, 0.85, 0.88])
STEEL = np.array([0.66, 0.67, 0.69])
DARK_METAL = np.array([0.22, 0.22, 0.24])
BRASS = np.array([0.72, 0.58, 0.3])
WHITE = np.array([0.93, 0.93, 0.91])
PAPER = np.array([0.95, 0.95, 0.93])
SOIL = np.array([0.24, 0.16, 0.1])


def hsv(h: float, s: float, v: float) -> Color:
    """HSV (each in [0, 1], hue wraps) to RGB."""
    h = (h % 1.0) * 6.0
    i = int(h) % 6
    f = h - int(h)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i])


def shade(c: Sequence[float], f: float) -> Color:
    """Color scaled by ``f`` (clipped to [0, 1])."""
    return np.clip(np.asarray(c, dtype=np.float64) * f, 0.0, 1.0)


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


# Palettes: rng -> (color, material); one per kind of surface.
def wood(rng: np.random.Generator) -> Finish:
    v = _u(rng, 0.28, 0.82)
    return hsv(_u(rng, 0.055, 0.1), _u(rng, 0.35, 0.65), v), ("dark_wood" if v < 0.42 else "wood")


def painted(rng: np.random.Generator) -> Finish:
    if rng.random() < 0.45:  # whites and greys
        return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.0, 0.06), _u(rng, 0.35, 0.95)), "paint"
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.15, 0.45), _u(rng, 0.4, 0.85)), "paint"


def furniture(rng: np.random.Generator) -> Finish:
    return wood(rng) if rng.random() < 0.6 else painted(rng)


def upholstery(rng: np.random.Generator) -> Finish:
    if rng.random() < 0.22:  # leather: browns, cognac, black
        return hsv(_u(rng, 0.03, 0.09), _u(rng, 0.3, 0.75), _u(rng, 0.1, 0.55)), "leather"
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.08, 0.5), _u(rng, 0.25, 0.78)), "fabric"


def bright_fabric(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.25, 0.8), _u(rng, 0.25, 0.9)), "fabric"


def knit(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.1, 0.6), _u(rng, 0.35, 0.92)), "knit"


def appliance(rng: np.random.Generator) -> Finish:
    kind = _pick(rng, ("white", "white", "steel", "black", "cream", "grey"))
    j = _u(rng, -0.04, 0.04)
    return {
        "white": (np.clip(WHITE + j, 0, 1), "plastic"),
        "steel": (np.clip(STEEL + j, 0, 1), "metal"),
        "black": (np.clip(BLACK + 0.04 + j / 2, 0, 1), "plastic"),
        "cream": (hsv(0.12, _u(rng, 0.1, 0.2), _u(rng, 0.82, 0.92)), "plastic"),
        "grey": (np.full(3, _u(rng, 0.35, 0.55)), "metal"),
    }[kind]


def electronics(rng: np.random.Generator) -> Finish:
    kind = _pick(rng, ("black", "black", "graphite", "silver", "white"))
    return {
        "black": (np.full(3, _u(rng, 0.05, 0.12)), "plastic"),
        "graphite": (hsv(0.6, 0.05, _u(rng, 0.22, 0.38)), "plastic"),
        "silver": (hsv(0.6, 0.03, _u(rng, 0.62, 0.78)), "metal"),
        "white": (np.full(3, _u(rng, 0.85, 0.95)), "plastic"),
    }[kind]


def tv_housing(rng: np.random.Generator) -> Finish:
    return (
        (np.full(3, _u(rng, 0.04, 0.3)), "plastic")
        if rng.random() < 0.8
        else (hsv(0.6, 0.03, _u(rng, 0.55, 0.75)), "metal")
    )


def ceramic(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.0, 0.07), _u(rng, 0.84, 0.96)), "ceramic"


def foliage(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.2, 0.42), _u(rng, 0.45, 0.85), _u(rng, 0.22, 0.62)), "foliage"


def frame_finish(rng: np.random.Generator) -> Finish:
    kind = _pick(rng, ("white", "white", "grey", "anthracite", "black", "wood"))
    if kind == "wood":
        return wood(rng)
    v = {
        "white": _u(rng, 0.85, 0.96),
        "grey": _u(rng, 0.5, 0.7),
        "anthracite": _u(rng, 0.2, 0.32),
        "black": _u(rng, 0.05, 0.12),
    }[kind]
    return hsv(0.6, _u(rng, 0.0, 0.05), v), "paint"


def ornament_frame(rng: np.random.Generator) -> Finish:
    kind = _pick(rng, ("gold", "black", "white", "wood", "silver"))
    if kind == "wood":
        return wood(rng)
    return {
        "gold": (hsv(_u(rng, 0.1, 0.14), _u(rng, 0.45, 0.7), _u(rng, 0.6, 0.85)), "metal"),
        "black": (np.full(3, _u(rng, 0.05, 0.15)), "paint"),
        "white": (np.full(3, _u(rng, 0.85, 0.95)), "paint"),
        "silver": (hsv(0.6, 0.03, _u(rng, 0.6, 0.78)), "metal"),
    }[kind]


def plastic_any(rng: np.random.Generator) -> Finish:
    if rng.random() < 0.3:
        return np.full(3, _u(rng, 0.1, 0.9)), ("metal" if rng.random() < 0.5 else "plastic")
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.3, 0.75), _u(rng, 0.3, 0.85)), "plastic"


def shade_fabric(rng: np.random.Generator) -> Finish:
    if rng.random() < 0.7:  # cream, white, beige, grey
        return hsv(_u(rng, 0.08, 0.14), _u(rng, 0.02, 0.3), _u(rng, 0.6, 0.97)), "fabric"
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.2, 0.6), _u(rng, 0.4, 0.85)), "fabric"


def art(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.15, 0.75), _u(rng, 0.25, 0.95)), "paper"


def surround(rng: np.random.Generator) -> Finish:
    kind = _pick(rng, ("white", "stone", "brick", "cream"))
    return {
        "white": (np.full(3, _u(rng, 0.86, 0.95)), "paint"),
        "stone": (hsv(0.1, _u(rng, 0.02, 0.12), _u(rng, 0.45, 0.7)), "ceramic"),
        "brick": (hsv(_u(rng, 0.0, 0.04), _u(rng, 0.5, 0.7), _u(rng, 0.4, 0.6)), "ceramic"),
        "cream": (hsv(0.11, _u(rng, 0.1, 0.25), _u(rng, 0.75, 0.9)), "paint"),
    }[kind]


def radiator_paint(rng: np.random.Generator) -> Finish:
    if rng.random() < 0.7:
        return np.full(3, _u(rng, 0.86, 0.96)), "paint"
    return hsv(0.6, 0.03, _u(rng, 0.2, 0.7)), "metal"


def piano_finish(rng: np.random.Generator) -> Finish:
    return (np.full(3, _u(rng, 0.03, 0.09)), "plastic") if rng.random() < 0.5 else wood(rng)


def board_white(rng: np.random.Generator) -> Finish:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.0, 0.03), _u(rng, 0.9, 0.98)), "plastic"


def book_color(rng: np.random.Generator) -> Color:
    return hsv(_u(rng, 0.0, 1.0), _u(rng, 0.2, 0.7), _u(rng, 0.2, 0.85))


# ------------------------------------------------------------------------------------------- kit
class Kit:
    """Adds parts of one object to a :class:`MeshBuilder`, in the object's local frame.

    Spans are ``(lo, hi)`` in meters along local x, y and z, with ``z`` measured from the bottom of
    the object's box. ``main`` is the object's main (body) color and ``main_mat`` its material.
    """

    def __init__(
        self, mb: MeshBuilder, obj: SceneObject, rng: np.random.Generator, main: Finish, placement: str = ""
    ) -> None:
        self.mb = mb
        self.obj = obj
        self.rng = rng
        self.main, self.main_mat = np.asarray(main[0], dtype=np.float64), main[1]
        self.placement = placement
        self.w, self.d, self.h = (float(v) for v in obj.extent)
        self.X, self.Y = self.w / 2.0, self.d / 2.0

    def u(self, lo: float, hi: float) -> float:
        """Uniform draw from the appearance generator."""
        return float(self.rng.uniform(lo, hi))

    def _world(self, local_center: Sequence[float]) -> np.ndarray:
        c = np.asarray(local_center, dtype=np.float64) - np.array([0.0, 0.0, self.h / 2.0])
        return self.obj.center + self.obj.rotation @ c

    @staticmethod
    def _box_of(x: Span, y: Span, z: Span) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([x[0], y[0], z[0]], dtype=np.float64)
        hi = np.array([x[1], y[1], z[1]], dtype=np.float64)
        return (lo + hi) / 2.0, np.maximum(hi - lo, 1e-4)

    def _fin(self, color, material: Optional[str]) -> tuple[Color, str]:
        if color is None:
            return self.main, self.main_mat if material is None else material
        return np.asarray(color, dtype=np.float64), (material or "plastic")

    def box(self, x: Span, y: Span, z: Span, color=None, material: Optional[str] = None) -> None:
        """Box over the spans; ``color=None`` uses the main finish."""
        c, e = self._box_of(x, y, z)
        col, mat = self._fin(color, material)
        self.mb.add_box(self._world(c), e, col, self.obj.object_id, self.obj.rotation, mat)

    def cyl(
        self,
        x: Span,
        y: Span,
        z: Span,
        color=None,
        material: Optional[str] = None,
        axis: int = 2,
        scales: tuple[float, float] = (1.0, 1.0),
        segments: int = 16,
    ) -> None:
        """Elliptic cylinder (or frustum with ``scales``) inscribed in the spans, along local ``axis``."""
        c, e = self._box_of(x, y, z)
        col, mat = self._fin(color, material)
        self.mb.add_frustum(self._world(c), e, col, self.obj.object_id, self.obj.rotation, axis, scales, segments, mat)

    def blob(
        self,
        x: Span,
        y: Span,
        z: Span,
        color=None,
        material: Optional[str] = None,
        square: tuple[float, float] = (1.0, 1.0),
        segments: int = 12,
        rings: int = 6,
    ) -> None:
        """(Super)ellipsoid inscribed in the spans (cushions, foliage, pillows)."""
        c, e = self._box_of(x, y, z)
        col, mat = self._fin(color, material)
        self.mb.add_ellipsoid(
            self._world(c), e, col, self.obj.object_id, self.obj.rotation, segments, rings, square, mat
        )

    def stick(
        self,
        a: Sequence[float],
        b: Sequence[float],
        width: float,
        thick: float,
        thick_dir: Sequence[float],
        color=None,
        material: Optional[str] = None,
    ) -> None:
        """Box from local point ``a`` to ``b`` (its long axis), ``thick`` along ``thick_dir`` (made
        perpendicular to the axis) and ``width`` across both. Callers keep the corners inside."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        ax = b - a
        length = float(np.linalg.norm(ax))
        ax /= length
        t = np.asarray(thick_dir, dtype=np.float64)
        t = t - ax * float(t @ ax)
        t /= np.linalg.norm(t)
        wv = np.cross(t, ax)
        rot = np.stack([ax, wv, t], axis=1)  # columns: long axis, width, thickness (right-handed)
        col, mat = self._fin(color, material)
        self.mb.add_box(
            self._world((a + b) / 2.0), (length, width, thick), col, self.obj.object_id, self.obj.rotation @ rot, mat
        )

    # -------------------------------------------------------------- small recurring parts
    def knob(self, x: float, z: float, r: float, y: Span, color=None, material: str = "metal") -> None:
        """Round knob on a front face: a short cylinder along y."""
        self.cyl((x - r, x + r), y, (z - r, z + r), STEEL if color is None else color, material, axis=1, segments=12)

    def bar(self, x: Span, z: Span, y: Span, color=None, material: str = "metal") -> None:
        """A handle bar (a box) standing proud of a front."""
        self.box(x, y, z, STEEL if color is None else color, material)

    def legs(
        self,
        x_out: float,
        y_out: float,
        size: float,
        z: Span,
        color=None,
        material: Optional[str] = None,
        round_: bool = False,
    ) -> None:
        """Four legs whose outer faces are at ``|x| = x_out`` and ``|y| = y_out``."""
        for sx in (-1, 1):
            for sy in (-1, 1):
                xs = tuple(sorted((sx * x_out, sx * (x_out - size))))
                ys = tuple(sorted((sy * y_out, sy * (y_out - size))))
                if round_:
                    self.cyl(xs, ys, z, color, material, segments=12)
                else:
                    self.box(xs, ys, z, color, material)


def _splits(lo: float, hi: float, n: int, gap: float) -> list[Span]:
    """``n`` equal spans between ``lo`` and ``hi`` with ``gap`` between neighbours."""
    step = (hi - lo + gap) / n
    return [(lo + i * step, lo + (i + 1) * step - gap) for i in range(n)]


# ------------------------------------------------------------------------------------ templates
def door(k: Kit) -> None:
    X, Y, h, d = k.X, k.Y, k.h, k.d
    trim, trim_mat = frame_finish(k.rng) if k.rng.random() < 0.6 else (shade(k.main, 0.85), k.main_mat)
    f = k.u(0.05, 0.08)
    for xs in ((-X, -X + f), (X - f, X)):
        k.box(xs, (-Y, Y), (0.0, h), trim, trim_mat)
    k.box((-X + f, X - f), (-Y, Y), (h - f, h), trim, trim_mat)
    leaf_front = -Y + 0.45 * d
    lx = (-X + f + 0.003, X - f - 0.003)
    k.box(lx, (-Y, leaf_front), (0.008, h - f - 0.003))
    if k.rng.random() < 0.6:  # raised panels
        n = int(k.rng.integers(2, 4))
        zs = _splits(0.12, h - f - 0.12, n, 0.1)
        for z in zs:
            k.box((lx[0] + 0.09, lx[1] - 0.09), (leaf_front, leaf_front + 0.005), z, shade(k.main, 0.92), k.main_mat)
    side = 1 if k.rng.random() < 0.5 else -1
    hx = side * (X - f - 0.07)
    hz = k.u(0.98, 1.05)
    k.cyl(
        (hx - 0.026, hx + 0.026), (leaf_front, Y - 0.012), (hz - 0.026, hz + 0.026), STEEL, "metal", axis=1, segments=12
    )
    k.bar(tuple(sorted((hx, hx - side * 0.13))), (hz - 0.01, hz + 0.01), (Y - 0.012, Y))


def window(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    f = k.u(0.045, 0.07)
    sill = 0.035
    k.box((-X, X), (-Y, Y), (0.0, sill))  # sill, the full depth and a little wider than the frame
    fx = X - 0.025
    fy = (-Y, Y - 0.012)
    for xs in ((-fx, -fx + f), (fx - f, fx)):
        k.box(xs, fy, (sill, h))
    k.box((-fx + f, fx - f), fy, (h - f, h))
    k.box((-fx + f, fx - f), fy, (sill, sill + f))
    z0, z1 = sill + f, h - f
    k.box((-fx + f, fx - f), (-Y + 0.008, -Y + 0.014), (z0, z1), GLASS + k.u(-0.05, 0.05), "glass")
    panes = max(2, int(round(k.w / 0.6)))  # casements: at least two
    my = (-Y + 0.004, Y - 0.02)
    for i in range(1, panes):
        x = -fx + f + i * (2 * fx - 2 * f) / panes
        k.box((x - 0.02, x + 0.02), my, (z0, z1))
    if k.rng.random() < 0.6:  # transom
        zt = z1 - 0.28 * (z1 - z0)
        k.box((-fx + f, fx - f), my, (zt - 0.02, zt + 0.02))


def bed(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    s = min(0.55, 0.5 * h)  # mattress top: procedural._Placer._commit's support height
    hb = k.u(0.06, 0.1)
    leg = k.u(0.06, 0.12)
    mt = k.u(0.16, 0.21)
    zb = s - mt
    k.box((-X, X), (-Y, -Y + hb), (0.0, h))  # headboard
    if k.rng.random() < 0.5:  # padded panel on the headboard's front
        k.box((-X + 0.05, X - 0.05), (-Y + hb, -Y + hb + 0.02), (s + 0.06, h - 0.05), shade(k.main, 1.12), k.main_mat)
    k.box((-X, X), (-Y + hb, Y), (leg, zb))  # base
    leg_col = DARK_METAL if k.rng.random() < 0.3 else shade(k.main, 0.6)
    for xs in ((-X + 0.03, -X + 0.08), (X - 0.08, X - 0.03)):
        for ys in ((-Y + hb + 0.03, -Y + hb + 0.08), (Y - 0.08, Y - 0.03)):
            k.box(xs, ys, (0.0, leg), leg_col, "wood")
    sheet = shade(WHITE, k.u(0.95, 1.05))
    k.box((-X + 0.025, X - 0.025), (-Y + hb + 0.01, Y - 0.023), (zb, s - 0.035), sheet, "fabric")  # mattress
    duvet, duvet_mat = knit(k.rng)
    yf = -Y + hb + k.u(0.35, 0.55)
    k.box((-X + 0.02, X - 0.02), (-Y + hb + 0.01, yf), (s - 0.035, s), sheet, "fabric")  # turned-down sheet
    k.box((-X + 0.012, X - 0.012), (yf, Y - 0.01), (s - 0.035, s), duvet, duvet_mat)
    for xs in ((-X + 0.012, -X + 0.025), (X - 0.025, X - 0.012)):
        k.box(xs, (yf, Y - 0.023), (zb + 0.03, s - 0.035), duvet, duvet_mat)
    k.box((-X + 0.012, X - 0.012), (Y - 0.023, Y - 0.01), (zb + 0.03, s - 0.035), duvet, duvet_mat)


def sofa(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    seat = 0.45  # procedural._Placer._commit's support height
    foot = k.u(0.04, 0.09)
    a = k.u(0.12, 0.19)  # arms (support keeps 0.2 m off each end)
    b = k.u(0.12, 0.16)  # back (support keeps 0.25 m off the back)
    arm_h = k.u(0.55, min(0.68, h - 0.08))
    ct = k.u(0.1, 0.14)
    for xs in ((-X, -X + a), (X - a, X)):
        k.box(xs, (-Y, Y), (foot, arm_h))
    k.box((-X + a, X - a), (-Y, -Y + b), (foot, h))
    k.box((-X + a, X - a), (-Y + b, Y - 0.01), (foot, seat - ct))
    n = 2 if k.w - 2 * a < 1.5 else 3
    for xs in _splits(-X + a + 0.005, X - a - 0.005, n, 0.012):
        k.blob(xs, (-Y + b, Y - 0.005), (seat - ct, seat), square=(0.22, 0.3))
        k.blob(xs, (-Y + b, -Y + 0.24), (seat, h - 0.02), square=(0.3, 0.35))
    leg_col, leg_mat = (DARK_METAL, "metal") if k.rng.random() < 0.4 else (hsv(0.07, 0.5, k.u(0.15, 0.4)), "dark_wood")
    k.legs(X - 0.03, Y - 0.03, 0.05, (0.0, foot), leg_col, leg_mat)


def cabinet(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    pl = k.u(0.06, 0.1)
    k.box((-X + 0.02, X - 0.02), (-Y, Y - 0.08), (0.0, pl), shade(k.main, 0.55), k.main_mat)  # plinth
    k.box((-X, X), (-Y, Y - 0.045), (pl, h - 0.025))
    k.box((-X, X), (-Y, Y - 0.02), (h - 0.025, h))  # top
    cols = 1 if k.w < 0.7 else 2
    rows = 2 if h > 1.3 else 1
    zsplit = [(pl + 0.004, h - 0.029)] if rows == 1 else _splits(pl + 0.004, h - 0.029, 2, 0.006)
    xs_all = _splits(-X + 0.004, X - 0.004, cols, 0.005)
    hl = k.u(0.1, 0.22)
    for zi, z in enumerate(zsplit):
        for ci, xs in enumerate(xs_all):
            k.box(xs, (Y - 0.045, Y - 0.025), z)
            hx = xs[1] - 0.04 if (cols == 2 and ci == 0) or cols == 1 else xs[0] + 0.04
            hz = (
                z[1] - 0.05 - hl / 2
                if zi == rows - 1 and rows == 2
                else (z[1] - 0.08 - hl / 2 if rows == 1 else z[0] + 0.08 + hl / 2)
            )
            hz = min(max(hz, z[0] + hl / 2 + 0.02), z[1] - hl / 2 - 0.02)
            k.bar((hx - 0.008, hx + 0.008), (hz - hl / 2, hz + hl / 2), (Y - 0.025, Y))


def shelf(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    t = 0.02
    pl = k.u(0.04, 0.08)
    for xs in ((-X, -X + t), (X - t, X)):
        k.box(xs, (-Y, Y), (0.0, h))
    k.box((-X + t, X - t), (-Y, Y), (h - t, h))
    k.box((-X + t, X - t), (-Y + 0.01, Y - 0.015), (0.0, pl))  # kick plate
    k.box((-X + t, X - t), (-Y, -Y + 0.008), (pl, h - t), shade(k.main, 0.8), k.main_mat)  # back panel
    n = max(2, int(round((h - pl) / 0.34)))
    boards = [pl + i * (h - t - pl) / n for i in range(n)]
    for z in boards:
        k.box((-X + t, X - t), (-Y + 0.008, Y - 0.005), (z, z + t))
    inner_d = k.d - 0.013
    for z in boards:
        gap = (h - t - pl) / n - t
        x = -X + t + 0.005
        while k.rng.random() < 0.85:
            bw = k.u(0.018, 0.05)
            if x + bw > X - t - 0.005:
                break
            bh = min(k.u(0.55, 0.92) * gap, 0.34)
            bd = k.u(0.6, 0.92) * inner_d
            k.box((x, x + bw), (Y - 0.005 - bd, Y - 0.006), (z + t, z + t + bh), book_color(k.rng), "paper")
            x += bw + (0.001 if k.rng.random() < 0.85 else k.u(0.03, 0.12))


def dresser(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    lh = k.u(0.08, 0.15)
    k.legs(X - 0.02, Y - 0.05, 0.04, (0.0, lh + 0.01), shade(k.main, 0.75), k.main_mat)
    k.box((-X, X), (-Y, Y - 0.035), (lh, h))
    rows = 3 if h < 0.9 else 4
    zs = _splits(lh + 0.01, h - 0.03, rows, 0.006)
    use_bars = k.rng.random() < 0.4
    for ri, z in enumerate(reversed(zs)):
        cols = 2 if (k.w > 1.0 and ri == 0) else 1
        for xs in _splits(-X + 0.015, X - 0.015, cols, 0.006):
            k.box(xs, (Y - 0.035, Y - 0.02), z, shade(k.main, 1.06), k.main_mat)
            zc = (z[0] + z[1]) / 2
            cx = (xs[0] + xs[1]) / 2
            if use_bars:
                k.bar((cx - 0.07, cx + 0.07), (zc - 0.008, zc + 0.008), (Y - 0.02, Y))
            else:
                width = xs[1] - xs[0]
                for x in (cx,) if width < 0.5 else (xs[0] + 0.25 * width, xs[1] - 0.25 * width):
                    k.knob(x, zc, 0.016, (Y - 0.02, Y), BRASS if k.main_mat == "paint" else STEEL)


def nightstand(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    lh = k.u(0.1, 0.18)
    t = 0.018
    k.legs(X, Y - 0.012, 0.035, (0.0, lh + 0.01))
    for xs in ((-X, -X + t), (X - t, X)):
        k.box(xs, (-Y, Y - 0.012), (lh, h - t))
    k.box((-X, X), (-Y, Y - 0.012), (h - t, h))
    k.box((-X + t, X - t), (-Y, Y - 0.012), (lh, lh + t))
    k.box((-X + t, X - t), (-Y, -Y + 0.01), (lh + t, h - t))
    dh = min(0.16, 0.45 * (h - lh))
    z = (h - t - dh, h - t - 0.003)
    k.box((-X + t, X - t), (-Y + 0.01, Y - 0.03), z, shade(k.main, 0.8), k.main_mat)  # drawer box
    k.box((-X + t + 0.002, X - t - 0.002), (Y - 0.03, Y - 0.012), z, shade(k.main, 1.08), k.main_mat)
    k.knob(0.0, (z[0] + z[1]) / 2, 0.014, (Y - 0.012, Y))


def tv_stand(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    lh = k.u(0.1, 0.17)
    t = 0.025
    leg_col, leg_mat = (DARK_METAL, "metal") if k.rng.random() < 0.5 else (shade(k.main, 0.7), k.main_mat)
    k.legs(X - 0.03, Y - 0.03, 0.035, (0.0, lh + 0.005), leg_col, leg_mat)
    k.box((-X, X), (-Y, Y), (h - t, h))
    k.box((-X, X), (-Y, Y - 0.01), (lh, lh + t))
    for xs in ((-X, -X + t), (X - t, X)):
        k.box(xs, (-Y, Y - 0.01), (lh + t, h - t))
    k.box((-X + t, X - t), (-Y, -Y + 0.008), (lh + t, h - t), shade(k.main, 0.75), k.main_mat)
    n = 3 if k.w > 1.3 else 2
    cells = _splits(-X + t, X - t, n, t)
    for xs in cells[:-1]:
        k.box((xs[1], xs[1] + t), (-Y + 0.008, Y - 0.01), (lh + t, h - t))
    if k.rng.random() < 0.5:  # one compartment with a drop-down flap, the rest open
        xs = cells[int(k.rng.integers(n))]
        k.box(
            (xs[0] + 0.003, xs[1] - 0.003),
            (Y - 0.01, Y),
            (lh + t + 0.003, h - t - 0.003),
            shade(k.main, 1.08),
            k.main_mat,
        )


def refrigerator(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    k.box((-X, X), (-Y, Y - 0.06), (0.0, h))
    k.box((-X + 0.03, X - 0.03), (Y - 0.06, Y - 0.045), (0.01, 0.065), DARK_METAL, "metal")  # kick grille
    dy = (Y - 0.06, Y - 0.03)
    hy = (Y - 0.03, Y)
    handle = STEEL if k.main_mat != "metal" else DARK_METAL
    if k.w >= 0.75 and k.rng.random() < 0.4:  # side by side
        xm = k.u(-0.08, 0.0) * k.w
        for xs, hx in (((-X + 0.003, xm - 0.004), xm - 0.04), ((xm + 0.004, X - 0.003), xm + 0.04)):
            k.box(xs, dy, (0.075, h - 0.005))
            k.bar((hx - 0.012, hx + 0.012), (0.55 * h - 0.3, 0.55 * h + 0.3), hy, handle)
        return
    zs = k.u(0.3, 0.38) * h if k.rng.random() < 0.65 else k.u(0.68, 0.74) * h  # freezer below / above
    k.box((-X + 0.003, X - 0.003), dy, (0.075, zs - 0.005))
    k.box((-X + 0.003, X - 0.003), dy, (zs + 0.005, h - 0.005))
    hx = X - 0.06
    for z0, z1 in ((0.075, zs - 0.005), (zs + 0.005, h - 0.005)):
        length = min(0.6, 0.55 * (z1 - z0))
        zc = z1 - 0.06 - length / 2 if z0 < 0.1 else z0 + 0.06 + length / 2
        k.bar((hx - 0.012, hx + 0.012), (zc - length / 2, zc + length / 2), hy, handle)


def _appliance_body(k: Kit, front: float) -> None:
    """Body of a kitchen appliance, its front at ``Y - front``."""
    k.box((-k.X, k.X), (-k.Y, k.Y - front), (0.0, k.h))


def oven(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    _appliance_body(k, 0.025)
    panel = BLACK if k.rng.random() < 0.5 else shade(k.main, 0.8)
    k.box((-X + 0.005, X - 0.005), (Y - 0.025, Y - 0.012), (h - 0.11, h - 0.01), panel, "plastic")
    for x in (-0.75 * X, -0.5 * X, 0.5 * X, 0.75 * X):
        k.knob(x, h - 0.06, 0.018, (Y - 0.012, Y))
    k.box((-0.15, 0.15), (Y - 0.012, Y - 0.006), (h - 0.08, h - 0.04), SCREEN, "screen")
    k.box((-X + 0.01, X - 0.01), (Y - 0.025, Y - 0.012), (0.14, h - 0.12))  # door
    k.box((-X + 0.08, X - 0.08), (Y - 0.012, Y - 0.006), (0.22, h - 0.25), DARK_GLASS, "glass")  # window
    k.bar((-X + 0.06, X - 0.06), (h - 0.17, h - 0.15), (Y - 0.012, Y))
    k.box((-X + 0.01, X - 0.01), (Y - 0.025, Y - 0.012), (0.02, 0.125), shade(k.main, 0.9), k.main_mat)  # drawer


def stove(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    zt = h - 0.1
    k.box((-X, X), (-Y, Y - 0.025), (0.0, zt - 0.02))
    top_col, top_mat = (BLACK, "glass") if k.rng.random() < 0.5 else (STEEL, "metal")
    k.box((-X, X), (-Y, Y - 0.015), (zt - 0.02, zt), top_col, top_mat)  # cooktop
    k.box((-X, X), (-Y, -Y + 0.05), (zt, h))  # backguard
    r = min(0.09, 0.22 * X)
    for bx in (-0.48 * X, 0.48 * X):
        for by in (-Y + 0.05 + 0.4 * (k.d - 0.05) * 0.5, -Y + 0.05 + 0.75 * (k.d - 0.05)):
            rr = r * (1.0 if by > 0 else 0.8)
            k.cyl((bx - rr, bx + rr), (by - rr, by + rr), (zt, zt + 0.015), DARK_METAL, "metal")
            k.cyl(
                (bx - rr * 0.4, bx + rr * 0.4),
                (by - rr * 0.4, by + rr * 0.4),
                (zt + 0.015, zt + 0.025),
                BLACK,
                "metal",
                segments=12,
            )
    for x in np.linspace(-0.7 * X, 0.7 * X, 4):
        k.knob(float(x), zt - 0.06, 0.018, (Y - 0.025, Y))
    k.box((-X + 0.01, X - 0.01), (Y - 0.025, Y - 0.012), (0.12, zt - 0.1))  # door, no window
    k.bar((-X + 0.06, X - 0.06), (zt - 0.15, zt - 0.13), (Y - 0.012, Y - 0.001))
    k.box((-X + 0.01, X - 0.01), (Y - 0.025, Y - 0.012), (0.015, 0.105), shade(k.main, 0.9), k.main_mat)


def dishwasher(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    k.box((-X + 0.02, X - 0.02), (-Y, Y - 0.06), (0.0, 0.09), BLACK, "plastic")  # recessed kick plate
    k.box((-X, X), (-Y, Y - 0.02), (0.09, h))
    k.box((-X + 0.005, X - 0.005), (Y - 0.02, Y - 0.006), (0.095, h - 0.005))  # door
    strip = BLACK if k.rng.random() < 0.5 else STEEL
    k.box((-X + 0.005, X - 0.005), (Y - 0.006, Y - 0.002), (h - 0.08, h - 0.01), strip, "plastic")
    for x in np.linspace(0.2 * X, 0.8 * X, 4):
        k.box(
            (float(x) - 0.012, float(x) + 0.012),
            (Y - 0.002, Y),
            (h - 0.05, h - 0.04),
            shade(strip, 1.6) + 0.1,
            "plastic",
        )
    k.bar((-0.18, 0.18), (h - 0.12, h - 0.1), (Y - 0.006, Y))


def washer(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    k.box((-X, X), (-Y, Y - 0.03), (0.0, h))
    k.box(
        (-X + 0.005, X - 0.005), (Y - 0.03, Y - 0.022), (h - 0.15, h - 0.005), shade(k.main, 0.95), k.main_mat
    )  # panel
    k.box(
        (-X + 0.03, -X + 0.03 + 0.32 * k.w),
        (Y - 0.022, Y - 0.012),
        (h - 0.12, h - 0.04),
        shade(k.main, 1.05),
        k.main_mat,
    )
    k.knob(X - 0.09, h - 0.08, 0.032, (Y - 0.022, Y), STEEL)
    k.box((0.0, 0.12), (Y - 0.022, Y - 0.016), (h - 0.1, h - 0.06), SCREEN, "screen")
    zc = 0.45 * (h - 0.15) + 0.02
    rr = min(0.21, 0.36 * k.w, 0.45 * (h - 0.17))
    k.cyl(
        (-rr, rr),
        (Y - 0.03, Y - 0.008),
        (zc - rr, zc + rr),
        STEEL if k.rng.random() < 0.6 else shade(k.main, 0.8),
        "metal",
        axis=1,
    )
    k.cyl((-0.72 * rr, 0.72 * rr), (Y - 0.008, Y), (zc - 0.72 * rr, zc + 0.72 * rr), DARK_GLASS, "glass", axis=1)


def microwave(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    for sx in (-1, 1):
        for sy in (-1, 1):
            k.box(
                tuple(sorted((sx * (X - 0.02), sx * (X - 0.05)))),
                tuple(sorted((sy * (Y - 0.03), sy * (Y - 0.06)))),
                (0.0, 0.012),
                BLACK,
                "plastic",
            )
    k.box((-X, X), (-Y, Y - 0.012), (0.01, h))
    cp = 0.26 * k.w
    door_col = k.main if k.rng.random() < 0.5 else BLACK
    k.box((-X + 0.005, X - cp - 0.005), (Y - 0.012, Y - 0.005), (0.02, h - 0.01), door_col, "plastic")
    k.box((-X + 0.045, X - cp - 0.06), (Y - 0.005, Y - 0.002), (0.055, h - 0.045), DARK_GLASS, "glass")
    k.bar((X - cp - 0.04, X - cp - 0.018), (0.05, h - 0.05), (Y - 0.005, Y), STEEL)
    k.box((X - cp, X - 0.005), (Y - 0.012, Y - 0.006), (0.02, h - 0.01), BLACK, "plastic")  # control panel
    k.box((X - cp + 0.015, X - 0.02), (Y - 0.006, Y - 0.003), (h - 0.07, h - 0.035), SCREEN, "screen")
    bx = _splits(X - cp + 0.015, X - 0.02, 2, 0.01)
    for z in _splits(0.06, h - 0.1, 3, 0.012):
        for xs in bx:
            k.box(xs, (Y - 0.006, Y - 0.002), z, shade(STEEL, 0.8), "plastic")


def sink(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    ct = h - k.u(0.13, 0.17)
    pl = 0.08
    k.box((-X + 0.02, X - 0.02), (-Y, Y - 0.06), (0.0, pl), shade(k.main, 0.5), k.main_mat)
    k.box((-X, X), (-Y, Y - 0.04), (pl, ct - 0.03))
    cols = 1 if k.w < 0.6 else 2
    for ci, xs in enumerate(_splits(-X + 0.004, X - 0.004, cols, 0.005)):
        k.box(xs, (Y - 0.04, Y - 0.022), (pl + 0.004, ct - 0.034))
        hx = xs[1] - 0.04 if ci == 0 else xs[0] + 0.04
        k.bar((hx - 0.007, hx + 0.007), (ct - 0.2, ct - 0.08), (Y - 0.022, Y - 0.002))
    top, top_mat = ceramic(k.rng) if k.rng.random() < 0.6 else (hsv(0.1, 0.05, k.u(0.2, 0.6)), "ceramic")
    k.box((-X, X), (-Y, Y), (ct - 0.03, ct), top, top_mat)
    bowl, _ = ceramic(k.rng)
    bw = min(0.4 * k.w, 0.22)
    bd = min(0.7 * k.d, 0.36)
    yb = (Y - 0.03 - bd, Y - 0.03)
    bh = min(k.u(0.09, 0.12), h - ct - 0.02)
    k.cyl((-bw, bw), yb, (ct, ct + bh), bowl, "ceramic", scales=(0.55, 1.0))
    k.cyl(
        (-0.82 * bw, 0.82 * bw),
        (yb[0] + 0.09 * bd, yb[1] - 0.09 * bd),
        (ct + bh, ct + bh + 0.002),
        shade(bowl, 0.82),
        "ceramic",
    )
    fy = -Y + 0.045
    k.cyl((-0.016, 0.016), (fy - 0.016, fy + 0.016), (ct, h - 0.012), STEEL, "metal", segments=12)
    k.box((-0.012, 0.012), (fy - 0.016, yb[0] + 0.06), (h - 0.025, h), STEEL, "metal")


def toilet(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    td = k.u(0.16, 0.2)
    k.box((-X, X), (-Y, -Y + td), (0.36, h - 0.025))  # tank
    k.box((-X, X), (-Y, -Y + td + 0.01), (h - 0.025, h))  # tank lid
    k.cyl((-0.55 * X, 0.55 * X), (-Y + 0.3 * td, Y - 0.2 * k.d), (0.0, 0.3), scales=(1.0, 0.8))  # pedestal
    k.box((-0.6 * X, 0.6 * X), (-Y + 0.02, -Y + td + 0.02), (0.2, 0.36))  # back of the bowl, under the tank
    k.cyl((-0.95 * X, 0.95 * X), (-Y + td - 0.06, Y), (0.24, 0.38), scales=(0.62, 1.0))  # bowl
    seat_col, seat_mat = (k.main, k.main_mat) if k.rng.random() < 0.75 else wood(k.rng)
    k.cyl((-0.94 * X, 0.94 * X), (-Y + td - 0.03, Y - 0.003), (0.38, 0.4), shade(seat_col, 0.97), seat_mat)
    k.cyl((-0.9 * X, 0.9 * X), (-Y + td - 0.02, Y - 0.015), (0.4, 0.425), seat_col, seat_mat)
    k.bar((-X + 0.03, -X + 0.09), (h - 0.08, h - 0.065), (-Y + td, -Y + td + 0.015))


def bathtub(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    t = k.u(0.06, 0.09)
    fz = k.u(0.1, 0.15)
    k.box((-X, X), (Y - t, Y), (0.0, h))
    k.box((-X, X), (-Y, -Y + t), (0.0, h))
    for xs in ((-X, -X + t), (X - t, X)):
        k.box(xs, (-Y + t, Y - t), (0.0, h))
    k.box((-X + t, X - t), (-Y + t, Y - t), (0.0, fz))
    inside = np.clip(shade(k.main, 1.0) + 0.06, 0, 1)
    li = 0.005
    k.box((-X + t, X - t), (-Y + t, Y - t), (fz, fz + li), inside, "ceramic")
    top = h - 0.012
    k.box((-X + t, X - t), (Y - t - li, Y - t), (fz + li, top), inside, "ceramic")
    k.box((-X + t, X - t), (-Y + t, -Y + t + li), (fz + li, top), inside, "ceramic")
    for xs in ((-X + t, -X + t + li), (X - t - li, X - t)):
        k.box(xs, (-Y + t + li, Y - t - li), (fz + li, top), inside, "ceramic")
    end = -1 if k.rng.random() < 0.5 else 1
    x0 = end * (X - t - li)
    k.box(tuple(sorted((x0, x0 - end * 0.11))), (-0.018, 0.018), (h - 0.1, h - 0.07), STEEL, "metal")
    xd = end * (X - t - 0.15)
    k.cyl((xd - 0.025, xd + 0.025), (-0.025, 0.025), (fz + li, fz + li + 0.002), DARK_METAL, "metal", segments=12)


def desk(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    t = k.u(0.025, 0.04)
    k.box((-X, X), (-Y, Y), (h - t, h))
    side = 1 if k.rng.random() < 0.5 else -1
    pw = min(k.u(0.35, 0.45), 0.4 * k.w)
    px = tuple(sorted((side * X, side * (X - pw))))
    k.box(px, (-Y + 0.03, Y - 0.04), (0.0, h - t))  # drawer pedestal
    for z in _splits(0.03, h - t - 0.004, 3, 0.006):
        k.box((px[0] + 0.004, px[1] - 0.004), (Y - 0.04, Y - 0.022), z, shade(k.main, 1.06), k.main_mat)
        zc = z[1] - 0.04
        cx = (px[0] + px[1]) / 2
        k.bar((cx - 0.06, cx + 0.06), (zc - 0.007, zc + 0.007), (Y - 0.022, Y - 0.004))
    ox = tuple(sorted((-side * X, -side * (X - 0.03))))
    k.box(ox, (-Y + 0.03, Y - 0.03), (0.0, h - t))  # panel leg
    mx = tuple(sorted((-side * (X - 0.03), side * (X - pw))))
    k.box(mx, (-Y + 0.04, -Y + 0.06), (0.3 * h, h - t), shade(k.main, 0.85), k.main_mat)  # modesty panel


def table(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    t = k.u(0.025, 0.05)
    k.box((-X, X), (-Y, Y), (h - t, h))
    leg = k.u(0.04, 0.07)
    inset = k.u(0.02, 0.08)
    round_legs = k.rng.random() < 0.4
    leg_col, leg_mat = (k.main, k.main_mat) if k.rng.random() < 0.7 else (DARK_METAL, "metal")
    k.legs(X - inset, Y - inset, leg, (0.0, h - t), leg_col, leg_mat, round_=round_legs)
    ap = k.u(0.05, 0.09)
    z = (h - t - ap, h - t)
    xi, yi = X - inset - leg, Y - inset - leg
    for sy in (-1, 1):
        k.box((-xi, xi), tuple(sorted((sy * (Y - inset - 0.005), sy * (Y - inset - 0.025)))), z)
    for sx in (-1, 1):
        k.box(tuple(sorted((sx * (X - inset - 0.005), sx * (X - inset - 0.025)))), (-yi, yi), z)


def coffee_table(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    leg = k.u(0.04, 0.06)
    t = k.u(0.03, 0.05)
    if k.rng.random() < 0.3:  # glass top on a frame
        k.box((-X, X), (-Y, Y), (h - 0.012, h), GLASS, "glass")
        for sy in (-1, 1):
            k.box((-X + 0.01, X - 0.01), tuple(sorted((sy * (Y - 0.01), sy * (Y - 0.04)))), (h - 0.05, h - 0.012))
        for sx in (-1, 1):
            k.box(tuple(sorted((sx * (X - 0.01), sx * (X - 0.04)))), (-Y + 0.04, Y - 0.04), (h - 0.05, h - 0.012))
        k.legs(X - 0.01, Y - 0.01, leg, (0.0, h - 0.012))
    else:
        k.box((-X, X), (-Y, Y), (h - t, h))
        k.legs(X - 0.03, Y - 0.03, leg, (0.0, h - t))
    sz = k.u(0.07, 0.12)
    k.box((-X + 0.03 + leg, X - 0.03 - leg), (-Y + 0.04, Y - 0.04), (sz, sz + 0.02))  # lower shelf


def chair(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    sh = k.u(0.43, 0.47)
    st = k.u(0.03, 0.05)
    leg = k.u(0.03, 0.045)
    for sx in (-1, 1):
        xs = tuple(sorted((sx * X, sx * (X - leg))))
        k.box(xs, (Y - leg, Y), (0.0, sh - st))  # front leg
        k.box(xs, (-Y, -Y + leg), (0.0, h))  # back leg and post
        k.box(xs, (-Y + leg, Y - leg), (0.14, 0.17))  # side stretcher
    k.box((-X, X), (-Y + leg, Y), (sh - st, sh))  # seat
    rail = k.u(0.07, 0.12)
    k.box((-X + leg, X - leg), (-Y + 0.004, -Y + leg - 0.004), (h - rail, h - 0.01))
    if k.rng.random() < 0.5:
        n = int(k.rng.integers(2, 5))
        for xs in _splits(-X + leg + 0.04, X - leg - 0.04, n, 0.05 if n > 2 else 0.08):
            k.box(xs, (-Y + 0.008, -Y + leg - 0.008), (sh, h - rail))
    else:
        k.box(
            (-X + leg, X - leg), (-Y + 0.006, -Y + leg - 0.006), (sh + 0.12, h - rail), shade(k.main, 0.92), k.main_mat
        )
    if k.rng.random() < 0.5:  # seat pad
        pad, pad_mat = upholstery(k.rng)
        k.blob(
            (-X + 0.015, X - 0.015),
            (-Y + leg + 0.01, Y - 0.015),
            (sh - 0.01, sh + 0.025),
            pad,
            pad_mat,
            square=(0.2, 0.4),
        )


def stool(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    top = k.u(0.03, 0.045)
    k.cyl((-X, X), (-Y, Y), (h - top, h))
    leg = 0.03
    px, py = 0.6 * X, 0.6 * Y
    for sx in (-1, 1):
        for sy in (-1, 1):
            k.box((sx * px - leg / 2, sx * px + leg / 2), (sy * py - leg / 2, sy * py + leg / 2), (0.0, h - top))
    zr = 0.3 * h
    k.box((-px, px), (-py - 0.01, -py + 0.01), (zr, zr + 0.02), shade(k.main, 0.85), k.main_mat)
    k.box((-px, px), (py - 0.01, py + 0.01), (zr, zr + 0.02), shade(k.main, 0.85), k.main_mat)
    k.box((-px - 0.01, -px + 0.01), (-py, py), (zr + 0.03, zr + 0.05), shade(k.main, 0.85), k.main_mat)
    k.box((px - 0.01, px + 0.01), (-py, py), (zr + 0.03, zr + 0.05), shade(k.main, 0.85), k.main_mat)


def lamp(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    metal = DARK_METAL if k.rng.random() < 0.5 else BRASS
    if h < 1.0:  # table lamp: a vase-like body
        sh = k.u(0.38, 0.48) * h
        bh = k.u(0.3, 0.4) * h
        body, body_mat = ceramic(k.rng) if k.rng.random() < 0.5 else (shade(metal, 1.0), "metal")
        k.blob((-0.35 * X, 0.35 * X), (-0.35 * Y, 0.35 * Y), (0.0, bh), body, body_mat, square=(1.0, 0.7))
        k.cyl((-0.01, 0.01), (-0.01, 0.01), (bh - 0.01, h - 0.6 * sh), metal, "metal", segments=12)
    else:
        sh = k.u(0.28, 0.38)
        k.cyl((-0.6 * X, 0.6 * X), (-0.6 * Y, 0.6 * Y), (0.0, 0.03), metal, "metal")
        k.cyl((-0.013, 0.013), (-0.013, 0.013), (0.03, h - 0.5 * sh), metal, "metal", segments=12)
    k.cyl((-X, X), (-Y, Y), (h - sh, h), scales=(1.0, k.u(0.6, 0.8)))


def tv(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    bz = k.u(0.008, 0.02)
    if k.placement == "mounted":
        pt = min(k.u(0.025, 0.045), k.d - 0.02)
        k.box((-X, X), (Y - pt, Y - 0.003), (0.0, h))
        k.box((-X + bz, X - bz), (Y - 0.003, Y), (bz, h - bz), SCREEN, "screen")
        k.box((-0.15, 0.15), (-Y, -Y + 0.008), (h / 2 - 0.12, h / 2 + 0.12), DARK_METAL, "metal")  # wall plate
        k.box((-0.05, 0.05), (-Y + 0.008, Y - pt), (h / 2 - 0.04, h / 2 + 0.04), DARK_METAL, "metal")  # arm
        return
    pt = min(k.u(0.03, 0.05), k.d - 0.01)
    fh = k.u(0.05, 0.09)
    yc = 0.0
    k.box((-X, X), (yc - pt / 2, yc + pt / 2 - 0.003), (fh, h))
    k.box((-X + bz, X - bz), (yc + pt / 2 - 0.003, yc + pt / 2), (fh + bz + 0.01, h - bz), SCREEN, "screen")
    k.box((-0.3 * X, 0.3 * X), (yc - pt / 2 - 0.012, yc - pt / 2), (fh + 0.15 * (h - fh), fh + 0.6 * (h - fh)))  # back
    fx = X - k.u(0.08, 0.2)
    for sx in (-1, 1):  # two splayed feet near the ends
        x = sx * fx
        for sy in (-1, 1):
            end = (x + sx * 0.06, sy * (Y - 0.03), 0.012)
            k.stick((x, yc, fh + 0.02), end, 0.02, 0.012, (0.0, 0.0, 1.0), DARK_METAL, "metal")
            k.box(
                (end[0] - 0.02, end[0] + 0.02),
                tuple(sorted((sy * (Y - 0.045), sy * Y))),
                (0.0, 0.012),
                DARK_METAL,
                "metal",
            )  # pad
        k.box((x - 0.015, x + 0.015), (yc - 0.012, yc + 0.012), (0.0, fh + 0.03), DARK_METAL, "metal")


def monitor(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    sh = min(h - 0.08, k.w * k.u(0.56, 0.64))
    z0 = h - sh
    bz = k.u(0.008, 0.02)
    ys = -0.015
    k.box((-X, X), (ys, ys + 0.022), (z0, h))
    k.box((-X + bz, X - bz), (ys + 0.022, ys + 0.025), (z0 + bz + 0.012, h - bz), SCREEN, "screen")
    k.box((-0.28 * k.w, 0.28 * k.w), (ys - 0.03, ys), (z0 + 0.2 * sh, h - 0.25 * sh))  # back bulge
    ny = (ys - 0.055, ys - 0.03)
    k.box((-0.025, 0.025), ny, (0.012, z0 + 0.5 * sh))  # neck
    if k.rng.random() < 0.5:
        k.box((-0.13, 0.13), (-Y, Y), (0.0, 0.014), shade(k.main, 0.85), k.main_mat)
    else:
        k.cyl((-0.12, 0.12), (-Y, Y), (0.0, 0.014), shade(k.main, 0.85), k.main_mat)


def laptop(k: Kit) -> None:
    """Closed laptop: the layout's boxes are 2-3 cm high, so the lid cannot be open."""
    X, Y, h = k.X, k.Y, k.h
    k.box((-X, X), (-Y, Y), (0.0, 0.46 * h))
    k.box((-X + 0.004, X - 0.004), (-Y + 0.004, Y - 0.006), (0.46 * h, 0.56 * h), BLACK, "plastic")
    k.box((-X, X), (-Y, Y - 0.002), (0.56 * h, h - 0.0008))
    logo = np.clip(k.main + 0.15, 0, 1) if k.main.mean() < 0.5 else shade(k.main, 0.8)
    k.cyl((-0.02, 0.02), (-0.02, 0.02), (h - 0.0008, h), logo, "plastic", segments=12)
    k.box((-0.03, 0.03), (Y - 0.002, Y), (0.5 * h, 0.56 * h), shade(k.main, 0.7), k.main_mat)  # lid notch


def keyboard(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    plate = shade(k.main, 0.6) if k.main.mean() > 0.3 else np.clip(k.main + 0.15, 0, 1)
    k.box((-X, X), (-Y, Y), (0.0, 0.3 * h))  # shell
    k.box((-X, X), (-Y, Y), (0.3 * h, 0.5 * h), plate, k.main_mat)  # key plate, between the keys
    key_col, key_mat = k.main, k.main_mat
    rows = 6 if k.d > 0.145 else 5
    zk = (0.5 * h, h)
    ys = _splits(-Y + 0.01, Y - 0.01, rows, 0.004)
    xu = (-X + 0.012, X - 0.012)
    span = xu[1] - xu[0]
    blocks = ((0.0, 0.64), (0.665, 0.79), (0.815, 1.0))
    for ri, yr in enumerate(ys):
        for bi, (a, b) in enumerate(blocks):
            if bi == 1 and 0 < ri < rows - 2:
                continue  # the gap above the arrow keys
            x0, x1 = xu[0] + a * span, xu[0] + b * span
            if bi == 0:
                parts = ((0.0, 0.18), (0.2, 0.78), (0.8, 1.0)) if ri == 0 else ((0.0, 0.32), (0.34, 0.66), (0.68, 1.0))
                for pa, pb in parts:
                    k.box((x0 + pa * (x1 - x0), x0 + pb * (x1 - x0)), yr, zk, key_col, key_mat)
            else:
                k.box((x0, x1), yr, zk, key_col, key_mat)


def printer(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    back = 0.07
    k.box((-X, X), (-Y + back, Y - 0.03), (0.0, 0.72 * h))
    k.box((-X, X), (-Y + back, Y - 0.04), (0.72 * h, 0.86 * h), shade(k.main, 0.93), k.main_mat)  # scanner lid
    th = 0.006
    a = (0.0, -Y + back + 0.005, 0.55 * h)
    b = (0.0, -Y, h)
    for _ in range(8):  # move the top end in until the tray's corners touch the back and the top
        ax = np.array([b[1] - a[1], b[2] - a[2]])
        ax /= np.linalg.norm(ax)
        b = (0.0, -Y + 0.5 * th * abs(ax[1]), h - 0.5 * th * abs(ax[0]))
    tray = BLACK if k.main.mean() > 0.4 else np.full(3, 0.6)
    k.stick(a, b, 0.7 * k.w, th, (0.0, b[2] - a[2], a[1] - b[1]), tray, "plastic")
    pa = (0.0, a[1] + 0.008, a[2] + 0.04)
    pb = (0.0, b[1] + 0.009, b[2] - 0.012)
    k.stick(pa, pb, 0.55 * k.w, 0.004, (0.0, pb[2] - pa[2], pa[1] - pb[1]), PAPER, "paper")
    k.box((-0.3 * k.w, 0.3 * k.w), (Y - 0.03, Y), (0.28 * h, 0.28 * h + 0.008), tray, "plastic")  # output tray
    k.box((-0.33 * k.w, 0.33 * k.w), (Y - 0.03, Y - 0.027), (0.31 * h, 0.45 * h), BLACK, "plastic")  # slot
    k.box((X - 0.14, X - 0.03), (Y - 0.04, Y - 0.035), (0.74 * h, 0.84 * h), SCREEN, "screen")


def computer_tower(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    fz = 0.015
    for sx in (-1, 1):
        for sy in (-1, 1):
            k.box(
                tuple(sorted((sx * (X - 0.01), sx * (X - 0.04)))),
                tuple(sorted((sy * (Y - 0.02), sy * (Y - 0.06)))),
                (0.0, fz),
                BLACK,
                "plastic",
            )
    k.box((-X, X), (-Y, Y - 0.012), (fz, h))
    bezel = BLACK if k.main.mean() > 0.3 else np.full(3, 0.3)
    k.box((-X + 0.004, X - 0.004), (Y - 0.012, Y - 0.004), (fz + 0.005, h - 0.005), bezel, "plastic")
    k.cyl(
        (-0.012, 0.012),
        (Y - 0.004, Y),
        (h - 0.05, h - 0.026),
        np.array([0.3, 0.6, 0.95]),
        "plastic",
        axis=1,
        segments=12,
    )
    k.box(
        (-X + 0.02, X - 0.02), (Y - 0.004, Y - 0.002), (h - 0.13, h - 0.09), shade(bezel, 1.8) + 0.05, "plastic"
    )  # drive bay
    if k.rng.random() < 0.4:  # glass side panel
        k.box((X - 0.003, X), (-Y + 0.04, Y - 0.05), (fz + 0.04, h - 0.04), DARK_GLASS, "glass")
    else:  # vents
        for z in np.linspace(fz + 0.08, h - 0.08, 6):
            k.box(
                (X - 0.002, X),
                (-Y + 0.06, Y - 0.1),
                (float(z) - 0.004, float(z) + 0.004),
                shade(k.main, 0.6),
                k.main_mat,
            )


def plant(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    pot_h = min(max(k.u(0.25, 0.35) * h, 0.08), 0.45)
    pr = k.u(0.55, 0.75)
    pot, pot_mat = _pick(
        k.rng,
        (
            (hsv(0.05, 0.6, 0.6), "ceramic"),
            (WHITE, "ceramic"),
            (np.full(3, 0.45), "ceramic"),
            (BLACK + 0.05, "plastic"),
        ),
    )
    pot = shade(pot, k.u(0.9, 1.1))
    k.cyl((-pr * X, pr * X), (-pr * Y, pr * Y), (0.0, pot_h), pot, pot_mat, scales=(0.75, 1.0))
    k.cyl((-0.86 * pr * X, 0.86 * pr * X), (-0.86 * pr * Y, 0.86 * pr * Y), (pot_h, pot_h + 0.008), SOIL, "soil")
    big = h > 0.45
    f0 = pot_h + (k.u(0.1, 0.3) * (h - pot_h) if big else -0.01)
    k.cyl((-0.012, 0.012), (-0.012, 0.012), (pot_h, f0 + 0.05), hsv(0.1, 0.5, 0.3), "wood", segments=12)  # stem
    _bush(k, f0, big)


def _bush(k: Kit, z0: float, big: bool) -> None:
    """Foliage over ``z0 .. h``: a core blob and leaf clusters poking out of it, the clusters at the
    four sides and the top reaching the box's faces; all in the main color."""
    X, Y, h = k.X, k.Y, k.h
    rz = (h - z0) / 2
    zc = z0 + rz
    k.blob((-0.78 * X, 0.78 * X), (-0.78 * Y, 0.78 * Y), (z0, h - 0.15 * rz))
    if not big:
        k.blob((-X, X), (-Y, Y), (zc - 0.5 * rz, zc + 0.7 * rz), segments=8, rings=4)
        k.blob((-0.5 * X, 0.5 * X), (-0.5 * Y, 0.5 * Y), (h - 0.6 * rz, h), segments=8, rings=4)
        return
    for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        s = k.u(0.4, 0.55)
        sx, sy, sz = s * X, s * Y, k.u(0.3, 0.45) * rz
        cx = dx * (X - sx) + (0 if dx else k.u(-0.3, 0.3) * X)
        cy = dy * (Y - sy) + (0 if dy else k.u(-0.3, 0.3) * Y)
        cz = zc + k.u(-0.35, 0.45) * rz
        k.blob((cx - sx, cx + sx), (cy - sy, cy + sy), (cz - sz, cz + sz), segments=8, rings=4)
    s = k.u(0.35, 0.5)
    k.blob((-s * X, s * X), (-s * Y, s * Y), (h - 0.7 * rz, h), segments=8, rings=4)
    for _ in range(int(k.rng.integers(3, 7))):
        a = k.u(0.0, 2 * np.pi)
        e = k.u(-0.6, 0.9)
        sx, sy, sz = k.u(0.2, 0.35) * X, k.u(0.2, 0.35) * Y, k.u(0.15, 0.3) * rz
        cx = np.clip(np.cos(a) * np.cos(e) * 0.8 * X, -X + sx, X - sx)
        cy = np.clip(np.sin(a) * np.cos(e) * 0.8 * Y, -Y + sy, Y - sy)
        cz = np.clip(zc + np.sin(e) * 0.8 * rz, z0 + sz, h - sz)
        k.blob(
            (cx - sx, cx + sx),
            (cy - sy, cy + sy),
            (cz - sz, cz + sz),
            shade(k.main, k.u(0.85, 1.15)),
            "foliage",
            segments=8,
            rings=4,
        )


def pillow(k: Kit) -> None:
    k.blob((-k.X, k.X), (-k.Y, k.Y), (0.0, k.h), square=(0.3, 0.55), segments=16)


def trash_can(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    if k.rng.random() < 0.5:  # open bin: a dark opening inside the rim
        k.cyl((-X, X), (-Y, Y), (0.0, h - 0.005), scales=(0.82, 1.0))
        k.cyl((-0.88 * X, 0.88 * X), (-0.88 * Y, 0.88 * Y), (h - 0.005, h), BLACK, "plastic")
    else:  # pedal bin with a lid
        k.cyl((-0.96 * X, 0.96 * X), (-0.96 * Y, 0.96 * Y), (0.0, h - 0.035), scales=(0.9, 1.0))
        k.cyl((-X, X), (-Y, Y), (h - 0.035, h), shade(k.main, 0.8), k.main_mat)
        k.box((-0.04, 0.04), (0.8 * Y, 0.995 * Y), (0.01, 0.03), DARK_METAL, "metal")


def backpack(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    strap = 0.03
    pocket = min(0.06, 0.3 * k.d)
    k.blob((-X, X), (-Y + strap, Y - pocket), (0.0, h - 0.04), square=(0.4, 0.5))
    k.blob(
        (-0.75 * X, 0.75 * X),
        (Y - pocket - 0.04, Y),
        (0.04, 0.5 * h),
        shade(k.main, 0.85),
        k.main_mat,
        square=(0.4, 0.5),
    )
    strap_col = shade(k.main, 0.5)
    for x in (-0.45 * X, 0.45 * X):
        k.box((x - 0.025, x + 0.025), (-Y, -Y + strap), (0.06, 0.85 * h), strap_col, "fabric")
    k.box((-0.05, 0.05), (-0.012, 0.012), (h - 0.05, h), strap_col, "fabric")  # top handle


def suitcase(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    wz = 0.05
    top = h - k.u(0.05, 0.1)
    k.blob((-X, X), (-Y, Y - 0.006), (wz - 0.01, top), square=(0.2, 0.2), segments=16)
    for x in np.linspace(-0.5 * X, 0.5 * X, 3):
        k.box(
            (float(x) - 0.012, float(x) + 0.012),
            (Y - 0.02, Y),
            (wz + 0.05, top - 0.06),
            shade(k.main, 0.85),
            k.main_mat,
        )
    for sx in (-1, 1):
        for sy in (-1, 1):
            x, y = sx * (X - 0.05), sy * (Y - 0.04)
            k.cyl((x - 0.012, x + 0.012), (y - 0.025, y + 0.025), (0.0, wz), BLACK, "plastic", axis=0, segments=12)
    for x in (-0.12, 0.12):
        k.box((x - 0.01, x + 0.01), (-Y + 0.025, -Y + 0.045), (top - 0.05, h - 0.02), DARK_METAL, "metal")
    k.box((-0.14, 0.14), (-Y + 0.02, -Y + 0.05), (h - 0.025, h), BLACK, "plastic")


def whiteboard(k: Kit) -> None:
    X, Y, h, d = k.X, k.Y, k.h, k.d
    f = 0.02
    fy = (-Y, -Y + 0.7 * d)
    for xs in ((-X, -X + f), (X - f, X)):
        k.box(xs, fy, (0.0, h), STEEL, "metal")
    k.box((-X + f, X - f), fy, (h - f, h), STEEL, "metal")
    k.box((-X + f, X - f), fy, (0.0, f), STEEL, "metal")
    k.box((-X + f, X - f), (-Y, -Y + 0.55 * d), (f, h - f))  # the board
    k.box((-0.4 * k.w, 0.4 * k.w), (-Y + 0.7 * d, Y), (0.0, 0.022), STEEL, "metal")  # tray
    for i, col in enumerate(((0.1, 0.1, 0.1), (0.8, 0.1, 0.1), (0.1, 0.2, 0.8))):
        x = -0.3 * k.w + i * 0.16
        k.cyl((x, x + 0.13), (Y - 0.018, Y - 0.004), (0.022, 0.036), col, "plastic", axis=0, segments=12)


def picture(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    frame, frame_mat = ornament_frame(k.rng)
    f = min(k.u(0.025, 0.06), 0.15 * min(k.w, h))
    fy = (Y - 0.012, Y)  # a flat frame on the front of a wrapped canvas
    for xs in ((-X, -X + f), (X - f, X)):
        k.box(xs, fy, (0.0, h), frame, frame_mat)
    for zs in ((0.0, f), (h - f, h)):
        k.box((-X + f, X - f), fy, zs, frame, frame_mat)
    k.box((-X, X), (-Y, Y - 0.012), (0.0, h))  # canvas (main color)
    for _ in range(int(k.rng.integers(2, 6))):  # a few shapes of paint
        ww, hh = k.u(0.15, 0.5) * (k.w - 2 * f), k.u(0.15, 0.5) * (h - 2 * f)
        cx, cz = k.u(-X + f + ww / 2, X - f - ww / 2), k.u(f + hh / 2, h - f - hh / 2)
        col = art(k.rng)[0]
        if k.rng.random() < 0.5:
            k.box((cx - ww / 2, cx + ww / 2), (Y - 0.012, Y - 0.01), (cz - hh / 2, cz + hh / 2), col, "paper")
        else:
            k.cyl(
                (cx - ww / 2, cx + ww / 2),
                (Y - 0.012, Y - 0.01),
                (cz - hh / 2, cz + hh / 2),
                col,
                "paper",
                axis=1,
                segments=12,
            )


def mirror(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    f = k.u(0.02, 0.05)
    for xs in ((-X, -X + f), (X - f, X)):
        k.box(xs, (-Y, Y), (0.0, h))
    for zs in ((0.0, f), (h - f, h)):
        k.box((-X + f, X - f), (-Y, Y), zs)
    k.box((-X + f, X - f), (-Y, Y - 0.006), (f, h - f), np.clip(MIRROR + k.u(-0.04, 0.04), 0, 1), "glass")


def clock(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    ry = (-Y, Y - 0.008)  # rim
    fy = (Y - 0.008, Y - 0.005)  # dial, in front of the rim
    face = np.full(3, k.u(0.88, 0.97)) if k.main.mean() < 0.75 or k.rng.random() < 0.5 else np.full(3, 0.12)
    hand_col = BLACK if face.mean() > 0.5 else WHITE
    if abs(k.w - h) <= 0.03:  # round (a hair elliptic)
        rx, rz, zc = X, h / 2, h / 2
    elif h > k.w:  # pendulum wall clock: the dial at the top, a pendulum below
        rx = rz = X
        zc = h - X
        k.box((-0.006, 0.006), (-Y + 0.004, -Y + 0.01), (0.04, zc - 0.5 * rz), BRASS, "metal")
        k.cyl((-0.03, 0.03), (-Y + 0.002, -Y + 0.012), (0.0, 0.06), BRASS, "metal", axis=1, segments=12)
    else:  # sunburst: rays around a round dial reach the sides
        rx = rz = h / 2
        zc = h / 2
        for i in range(12):
            a = np.pi * i / 6
            ca, sa = np.cos(a), np.sin(a)
            ex, ez = X - 0.004, h / 2 - 0.004
            reach = 1.0 / np.sqrt((ca / ex) ** 2 + (sa / ez) ** 2)  # on the ellipse through the box sides
            reach = reach if i in (0, 6) else 0.9 * reach
            p1 = (ca * (reach + (0.004 if i in (0, 6) else 0.0)), -Y + 0.01, zc + sa * reach)
            k.stick((0.0, -Y + 0.01, zc), p1, 0.008, 0.008, (0.0, 1.0, 0.0))
    k.cyl((-rx, rx), ry, (zc - rz, zc + rz), axis=1)
    k.cyl((-0.88 * rx, 0.88 * rx), fy, (zc - 0.88 * rz, zc + 0.88 * rz), face, "paper", axis=1)
    for i in range(12):  # hour marks
        a = np.pi * i / 6
        p0 = np.array([np.cos(a) * 0.68, np.sin(a) * 0.68])
        p1 = np.array([np.cos(a) * (0.8 if i % 3 else 0.84), np.sin(a) * (0.8 if i % 3 else 0.84)])
        k.stick(
            (p0[0] * rx, Y - 0.0045, zc + p0[1] * rz),
            (p1[0] * rx, Y - 0.0045, zc + p1[1] * rz),
            0.006,
            0.001,
            (0.0, 1.0, 0.0),
            hand_col,
            "paint",
        )
    for a, length, width in ((k.u(0, 2 * np.pi), 0.5, 0.01), (k.u(0, 2 * np.pi), 0.72, 0.006)):
        tip = (np.cos(a) * length * rx, Y - 0.003, zc + np.sin(a) * length * rz)
        k.stick((0.0, Y - 0.003, zc), tip, width, 0.002, (0.0, 1.0, 0.0), hand_col, "paint")
    k.cyl((-0.012, 0.012), (Y - 0.002, Y), (zc - 0.012, zc + 0.012), hand_col, "paint", axis=1, segments=12)


def piano(k: Kit) -> None:
    X, Y, h, d = k.X, k.Y, k.h, k.d
    cd = min(k.u(0.28, 0.34), d - 0.17)
    kz = k.u(0.66, 0.72)  # top of the white keys
    ch = 0.06  # cheek width
    k.box((-X, X), (-Y, -Y + cd), (0.0, h - 0.02))  # case
    k.box((-X, X), (-Y, -Y + cd + 0.02), (h - 0.02, h))  # lid
    for xs in ((-X, -X + ch), (X - ch, X)):
        k.box(xs, (-Y + cd, Y), (kz - 0.1, kz + 0.04))  # cheeks
        k.box(xs, (Y - 0.08, Y - 0.02), (0.05, kz - 0.1))  # front legs
        k.box(xs, (-Y + cd, Y - 0.01), (0.0, 0.05))  # toe blocks
    k.box((-X + ch, X - ch), (-Y + cd, Y - 0.01), (kz - 0.1, kz - 0.025))  # key bed
    kx = (-X + ch + 0.005, X - ch - 0.005)
    k.box(kx, (Y - 0.16, Y - 0.012), (kz - 0.025, kz), WHITE, "plastic")
    n_white = 52
    wk = (kx[1] - kx[0]) / n_white
    for i in range(n_white - 1):
        if (i % 7) in (2, 6):  # no black key between E-F and B-C (keys start at A)
            continue
        x = kx[0] + (i + 1) * wk
        k.box((x - 0.3 * wk, x + 0.3 * wk), (Y - 0.16, Y - 0.065), (kz, kz + 0.012), BLACK, "plastic")
    k.box((-X + ch, X - ch), (-Y + cd, -Y + cd + 0.03), (kz - 0.025, kz + 0.1))  # key slip / fall board
    k.box(
        (-0.3 * k.w, 0.3 * k.w),
        (-Y + cd, -Y + cd + 0.015),
        (kz + 0.16, min(kz + 0.32, h - 0.05)),
        shade(k.main, 0.85),
        k.main_mat,
    )  # music desk
    for x in (-0.05, 0.0, 0.05):
        k.box((x - 0.012, x + 0.012), (-Y + cd, -Y + cd + 0.07), (0.06, 0.075), BRASS, "metal")


def fireplace(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    hearth = hsv(0.1, 0.05, k.u(0.25, 0.45))
    k.box((-X, X), (-Y, Y), (0.0, 0.05), hearth, "ceramic")
    mantel, mantel_mat = wood(k.rng) if k.rng.random() < 0.5 else (shade(k.main, 0.95), k.main_mat)
    k.box((-X, X), (-Y, Y), (h - 0.06, h), mantel, mantel_mat)
    pw = k.u(0.14, 0.22) * k.w
    lt = k.u(0.15, 0.25)
    sy = (-Y, Y - 0.04)
    ix = (-X + 0.04 + pw, X - 0.04 - pw)
    for xs in ((-X + 0.04, ix[0]), (ix[1], X - 0.04)):
        k.box(xs, sy, (0.05, h - 0.06))
    k.box(ix, sy, (h - 0.06 - lt, h - 0.06))  # lintel
    soot = np.array([0.08, 0.07, 0.07])
    top = h - 0.06 - lt
    k.box(ix, (-Y, -Y + 0.04), (0.05, top), soot, "ceramic")  # firebox back
    for xs in ((ix[0], ix[0] + 0.01), (ix[1] - 0.01, ix[1])):
        k.box(xs, (-Y + 0.04, Y - 0.06), (0.05, top), soot, "ceramic")
    k.box((ix[0] + 0.01, ix[1] - 0.01), (-Y + 0.04, Y - 0.06), (top - 0.01, top), soot, "ceramic")
    lw = 0.38 * (ix[1] - ix[0])
    logc = hsv(0.07, 0.5, 0.3)
    for i, (x0, zlog) in enumerate(((-lw / 2 - 0.06, 0.05), (-lw / 2 + 0.06, 0.05), (-lw / 2, 0.13))):
        k.cyl(
            (x0, x0 + lw),
            (-0.06 - 0.04 * (i % 2), 0.02 - 0.04 * (i % 2)),
            (zlog, zlog + 0.08),
            logc,
            "wood",
            axis=0,
            segments=12,
        )
    k.blob((-0.15, 0.15), (-0.08, 0.02), (0.1, 0.3), np.array([1.0, 0.5, 0.12]), "ceramic", rings=4)  # glow


def radiator(k: Kit) -> None:
    X, Y, h = k.X, k.Y, k.h
    foot = 0.06
    for x in (-X + 0.08, X - 0.08):
        k.box((x - 0.02, x + 0.02), (-Y + 0.025, Y - 0.01), (0.0, foot), shade(k.main, 0.8), k.main_mat)
        k.box((x - 0.02, x + 0.02), (-Y, -Y + 0.025), (h - 0.16, h - 0.12), DARK_METAL, "metal")  # wall bracket
    n = max(6, int(k.w / 0.05))
    fw = 0.7 * k.w / n
    for i in range(n):
        x = -X + fw / 2 + i * (k.w - fw) / (n - 1)
        k.box((x - fw / 2, x + fw / 2), (-Y + 0.025, Y), (foot, h))
    cy = (-Y + 0.035, Y - 0.015)
    for z in (foot + 0.03, h - 0.07):
        k.cyl((-X + 0.002, X - 0.002), cy, (z, z + 0.04), shade(k.main, 0.95), k.main_mat, axis=0, segments=12)
    vx = X - 0.015
    k.cyl((vx - 0.015, vx + 0.015), (Y - 0.03, Y - 0.0), (h - 0.05, h), STEEL, "metal", segments=12)  # valve


# One template per category (the keys of procedural.CATEGORIES).
TEMPLATES: dict[str, Callable[[Kit], None]] = {
    "door": door,
    "window": window,
    "bed": bed,
    "sofa": sofa,
    "cabinet": cabinet,
    "shelf": shelf,
    "dresser": dresser,
    "nightstand": nightstand,
    "tv stand": tv_stand,
    "refrigerator": refrigerator,
    "oven": oven,
    "stove": stove,
    "dishwasher": dishwasher,
    "washer": washer,
    "sink": sink,
    "toilet": toilet,
    "bathtub": bathtub,
    "desk": desk,
    "piano": piano,
    "fireplace": fireplace,
    "radiator": radiator,
    "table": table,
    "coffee table": coffee_table,
    "chair": chair,
    "stool": stool,
    "lamp": lamp,
    "tv": tv,
    "monitor": monitor,
    "laptop": laptop,
    "keyboard": keyboard,
    "printer": printer,
    "microwave": microwave,
    "pillow": pillow,
    "computer tower": computer_tower,
    "plant": plant,
    "trash can": trash_can,
    "backpack": backpack,
    "suitcase": suitcase,
    "whiteboard": whiteboard,
    "picture": picture,
    "mirror": mirror,
    "clock": clock,
}

# The main (body) finish of each category.
PALETTES: dict[str, Callable[[np.random.Generator], Finish]] = {
    "door": lambda r: wood(r) if r.random() < 0.5 else painted(r),
    "window": frame_finish,
    "bed": lambda r: upholstery(r) if r.random() < 0.5 else wood(r),
    "sofa": upholstery,
    "cabinet": furniture,
    "shelf": furniture,
    "dresser": furniture,
    "nightstand": furniture,
    "tv stand": furniture,
    "refrigerator": appliance,
    "oven": appliance,
    "stove": appliance,
    "dishwasher": appliance,
    "washer": appliance,
    "sink": furniture,
    "toilet": ceramic,
    "bathtub": ceramic,
    "desk": furniture,
    "piano": piano_finish,
    "fireplace": surround,
    "radiator": radiator_paint,
    "table": furniture,
    "coffee table": furniture,
    "chair": furniture,
    "stool": furniture,
    "lamp": shade_fabric,
    "tv": tv_housing,
    "monitor": electronics,
    "laptop": electronics,
    "keyboard": electronics,
    "printer": electronics,
    "microwave": appliance,
    "pillow": lambda r: knit(r) if r.random() < 0.5 else bright_fabric(r),
    "computer tower": electronics,
    "plant": foliage,
    "trash can": plastic_any,
    "backpack": bright_fabric,
    "suitcase": plastic_any,
    "whiteboard": board_white,
    "picture": art,
    "mirror": ornament_frame,
    "clock": ornament_frame,
}

MIN_MAIN_DISTANCE = 0.15  # RGB distance aimed for between main colors of one category in a room


def template(label: str) -> Callable[[Kit], None]:
    """The template of a category; raises ``KeyError`` listing the known categories."""
    try:
        return TEMPLATES[label]
    except KeyError:
        raise KeyError(f"no furniture template for {label!r}; known: {sorted(TEMPLATES)}") from None


def draw_main(label: str, rng: np.random.Generator, avoid: Sequence[Color] = (), tries: int = 40) -> Finish:
    """A main finish for ``label`` at least :data:`MIN_MAIN_DISTANCE` (RGB) from every color in
    ``avoid`` (the same category's instances already in the room); after ``tries`` draws, the
    farthest candidate."""
    template(label)
    best, best_d = None, -1.0
    for _ in range(tries):
        cand = PALETTES[label](rng)
        dist = min((float(np.linalg.norm(cand[0] - np.asarray(a))) for a in avoid), default=np.inf)
        if dist >= MIN_MAIN_DISTANCE:
            return cand
        if dist > best_d:
            best, best_d = cand, dist
    return best


def build_object(
    mb: MeshBuilder,
    obj: SceneObject,
    rng: np.random.Generator,
    placement: str = "",
    avoid: Sequence[Color] = (),
    main: Optional[Finish] = None,
) -> Color:
    """Add ``obj``'s parts to ``mb`` (ids ``obj.object_id``) and return its main color.

    Args:
        mb: Mesh builder of the scene.
        obj: The object; its label picks the template and its box is the envelope of the parts.
        rng: Appearance generator (colors, proportions, counts).
        placement: The layout rule that placed it (``tv`` differs between ``on`` and ``mounted``).
        avoid: Main colors of the same category already used in the room.
        main: A given main finish instead of a drawn one.
    """
    build = template(obj.label)
    fin = main if main is not None else draw_main(obj.label, rng, avoid)
    build(Kit(mb, obj, rng, fin, placement))
    return np.asarray(fin[0], dtype=np.float64)

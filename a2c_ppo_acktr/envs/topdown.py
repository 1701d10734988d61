"""Top-down map of a scene: room outline, labelled object boxes, the agent's path, highlighted targets.

Drawn with matplotlib's Agg canvas directly (no pyplot, so no global figure state and no display),
returned as a ``uint8`` RGB array of ``size x size`` pixels for reports, videos and teacher prompts.

Object labels never overlap: :func:`place_labels` puts each one greedily (highlighted objects first,
then larger ones) at the first of a ring of candidate spots around its object whose text box is free,
with a leader line when it had to move, and abbreviates or drops a label only where no spot is free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.envs.renderer import Pose
from a2c_ppo_acktr.envs.scene import Scene

_HIGHLIGHT = "#d62728"
_PATH = "#1f77b4"


# The 8 directions tried around an anchor, nearest ring first: above, below, right, left, diagonals.
_DIRECTIONS = ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, 1), (1, -1), (-1, -1))


@dataclass(frozen=True)
class LabelBox:
    """An axis-aligned box in display pixels (y up), ``x0 <= x1`` and ``y0 <= y1``."""

    x0: float
    y0: float
    x1: float
    y1: float

    def intersects(self, other: "LabelBox") -> bool:
        """Whether the two boxes share interior area (touching edges do not count)."""
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    def inside(self, bounds: "LabelBox") -> bool:
        return self.x0 >= bounds.x0 and self.y0 >= bounds.y0 and self.x1 <= bounds.x1 and self.y1 <= bounds.y1

    @property
    def center(self) -> tuple[float, float]:
        return (self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2


@dataclass(frozen=True)
class PlacedLabel:
    """Where :func:`place_labels` put one label.

    Attributes:
        index: The label's index in the inputs.
        text: The variant drawn (the first that fitted), or None when the label was dropped.
        box: Its box in display pixels (None when dropped).
        displaced: Whether the box moved off its anchor (a leader line is drawn).
    """

    index: int
    text: Optional[str]
    box: Optional[LabelBox]
    displaced: bool = False


def candidate_offsets(width: float, height: float, rings: int = 4, gap: float = 2.0) -> list[tuple[float, float]]:
    """Offsets of a label's center from its anchor, in the order tried: the anchor itself, then
    ``rings`` rings of the 8 directions, ring ``k`` moved ``k * (width / 2 + gap)`` sideways and
    ``k * (height / 2 + gap)`` up or down (ring 1 puts the box just beside the anchor)."""
    offsets = [(0.0, 0.0)]
    for k in range(1, rings + 1):
        offsets += [(ux * k * (width / 2 + gap), uy * k * (height / 2 + gap)) for ux, uy in _DIRECTIONS]
    return offsets


def place_labels(
    anchors: Sequence[tuple[float, float]],
    variants: Sequence[Sequence[tuple[str, float, float]]],
    bounds: LabelBox,
    *,
    rings: int = 4,
    gap: float = 2.0,
) -> list[PlacedLabel]:
    """Greedy label placement without overlaps, in the order given (put important labels first).

    Each label tries its variants in order (full text, then shorter ones); for each variant, the
    spots of :func:`candidate_offsets` around its anchor; it takes the first spot whose box lies
    in ``bounds`` and intersects no box placed before (boxes are grown by ``gap / 2`` on every side
    for that test, so placed labels stay at least ``gap`` apart). A label with no free spot for any
    variant is dropped (``text`` None).

    Args:
        anchors: ``(x, y)`` of each label's object, display pixels, shape ``(K, 2)``.
        variants: Per label, ``(text, width, height)`` of each variant, in order of preference
            (the caller measures the text).
        bounds: Where labels may go.
        rings: Rings of candidate spots (:func:`candidate_offsets`).
        gap: Least distance between two placed boxes, pixels.

    Returns:
        One :class:`PlacedLabel` per label, in input order. Placed boxes never intersect.
    """
    if len(anchors) != len(variants):
        raise ValueError(
            f"place_labels got {len(anchors)} anchors for {len(variants)} labels; give one anchor per label"
        )
    placed: list[LabelBox] = []
    out: list[PlacedLabel] = []
    half = gap / 2
    for i, ((ax, ay), options) in enumerate(zip(anchors, variants)):
        result = PlacedLabel(i, None, None)
        for text, w, h in options:
            for dx, dy in candidate_offsets(w, h, rings, gap):
                cx, cy = ax + dx, ay + dy
                box = LabelBox(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                grown = LabelBox(box.x0 - half, box.y0 - half, box.x1 + half, box.y1 + half)
                if box.inside(bounds) and not any(grown.intersects(p) for p in placed):
                    result = PlacedLabel(i, text, box, displaced=(dx, dy) != (0.0, 0.0))
                    break
            if result.box is not None:
                break
        if result.box is not None:
            placed.append(grown)
        out.append(result)
    return out


def label_variants(label: str, object_id: int) -> list[str]:
    """A label's texts in order of preference: ``"trash can 7"``, ``"tra. 7"``, ``"7"``."""
    out = [f"{label} {object_id}"]
    if len(label) > 4:
        out.append(f"{label[:3]}. {object_id}")
    out.append(str(object_id))
    return out


def render_topdown(
    scene: Scene,
    path: Sequence[Pose] = (),
    highlight_ids: Iterable[int] = (),
    caption: Optional[str] = None,
    size: int = 512,
    show_labels: bool = True,
) -> np.ndarray:
    """Draw the scene seen from above (:func:`topdown_figure`, rasterised).

    Returns:
        ``(size, size, 3)`` uint8 RGB image.
    """
    fig, _ = topdown_figure(scene, path, highlight_ids, caption, size, show_labels)
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    img = np.ascontiguousarray(rgba[..., :3])
    if img.shape[:2] != (size, size):  # Agg rounds figure sizes to whole pixels
        img = _fit(img, size)
    return img


def topdown_figure(
    scene: Scene,
    path: Sequence[Pose] = (),
    highlight_ids: Iterable[int] = (),
    caption: Optional[str] = None,
    size: int = 512,
    show_labels: bool = True,
):
    """Draw the scene seen from above, as a matplotlib Figure on an Agg canvas.

    Args:
        scene: The scene.
        path: Agent poses in order; drawn as a polyline with a heading arrow at every pose, the
            start as a circle and the last pose as a larger arrow.
        highlight_ids: Object ids drawn in red with a thick outline (e.g. the question's targets).
        caption: Optional text above the map (question, answer, score).
        size: Output width and height in pixels.
        show_labels: Label every object (``"chair 3"``; highlighted objects are labelled anyway),
            placed without overlaps by :func:`place_labels`.

    Returns:
        ``(figure, placements)``: the Figure and one :class:`PlacedLabel` per labelled object (in
        placement order; ``index`` is the object's position in ``scene.objects``).
    """
    if size < 32:
        raise ValueError(f"topdown size={size} is too small; use >= 32 pixels")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrow, Polygon

    dpi = 100
    fig = Figure(figsize=(size / dpi, size / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.88 if caption else 0.96))
    ax.set_aspect("equal")
    ax.axis("off")
    highlight = {int(i) for i in highlight_ids}
    font = max(4.0, size / 110.0)
    labelled: list[int] = []  # indices into scene.objects

    ax.add_patch(Polygon(scene.floor_polygon, closed=True, facecolor="#f2efe6", edgecolor="black", linewidth=1.5))
    # Draw high (mounted) objects last and dashed so floor furniture stays readable.
    for k, obj in sorted(enumerate(scene.objects), key=lambda ko: (ko[1].aabb_min[2], ko[1].object_id)):
        hl = obj.object_id in highlight
        color = _object_color(scene, obj.object_id)
        ax.add_patch(
            Polygon(
                obj.footprint,
                closed=True,
                facecolor=_HIGHLIGHT if hl else color,
                alpha=0.85 if hl else 0.6,
                edgecolor=_HIGHLIGHT if hl else "#333333",
                linewidth=2.5 if hl else 0.6,
                linestyle="-" if obj.aabb_min[2] < 1.0 or hl else "--",
            )
        )
        if show_labels or hl:
            labelled.append(k)
    if len(path):
        xy = np.array([[p.x, p.y] for p in path])
        ax.plot(xy[:, 0], xy[:, 1], color=_PATH, linewidth=1.5, zorder=5)
        ax.plot(xy[0, 0], xy[0, 1], "o", color=_PATH, markersize=font, zorder=6)
        extent = float(np.ptp(scene.floor_polygon, axis=0).max())
        for i, p in enumerate(path):
            last = i == len(path) - 1
            length = extent * (0.06 if last else 0.035)
            yaw = np.deg2rad(p.yaw_deg)
            ax.add_patch(
                FancyArrow(
                    p.x,
                    p.y,
                    length * np.cos(yaw),
                    length * np.sin(yaw),
                    width=length * 0.12,
                    head_width=length * 0.45,
                    head_length=length * 0.45,
                    length_includes_head=True,
                    color="#ff7f0e" if last else _PATH,
                    zorder=7,
                )
            )
    lo = scene.floor_polygon.min(axis=0)
    hi = scene.floor_polygon.max(axis=0)
    pad = 0.03 * float((hi - lo).max()) + 0.1
    ax.set_xlim(lo[0] - pad, hi[0] + pad)
    ax.set_ylim(lo[1] - pad, hi[1] + pad)
    if caption:
        fig.text(0.5, 0.985, caption, ha="center", va="top", fontsize=font * 1.2, wrap=True)
    placements = _draw_labels(ax, canvas.get_renderer(), scene, labelled, highlight, font, dpi)
    return fig, placements


def _draw_labels(
    ax, renderer, scene: Scene, labelled: Sequence[int], highlight: set[int], font: float, dpi: int
) -> list[PlacedLabel]:
    """Measure, place (:func:`place_labels`) and draw the labels of ``scene.objects[labelled]``."""
    ax.apply_aspect()  # the equal-aspect box is final before data and pixels are related
    to_px = ax.transData
    # Targets first (never lose the question's objects), then large objects, whose labels sit best inside them.
    # Labels go under the path and its arrows (zorder 5-7): where the agent went stays visible.
    order = sorted(
        labelled,
        key=lambda k: (
            scene.objects[k].object_id not in highlight,
            -_area(scene.objects[k].footprint),
            scene.objects[k].object_id,
        ),
    )
    anchors, variants, styles = [], [], []
    # Text boxes get a light background; its padding (points) is part of the measured box.
    pad_pt = 0.15 * font
    pad_px = 2 * pad_pt * dpi / 72.0
    for k in order:
        obj = scene.objects[k]
        hl = obj.object_id in highlight
        style = dict(fontsize=font * (1.2 if hl else 1.0), weight="bold" if hl else "normal")
        measured = []
        for text in label_variants(obj.label, obj.object_id):
            probe = ax.text(0, 0, text, ha="center", va="center", **style)
            bb = probe.get_window_extent(renderer)
            probe.remove()
            measured.append((text, bb.width + pad_px, bb.height + pad_px))
        anchors.append(tuple(to_px.transform(obj.center[:2])))
        variants.append(measured)
        styles.append(style)
    bbox = ax.get_window_extent(renderer)
    placements = place_labels(anchors, variants, LabelBox(bbox.x0, bbox.y0, bbox.x1, bbox.y1))
    to_data = to_px.inverted()
    out = []
    for p, k, anchor, style in zip(placements, order, anchors, styles):
        out.append(PlacedLabel(k, p.text, p.box, p.displaced))
        if p.box is None:
            continue
        cx, cy = to_data.transform(p.box.center)
        ax.text(
            cx,
            cy,
            p.text,
            ha="center",
            va="center",
            color="black",
            clip_on=True,
            zorder=4,
            bbox=dict(
                boxstyle=f"square,pad={pad_pt / style['fontsize']:.3f}", facecolor="white", alpha=0.6, linewidth=0
            ),
            **style,
        )
        if p.displaced:
            # Leader from the object to the nearest point of its label.
            nx = min(max(anchor[0], p.box.x0), p.box.x1)
            ny = min(max(anchor[1], p.box.y0), p.box.y1)
            (ax0, ay0), (nx, ny) = to_data.transform([anchor, (nx, ny)])
            ax.plot([ax0, nx], [ay0, ny], color="#555555", linewidth=0.5, zorder=3.5)
    return out


def _area(polygon: np.ndarray) -> float:
    """Area of a simple polygon (shoelace formula)."""
    x, y = polygon[:, 0], polygon[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _object_color(scene: Scene, object_id: int) -> np.ndarray:
    """Mean color of the object's triangles (the color it has in renders)."""
    mask = scene.triangle_object_ids == object_id
    if not mask.any():
        return np.array([0.6, 0.6, 0.6])
    return scene.triangle_colors[mask].mean(axis=0).clip(0, 1)


def _fit(img: np.ndarray, size: int) -> np.ndarray:
    out = np.full((size, size, 3), 255, dtype=np.uint8)
    h, w = min(size, img.shape[0]), min(size, img.shape[1])
    out[:h, :w] = img[:h, :w]
    return out

"""Top-down map of a scene: room outline, labelled object boxes, the agent's path, highlighted targets.

Drawn with matplotlib's Agg canvas directly (no pyplot, so no global figure state and no display),
returned as a ``uint8`` RGB array of ``size x size`` pixels for reports, videos and teacher prompts.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from .renderer import Pose
from .scene import Scene

_HIGHLIGHT = "#d62728"
_PATH = "#1f77b4"


def render_topdown(
    scene: Scene,
    path: Sequence[Pose] = (),
    highlight_ids: Iterable[int] = (),
    caption: Optional[str] = None,
    size: int = 512,
    show_labels: bool = True,
) -> np.ndarray:
    """Draw the scene seen from above.

    Args:
        scene: The scene.
        path: Agent poses in order; drawn as a polyline with a heading arrow at every pose, the
            start as a circle and the last pose as a larger arrow.
        highlight_ids: Object ids drawn in red with a thick outline (e.g. the question's targets).
        caption: Optional text above the map (question, answer, score).
        size: Output width and height in pixels.
        show_labels: Write each object's label (and id) at its center.

    Returns:
        ``(size, size, 3)`` uint8 RGB image.
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

    ax.add_patch(Polygon(scene.floor_polygon, closed=True, facecolor="#f2efe6", edgecolor="black", linewidth=1.5))
    # Draw high (mounted) objects last and dashed so floor furniture stays readable.
    for obj in sorted(scene.objects, key=lambda o: (o.aabb_min[2], o.object_id)):
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
            ax.text(
                obj.center[0], obj.center[1], f"{obj.label} {obj.object_id}", fontsize=font * (1.2 if hl else 1.0),
                ha="center", va="center", color="black", weight="bold" if hl else "normal", clip_on=True,
            )
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
                    p.x, p.y, length * np.cos(yaw), length * np.sin(yaw), width=length * 0.12,
                    head_width=length * 0.45, head_length=length * 0.45, length_includes_head=True,
                    color="#ff7f0e" if last else _PATH, zorder=7,
                )
            )
    lo = scene.floor_polygon.min(axis=0)
    hi = scene.floor_polygon.max(axis=0)
    pad = 0.03 * float((hi - lo).max()) + 0.1
    ax.set_xlim(lo[0] - pad, hi[0] + pad)
    ax.set_ylim(lo[1] - pad, hi[1] + pad)
    if caption:
        fig.text(0.5, 0.985, caption, ha="center", va="top", fontsize=font * 1.2, wrap=True)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    img = np.ascontiguousarray(rgba[..., :3])
    if img.shape[:2] != (size, size):  # Agg rounds figure sizes to whole pixels
        img = _fit(img, size)
    return img


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

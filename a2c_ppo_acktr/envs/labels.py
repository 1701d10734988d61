"""Object labels drawn on observation frames (set-of-marks prompting, ``env.object_labels``).

``names`` writes each visible object's category name, ``ids`` its object id (stable across the frames
of an episode), at a pixel inside the object's visible mask, so that a policy can be trained on spatial
reasoning apart from recognition. ``none`` draws nothing.

Only objects covering at least ``min_pixels`` pixels of the frame's ``object_ids`` map get a label.
The anchor is the pixel holding the projection of the object's box centre when that pixel belongs to
the object's visible mask, else the mask's most interior pixel (largest distance to the mask's
boundary or the image border, found by iterative erosion). The text is white on a semi-opaque dark
box centred on the anchor and shifted to stay inside the image; labels are drawn far to near (depth at
the anchor), so nearer objects' labels lie on top. Everything is deterministic.

The renderer is not involved beyond :meth:`Renderer.project`: frames keep their unlabelled ``rgb``
and this module returns new images.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from a2c_ppo_acktr.envs.renderer import Frame, visible_objects
from a2c_ppo_acktr.envs.scene import Scene

MODES = ("none", "names", "ids")  # the values of EnvConfig.object_labels
BOX_RGB = (0, 0, 0)  # label background
BOX_ALPHA = 0.6  # label background opacity
TEXT_RGB = (255, 255, 255)
PAD = 1  # pixels between the text and the box edge


@dataclass(frozen=True)
class Label:
    """One label as drawn.

    Attributes:
        object_id: The labelled object.
        text: Its category name or id.
        anchor: ``(row, col)`` of a pixel of the object's visible mask; the box is centred on it
            unless shifted to stay inside the image.
        box: ``(top, left, bottom, right)`` pixel bounds of the drawn box (bottom/right exclusive);
            nothing outside the boxes changes.
    """

    object_id: int
    text: str
    anchor: tuple[int, int]
    box: tuple[int, int, int, int]


def font_size(height: int) -> int:
    """Label font size in pixels for an image ``height`` pixels high."""
    return max(8, int(height) // 20)


@functools.lru_cache(maxsize=16)
def _font(size: int) -> Any:
    return ImageFont.load_default(size)


@functools.lru_cache(maxsize=4096)
def _text_alpha(text: str, size: int) -> np.ndarray:
    """The label's text coverage (h, w) float32 in [0, 1] over its whole box: the box holds the text's
    ink bounds plus ``PAD`` on each side, with odd sides so that a box centred on a pixel is centred
    exactly. Read-only (cached)."""
    font = _font(size)
    left, top, right, bottom = font.getbbox(text)
    w = (right - left) + 2 * PAD
    h = (bottom - top) + 2 * PAD
    w += 1 - w % 2
    h += 1 - h % 2
    img = Image.new("L", (w, h), 0)
    ImageDraw.Draw(img).text(
        (PAD - left + (w - 2 * PAD - (right - left)) // 2, PAD - top + (h - 2 * PAD - (bottom - top)) // 2),
        text,
        fill=255,
        font=font,
    )
    alpha = np.asarray(img, dtype=np.float32) / 255.0
    alpha.flags.writeable = False
    return alpha


def label_text(scene: Scene, object_id: int, mode: str) -> str:
    """The text of ``object_id``'s label in ``mode`` (``names`` or ``ids``)."""
    if mode == "names":
        return scene.object(object_id).label
    if mode == "ids":
        return str(int(object_id))
    raise ValueError(f"object label mode {mode!r} has no text; choose one of {list(MODES[1:])}")


def interior_pixel(mask: np.ndarray) -> tuple[int, int]:
    """``(row, col)`` of the most interior pixel of a non-empty boolean mask.

    Erodes the mask (alternating 4- and 8-neighbour steps: an octagonal distance; the image border
    counts as boundary) until nothing is left; of the pixels that survived longest, the one nearest
    to their mean position (then the first in row-major order) is returned. Works on the mask's
    bounding box only.
    """
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        raise ValueError("interior_pixel needs a non-empty mask")
    r0, c0 = int(rows[0]), int(cols[0])
    m = np.zeros((rows[-1] - r0 + 3, cols[-1] - c0 + 3), dtype=bool)
    m[1:-1, 1:-1] = mask[r0 : rows[-1] + 1, c0 : cols[-1] + 1]
    step = 0
    while True:
        core = m[1:-1, 1:-1]
        e = core & m[:-2, 1:-1] & m[2:, 1:-1] & m[1:-1, :-2] & m[1:-1, 2:]
        if step % 2:
            e &= m[:-2, :-2] & m[:-2, 2:] & m[2:, :-2] & m[2:, 2:]
        if not e.any():
            break
        m[1:-1, 1:-1] = e
        step += 1
    rr, cc = np.nonzero(m[1:-1, 1:-1])
    d2 = (rr - rr.mean()) ** 2 + (cc - cc.mean()) ** 2
    k = int(np.argmin(d2))  # first minimum: row-major order breaks ties
    return r0 + int(rr[k]), c0 + int(cc[k])


def layout_labels(
    frame: Frame, scene: Scene, mode: str, min_pixels: int, renderer: Optional[Any] = None
) -> list[Label]:
    """The labels of ``frame`` in drawing order (far to near), without drawing them.

    Args:
        frame: A rendered frame (its ``object_ids`` decide visibility and masks).
        scene: The scene it shows (for the category names and the box centres).
        mode: ``none`` (no labels), ``names`` or ``ids``.
        min_pixels: Pixels an object must cover in this frame to be labelled.
        renderer: Anything with ``project(pose, points) -> (uv, depth)`` (the frame's
            :class:`~a2c_ppo_acktr.envs.renderer.Renderer`); without it (or without ``frame.pose``)
            every anchor is the mask's most interior pixel.
    """
    if mode not in MODES:
        raise ValueError(f"object label mode {mode!r} is not one of {list(MODES)}")
    if mode == "none":
        return []
    ids_map = frame.object_ids
    height, width = ids_map.shape
    visible = visible_objects(frame, int(min_pixels))
    if not visible:
        return []
    projected: dict[int, tuple[int, int]] = {}
    if renderer is not None and frame.pose is not None:
        centers = np.stack([np.asarray(scene.object(i).center, dtype=np.float64) for i in visible])
        uv, z = renderer.project(frame.pose, centers)
        for i, (u, v), depth in zip(visible, uv, z):
            if depth > 0 and np.isfinite(u) and np.isfinite(v) and 0 <= u < width and 0 <= v < height:
                projected[i] = (int(v), int(u))  # the pixel holding the projection (centres at +0.5)
    size = font_size(height)
    labels = []
    keys = []
    for i in visible:
        mask = ids_map == i
        p = projected.get(i)
        anchor = p if p is not None and mask[p] else interior_pixel(mask)
        text = label_text(scene, i, mode)
        h, w = _text_alpha(text, size).shape
        top = min(max(anchor[0] - h // 2, 0), max(height - h, 0))
        left = min(max(anchor[1] - w // 2, 0), max(width - w, 0))
        labels.append(Label(i, text, anchor, (top, left, min(top + h, height), min(left + w, width))))
        depth = float(frame.depth[anchor]) if frame.depth is not None else 0.0
        keys.append((-depth if np.isfinite(depth) else -np.inf, i))
    order = sorted(range(len(labels)), key=lambda k: keys[k])
    return [labels[k] for k in order]


def draw_labels(frame: Frame, scene: Scene, mode: str, min_pixels: int, renderer: Optional[Any] = None) -> np.ndarray:
    """``frame.rgb`` with a label on each visible object (see the module docstring).

    Args:
        frame: The rendered frame; not modified.
        scene: The scene it shows.
        mode: ``none``, ``names`` or ``ids``.
        min_pixels: Pixels an object must cover in this frame to be labelled.
        renderer: Projects the objects' box centres (see :func:`layout_labels`).

    Returns:
        A new (H, W, 3) uint8 image; a plain copy of ``frame.rgb`` for ``none`` or when no object is
        visible.
    """
    labels = layout_labels(frame, scene, mode, min_pixels, renderer)
    out = np.array(frame.rgb, dtype=np.uint8, copy=True)
    if not labels:
        return out
    size = font_size(out.shape[0])
    box = np.asarray(BOX_RGB, dtype=np.float32)
    ink = np.asarray(TEXT_RGB, dtype=np.float32)
    for lab in labels:
        top, left, bottom, right = lab.box
        alpha = _text_alpha(lab.text, size)[: bottom - top, : right - left, None]
        region = out[top:bottom, left:right].astype(np.float32)
        region = region * (1.0 - BOX_ALPHA) + box * BOX_ALPHA  # the dark box
        region = region * (1.0 - alpha) + ink * alpha  # the text, anti-aliased
        out[top:bottom, left:right] = (region + 0.5).astype(np.uint8)
    return out

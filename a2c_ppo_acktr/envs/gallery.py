"""Contact sheets of the procedural furniture and rooms, for eyeballing what the agent sees.

``python -m a2c_ppo_acktr.envs.gallery --out DIR`` writes

* ``categories.png``: every category of :data:`procedural.CATEGORIES` alone on an empty floor, at the
  middle of its size ranges, from two viewpoints (front-left-above and back-right), the name under
  each pair of tiles;
* ``rooms.png``: random procedural rooms, one row each: a 360-degree sweep of 8 frames from a free
  pose, labelled with the scene id and theme.

Options: ``--size`` (tile side in pixels, default 224), ``--seed`` (which rooms and looks),
``--look shaded|flat`` (handed to the renderer when it takes a ``look`` argument), ``--categories``
(a subset), ``--rooms`` (how many rooms, default 6). ``--out`` may hold other files: the two sheets are
refused where they already are, and ``--overwrite`` moves the old ones to ``NAME.old-<time>`` first
(nothing is deleted).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Optional, Sequence

import numpy as np

from a2c_ppo_acktr.envs.furniture import build_object
from a2c_ppo_acktr.envs.navigation import sample_free_pose
from a2c_ppo_acktr.envs.procedural import CATEGORIES, make_procedural_scene
from a2c_ppo_acktr.envs.renderer import Camera, Pose, Renderer
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject

VIEWS = {
    "front-left": (35.0, 25.0),
    "back-right": (215.0, 20.0),
}  # (azimuth from the front toward -x, elevation) in degrees
LABEL_H = 16  # pixels of the text strip under a tile row


def _renderer(scene: Scene, camera: Camera, look: Optional[str]) -> Renderer:
    """A renderer, passing ``look`` only to a renderer that accepts it."""
    if look is not None and "look" in inspect.signature(Renderer.__init__).parameters:
        return Renderer(scene, camera, look=look)
    return Renderer(scene, camera)


def category_scene(
    label: str, size: Optional[Sequence[float]] = None, variant: int = 0, look_seed: int = 0, floor: float = 4.0
) -> tuple[Scene, SceneObject]:
    """A scene with one ``label`` object (id 0, yaw 0, front toward +y) standing at the origin on a
    ``2 floor`` x ``2 floor`` m floor (no walls); ``size`` defaults to the middle of the variant's ranges."""
    v = CATEGORIES[label][variant]
    if size is None:
        size = [sum(v.width) / 2, sum(v.depth) / 2, sum(v.height) / 2]
    size = np.asarray(size, dtype=np.float64)
    obj = SceneObject.upright(0, label, (0.0, 0.0, size[2] / 2), size, 0.0)
    mb = MeshBuilder()
    poly = np.array([[-floor, -floor], [floor, -floor], [floor, floor], [-floor, floor]])
    mb.add_flat_polygon(poly, 0.0, (0.55, 0.55, 0.55), material="parquet")
    build_object(mb, obj, np.random.default_rng([look_seed, 11]), v.placement)
    vtx, tri, col, ids = mb.build()
    scene = Scene(
        f"alone_{label}", "procedural", vtx, tri, col, ids, [obj], poly, 3.0, triangle_materials=mb.triangle_materials()
    )
    return scene, obj


def orbit_camera(
    obj: SceneObject, azimuth_deg: float, elevation_deg: float, size: int, fov_deg: float = 50.0, margin: float = 1.08
) -> tuple[Camera, Pose]:
    """Camera and pose looking at ``obj``'s center from ``azimuth_deg`` (0 = in front of it, on its
    +y side; positive turns toward its -x side) and ``elevation_deg`` above, far enough that its
    bounding sphere fits the view."""
    radius = float(np.linalg.norm(obj.extent)) / 2.0
    dist = margin * radius / np.sin(np.deg2rad(fov_deg) / 2.0)
    a, e = np.deg2rad(azimuth_deg), np.deg2rad(elevation_deg)
    local = np.array([-np.sin(a), np.cos(a), 0.0]) * np.cos(e)  # horizontal direction object -> camera
    horiz = obj.rotation @ local
    pos = obj.center + dist * (horiz + np.array([0.0, 0.0, np.sin(e)]))
    yaw = float(np.degrees(np.arctan2(-horiz[1], -horiz[0])))
    camera = Camera(width=size, height=size, fov_deg=fov_deg, eye_height=float(pos[2]), pitch_deg=float(elevation_deg))
    return camera, Pose(float(pos[0]), float(pos[1]), yaw)


def render_alone(label: str, view: str, size: int, look: Optional[str] = None, look_seed: int = 0):
    """One category alone from a named view (see :data:`VIEWS`); returns the renderer's frame."""
    scene, obj = category_scene(label, look_seed=look_seed)
    camera, pose = orbit_camera(obj, *VIEWS[view], size)
    return _renderer(scene, camera, look).render(pose)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=max(8, size))
    except TypeError:  # Pillow < 10.1 has one fixed-size default font
        return ImageFont.load_default()


def categories_sheet(labels: Sequence[str], size: int, look: Optional[str], seed: int, per_row: int = 6):
    """Contact sheet (PIL image) of each label from the two views, the name under each pair."""
    from PIL import Image, ImageDraw

    rows = (len(labels) + per_row - 1) // per_row
    cols = min(per_row, len(labels))
    sheet = Image.new("RGB", (cols * 2 * size, rows * (size + LABEL_H)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    font = _font(LABEL_H - 4)
    for i, label in enumerate(labels):
        r, c = divmod(i, per_row)
        x0, y0 = c * 2 * size, r * (size + LABEL_H)
        for j, view in enumerate(VIEWS):
            frame = render_alone(label, view, size, look, look_seed=seed)
            sheet.paste(Image.fromarray(frame.rgb), (x0 + j * size, y0))
        draw.text((x0 + 4, y0 + size + 1), label, fill=(0, 0, 0), font=font)
    return sheet


def rooms_sheet(num_rooms: int, size: int, look: Optional[str], seed: int, frames: int = 8):
    """Contact sheet (PIL image): per room a row of ``frames`` views turning 360 degrees."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    sheet = Image.new("RGB", (frames * size, num_rooms * (size + LABEL_H)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    font = _font(LABEL_H - 4)
    for r in range(num_rooms):
        room_seed = int(rng.integers(0, 1_000_000))
        scene = make_procedural_scene(room_seed)
        start = sample_free_pose(scene, rng, 0.2)
        camera = Camera(width=size, height=size, fov_deg=90.0, eye_height=1.5, pitch_deg=10.0)
        poses = [Pose(start.x, start.y, start.yaw_deg + 360.0 * k / frames) for k in range(frames)]
        for k, frame in enumerate(_renderer(scene, camera, look).render_many(poses)):
            sheet.paste(Image.fromarray(frame.rgb), (k * size, r * (size + LABEL_H)))
        text = (
            f"{scene.scene_id}  {getattr(scene, 'theme', '')}  {len(scene.objects)} objects  {scene.num_triangles} "
            "triangles"
        )
        draw.text((4, r * (size + LABEL_H) + size + 1), text, fill=(0, 0, 0), font=font)
    return sheet


# Bounds of the sheets' inputs: the largest sheet (every category x 4 views at MAX_TILE) stays a few
# hundred megabytes, where --size 100000 asked for tens of gigabytes.
MIN_TILE, MAX_TILE, MAX_ROOMS = 16, 1024, 64


SHEETS = ("categories.png", "rooms.png")


def main(argv: Optional[Sequence[str]] = None) -> dict[str, str]:
    """Command line entry; returns ``{"categories": path, "rooms": path}``."""
    from a2c_ppo_acktr.common.atomic import open_atomic
    from a2c_ppo_acktr.run.rundir import check_output_path, claim_output_files, directory_lock

    parser = argparse.ArgumentParser(prog="python -m a2c_ppo_acktr.envs.gallery", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--size", type=int, default=224, help="tile side in pixels")
    parser.add_argument("--seed", type=int, default=0, help="picks the rooms and the furniture looks")
    parser.add_argument(
        "--look", choices=("shaded", "flat"), default=None, help="renderer look (when the renderer supports it)"
    )
    parser.add_argument("--categories", nargs="*", default=None, help="subset of categories (default: all)")
    parser.add_argument("--rooms", type=int, default=6, help="number of rooms")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="move sheets already in --out aside to NAME.old-<time> (nothing is deleted)",
    )
    args = parser.parse_args(argv)
    labels = list(CATEGORIES) if args.categories is None else list(args.categories)
    unknown = [lab for lab in labels if lab not in CATEGORIES]
    if unknown:
        parser.error(f"unknown categories {unknown}; known: {sorted(CATEGORIES)}")
    if not labels:
        parser.error("--categories names no category; name at least one, or leave the flag out for all of them")
    if not MIN_TILE <= args.size <= MAX_TILE:
        parser.error(f"--size={args.size} must be in [{MIN_TILE}, {MAX_TILE}] pixels (a sheet holds dozens of tiles)")
    if not 1 <= args.rooms <= MAX_ROOMS:
        parser.error(f"--rooms={args.rooms} must be in [1, {MAX_ROOMS}]")
    with directory_lock(check_output_path(args.out)):
        folder = claim_output_files(args.out, SHEETS, overwrite=args.overwrite)
        out = {"categories": str(folder / "categories.png"), "rooms": str(folder / "rooms.png")}
        with open_atomic(out["categories"], "wb") as f:
            categories_sheet(labels, args.size, args.look, args.seed).save(f, format="PNG")
        print(
            f"categories.png: {len(labels)} categories x {len(VIEWS)} views at {args.size}px -> {out['categories']}",
            flush=True,
        )
        with open_atomic(out["rooms"], "wb") as f:
            rooms_sheet(args.rooms, args.size, args.look, args.seed).save(f, format="PNG")
        print(f"rooms.png: {args.rooms} rooms x 8 frames at {args.size}px -> {out['rooms']}", flush=True)
    return out


if __name__ == "__main__":
    import sys

    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "python -m a2c_ppo_acktr.envs.gallery"))

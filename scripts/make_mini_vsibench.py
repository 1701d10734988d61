#!/usr/bin/env python
"""Build a mini VSI-Bench from procedural rooms: walk-through videos, rows in the official schema,
and each room as an ARKitScenes 3DOD scan, so both evaluation protocols run offline on it.

Usage (from the repository root)::

    python scripts/make_mini_vsibench.py --out outputs/mini_vsibench [--scenes 4] [--seed 0] [--frames 32] [--size 128]

Writes under ``--out``:

* ``arkitscenes/<scene>.mp4``: the room's walk-through video, laid out as the benchmark ships its videos
  (``<dataset>/<scene_name>.mp4``) for ``eval_vsi.py --protocol video --video-root OUT``;
* ``test.parquet``: the questions, one row each, in the official schema (``id``, ``dataset``,
  ``scene_name``, ``question_type``, ``question``, ``options``, ``ground_truth``), checked with the
  package's own row validation (``envs/vsibench.py``);
* ``scans/arkitscenes/<scene>/<scene>_3dod_mesh.ply`` and ``<scene>_3dod_annotation.json``: the room
  as an ARKitScenes 3DOD scan (mesh with vertex colours, oriented boxes), for the interactive protocol
  (``eval_vsi.py --vsibench OUT/test.parquet --data-root OUT/scans``). The scan keeps geometry and
  colours, not the procedural materials, so the interactive renders look plainer than the video;
* ``manifest.json``: what was built (seeds, camera path, frame rate, exact values behind each answer).

The dataset is named ``arkitscenes`` because the row loader accepts only the benchmark's three dataset
names (``envs/vsibench.py``, ``DATASETS``); the scene names (``proc_<seed>``) say the rooms are procedural.

Camera path (``envs/navigation.walkthrough_poses``): from a free start pose (``envs/navigation.sample_free_pose``), a
360-degree turn in place
over the first half of the frames, then a walk for the rest: each frame turns up to 30 degrees toward a
waypoint and steps 0.3 m forward (``envs/navigation.try_move``, collision-checked); a blocked step turns
90 degrees left instead, and a reached waypoint is replaced by a new free point.

Questions: every one of the 10 raw types is asked in each room where the room supports it (up to
``--per-type`` per room), by the package's question generator (``envs/questions.generate_question``),
so ground truths come from the scene geometry exactly as in the env. Appearance order uses the first
appearance of each object over the video's own frames (``envs/questions.appearance_from_frames`` on the
rendered object-id maps of all frames, with the env's ``appearance_min_fraction``).

Frame rate: 2 frames per second by default, the rate at which qwen-vl-utils (and lmms-eval's Qwen
wrappers on top of it) read videos, so with an even ``--frames`` that reader keeps every frame and all
the frame samplers of ``a2c_ppo_acktr/eval/video_protocol.py`` pick the same frames.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common.errors import UserError

logger = logging.getLogger("make_mini_vsibench")

DATASET = "arkitscenes"
DEFAULT_FPS = 2.0


def camera_path(scene: Any, rng: np.random.Generator, num_frames: int, radius: float) -> list:
    """Poses of the walk-through video: :func:`a2c_ppo_acktr.envs.navigation.walkthrough_poses` (a
    360-degree turn in place over half the frames, then a collision-checked walk), the path the env's
    ``video_qa`` mode renders too."""
    from a2c_ppo_acktr.envs.navigation import walkthrough_poses

    return walkthrough_poses(scene, rng, num_frames, radius)


def encode_video(frames: Sequence[np.ndarray], path: Path, fps: float) -> str:
    """Write RGB frames (H, W, 3 uint8, even sides) to an mp4 with PyAV; returns the codec used.

    libx264 (yuv420p, crf 18) when the installed PyAV wheel has it, else FFmpeg's own ``mpeg4``.
    """
    import av
    from fractions import Fraction

    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    height, width = frames[0].shape[:2]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"crf": "18"}
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():  # flush the encoder
            container.mux(packet)
    return codec


def write_arkit_scan(scene: Any, scan_dir: Path) -> None:
    """Write ``scene`` as an ARKitScenes 3DOD scan (the layout ``envs/real_scans.py`` loads).

    The mesh gets one vertex per triangle corner so that each triangle keeps its own colour; each
    object's box is written as ``obbAligned`` with ``normalizedAxes`` holding the box axes as rows
    (the loader takes its transpose as the rotation).
    """
    import open3d as o3d

    scan_dir.mkdir(parents=True, exist_ok=True)
    corners = scene.vertices[scene.triangles].reshape(-1, 3).astype(np.float64)
    mesh = o3d.geometry.TriangleMesh(
        o3d.utility.Vector3dVector(corners), o3d.utility.Vector3iVector(np.arange(len(corners)).reshape(-1, 3))
    )
    mesh.vertex_colors = o3d.utility.Vector3dVector(np.repeat(scene.triangle_colors.astype(np.float64), 3, axis=0))
    ply = scan_dir / f"{scene.scene_id}_3dod_mesh.ply"
    if not o3d.io.write_triangle_mesh(str(ply), mesh, write_ascii=False, compressed=False):
        raise OSError(f"open3d could not write {ply}")
    data = [
        {
            "label": o.label,
            "segments": {
                "obbAligned": {
                    "centroid": np.asarray(o.center, dtype=float).tolist(),
                    "axesLengths": np.asarray(o.extent, dtype=float).tolist(),
                    "normalizedAxes": np.asarray(o.rotation, dtype=float).T.reshape(-1).tolist(),
                }
            },
        }
        for o in scene.objects
    ]
    (scan_dir / f"{scene.scene_id}_3dod_annotation.json").write_text(json.dumps({"data": data}), encoding="utf-8")


def build_scene(seed: int, num_frames: int, size: int, per_type: int, fps: float, out: Path) -> tuple[list[dict], dict]:
    """Render one procedural room's video, write its scan and ask its questions.

    Returns:
        ``(rows without ids, manifest entry)``.
    """
    from a2c_ppo_acktr.config.arguments import EnvConfig
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene
    from a2c_ppo_acktr.envs.questions import QuestionUnavailable, appearance_from_frames, generate_question
    from a2c_ppo_acktr.envs.renderer import Renderer
    from a2c_ppo_acktr.common.scoring import TASKS

    env_cfg = EnvConfig(image_size=size)
    rng = np.random.default_rng(seed)
    scene = make_procedural_scene(seed, env_cfg.procedural_min_room, env_cfg.procedural_max_room)
    poses = camera_path(scene, rng, num_frames, env_cfg.agent_radius)
    frames = Renderer.for_env(scene, env_cfg).render_many(poses)
    video = out / DATASET / f"{scene.scene_id}.mp4"
    codec = encode_video([f.rgb for f in frames], video, fps)
    write_arkit_scan(scene, out / "scans" / DATASET / scene.scene_id)
    min_pixels = max(1, int(round(env_cfg.appearance_min_fraction * size * size)))  # the env's rule (vsi_env.py)
    order, first_frames = appearance_from_frames([f.object_ids for f in frames], min_pixels)
    rows: list[dict] = []
    questions: list[dict] = []
    unavailable: dict[str, str] = {}
    for qtype in TASKS:
        asked: set[str] = set()
        for _ in range(per_type):
            try:
                q = generate_question(
                    scene, qtype, rng, start_pose=poses[0], appearance_order=order, appearance_frames=first_frames
                )
            except QuestionUnavailable as e:
                unavailable[qtype] = str(e)
                break
            if q.question in asked:
                continue
            asked.add(q.question)
            rows.append(
                {
                    "dataset": DATASET,
                    "scene_name": scene.scene_id,
                    "question_type": q.question_type,
                    "question": q.question,
                    "options": list(q.options) if q.options else None,
                    "ground_truth": q.ground_truth,
                }
            )
            questions.append({"question_type": q.question_type, "question": q.question, "meta": _jsonable(q.meta)})
    entry = {
        "scene_name": scene.scene_id,
        "seed": seed,
        "theme": getattr(scene, "theme", None),
        "video": str(video.relative_to(out)),
        "codec": codec,
        "fps": fps,
        "frames": num_frames,
        "size": size,
        "poses": [[p.x, p.y, p.yaw_deg] for p in poses],
        "appearance_order": {"object_ids": order, "frames": first_frames},
        "questions": questions,
        "unavailable_types": unavailable,
    }
    return rows, entry


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


class MiniBenchError(ValueError, UserError):
    """A setting the mini benchmark cannot be built with; the message says what to change."""


def make_mini_vsibench(
    out: str | Path,
    scenes: int = 4,
    seed: int = 0,
    frames: int = 32,
    size: int = 128,
    per_type: int = 1,
    fps: float = DEFAULT_FPS,
    overwrite: bool = False,
) -> Path:
    """Build the mini benchmark (see the module docstring); returns the rows file ``OUT/test.parquet``.

    The whole tree is built in a temporary sibling of ``out`` and renamed into place at the end: a
    failure leaves nothing behind, and an ``out`` that already holds files is refused, or with
    ``overwrite`` moved aside to ``OUT.old-<time>`` (nothing is deleted).

    Raises:
        MiniBenchError: On bad sizes, or when the rooms together do not support all 10 question types
            (the message names the missing types and suggests more ``--scenes`` or another ``--seed``).
        ConfigError: ``out`` holds files (without ``overwrite``), or is held by another process.
    """
    from a2c_ppo_acktr.run.rundir import check_output_path, claim_output_dir, directory_lock, staged_output_dir

    if scenes < 1:
        raise MiniBenchError(f"--scenes={scenes} must be >= 1")
    if frames < 4:
        raise MiniBenchError(f"--frames={frames} must be >= 4 (half of them turn in place, half walk)")
    if size < 16 or size % 2:
        raise MiniBenchError(f"--size={size} must be an even number >= 16 (yuv420p video needs even sides)")
    if per_type < 1:
        raise MiniBenchError(f"--per-type={per_type} must be >= 1")
    if not fps > 0:
        raise MiniBenchError(f"--fps={fps} must be > 0")
    target = check_output_path(out)
    with directory_lock(target):
        if not overwrite:  # refused now, not after minutes of rendering
            claim_output_dir(out, overwrite=False, create=False)
        with staged_output_dir(out, target, overwrite=overwrite) as tmp:
            _build(tmp, scenes, seed, frames, size, per_type, fps)
    return target / "test.parquet"


def _build(out: Path, scenes: int, seed: int, frames: int, size: int, per_type: int, fps: float) -> None:
    """Write the benchmark's files into the (new, empty) directory ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows, validate_row
    from a2c_ppo_acktr.common.scoring import TASKS

    rows: list[dict] = []
    manifest: dict[str, Any] = {
        "seed": seed,
        "scenes": [],
        "frames": frames,
        "size": size,
        "fps": fps,
        "dataset": DATASET,
    }
    for k in range(scenes):
        scene_rows, entry = build_scene(seed + k, frames, size, per_type, fps, out)
        rows += scene_rows
        manifest["scenes"].append(entry)
        logger.info("scene %s: %d questions, video %s", entry["scene_name"], len(scene_rows), entry["video"])
    missing = [t for t in TASKS if not any(r["question_type"] == t for r in rows)]
    if missing:
        raise MiniBenchError(
            f"the {scenes} room(s) from seed {seed} support no question of types {missing}; "
            "use more --scenes or another --seed"
        )
    rows = [validate_row({"id": i, **r}, where=f"generated row {i}") for i, r in enumerate(rows)]
    path = out / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    load_vsibench_rows(path)  # read back through the loader the evaluations use
    manifest["num_rows"] = len(rows)
    manifest["counts"] = {t: sum(r["question_type"] == t for r in rows) for t in TASKS}
    (out / "manifest.json").write_text(json.dumps(_jsonable(manifest), indent=1), encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out", required=True, help="output directory (new; one that holds files is refused unless --overwrite)"
    )
    p.add_argument("--scenes", type=int, default=4, help="procedural rooms (seeds SEED, SEED+1, ...)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first room")
    p.add_argument("--frames", type=int, default=32, help="video frames per room")
    p.add_argument("--size", type=int, default=128, help="frame width and height in pixels (even)")
    p.add_argument(
        "--per-type", type=int, default=1, help="questions per type and room (where the room supports the type)"
    )
    p.add_argument(
        "--fps", type=float, default=DEFAULT_FPS, help="video frame rate (2: qwen-vl-utils reads every frame)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="move an --out that holds files aside to OUT.old-<time> (nothing is deleted)",
    )
    args = p.parse_args(argv)
    path = make_mini_vsibench(
        args.out, args.scenes, args.seed, args.frames, args.size, args.per_type, args.fps, overwrite=args.overwrite
    )
    manifest = json.loads((path.parent / "manifest.json").read_text(encoding="utf-8"))
    print(f"{manifest['num_rows']} questions over {len(manifest['scenes'])} rooms: {path}")
    print("per type: " + ", ".join(f"{t} {n}" for t, n in manifest["counts"].items()))
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "make_mini_vsibench.py"))

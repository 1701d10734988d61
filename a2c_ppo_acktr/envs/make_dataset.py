"""Build a training set from real scans: questions of VSI-Bench's types with exact ground truth, as rows.

    python -m a2c_ppo_acktr.envs.make_dataset --scannet ROOT --arkitscenes ROOT [--scannetpp ROOT] --out DIR
        [--exclude VSIBENCH_PARQUET ...] [--questions-per-scene N] [--seed S] [--video-root VIDEOS]
        [--preset P] [--config C] [--env.KEY VALUE ...] [--overwrite] [--no-progress]

Every scan found under the dataset roots (by the files :data:`~.real_scans.SCAN_MARKERS` names) is
loaded as the env loads it (:func:`~.real_scans.find_scene`: labels mapped to the benchmark's
categories, boxes, floor, occupancy) and asked ``--questions-per-scene`` questions by the env's own
generator (:func:`~.questions.generate_question`), the types of ``env.question_types`` in turn, each
from a free start pose drawn for it. A scan that cannot support a type is asked the other types; an
``obj_appearance_order`` question reads the order from the env's sweep at its start pose, rendered
with the config's camera and sweep settings (``--preset``, ``--env.*``: use the training run's).

A scene named in any ``--exclude`` file (VSI-Bench's test parquet: its 288 scenes) is refused, one
log line naming the scene and the file, so the set never trains on the benchmark's scans; so is every
other ScanNet scan of a test scene's room (``scene0011_01`` beside ``scene0011_00``). A scan that fails
to load is skipped with its one-line reason. Both lists are in the manifest.

Writes under ``--out`` (a used directory is refused; ``--overwrite`` moves it aside, nothing is
deleted):

* ``train.parquet``: one row per question with the benchmark's fields (``id``, ``dataset``,
  ``scene_name``, ``question_type``, ``question``, ``options``, ``ground_truth``; ``envs/vsibench.py``
  reads them) and the training fields (``start_pose``, ``object_ids``, ``sweep``, ``video``: see
  :mod:`~.vsibench`). ``video`` is ``<dataset>/<scene_name>.mp4``, the benchmark's layout, when that
  file exists under ``--video-root``, else null; no frames are written (the env renders them);
* ``manifest.json``: the data root, the roots, the refused and skipped scenes, per-scene and per-type
  counts, the sweep settings and the seed.

Training reads the set with ``--env.scene_source parquet --env.vsibench_path OUT/train.parquet
--env.data_root DATA``, where ``DATA`` is the directory holding every root (printed at the end, and
``data_root`` in the manifest): the env finds each row's scan there as ``find_scene`` does. The same
seed and inputs give the same file.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.config.arguments import ConfigError, EnvConfig

logger = logging.getLogger(__name__)

DATASET_FLAGS = {"scannet": "--scannet", "arkitscenes": "--arkitscenes", "scannetpp": "--scannetpp"}
ROWS_FILE = "train.parquet"
MANIFEST_FILE = "manifest.json"
APPEARANCE_TRIES = 3  # start poses tried for an appearance-order question before the type is dropped in a scan
TRIES_PER_QUESTION = 4  # draws per wanted question before a scan gives up (duplicates, unavailable types)


def room_of(dataset: str, scene_name: str) -> str:
    """The room a scan shows: ScanNet scans the same room several times (``scene0011_00``,
    ``scene0011_01``), and a rescan of a test room is as good as the test scan itself."""
    match = re.fullmatch(r"(scene\d{4})_\d{2}", scene_name) if dataset == "scannet" else None
    return f"{dataset}/{match.group(1) if match else scene_name}"


def benchmark_rooms(parquets: Sequence[str | Path]) -> dict[str, tuple[str, str]]:
    """Room (:func:`room_of`) -> (a scene of it, the first of ``parquets`` naming it), over VSI-Bench row files."""
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

    rooms: dict[str, tuple[str, str]] = {}
    for path in parquets:
        for row in load_vsibench_rows(path):
            rooms.setdefault(room_of(row["dataset"], row["scene_name"]), (row["scene_name"], str(path)))
    return rooms


def data_root_of(roots: Mapping[str, str | Path]) -> Path:
    """The deepest directory holding every root: what training reads as ``env.data_root``."""
    resolved = [str(Path(r).resolve()) for r in roots.values()]
    return Path(os.path.commonpath(resolved))


def scene_questions(
    scene: Any, env: EnvConfig, rng: np.random.Generator, count: int
) -> tuple[list[dict], dict[str, str]]:
    """Up to ``count`` distinct questions about ``scene``, the types of ``env.question_types`` in turn.

    Returns:
        ``(rows without id, dataset or video; unavailable type -> reason)``.
    """
    from a2c_ppo_acktr.envs.navigation import sample_free_pose
    from a2c_ppo_acktr.envs.questions import QuestionUnavailable, appearance_from_frames, generate_question
    from a2c_ppo_acktr.envs.renderer import Renderer
    from a2c_ppo_acktr.envs.vsi_env import appearance_min_pixels, sweep_poses, sweep_settings
    from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError, validate_row

    types = list(env.question_types)
    unavailable: dict[str, str] = {}
    appearance_misses = 0
    renderer: Optional[Renderer] = None
    rows: list[dict] = []
    seen: set[tuple] = set()
    for draw in range(count * TRIES_PER_QUESTION):
        if len(rows) >= count or len(unavailable) == len(types):
            break
        qtype = types[draw % len(types)]
        if qtype in unavailable:
            continue
        pose = sample_free_pose(scene, rng, env.agent_radius)
        order = frames = sweep = None
        if qtype == "obj_appearance_order":
            renderer = renderer or Renderer.for_env(scene, env)
            rendered = renderer.render_many(sweep_poses(pose, env.num_sweep_frames))
            order, frames = appearance_from_frames([f.object_ids for f in rendered], appearance_min_pixels(env))
            sweep = sweep_settings(env)
        try:
            q = generate_question(scene, qtype, rng, start_pose=pose, appearance_order=order, appearance_frames=frames)
        except QuestionUnavailable as e:
            # Appearance order depends on the start pose: a few poses are tried before giving up on it.
            appearance_misses += qtype == "obj_appearance_order"
            if qtype != "obj_appearance_order" or appearance_misses >= APPEARANCE_TRIES:
                unavailable[qtype] = str(e)
            continue
        key = (q.question_type, q.question, tuple(q.options or ()))
        if key in seen:
            continue
        row = {
            "dataset": scene.dataset,
            "scene_name": scene.scene_id,
            "question_type": q.question_type,
            "question": q.question,
            "options": list(q.options) if q.options else None,
            "ground_truth": q.ground_truth,
            "start_pose": [pose.x, pose.y, pose.yaw_deg],
            "object_ids": [int(i) for i in q.object_ids],
            "sweep": sweep,
        }
        try:
            validate_row({"id": 0, **row})
        except VSIBenchRowError as e:  # e.g. a 4 mm object whose size rounds to 0 cm: MRA cannot score it
            logger.info("%s scene %s: a %s question left out (%s)", scene.dataset, scene.scene_id, qtype, e)
            continue
        seen.add(key)
        rows.append(row)
    return rows, unavailable


def build_dataset(
    roots: Mapping[str, str | Path],
    out: str | Path,
    *,
    env: Optional[EnvConfig] = None,
    exclude: Sequence[str | Path] = (),
    questions_per_scene: int = 20,
    seed: int = 0,
    video_root: Optional[str | Path] = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Build the training set (see the module docstring) and return the path of its rows file.

    Args:
        roots: Dataset (``scannet``, ``arkitscenes``, ``scannetpp``) -> directory of its scans.
        out: Output directory.
        env: The env config whose question types, camera and sweep the questions are made for
            (default: the defaults).
        exclude: VSI-Bench row files whose scenes are refused.
        questions_per_scene: Questions asked per scan (fewer where a scan supports fewer).
        seed: Seed of every draw (each scan's draws depend on the seed and the scan's name only).
        video_root: Directory of videos in the benchmark's layout (``<dataset>/<scene_name>.mp4``).
        overwrite: Move a used ``out`` aside first.
        progress: Show a progress bar over the scans.

    Raises:
        ConfigError: No root, an unknown dataset, a bad count, a used ``out``, roots that training
            cannot read from one data root, or no question at all.
        FileNotFoundError: A root, an exclude file or the video root that does not exist, or a root
            without scans.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    from a2c_ppo_acktr.common.atomic import open_atomic, write_json
    from a2c_ppo_acktr.common.safe_paths import contained
    from a2c_ppo_acktr.common.scoring import TASKS
    from a2c_ppo_acktr.envs.real_scans import SceneLoadError, find_scan_names, find_scene, scene_candidates
    from a2c_ppo_acktr.envs.vsi_env import sweep_settings
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows, validate_row
    from a2c_ppo_acktr.run.rundir import claim_output_dir

    env = env if env is not None else EnvConfig()
    if not roots:
        raise ConfigError(f"no scans to build from: pass at least one of {', '.join(DATASET_FLAGS.values())}")
    for dataset, root in roots.items():
        if dataset not in DATASET_FLAGS:
            raise ConfigError(f"unknown dataset {dataset!r}; known: {list(DATASET_FLAGS)}")
        if not Path(root).is_dir():
            raise FileNotFoundError(f"{DATASET_FLAGS[dataset]} {root}: not a directory")
    if questions_per_scene < 1:
        raise ConfigError(f"--questions-per-scene={questions_per_scene} must be >= 1")
    if video_root is not None and not Path(video_root).is_dir():
        raise FileNotFoundError(f"--video-root {video_root}: not a directory")
    inputs = [*roots.values(), *exclude, *([video_root] if video_root is not None else [])]
    # Before the hours of loading: a used --out is refused (or moved aside) now, not at the end.
    out = claim_output_dir(out, overwrite=overwrite, inputs=inputs, create=False)
    test_rooms = benchmark_rooms(exclude)
    if not exclude:
        logger.warning("no --exclude given: nothing keeps VSI-Bench's test scenes out of this training set")
    data_root = data_root_of(roots)

    refused: list[dict[str, str]] = []
    todo: list[tuple[str, str]] = []
    for dataset, root in roots.items():
        for name in find_scan_names(root, dataset):
            room = room_of(dataset, name)
            if room in test_rooms:
                test_scene, parquet = test_rooms[room]
                what = (
                    "it is a VSI-Bench test scene"
                    if test_scene == name
                    else f"it shows the room of VSI-Bench test scene {test_scene}"
                )
                logger.warning("refused %s scene %s: %s (in %s)", dataset, name, what, parquet)
                refused.append({"dataset": dataset, "scene_name": name, "test_scene": test_scene, "parquet": parquet})
                continue
            if not any(c.is_dir() for c in scene_candidates(data_root, dataset, name)):
                raise ConfigError(
                    f"{dataset} scene {name} (under {root}) cannot be found from {data_root}, the directory training "
                    "reads as "
                    "env.data_root; put the datasets side by side (DATA/scannet/scans, DATA/arkitscenes/3dod/Training, "
                    "DATA/scannetpp/data: docs/DATA.md) and pass those folders"
                )
            todo.append((dataset, name))

    rows: list[dict] = []
    scenes: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for dataset, name in tqdm(todo, desc="scenes", unit="scene", disable=not progress):
        try:
            scene = find_scene(data_root, dataset, name)
            rng = np.random.default_rng([seed, zlib.crc32(f"{dataset}/{name}".encode())])
            scene_rows, unavailable = scene_questions(scene, env, rng, questions_per_scene)
        except (SceneLoadError, ValueError) as e:  # a broken scan, or one with no free floor: the others go on
            logger.warning("skipped %s scene %s: %s", dataset, name, e)
            skipped.append({"dataset": dataset, "scene_name": name, "reason": str(e)})
            continue
        video = None
        if video_root is not None:
            relative = f"{dataset}/{name}.mp4"
            video = relative if contained(video_root, relative, f"{dataset} scene {name!r}'s video").is_file() else None
        rows += [{**r, "video": video} for r in scene_rows]
        scenes.append(
            {
                "dataset": dataset,
                "scene_name": name,
                "questions": len(scene_rows),
                "objects": len(scene.objects),
                "video": video,
                "unavailable_types": unavailable,
            }
        )
    if not rows:
        raise ConfigError(
            f"no question was generated: {len(todo)} scans loaded, {len(refused)} refused as test scenes, "
            f"{len(skipped)} skipped "
            f"(first: {skipped[0]['reason'] if skipped else 'none'}); add scans or widen env.question_types"
        )
    rows = [validate_row({"id": i, **r}, where=f"generated row {i}") for i, r in enumerate(rows)]

    out.mkdir(parents=True, exist_ok=True)
    path = out / ROWS_FILE
    with open_atomic(path, "wb") as f:
        pq.write_table(pa.Table.from_pylist(rows), f)
    load_vsibench_rows(path)  # read back through the loader training and evaluation use
    manifest = {
        "data_root": str(data_root),
        "roots": {d: str(Path(r).resolve()) for d, r in roots.items()},
        "exclude": [str(p) for p in exclude],
        "video_root": str(video_root) if video_root is not None else None,
        "seed": seed,
        "questions_per_scene": questions_per_scene,
        "question_types": list(env.question_types),
        "sweep": sweep_settings(env),
        "agent_radius": env.agent_radius,
        "num_rows": len(rows),
        "counts": {t: sum(r["question_type"] == t for r in rows) for t in TASKS if t in env.question_types},
        "scenes": scenes,
        "refused": refused,
        "skipped": skipped,
    }
    write_json(manifest, out / MANIFEST_FILE, indent=1)
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--preset``/``--config`` and ``--env.*`` overrides pick the env the set is for)."""
    from a2c_ppo_acktr.config.arguments import add_config_args

    p = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.envs.make_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for dataset, flag in DATASET_FLAGS.items():
        p.add_argument(flag, default=None, metavar="ROOT", help=f"directory of {dataset} scans")
    p.add_argument("--out", required=True, help="output directory (train.parquet, manifest.json)")
    p.add_argument(
        "--exclude",
        action="extend",
        nargs="+",
        default=[],
        metavar="VSIBENCH_PARQUET",
        help="VSI-Bench row files whose scenes are refused (the benchmark's test parquet)",
    )
    p.add_argument(
        "--questions-per-scene", type=int, default=20, metavar="N", help="questions per scan (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (default %(default)s)")
    p.add_argument(
        "--video-root",
        default=None,
        metavar="VIDEOS",
        help="videos in the benchmark's layout, <dataset>/<scene_name>.mp4",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="move a used --out aside to OUT.old-<time> first (nothing is deleted)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_args(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from a2c_ppo_acktr.config.arguments import config_from_args
    from a2c_ppo_acktr.config.cli import check_flag_typos

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    check_flag_typos(parser, extra)
    cfg = config_from_args(args, extra)
    roots = {d: getattr(args, d) for d in DATASET_FLAGS if getattr(args, d) is not None}
    path = build_dataset(
        roots,
        args.out,
        env=cfg.env,
        exclude=args.exclude,
        questions_per_scene=args.questions_per_scene,
        seed=args.seed,
        video_root=args.video_root,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    import json

    manifest = json.loads((path.parent / MANIFEST_FILE).read_text(encoding="utf-8"))
    print(
        f"{manifest['num_rows']} questions over {len(manifest['scenes'])} scans ({len(manifest['refused'])} refused as "
        f"VSI-Bench test scenes, {len(manifest['skipped'])} skipped): {path}"
    )
    print(f"train on it: --env.scene_source parquet --env.vsibench_path {path} --env.data_root {manifest['data_root']}")
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "python -m a2c_ppo_acktr.envs.make_dataset"))

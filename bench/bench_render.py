"""Renderer throughput per look: full frames (RGB + depth + ids) vs raw ``cast_rays`` on the same rays.

    python bench/bench_render.py [--sizes 224 112] [--batch 8] [--repeats 5] [--threads 0] [--looks flat shaded
    shaded+shadows]

Prints one row per (scene, resolution, look): triangles, frames/s of ``Renderer.render_many`` (ray
construction + cast + shading/look-ups), frames/s of the bare ``RaycastingScene.cast_rays`` on
prebuilt rays, and their ratio (raw / render; 1.0 means no overhead). ``flat`` is the old look (one
color per triangle), ``shaded`` the default (per-pixel light and textures), ``shaded+shadows`` adds
the second ray per pixel. All are timed interleaved, best of ``--repeats`` each, and the machine
load is printed, because shared CPUs make absolute numbers vary. The "500k" scene is the
procedural scene with every triangle split into four until it has at least 500,000 triangles (same
geometry, scan-like triangle count).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from a2c_ppo_acktr.envs.procedural import make_procedural_scene
from a2c_ppo_acktr.envs.renderer import Camera, Pose, Renderer
from a2c_ppo_acktr.envs.navigation import sample_free_pose
from a2c_ppo_acktr.envs.scene import Scene


def subdivide(scene: Scene, min_triangles: int) -> Scene:
    """Split every triangle into four (edge midpoints) until the mesh has ``min_triangles``."""
    v = scene.vertices.astype(np.float64)
    t = scene.triangles
    col, ids, mats = scene.triangle_colors, scene.triangle_object_ids, scene.triangle_materials
    while len(t) < min_triangles:
        a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
        n = len(v)
        f = len(t)
        # Midpoints are stored per triangle (not shared); fine for ray casting.
        v = np.concatenate([v, (a + b) / 2, (b + c) / 2, (c + a) / 2])
        ab, bc, ca = n + np.arange(f), n + f + np.arange(f), n + 2 * f + np.arange(f)
        t = np.concatenate(
            [
                np.stack([t[:, 0], ab, ca], 1),
                np.stack([ab, t[:, 1], bc], 1),
                np.stack([ca, bc, t[:, 2]], 1),
                np.stack([ab, bc, ca], 1),
            ]
        )
        col = np.tile(col, (4, 1))
        ids = np.tile(ids, 4)
        mats = np.tile(mats, 4)
    return Scene(
        scene.scene_id + "_sub",
        scene.dataset,
        v,
        t,
        col,
        ids,
        scene.objects,
        scene.floor_polygon,
        scene.ceiling_height,
        triangle_materials=mats,
    )


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[224, 112])
    ap.add_argument("--batch", type=int, default=8, help="poses per render_many call (a 360-degree sweep)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="ray-caster threads (0 = all cores)")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument(
        "--looks", nargs="+", default=["flat", "shaded", "shaded+shadows"], choices=["flat", "shaded", "shaded+shadows"]
    )
    args = ap.parse_args()

    base = make_procedural_scene(args.seed)
    scenes = [("procedural", base), ("procedural x4^k (500k)", subdivide(base, 500_000))]
    pose = sample_free_pose(base, np.random.default_rng(0), 0.2)
    poses = [Pose(pose.x, pose.y, pose.yaw_deg + 360.0 * k / args.batch) for k in range(args.batch)]
    print(
        f"cpus={os.cpu_count()} loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())} batch={args.batch} "
        f"threads={args.threads or 'all'}"
    )
    print(
        f"{'scene':<24} {'triangles':>10} {'resolution':>10} {'look':>15} {'render fps':>11} {'raw cast fps':>13} "
        f"{'raw/render':>10}"
    )
    for name, scene in scenes:
        for size in args.sizes:
            cam = Camera(size, size, 90.0, 1.5)
            renderers = {
                look: Renderer(
                    scene, cam, num_threads=args.threads, look=look.split("+")[0], shadows=look.endswith("+shadows")
                )
                for look in args.looks
            }
            for r in renderers.values():
                r.render_many(poses)  # warm-up (BVH build, page faults, work buffers)
            first = next(iter(renderers.values()))
            rays = first.rays(poses)
            # Interleaved so that all see the same (shared, fluctuating) machine load.
            t_render = {look: float("inf") for look in renderers}
            t_raw = float("inf")
            for _ in range(args.repeats):
                for look, r in renderers.items():
                    t_render[look] = min(t_render[look], best_of(lambda: r.render_many(poses), 1))
                t_raw = min(t_raw, best_of(lambda: first.cast(rays), 1))
            fps_raw = len(poses) / t_raw
            for look in renderers:
                fps_render = len(poses) / t_render[look]
                print(
                    f"{name:<24} {scene.num_triangles:>10} {f'{size}x{size}':>10} {look:>15} {fps_render:>11.1f} "
                    f"{fps_raw:>13.1f} {fps_raw / fps_render:>10.2f}"
                )


if __name__ == "__main__":
    main()

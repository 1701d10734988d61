"""Renderer throughput: full frames (RGB + depth + ids) vs raw ``cast_rays`` on the same rays.

    python bench/bench_render.py [--sizes 224 112] [--batch 8] [--repeats 5] [--threads 0]

Prints one row per (scene, resolution): triangles, frames/s of ``Renderer.render_many`` (ray
construction + cast + color/id look-ups), frames/s of the bare ``RaycastingScene.cast_rays`` on
prebuilt rays, and their ratio (raw / render; 1.0 means no overhead). The two are timed
interleaved, best of ``--repeats`` each, and the machine load is printed, because shared CPUs make
absolute numbers vary. The "500k" scene is the procedural scene with every triangle split into four
until it has at least 500,000 triangles (same geometry, scan-like triangle count).
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
    col, ids = scene.triangle_colors, scene.triangle_object_ids
    while len(t) < min_triangles:
        a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
        n = len(v)
        f = len(t)
        # Midpoints are stored per triangle (not shared); fine for ray casting.
        v = np.concatenate([v, (a + b) / 2, (b + c) / 2, (c + a) / 2])
        ab, bc, ca = n + np.arange(f), n + f + np.arange(f), n + 2 * f + np.arange(f)
        t = np.concatenate([np.stack([t[:, 0], ab, ca], 1), np.stack([ab, t[:, 1], bc], 1),
                            np.stack([ca, bc, t[:, 2]], 1), np.stack([ab, bc, ca], 1)])
        col = np.tile(col, (4, 1))
        ids = np.tile(ids, 4)
    return Scene(scene.scene_id + "_sub", scene.dataset, v, t, col, ids, scene.objects, scene.floor_polygon, scene.ceiling_height)


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
    args = ap.parse_args()

    base = make_procedural_scene(args.seed)
    scenes = [("procedural", base), ("procedural x4^k (500k)", subdivide(base, 500_000))]
    pose = sample_free_pose(base, np.random.default_rng(0), 0.2)
    poses = [Pose(pose.x, pose.y, pose.yaw_deg + 360.0 * k / args.batch) for k in range(args.batch)]
    print(f"cpus={os.cpu_count()} loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())} batch={args.batch} threads={args.threads or 'all'}")
    print(f"{'scene':<24} {'triangles':>10} {'resolution':>10} {'render fps':>11} {'raw cast fps':>13} {'raw/render':>10}")
    for name, scene in scenes:
        for size in args.sizes:
            r = Renderer(scene, Camera(size, size, 90.0, 1.5), num_threads=args.threads)
            r.render_many(poses)  # warm-up (BVH build, page faults)
            rays = r.rays(poses)
            # Interleaved so that both see the same (shared, fluctuating) machine load.
            t_render, t_raw = float("inf"), float("inf")
            for _ in range(args.repeats):
                t_render = min(t_render, best_of(lambda: r.render_many(poses), 1))
                t_raw = min(t_raw, best_of(lambda: r.cast(rays), 1))
            fps_render, fps_raw = len(poses) / t_render, len(poses) / t_raw
            print(f"{name:<24} {scene.num_triangles:>10} {f'{size}x{size}':>10} {fps_render:>11.1f} {fps_raw:>13.1f} {fps_raw / fps_render:>10.2f}")


if __name__ == "__main__":
    main()

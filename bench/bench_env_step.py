"""Env speed without a model: reset (cold scene / cached scene), step (move, invalid, answer), render.

Usage::

    python bench/bench_env_step.py --sizes 224 64 --steps 100

Prints one row per image size: median and 90th-percentile milliseconds. "cold reset" builds a new
procedural scene and its ray-casting structure; "warm reset" reuses a cached scene (new start pose,
sweep and question); "step move" includes parsing, collision checking and rendering one view, and
"render" is the renderer alone (the part of a move step the env does not control).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from a2c_ppo_acktr.arguments import EnvConfig
from a2c_ppo_acktr.envs.vsi_env import VSIEnv
from a2c_ppo_acktr.prompts import Answer, Move, format_response


def _timed(fn, n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), 1e3 * float(np.percentile(times, 90))


def bench(size: int, steps: int, resets: int, sweep: int) -> dict[str, tuple[float, float]]:
    env = VSIEnv(EnvConfig(image_size=size, num_sweep_frames=sweep, num_scenes=10_000, max_turns=10**6))
    env.reset(seed=0)  # imports, first scene
    counter = iter(range(1, 10**6))
    out = {"cold reset": _timed(lambda: env.reset(options={"scene_index": next(counter)}), resets)}
    env.reset(seed=0, options={"scene_index": 0})
    out["warm reset"] = _timed(lambda: env.reset(options={"scene_index": 0}), resets)
    env.reset(seed=0, options={"scene_index": 0})
    moves = [format_response("look", Move(37.0, 0.0)), format_response("walk", Move(-20.0, 0.3))]
    k = iter(range(10**9))
    out["step move"] = _timed(lambda: env.step(moves[next(k) % 2]), steps)
    out["step invalid"] = _timed(lambda: env.step("not json"), steps)
    out["render"] = _timed(lambda: env.renderer.render(env.pose), steps)

    def answer() -> None:
        env.step(format_response("done", Answer("A")))
        env.reset(options={"scene_index": 0})

    out["answer+warm reset"] = _timed(answer, max(resets // 2, 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 64])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--resets", type=int, default=10)
    parser.add_argument("--sweep", type=int, default=8, help="num_sweep_frames")
    args = parser.parse_args()
    rows = {size: bench(size, args.steps, args.resets, args.sweep) for size in args.sizes}
    names = list(next(iter(rows.values())))
    print(f"{'image':>6} | " + " | ".join(f"{n:>22}" for n in names))
    print(f"{'':>6} | " + " | ".join(f"{'median / p90 ms':>22}" for _ in names))
    print("-" * (9 + 25 * len(names)))
    for size, r in rows.items():
        print(f"{size:>6} | " + " | ".join(f"{r[n][0]:>10.2f} / {r[n][1]:>9.2f}" for n in names))


if __name__ == "__main__":
    main()

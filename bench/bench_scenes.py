"""Procedural scene generation and the room-size samples' drawing, without a model.

Usage::

    python bench/bench_scenes.py                      # 200 scenes, best of 3 passes
    python bench/bench_scenes.py --scenes 500 --repeats 5

One Markdown table, one row per part, each in milliseconds per scene (best and median pass):

* ``layout``: the room polygon, theme and the placement of every object (``procedural._layout``: the
  thousands of candidate placements and their overlap and containment tests);
* ``make_procedural_scene``: the layout plus the triangle mesh of the room and its furniture (what an
  env's reset builds for a new scene, before its ray-casting structure);
* ``room_size sample``: one sample of the rooms build's vision pre-training (the scene, a free pose and
  the 4 frames of its sweep at 64 px), which ``python -m a2c_ppo_acktr.tiny --render-samples`` draws
  1000 of.

Seeds are ``--first`` .. ``--first + --scenes - 1`` at the env's default room sizes; one thread. The
defaults take about 40 s on 2 idle CPU cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable, Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")


def per_scene_ms(fn: Callable[[int], object], seeds: Sequence[int], repeats: int) -> tuple[float, float]:
    """Best and median (over ``repeats`` passes) milliseconds per seed of ``fn``."""
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for seed in seeds:
            fn(seed)
        passes.append((time.perf_counter() - start) * 1000.0 / len(seeds))
    return min(passes), statistics.median(passes)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=200, help="seeds per pass")
    parser.add_argument("--repeats", type=int, default=3, help="passes; the table shows the best and the median")
    parser.add_argument("--first", type=int, default=0, help="first seed")
    args = parser.parse_args(argv)

    from a2c_ppo_acktr.config.arguments import EnvConfig
    from a2c_ppo_acktr.envs.procedural import _layout, make_procedural_scene
    from a2c_ppo_acktr.tiny.vision import room_size_samples

    cfg = EnvConfig()
    lo, hi = cfg.procedural_min_room, cfg.procedural_max_room
    seeds = list(range(args.first, args.first + args.scenes))
    parts = {
        "layout": lambda s: _layout(s, lo, hi),
        "make_procedural_scene": lambda s: make_procedural_scene(s, lo, hi),
        "room_size sample (scene, pose, 4 frames at 64 px)": lambda s: room_size_samples([s], 64),
    }
    rows = []
    for name, fn in parts.items():
        best, median = per_scene_ms(fn, seeds, args.repeats)
        rows.append(f"| {name} | {best:.1f} | {median:.1f} |")
    print(f"# Procedural scenes: {args.scenes} seeds from {args.first}, rooms {lo}-{hi} m, {args.repeats} passes\n")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n")
    print("| part | ms per scene (best pass) | ms per scene (median pass) |\n|---|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

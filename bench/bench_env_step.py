"""Env speed without a model: every env of the registry (reset, random legal step, invalid step), and
VSI's parts in detail (cold / cached-scene reset, move, invalid, render, answer).

Usage::

    python bench/bench_env_step.py                                   # every env of registry.TESTED_IDS
    python bench/bench_env_step.py --sizes 224 64 --steps 100        # sizes of the VSI detail table
    python bench/bench_env_step.py --envs NumberLine-v0 Sokoban-v0 --steps 500 --image-size 128

Two Markdown tables.

"All envs", one row per ``--envs`` id (default: ``registry.TESTED_IDS``), each env built by
``registry.make_env`` from ``--preset`` (cpu-demo) plus its overlay in ``configs/envs/`` (the overlay
whose ``env.env_id`` is that id; VSI-v0 and ids without one: the preset alone), at the image size of
that config unless ``--image-size`` is given (the card games need >= 64; Sokoban sizes its image by
``env.game.tile_size`` and ignores it). Per env, each as mean / median / 90th percentile ms:
``reset`` over ``--resets`` resets with distinct seeds (VSI: a mix of new and cached scenes, as in
training); ``step`` over ``--steps`` steps with ``env.unwrapped.random_reply(rng)`` (the reply is drawn
outside the timing; an episode that ends is reset, untimed); ``invalid step`` the same with the reply
``"not json"`` (parsing is part of a step's cost; invalid replies use turns, so episodes are truncated
and reset the same way). The median is there because on a loaded machine a few preempted steps (~4
ms each) move the mean of sub-millisecond steps above the p90; ``--steps 1000`` steadies the mean.
``episodes ended`` counts the untimed resets in the step loop. ``images`` is the
observation's images (count x HxW), ``text`` / ``system`` the mean characters of the observation's
text and the game's system prompt (VSI has none: the pipeline supplies its own).

"VSI-v0 detail" (only when VSI-v0 is in ``--envs``), one row per ``--sizes`` image size, median and
90th-percentile milliseconds, with ``--sweep`` sweep frames: "cold reset" builds a new procedural scene
and its ray-casting structure; "warm reset" reuses a cached scene (new start pose, sweep and
question); "step move" includes parsing, collision checking and rendering one view, and "render" is
the renderer alone (the part of a move step the env does not control).

The defaults take about 8 s on 2 idle CPU cores (about 20 s when the cores are shared).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.config.arguments import CONFIG_DIR, EnvConfig, load_config
from a2c_ppo_acktr.common.env_ids import TESTED_IDS, VSI_ID, canonical_id, overlay_path
from a2c_ppo_acktr.common.prompts import Answer, Move, format_response

INVALID_REPLY = "not json"


# ---------------------------------------------------------------------------------------------- helpers
def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``headers`` as a Markdown table (cells as ``str``)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_median_p90_ms(seconds: Sequence[float]) -> tuple[float, float, float]:
    """Mean, median and 90th percentile of ``seconds``, in milliseconds."""
    ms = 1e3 * np.asarray(seconds, dtype=float)
    return float(np.mean(ms)), float(np.median(ms)), float(np.percentile(ms, 90))


def fmt_ms(stats: Sequence[float]) -> str:
    """``mean / median / p90`` milliseconds, with three significant decimals below 10 ms."""
    return " / ".join(f"{x:.3f}" if x < 10 else f"{x:.1f}" for x in stats)


def overlay_for(env_id: str) -> Optional[Path]:
    """The overlay ``env_id`` is built with (:func:`a2c_ppo_acktr.common.env_ids.overlay_path`), or None."""
    return overlay_path(env_id)


def env_config(
    env_id: str, preset: str = "cpu-demo", image_size: Optional[int] = None
) -> tuple[EnvConfig, Optional[Path]]:
    """The ``env`` config the table builds ``env_id`` from, and the overlay it used (None: the preset
    alone, with ``env.env_id`` set)."""
    overlay = overlay_for(env_id)
    overrides: dict[str, Any] = {"env": {"env_id": env_id}}
    if image_size is not None:
        overrides["env"]["image_size"] = image_size
    cfg = load_config(preset=preset, config=None if overlay is None else str(overlay), overrides=overrides)
    return cfg.env, overlay


def image_shapes(obs: dict) -> str:
    """The observation's images as ``count x HxW`` (``64x64``, ``5 x 64x64``; mixed sizes joined by ``+``)."""
    shapes = [np.asarray(im).shape[:2] for im in obs["images"]]
    parts = []
    for hw in dict.fromkeys(shapes):
        n = shapes.count(hw)
        parts.append(f"{n} x {hw[0]}x{hw[1]}" if n > 1 else f"{hw[0]}x{hw[1]}")
    return " + ".join(parts) if parts else "none"


def time_steps(env: Any, reply: Callable[[], str], n: int, first_seed: int) -> dict[str, Any]:
    """``n`` timed ``env.step(reply())`` (the reply drawn outside the timing), resetting (untimed, seeds
    ``first_seed``, ``first_seed + 1``, ...) whenever an episode ends.

    Returns:
        ``seconds`` (one per step), ``text`` / ``system`` (characters of each step's observation),
        ``episodes`` (episodes that ended), ``images`` (``image_shapes`` of the last observation).
    """
    seed = first_seed
    obs, _ = env.reset(seed=seed)
    seconds, text, system, episodes = [], [], [], 0
    for _ in range(n):
        action = reply()
        t0 = time.perf_counter()
        obs, _, terminated, truncated, _ = env.step(action)
        seconds.append(time.perf_counter() - t0)
        text.append(len(obs["text"]))
        system.append(len(obs.get("system") or ""))
        if terminated or truncated:
            episodes += 1
            seed += 1
            obs, _ = env.reset(seed=seed)
    return {"seconds": seconds, "text": text, "system": system, "episodes": episodes, "images": image_shapes(obs)}


def bench_registry_env(env: Any, steps: int, resets: int, seed: int = 0) -> dict[str, Any]:
    """Reset, random-step and invalid-step timings of one env (see the module docstring)."""
    rng = np.random.default_rng(seed)
    time_steps(env, lambda: env.unwrapped.random_reply(rng), 3, first_seed=10**6)  # warm-up: imports, caches
    reset_s = []
    for k in range(resets):
        t0 = time.perf_counter()
        env.reset(seed=seed + 1 + k)
        reset_s.append(time.perf_counter() - t0)
    legal = time_steps(env, lambda: env.unwrapped.random_reply(rng), steps, first_seed=seed + 1000)
    invalid = time_steps(env, lambda: INVALID_REPLY, steps, first_seed=seed + 2000)
    return {
        "reset": mean_median_p90_ms(reset_s),
        "step": mean_median_p90_ms(legal["seconds"]),
        "invalid": mean_median_p90_ms(invalid["seconds"]),
        "images": legal["images"],
        "text": float(np.mean(legal["text"])),
        "system": float(np.mean(legal["system"])),
        "episodes": legal["episodes"],
    }


REGISTRY_HEADERS = (
    "env",
    "config",
    "images",
    "text chars",
    "system chars",
    "reset ms (mean / median / p90)",
    "step ms (mean / median / p90)",
    "invalid step ms (mean / median / p90)",
    "episodes ended in steps",
)


def registry_row(env_id: str, source: str, r: dict[str, Any]) -> list[str]:
    """One row of the all-envs table from ``bench_registry_env``'s result."""
    return [
        env_id,
        source,
        r["images"],
        f"{r['text']:.0f}",
        f"{r['system']:.0f}" if r["system"] else "-",
        fmt_ms(r["reset"]),
        fmt_ms(r["step"]),
        fmt_ms(r["invalid"]),
        str(r["episodes"]),
    ]


# ------------------------------------------------------------------------------------------ VSI detail
def _timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), 1e3 * float(np.percentile(times, 90))


def bench(size: int, steps: int, resets: int, sweep: int) -> dict[str, tuple[float, float]]:
    """VSI's parts at ``size`` px (median / p90 ms each)."""
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

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
    out["step invalid"] = _timed(lambda: env.step(INVALID_REPLY), steps)
    out["render"] = _timed(lambda: env.renderer.render(env.pose), steps)

    def answer() -> None:
        env.step(format_response("done", Answer("A")))
        env.reset(options={"scene_index": 0})

    out["answer+warm reset"] = _timed(answer, max(resets // 2, 1))
    return out


# ---------------------------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--envs",
        nargs="+",
        default=list(TESTED_IDS),
        metavar="ENV_ID",
        help="env ids to measure (default: registry.TESTED_IDS; any minigrid id works)",
    )
    parser.add_argument("--steps", type=int, default=100, help="timed steps per env (and per VSI detail column)")
    parser.add_argument("--resets", type=int, default=10, help="timed resets per env (and per VSI detail reset column)")
    parser.add_argument("--preset", default="cpu-demo", help="model preset the env overlays are combined with")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image size of every env in the all-envs table (default: the preset's/overlay's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="first reset seed and random-reply seed")
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[224, 64], help="VSI detail table image sizes (none: skip it)"
    )
    parser.add_argument("--sweep", type=int, default=8, help="num_sweep_frames of the VSI detail table")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.resets < 1:
        parser.error("--steps and --resets must be >= 1")

    from a2c_ppo_acktr.envs import registry

    built = []
    for env_id in args.envs:
        try:
            cfg, overlay = env_config(env_id, args.preset, args.image_size)
            built.append((env_id, overlay, registry.make_env(cfg)))
        except ValueError as e:  # unknown id, bad image size (cards need >= 64), bad overlay: the message names the env
            parser.error(str(e))

    print(
        f"machine: {platform.processor() or platform.machine()}, cpus={os.cpu_count()}, "
        f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(
        f"\nAll envs: preset {args.preset} + overlay, image size {args.image_size or 'of the config'}, "
        f"{args.resets} resets, {args.steps} steps (random legal replies) and {args.steps} invalid steps each\n"
    )
    rows = []
    for env_id, overlay, env in built:
        source = f"{args.preset} + {overlay.relative_to(CONFIG_DIR.parent)}" if overlay else args.preset
        rows.append(registry_row(env_id, source, bench_registry_env(env, args.steps, args.resets, args.seed)))
        env.close()
    print(markdown_table(REGISTRY_HEADERS, rows))

    if any(canonical_id(e) == VSI_ID for e in args.envs) and args.sizes:
        detail = {size: bench(size, args.steps, args.resets, args.sweep) for size in args.sizes}
        names = list(next(iter(detail.values())))
        print(f"\nVSI-v0 detail: {args.sweep} sweep frames, procedural scenes, median / p90 ms\n")
        print(
            markdown_table(
                ["image", *names],
                [[size, *(f"{r[n][0]:.2f} / {r[n][1]:.2f}" for n in names)] for size, r in detail.items()],
            )
        )


if __name__ == "__main__":
    main()

"""The tiny models' command line: ``python -m a2c_ppo_acktr.tiny`` (``vsi-tiny``).

Kept apart from :mod:`a2c_ppo_acktr.tiny.build`, whose code is part of every build's spec hash: an edit
of the command line rebuilds nothing. It calls the build through its module (``build.<name>``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from a2c_ppo_acktr.tiny import build
from a2c_ppo_acktr.tiny.shipped import install_shipped


def main(argv: Optional[Sequence[str]] = None) -> None:
    """CLI: build a tiny model into ``--out`` (or the cache when ``--out`` is omitted)."""
    parser = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.tiny",
        description="Build an offline tiny VLM (Qwen-VL or LLaVA family), tokenizer and processor.",
    )
    parser.add_argument(
        "--family",
        choices=build.BUILDS,
        default="qwen2_5_vl",
        help="a family, or a build with another vision pre-training",
    )
    parser.add_argument("--out", default=None, help="output directory (default: the tiny cache, printed)")
    parser.add_argument(
        "--seed", type=int, default=None, help=f"weight initialisation seed (default: ${build.SEED_ENV}, else 0)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="move an --out that holds files aside to OUT.old-<time> first (nothing is deleted)",
    )
    parser.add_argument(
        "--base",
        default=None,
        help="for a build on top of another (qwen2_5_vl-rooms: of qwen2_5_vl): the directory holding that build "
        "of the same seed (default: the tiny cache's, built first when absent)",
    )
    parser.add_argument(
        "--render-samples",
        metavar="FILE",
        default=None,
        help="only render this build's vision pre-training samples into FILE (.npz) and exit, for --samples",
    )
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="copy the build that ships with the package into --out when it is this code's build of --family and "
        "--seed (seconds instead of minutes; python -m a2c_ppo_acktr.tiny.shipped --check), else build",
    )
    parser.add_argument(
        "--samples",
        metavar="FILE",
        default=None,
        help="the vision pre-training's samples, rendered beforehand with --render-samples (same weights)",
    )
    args = parser.parse_args(argv)
    if args.render_samples is not None:
        if args.out is not None or args.samples is not None or args.base is not None:
            parser.error("--render-samples only renders: leave --out, --samples and --base out")
        try:
            print(build.render_samples(args.family, args.render_samples))
        except build.TinySamplesError as err:
            parser.error(f"--render-samples: {err}")
        return
    try:
        seed = build.default_seed() if args.seed is None else args.seed
    except build.TinySeedError as err:
        parser.error(str(err))
    if args.samples is not None:
        if args.out is None:
            parser.error("--samples builds into --out; the cache renders its own samples")
        try:
            build.load_rendered_samples(args.family, args.samples)
        except build.TinySamplesError as err:
            parser.error(f"--samples: {err}")
    base_build = build.tiny_spec(args.family).vision_base
    if args.base is not None:
        if not base_build:
            parser.error(f"--base: {args.family} is not built on top of another build; leave --base out")
        try:
            build.check_base_build(Path(args.base), base_build, seed)
        except build.TinyBaseError as err:
            parser.error(f"--base: {err}")
    if args.shipped and args.out is None:
        parser.error("--shipped copies into --out")
    if args.out is None:
        if args.base is not None:
            parser.error("--base builds into --out; the cache builds its own base")
        print(build.tiny_model_dir(args.family, seed=seed))
        return
    from a2c_ppo_acktr.run.rundir import check_output_path, claim_output_dir, directory_lock

    with directory_lock(check_output_path(args.out)):
        claim_output_dir(args.out, overwrite=args.overwrite)
        if args.shipped:
            reason = install_shipped(args.family, seed, args.out)
            if not reason:
                print(f"[tiny] the shipped build of {args.family} seed {seed}, copied", file=sys.stderr)
                print(Path(args.out).resolve())
                return
            print(f"[tiny] building {args.family} seed {seed}: {reason}", file=sys.stderr)
        print(build.build_tiny_model(args.family, args.out, seed=seed, base_dir=args.base, samples_path=args.samples))

"""Video-protocol throughput (``eval_vsi.py --protocol video``) on the tiny model: questions per second,
with frame decoding (probe, decode, qwen-vl-utils resize) timed apart from the processor and ``generate``.

Builds a mini benchmark (``scripts/make_mini_vsibench.py``) in a temporary directory, loads the
policy once, then runs the protocol over all its questions for each batch size (interleaved,
best of ``--repeats``; the first pass is a warm-up). A second table times decoding alone on a
camera-sized synthetic video (640x480, 30 fps, ``--video-seconds`` long): the cost the real
benchmark's videos add per scene, which the tiny model's 64-256 px frames hide.

    .venv/bin/python bench/bench_video_protocol.py [--scenes 4] [--frames 32] [--size 128] [--num-frames 16]
    [--batch-sizes 1 4 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from a2c_ppo_acktr.eval import video_protocol as vp
from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

REPO = Path(__file__).resolve().parent.parent


def _mini_module():
    spec = importlib.util.spec_from_file_location("make_mini_vsibench", REPO / "scripts" / "make_mini_vsibench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _synthetic_video(path: Path, seconds: float, fps: int = 30, width: int = 640, height: int = 480) -> None:
    """A moving colour gradient (so the encoder has real work), libx264, ultrafast."""
    import av

    yy, xx = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "ultrafast"} if s.codec_context.name == "libx264" else {}
        for k in range(int(seconds * fps)):
            rgb = np.stack([(xx + 4 * k) % 256, (yy + 2 * k) % 256, (xx + yy + k) % 256], axis=-1).astype(np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default="tiny:qwen2_5_vl")
    ap.add_argument("--scenes", type=int, default=4)
    ap.add_argument("--frames", type=int, default=32, help="video frames per mini-benchmark room")
    ap.add_argument("--size", type=int, default=128, help="mini-benchmark frame size (px)")
    ap.add_argument("--num-frames", type=int, default=16, help="frames shown per question (the reference shows 32)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--video-seconds", type=float, default=20.0, help="length of the 640x480 decode-only video (0: skip)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from a2c_ppo_acktr.config.arguments import RunConfig
    from a2c_ppo_acktr.eval.evaluation import load_policy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        rows_path = _mini_module().make_mini_vsibench(
            root / "mini", scenes=args.scenes, frames=args.frames, size=args.size
        )
        build_s = time.perf_counter() - t0
        rows = load_vsibench_rows(rows_path)
        questions = vp.video_questions(rows, root / "mini")
        cfg = RunConfig.from_dict({"model": {"model_path": args.model_path, "device": "cpu"}})
        policy = load_policy(cfg)
        sampling = vp.REFERENCE_FRAME_SAMPLING.get(policy.family, vp.DEFAULT_FRAME_SAMPLING)

        def run(batch_size: int) -> dict:
            answerer = vp.ModelAnswerer(policy)
            pcfg = vp.VideoProtocolConfig(
                video_root=str(root / "mini"),
                num_frames=args.num_frames,
                frame_sampling=sampling,
                batch_size=batch_size,
            )
            return vp.run_video_protocol(questions, answerer, pcfg).timings

        best: dict[int, dict] = {}
        for b in args.batch_sizes:  # warm-up
            run(b)
        for _ in range(args.repeats):
            for b in args.batch_sizes:
                t = run(b)
                if b not in best or t["total_s"] < best[b]["total_s"]:
                    best[b] = t

        print(
            f"machine: {platform.machine()}, torch {torch.__version__}, {args.threads} thread(s); model "
            f"{args.model_path} ({policy.family})"
        )
        print(
            f"mini benchmark: {len(questions)} questions over {args.scenes} videos of {args.frames} frames at "
            f"{args.size}x{args.size} "
            f"(built in {build_s:.1f} s); {args.num_frames} frames shown per question ({sampling}); best of "
            f"{args.repeats}\n"
        )
        print(
            "| batch size | questions/s | total s | decode s (videos) | processor s | generate s | decode ms / video | "
            "generate ms / question |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in args.batch_sizes:
            t = best[b]
            print(
                f"| {b} | {t['questions'] / t['total_s']:.1f} | {t['total_s']:.2f} | {t['decode_s']:.2f} "
                f"({t['videos']}) | {t['encode_s']:.2f} | "
                f"{t['generate_s']:.2f} | {1000 * t['decode_s'] / t['videos']:.0f} | "
                f"{1000 * t['generate_s'] / t['questions']:.0f} |"
            )

        if args.video_seconds > 0:
            video = root / "camera.mp4"
            _synthetic_video(video, args.video_seconds)
            print(
                f"\nDecoding alone, 640x480 30 fps {args.video_seconds:g} s video (PyAV, frame-threaded), best of "
                f"{args.repeats}:\n"
            )
            print(
                "| sampling | frames shown | probe ms | decode ms | qwen resize ms (reference budget 128-768 "
                "tokens/frame) |"
            )
            print("|---|---:|---:|---:|---:|")
            for sampling_name in ("uniform", "qwen_2fps"):
                for n in (8, 32):
                    times = {"probe": [], "decode": [], "resize": []}
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        total, fps = vp.probe_video(video)
                        t1 = time.perf_counter()
                        sample = vp.sample_frames(sampling_name, total, fps, n)
                        frames = vp.decode_frames(video, sample.indices)
                        t2 = time.perf_counter()
                        vp.qwen_resize(
                            frames,
                            min_pixels=128 * 28 * 28,
                            max_pixels=768 * 28 * 28,
                            patch_size=14,
                            merge_size=2,
                            read_frames=sample.read_frames,
                        )
                        t3 = time.perf_counter()
                        times["probe"].append(t1 - t0)
                        times["decode"].append(t2 - t1)
                        times["resize"].append(t3 - t2)
                    print(
                        f"| {sampling_name} | {n} | {1000 * min(times['probe']):.0f} | "
                        f"{1000 * min(times['decode']):.0f} | "
                        f"{1000 * min(times['resize']):.0f} |"
                    )


if __name__ == "__main__":
    sys.exit(main())

"""What the benchmark scripts share (imported as ``common`` from ``bench/``): the policy options and
set-up of the model benchmarks, interleaved best-of timing and peak memory."""

from __future__ import annotations

import argparse
import resource
import time
from typing import Callable, Sequence

import torch

from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy


def add_policy_args(ap: argparse.ArgumentParser) -> None:
    """Options every policy benchmark takes (model, batch shape, repetitions, threads)."""
    ap.add_argument("--model-path", default="tiny:qwen2_5_vl")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the policy runs (cuda: e.g. a build of python -m a2c_ppo_acktr.real_size as --model-path)",
    )
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="model.dtype (default: float32 on cpu, bfloat16 on cuda)",
    )


def load_policy(args: argparse.Namespace) -> VLMPolicy:
    """The policy the benchmark measures, on ``args.device`` (CPU: ``args.threads`` torch threads),
    seed 0."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = getattr(args, "device", "cpu")
    dtype = getattr(args, "dtype", None) or ("bfloat16" if device == "cuda" else "float32")
    cfg = ModelConfig(model_path=args.model_path, device=device, dtype=dtype, max_new_tokens=args.max_new_tokens)
    return VLMPolicy(cfg, load_vlm(cfg))


def synchronised(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` followed by a CUDA synchronise when CUDA is in use, so wall time covers queued kernels."""

    def call() -> object:
        out = fn()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return out

    return call


def best_interleaved(fns: Sequence[Callable[[], object]], repeats: int, warmup: bool = True) -> list[float]:
    """Best-of-``repeats`` wall time of each function, run alternately so that load drift on a shared
    CPU hits all of them alike (the minimum is the least noisy estimate). ``warmup`` calls each once
    first (JIT, caches, thread pools); turn it off when a call changes state the timing depends on."""
    if warmup:
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return [min(t) for t in times]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

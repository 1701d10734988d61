"""Cost of one PPO update vs a bare forward+backward over the same minibatches (tiny offline model).

The bare loop does what a plain trainer does per minibatch: process the images and texts, forward
``[prompt | response]`` through the LoRA model, a summed token log-prob loss, backward, clip, step.
The PPO update forwards the processor output ``act`` kept (no processor run) and adds the
value/temperature heads, the clipped losses and, with ``kl_coef = 0``, a no-grad reference forward for
the ``losses/kl_ref`` monitor on the first minibatch of an update: the "PPO.update" row measures it on
every update (``kl_ref_interval=1``), the next row as training runs it (``log.kl_ref_interval``
default 10: most updates have none).

Peak memory, per minibatch: each measurement runs in a fresh process (``--measure bare|ppo``) on the
same minibatch (same seed: the same rollout), after one warm-up step, as the peak above the level
before the step: resident memory on CPU (the kernel's high-water mark, reset first, with glibc told
to return freed blocks: ``a2c_ppo_acktr.memory.HONEST_MALLOC_ENV``), ``torch.cuda.max_memory_allocated``
on CUDA. The PPO step is an update's first minibatch (policy forward, reference forward for the KL,
chunked log-probs/entropy/KL, losses, backward); the bare step computes the full ``(B, R, V)``
float32 logits as a plain trainer does. The formula row is ``python -m a2c_ppo_acktr.memory``'s
"update" total for the PPO step's shapes.

Usage: ``python bench/bench_ppo_update.py [--num-envs 8] [--num-steps 2] [--mini-batch-size 4] [--epochs 2]
[--max-new-tokens 32] [--images 4] [--image-size 224] [--device cpu|cuda] [--gradient-checkpointing]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from typing import Callable

import numpy as np
import torch

from common import add_policy_args, best_interleaved, load_policy, peak_rss_mb

from a2c_ppo_acktr import memory
from a2c_ppo_acktr.algo.ppo import PPO, ppo_loss
from a2c_ppo_acktr.config.arguments import ModelConfig, PPOConfig
from a2c_ppo_acktr.policy.distributions import process_logits, token_log_probs
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import Minibatch, RolloutStorage


def collect(policy: VLMPolicy, num_envs: int, num_steps: int, images: int, size: int) -> RolloutStorage:
    rng = np.random.default_rng(0)
    st = RolloutStorage(num_steps, num_envs)
    for t in range(num_steps):
        obs = [
            {
                "images": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(images)],
                "text": f"step {t} env {i}: how far is the bed from the sofa?" + " more" * i,
            }
            for i in range(num_envs)
        ]
        act = policy.act(obs)
        st.insert(
            act, torch.from_numpy(rng.normal(size=num_envs)).float(), torch.zeros(num_envs), torch.zeros(num_envs)
        )
    st.compute_returns(torch.zeros(num_envs))
    return st


def bare_loss(policy: VLMPolicy, mb: Minibatch) -> torch.Tensor:
    """A plain trainer's minibatch loss: full logits, token log-probs, advantage-weighted sum."""
    enc = policy._encode(mb.prompts, mb.images)
    dev = policy.device
    R = max(len(g) for g in mb.generated_ids)
    resp = torch.full((len(mb), R), policy.pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros(len(mb), R, dtype=torch.bool, device=dev)
    for i, g in enumerate(mb.generated_ids):
        resp[i, : len(g)], mask[i, : len(g)] = g.to(dev), True
    inputs = dict(enc)
    inputs["input_ids"] = torch.cat([enc["input_ids"], resp], 1)
    inputs["attention_mask"] = torch.cat([enc["attention_mask"], mask.long()], 1)
    if "mm_token_type_ids" in enc:
        inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(resp)], 1)
    logits = policy.model(**inputs, use_cache=False, logits_to_keep=R + 1).logits[:, :R]
    lp = token_log_probs(process_logits(logits, torch.ones(len(mb), device=dev), policy.forbidden_ids), resp)
    return -(lp * mask).sum(-1).mul(mb.advantages.to(dev)).mean()


def bare_epochs(policy: VLMPolicy, st: RolloutStorage, cfg: PPOConfig, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = policy.trainable_parameters()
    for _ in range(cfg.ppo_epochs):
        for mb in st.minibatches(cfg.mini_batch_size, gen, cfg.adv_norm, cfg.adv_std_floor):
            bare_loss(policy, mb).backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            opt.zero_grad()


def _peak_above_start(step: Callable[[], None], device: torch.device) -> int:
    """Bytes memory peaked above its level before ``step`` (after one warm-up call)."""
    step()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    return memory.peak_rss_delta(step)[1]


def measure(args: argparse.Namespace) -> None:
    """Child process: the peak of one minibatch step of kind ``args.measure``, as one JSON line."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(
        model_path=args.model_path,
        device=args.device,
        max_new_tokens=args.max_new_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    policy = VLMPolicy(cfg, load_vlm(cfg))
    st = collect(policy, args.mini_batch_size, 1, args.images, args.image_size)
    mb = next(st.minibatches(args.mini_batch_size, torch.Generator().manual_seed(0)))
    policy.train()
    ppo_cfg = PPOConfig(mini_batch_size=args.mini_batch_size)

    def step() -> None:
        if args.measure == "bare":
            loss = bare_loss(policy, mb)
        else:
            out = policy(mb, with_kl=True)  # an update's first minibatch also runs the reference forward
            loss, _ = ppo_loss(out, mb, ppo_cfg, 0.0)
        loss.backward()
        for p in policy.parameters():
            p.grad = None

    peak = _peak_above_start(step, policy.device)
    enc = policy._encode(mb.prompts, mb.images)
    shapes = {
        "B": len(mb),
        "P": int(enc["input_ids"].shape[1]),
        "R": max(len(g) for g in mb.generated_ids),
        "images": max(len(im) for im in mb.images),
        "pixel_values": int(enc["pixel_values"].numel()) // max(1, sum(len(im) for im in mb.images))
        if "pixel_values" in enc
        else 0,
    }
    print(json.dumps({"kind": args.measure, "peak": peak, "device": str(policy.device), **shapes}))


def memory_rows(args: argparse.Namespace) -> list[dict]:
    """Run :func:`measure` for the bare and the PPO step, each in a fresh process."""
    rows = []
    for kind in ("bare", "ppo"):
        cmd = [sys.executable, __file__, "--measure", kind] + [a for a in sys.argv[1:]]
        env = {**os.environ, **memory.HONEST_MALLOC_ENV, "OMP_NUM_THREADS": str(args.threads)}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"memory measurement ({kind}) failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def formula_bytes(args: argparse.Namespace, row: dict) -> float:
    """``a2c_ppo_acktr.memory``'s update total for the measured PPO step's shapes (float32, no DeepSpeed)."""
    cfg = ModelConfig(model_path=args.model_path, gradient_checkpointing=args.gradient_checkpointing)
    dims = memory.model_dims(cfg)
    shapes = memory.Shapes(
        batch=row["B"],
        prompt_tokens=row["P"],
        response_tokens=row["R"],
        padded=row["B"] > 1,
        num_envs=row["B"],
        images=row["images"],
        image_tokens=0,
        pixel_values=row["pixel_values"],
        text_tokens=0,
        text_exact=True,
    )
    setup = memory.Setup(
        dtype_bytes=4,
        lora_bytes=4,
        zero_stage=0,
        gpus=1,
        gradient_checkpointing=args.gradient_checkpointing,
        reduce_bucket_elements=0,
        lora_r=cfg.lora_r,
    )
    heads = memory.head_params(dims.hidden, cfg.value_head_hidden, cfg.temp_head_hidden, cfg.use_temp_predictor)
    return memory.totals(memory.estimate(dims, shapes, setup, heads=heads))["update"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_policy_args(ap)
    ap.add_argument("--num-steps", type=int, default=2)
    ap.add_argument("--mini-batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for the memory rows (timings stay on CPU)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--skip-timing", action="store_true", help="only the memory table")
    ap.add_argument("--measure", choices=["bare", "ppo"], help=argparse.SUPPRESS)  # child process
    args = ap.parse_args()
    if args.measure:
        measure(args)
        return
    print(
        f"\nbench_ppo_update: {args.model_path}, {args.images} images {args.image_size}px, {args.max_new_tokens} new "
        "tokens, "
        f"mini_batch_size={args.mini_batch_size}, gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'}, "
        f"threads={args.threads}"
    )
    if not args.skip_timing:
        timing(args)
    rows = memory_rows(args)
    bare, ppo = rows
    predicted = formula_bytes(args, ppo)
    unit = "RSS" if ppo["device"] == "cpu" else "max_memory_allocated"
    print(
        f"\nPeak memory above the start of one minibatch step (fresh process each, {unit}, {ppo['device']}; "
        f"B={ppo['B']} turns x {ppo['P']} prompt + {ppo['R']} generated tokens):\n"
    )
    print("| step | peak MiB | vs bare |")
    print("|---|---|---|")
    print(f"| bare forward+backward (full logits) | {bare['peak'] / 2**20:.1f} | 1.00x |")
    print(
        f"| PPO update minibatch (+ reference forward, heads, chunked log-probs) | {ppo['peak'] / 2**20:.1f} | "
        f"{ppo['peak'] / bare['peak']:.2f}x |"
    )
    print(
        f"| formula (python -m a2c_ppo_acktr.memory, update total) | {predicted / 2**20:.1f} | "
        f"{predicted / bare['peak']:.2f}x |"
    )


def timing(args: argparse.Namespace) -> None:
    policy = load_policy(args)
    st = collect(policy, args.num_envs, args.num_steps, args.images, args.image_size)
    rss_rollout = peak_rss_mb()
    cfg = PPOConfig(ppo_epochs=args.epochs, mini_batch_size=args.mini_batch_size, lr=1e-5)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.lr)
    ppo = PPO(policy, opt, cfg, seed=0)  # the reference forward on every update
    # As training runs it: the first update measures losses/kl_ref, the timed ones do not.
    ppo_monitor = PPO(policy, opt, cfg, seed=0, kl_ref_interval=10**9)
    policy.train()

    bare_epochs(policy, st, cfg, opt, seed=0)  # warm-up (allocator, optimizer state)
    rss_bare = peak_rss_mb()
    metrics = {}
    ppo.update(st)
    ppo_monitor.update(st)
    rss_ppo = peak_rss_mb()
    t_bare, t_ppo, t_monitor = best_interleaved(
        [
            lambda: bare_epochs(policy, st, cfg, opt, seed=0),
            lambda: metrics.update(ppo.update(st)),
            lambda: ppo_monitor.update(st),
        ],
        args.repeats,
        warmup=False,  # all ran once just above (peak-memory readings)
    )

    n_mb = args.epochs * args.num_envs * args.num_steps // args.mini_batch_size
    print(
        f"\n{args.num_envs} envs x {args.num_steps} steps, epochs={args.epochs} ({n_mb} minibatches), best of "
        f"{args.repeats} (interleaved)\n"
    )
    print("| what | wall s | s / minibatch | ratio |")
    print("|---|---|---|---|")
    print(f"| bare forward+backward+step | {t_bare:.3f} | {t_bare / n_mb:.3f} | 1.00x |")
    print(
        f"| PPO.update (reference forward on every update) | {t_ppo:.3f} | {t_ppo / n_mb:.3f} | {t_ppo / t_bare:.2f}x |"
    )
    print(
        f"| PPO.update (log.kl_ref_interval=10: an update without it) | {t_monitor:.3f} | {t_monitor / n_mb:.3f} | "
        f"{t_monitor / t_bare:.2f}x |"
    )
    print(
        f"\nprocess peak RSS: after rollout {rss_rollout:.0f} MB, after one bare pass {rss_bare:.0f} MB, after one PPO "
        f"update {rss_ppo:.0f} MB"
    )
    print("last update:", {k: round(v, 4) for k, v in metrics.items()})


if __name__ == "__main__":
    main()

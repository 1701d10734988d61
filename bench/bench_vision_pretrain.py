"""Vision pre-training of the tiny model: which image facts it learns, from which mix, in how many steps.

Each row builds the default tiny Qwen2.5-VL spec (16 visual tokens per frame, white -> 0) with the
reply-format pretraining, then runs ``tiny_vision.pretrain_vision`` on the chosen tasks with the given
steps and learning rate, and probes held-out renders greedily: exact-answer accuracy with the frames
and with every frame zeroed (the same tokens), next to the best constant answer. Seeded, one thread.

    .venv/bin/python bench/bench_vision_pretrain.py [--tasks numberline left_right present]
        [--steps 1000] [--lr 3e-4] [--scenes 40] [--probe-scenes 20]

A row takes about 80 s per 1000 steps on one core. The embedded default is ``--tasks numberline
--steps 1000 --lr 3e-4``. ``--then TASK... --then-steps N`` continues from the first stage's weights
with a second stage on other tasks (``--then-balanced`` draws its batches evenly over them), and the
probe covers both stages' tasks: whether a second task is learned on top of a first, and what it costs
the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import torch

from a2c_ppo_acktr.tiny import build as tiny, vision as tiny_vision


def run(
    tasks: list[str],
    steps: int,
    lr: float,
    scenes: int,
    probe_scenes: int,
    seed: int = 0,
    reply_steps: int | None = None,
    pixels: int | None = None,
    image_size: int | None = None,
    text_per_batch: int | None = None,
    balanced: bool = False,
    then_tasks: list[str] | None = None,
    then_steps: int = 0,
    then_balanced: bool = False,
) -> list[dict]:
    """Build, pre-train and probe one model; one dict per probed task (``reply_steps``: the
    reply-format pretraining's steps, default the spec's; ``pixels``: the processor's frame side,
    default the spec's 112, i.e. 16 visual tokens; ``image_size``: the frames' side, default 64;
    ``text_per_batch``: reply-format rows per batch, default the spec's)."""
    from transformers import AutoModelForImageTextToText

    spec = dataclasses.replace(tiny.tiny_spec("qwen2_5_vl"), vision_pretrain_steps=0)
    if pixels is not None:
        spec = dataclasses.replace(spec, min_pixels=pixels * pixels, max_pixels=pixels * pixels)
    if image_size is not None:
        spec = dataclasses.replace(spec, vision_image_size=image_size)
    if text_per_batch is not None:
        spec = dataclasses.replace(spec, vision_text_per_batch=text_per_batch)
    if reply_steps is not None:
        spec = dataclasses.replace(spec, pretrain_steps=reply_steps)
    tokenizer = tiny.build_tokenizer(spec, tiny.training_corpus())
    processor = tiny.build_processor(spec, tokenizer)
    train = tiny_vision.training_samples(spec.vision_image_size, scenes, tasks)
    held = tiny_vision.probe_samples(spec.vision_image_size, probe_scenes, tasks)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(tiny.build_config(spec, tokenizer), dtype=torch.float32)
        tiny.pretrain_reply_format(model, tokenizer, spec, tiny.training_corpus(), seed)
        t0 = time.perf_counter()
        text_docs = tiny.reply_documents(tokenizer, tiny.training_corpus())
        stages = [(train, steps, balanced)]
        if then_tasks:  # a second stage from the first's weights; the probe covers its new tasks too
            more = tiny_vision.training_samples(spec.vision_image_size, scenes, then_tasks)
            stages.append((more, then_steps, then_balanced))
            train = train + [s for s in more if s.task not in tasks]
            held = held + [
                s
                for s in tiny_vision.probe_samples(spec.vision_image_size, probe_scenes, then_tasks)
                if s.task not in tasks
            ]
        for k, (samples, stage_steps, stage_balanced) in enumerate(stages):
            losses = tiny_vision.pretrain_vision(
                model,
                processor,
                samples,
                steps=stage_steps,
                batch_size=spec.vision_pretrain_batch_size,
                lr=lr,
                seed=seed + k,
                text_docs=text_docs,
                text_per_batch=spec.vision_text_per_batch,
                balance_tasks=stage_balanced,
            )
        seconds = time.perf_counter() - t0
    torch.set_num_threads(1)
    sighted = tiny_vision.probe(model, processor, held)
    zeroed = tiny_vision.probe(model, processor, held, zero_images=True)
    fit = tiny_vision.probe(model, processor, train[:: max(1, len(train) // 200)])
    chance = tiny_vision.chance_levels(held)
    window = min(20, len(losses)) or 1
    return [
        {
            "task": t,
            "train_samples": sum(s.task == t for s in train),
            "held_out": sum(s.task == t for s in held),
            "chance": chance[t],
            "fit": fit.get(t, float("nan")),
            "accuracy": sighted[t],
            "zeroed": zeroed[t],
            "loss_last": sum(losses[-window:]) / window if losses else float("nan"),
            "seconds": seconds,
        }
        for t in sorted(sighted)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(tiny_vision.TASKS), choices=tiny_vision.ALL_TASKS)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--scenes", type=int, default=40, help="procedural training scenes for the room tasks")
    p.add_argument("--probe-scenes", type=int, default=20, help="held-out procedural scenes for the room tasks")
    p.add_argument(
        "--pixels",
        type=int,
        default=None,
        help="processor frame side (default the spec's 112: 16 visual tokens; 224: 64)",
    )
    p.add_argument("--image-size", type=int, default=None, help="frame side the envs draw (default the spec's 64)")
    p.add_argument(
        "--text-per-batch", type=int, default=None, help="reply-format rows per batch (default the spec's 4)"
    )
    p.add_argument(
        "--then",
        nargs="+",
        default=[],
        choices=tiny_vision.ALL_TASKS,
        help="a second stage's tasks, from the first's weights",
    )
    p.add_argument("--then-steps", type=int, default=1000)
    p.add_argument("--then-balanced", action="store_true", help="the second stage's batches evenly over its tasks")
    p.add_argument(
        "--balanced",
        action="store_true",
        help="each batch's rows evenly over the tasks (default: uniform over the pooled samples)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = run(
        args.tasks,
        args.steps,
        args.lr,
        args.scenes,
        args.probe_scenes,
        pixels=args.pixels,
        image_size=args.image_size,
        text_per_batch=args.text_per_batch,
        balanced=args.balanced,
        then_tasks=args.then,
        then_steps=args.then_steps,
        then_balanced=args.then_balanced,
    )
    then = f", then {args.then} for {args.then_steps} steps" if args.then else ""
    then += " (balanced)" if args.then and args.then_balanced else ""
    print(
        f"vision pre-training on {args.tasks}{' (balanced batches)' if args.balanced else ''}, {args.steps} steps at "
        f"lr {args.lr:g}{then}, batch 16 + text rows "
        f"{args.text_per_batch}, pixels {args.pixels}, image size {args.image_size} (None: the spec's); "
        f"{platform.machine()}, {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        "| task | train samples | held-out | best constant | fit (train) | held-out accuracy | zeroed frames | loss "
        "(last 20) | pre-training s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['task']} | {r['train_samples']} | {r['held_out']} | {r['chance']:.3f} | {r['fit']:.3f} | "
            f"{r['accuracy']:.3f} | "
            f"{r['zeroed']:.3f} | {r['loss_last']:.3f} | {r['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()

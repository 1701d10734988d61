"""Tiny offline VLMs: build time, size, load, forward and generate timings per family.

Prints a Markdown table. Each family is built fresh into a temporary directory (the build time is
that of a cache miss), then loaded through ``load_vlm`` and timed on a left-padded batch of two
prompts with one 224x224 frame each, and on a realistic prompt (system prompt, 9 frames).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_tiny.py [--repeats 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import numpy as np
import torch

from a2c_ppo_acktr.tiny import build as tiny
from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.policy.loading import forbidden_token_ids, load_vlm


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _batch(processor, prompts, frames):
    texts, images, i = [], [], 0
    for k, text in prompts:
        content = [{"type": "image"}] * k + [{"type": "text", "text": text}]
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": content}]
        texts.append(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        images.append(frames[i : i + k])
        i += k
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1 is steadiest on a shared CPU)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(9)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: the first build pays for lazy imports
        tiny.build_tiny_model(tiny.FAMILIES[0], tmp)
    for family in tiny.FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            path = tiny.build_tiny_model(family, tmp)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            loaded = load_vlm(ModelConfig(model_path=str(path), device="cpu"))
            load_s = time.perf_counter() - t0
        model, processor = loaded.model, loaded.processor
        params = sum(p.numel() for p in model.parameters())
        vision = sum(
            p.numel()
            for n, p in model.named_parameters()
            if any(k in n for k in ("visual", "vision_tower", "multi_modal_projector"))
        )
        batch = _batch(
            processor, [(1, "How many chairs are in this room? Look at every frame."), (1, "Count.")], frames
        )
        big = _batch(
            processor, [(9, "Question: How many chairs are in this room?\nAnswer with a single number.")], frames
        )
        bad = forbidden_token_ids(processor, model.config.get_text_config().vocab_size)
        with torch.no_grad():
            fwd = _median_ms(lambda: model(**batch), args.repeats)
            fwd_big = _median_ms(lambda: model(**big), args.repeats)

        def gen():
            model.generate(**batch, max_new_tokens=20, min_new_tokens=20, do_sample=True, suppress_tokens=bad)

        gen_ms = _median_ms(gen, max(3, args.repeats // 4))
        rows.append(
            (
                family,
                f"{params / 1e3:.0f}k ({vision / 1e3:.0f}k vision)",
                len(processor.tokenizer),
                f"{build_s:.2f}",
                f"{load_s:.2f}",
                tuple(batch["input_ids"].shape),
                f"{fwd:.1f}",
                tuple(big["input_ids"].shape),
                f"{fwd_big:.1f}",
                f"{gen_ms:.0f}",
            )
        )
    print(
        f"machine: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}, torch "
        f"{torch.__version__}\n"
    )
    print(
        "| family | params | tokenizer | build s | load s | batch | forward ms | 9-frame prompt | forward ms | "
        "generate 20 tok x2 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print("\ntargets: forward ~5 ms, generate 20 tokens ~50 ms")


if __name__ == "__main__":
    main()

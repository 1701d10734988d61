"""Rollout throughput of VLMPolicy.act on the tiny offline model.

Prints two tables:
1. batched ``act`` for N envs (one ``generate``) vs a loop of N one-env ``act`` calls (env-steps/s);
2. ``act`` wall time vs a bare batched ``generate`` on the same prompts (processor + generate +
   decode, with the same forbidden tokens suppressed).
All variants decode greedily, so they produce the same tokens and the times compare like for like
(sampled lengths differ from run to run); measurements are interleaved, best of ``--repeats``.
Plus the process's peak resident memory (``resource.getrusage``).

Usage: ``python bench/bench_rollout.py [--num-envs 8] [--images 4] [--max-new-tokens 32] [--repeats 3]``
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from common import add_policy_args, best_interleaved, load_policy, peak_rss_mb



def observations(n: int, images: int, size: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"images": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(images)],
         "text": f"Env {i}: how many chairs are in this room?" + " Look around." * (i % 3)}
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_policy_args(ap)
    args = ap.parse_args()
    policy = load_policy(args)
    obs = observations(args.num_envs, args.images, args.image_size, seed=0)
    rss_loaded = peak_rss_mb()

    texts, images = policy._prompts_and_images(obs, blind=False)
    gen_cfg = policy._generation_config(greedy=True)
    gen_cfg.suppress_tokens = policy.forbidden_ids.tolist()

    @torch.no_grad()
    def bare() -> list[str]:
        enc = policy._encode(texts, images)
        seqs = policy.model.generate(**enc, generation_config=gen_cfg)
        return policy.tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    def act_recompute() -> None:
        policy.cfg.rollout_log_probs = "recompute"
        try:
            policy.act(obs, greedy=True)
        finally:
            policy.cfg.rollout_log_probs = "generate"

    # Greedy everywhere: every variant produces the same tokens, so the times compare like for like.
    same = bare() == policy.act(obs, greedy=True).texts == [policy.act([o], greedy=True).texts[0] for o in obs]
    looped, t_act, t_bare, t_act_recompute = best_interleaved(
        [lambda: [policy.act([o], greedy=True) for o in obs], lambda: policy.act(obs, greedy=True), bare, act_recompute],
        args.repeats,
    )
    batched = t_act
    rss_act = peak_rss_mb()

    n = args.num_envs
    print(f"\nbench_rollout: {args.model_path}, {n} envs, {args.images} images {args.image_size}px each, "
          f"max_new_tokens={args.max_new_tokens}, threads={args.threads}, best of {args.repeats}\n")
    print("| mode | wall s / step | env-steps/s | speed-up |")
    print("|---|---|---|---|")
    print(f"| one env at a time (loop of {n} act) | {looped:.3f} | {n / looped:.1f} | 1.00x |")
    print(f"| batched act ({n} envs, one generate) | {batched:.3f} | {n / batched:.1f} | {looped / batched:.2f}x |")
    print()
    print("| what (greedy, same tokens) | wall s | ratio to bare generate |")
    print("|---|---|---|")
    print(f"| bare processor+generate+decode | {t_bare:.3f} | 1.00x |")
    print(f"| act (greedy, rollout_log_probs=generate) | {t_act:.3f} | {t_act / t_bare:.2f}x |")
    print(f"| act (greedy, rollout_log_probs=recompute) | {t_act_recompute:.3f} | {t_act_recompute / t_bare:.2f}x |")
    print(f"\nsame texts from batched act, bare generate and one-env act: {same}")
    print(f"peak RSS: after load {rss_loaded:.0f} MB, after act runs {rss_act:.0f} MB, at end {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()

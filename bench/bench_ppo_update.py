"""Cost of one PPO update vs a bare forward+backward over the same minibatches (tiny offline model).

The bare loop does what any trainer must do per minibatch: process the images and texts, forward
``[prompt | response]`` through the LoRA model, a summed token log-prob loss, backward, clip, step.
The PPO update adds the value/temperature heads, the clipped losses, the prompt-ids check and (once
per update, with ``kl_coef = 0``) a no-grad reference forward for the ``losses/kl_ref`` monitor.
Peak resident memory comes from ``resource.getrusage``.

Usage: ``python bench/bench_ppo_update.py [--num-envs 8] [--num-steps 2] [--mini-batch-size 4] [--epochs 2]``
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from common import add_policy_args, best_interleaved, load_policy, peak_rss_mb

from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.arguments import PPOConfig
from a2c_ppo_acktr.distributions import process_logits, token_log_probs
from a2c_ppo_acktr.model import VLMPolicy
from a2c_ppo_acktr.storage import RolloutStorage


def collect(policy: VLMPolicy, num_envs: int, num_steps: int, images: int, size: int) -> RolloutStorage:
    rng = np.random.default_rng(0)
    st = RolloutStorage(num_steps, num_envs)
    for t in range(num_steps):
        obs = [{"images": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(images)],
                "text": f"step {t} env {i}: how far is the bed from the sofa?" + " more" * i} for i in range(num_envs)]
        act = policy.act(obs)
        st.insert(act, torch.from_numpy(rng.normal(size=num_envs)).float(), torch.zeros(num_envs), torch.zeros(num_envs))
    st.compute_returns(torch.zeros(num_envs))
    return st


def bare_epochs(policy: VLMPolicy, st: RolloutStorage, cfg: PPOConfig, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = policy.trainable_parameters()
    for _ in range(cfg.ppo_epochs):
        for mb in st.minibatches(cfg.mini_batch_size, gen, cfg.norm_adv):
            enc = policy._encode(mb.prompts, mb.images)
            R = max(len(g) for g in mb.generated_ids)
            resp = torch.full((len(mb), R), policy.pad_id, dtype=torch.long)
            mask = torch.zeros(len(mb), R, dtype=torch.bool)
            for i, g in enumerate(mb.generated_ids):
                resp[i, : len(g)], mask[i, : len(g)] = g, True
            inputs = dict(enc)
            inputs["input_ids"] = torch.cat([enc["input_ids"], resp], 1)
            inputs["attention_mask"] = torch.cat([enc["attention_mask"], mask.long()], 1)
            if "mm_token_type_ids" in enc:
                inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(resp)], 1)
            logits = policy.model(**inputs, use_cache=False, logits_to_keep=R + 1).logits[:, :R]
            lp = token_log_probs(process_logits(logits, torch.ones(len(mb)), policy.forbidden_ids), resp)
            loss = -(lp * mask).sum(-1).mul(mb.advantages).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            opt.zero_grad()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_policy_args(ap)
    ap.add_argument("--num-steps", type=int, default=2)
    ap.add_argument("--mini-batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    policy = load_policy(args)
    st = collect(policy, args.num_envs, args.num_steps, args.images, args.image_size)
    rss_rollout = peak_rss_mb()
    cfg = PPOConfig(ppo_epochs=args.epochs, mini_batch_size=args.mini_batch_size, lr=1e-5)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.lr)
    ppo = PPO(policy, opt, cfg, seed=0)
    policy.train()

    bare_epochs(policy, st, cfg, opt, seed=0)  # warm-up (allocator, optimizer state)
    rss_bare = peak_rss_mb()
    metrics = {}
    ppo.update(st)
    rss_ppo = peak_rss_mb()
    t_bare, t_ppo = best_interleaved(
        [lambda: bare_epochs(policy, st, cfg, opt, seed=0), lambda: metrics.update(ppo.update(st))], args.repeats,
        warmup=False,  # both ran once just above (peak-memory readings)
    )

    n_mb = args.epochs * args.num_envs * args.num_steps // args.mini_batch_size
    print(f"\nbench_ppo_update: {args.model_path}, {args.num_envs} envs x {args.num_steps} steps, {args.images} images "
          f"{args.image_size}px, mini_batch_size={args.mini_batch_size}, epochs={args.epochs} ({n_mb} minibatches), "
          f"threads={args.threads}, best of {args.repeats} (interleaved)\n")
    print("| what | wall s | s / minibatch | ratio |")
    print("|---|---|---|---|")
    print(f"| bare forward+backward+step | {t_bare:.3f} | {t_bare / n_mb:.3f} | 1.00x |")
    print(f"| PPO.update | {t_ppo:.3f} | {t_ppo / n_mb:.3f} | {t_ppo / t_bare:.2f}x |")
    print(f"\npeak RSS: after rollout {rss_rollout:.0f} MB, after one bare pass {rss_bare:.0f} MB, after one PPO update {rss_ppo:.0f} MB")
    print("last update:", {k: round(v, 4) for k, v in metrics.items()})


if __name__ == "__main__":
    main()

"""Rollout throughput of VLMPolicy.act on the tiny offline model.

Prints two tables:
1. batched ``act`` for N envs (one ``generate``) vs a loop of N one-env ``act`` calls (env-steps/s);
2. ``act`` wall time vs a bare batched ``generate`` on the same prompts (processor + generate +
   decode, with the same forbidden tokens suppressed).
All variants decode greedily, so they produce the same tokens and the times compare like for like
(sampled lengths differ from run to run); measurements are interleaved, best of ``--repeats``.
3. where the time goes: processor, generate's set-up + prefill (first token) and the cost of one
   more decode step, for one env and for N envs, and what the speed-up of table 1 could be at most if
   the N-row processor + prefill cost no more than one row's (decoding alone).
Plus the process's peak resident memory (``resource.getrusage``).

Usage: ``python bench/bench_rollout.py [--num-envs 8] [--images 4] [--max-new-tokens 32] [--repeats 3]``
On a GPU: ``--device cuda --model-path DIR`` (bf16; DIR e.g. a random real-size build of
``python -m a2c_ppo_acktr.real_size --device cuda``).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from common import add_policy_args, best_interleaved, load_policy, peak_rss_mb, synchronised



def observations(n: int, images: int, size: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"images": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(images)],
         "text": f"Env {i}: how many chairs are in this room?" + " Look around." * (i % 3)}
        for i in range(n)
    ]


def cost_parts(policy, obs: list[dict], repeats: int, steps: int = 32) -> tuple[float, float, float]:
    """(processor s, generate set-up + prefill + first token s, s per further decode step) for one
    batch, timed with EOS replaced by a forbidden id so that every call decodes exactly ``steps``."""
    texts, images = policy._prompts_and_images(obs, blind=False)
    enc = policy._encode(texts, images)
    never = int(policy.forbidden_ids[0])  # suppressed, so never generated: fixed-length decoding

    def gen(n: int):
        cfg = policy._generation_config(greedy=True)
        cfg.max_new_tokens, cfg.eos_token_id = n, never
        cfg.suppress_tokens = policy.forbidden_ids.tolist()
        return torch.no_grad()(lambda: policy.model.generate(**enc, generation_config=cfg))

    t_enc, t_first, t_all = best_interleaved([synchronised(f) for f in (lambda: policy._encode(texts, images), gen(1), gen(steps))], repeats)
    return t_enc, t_first, (t_all - t_first) / (steps - 1)


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
        [synchronised(f) for f in (lambda: [policy.act([o], greedy=True) for o in obs], lambda: policy.act(obs, greedy=True), bare, act_recompute)],
        args.repeats,
    )
    batched = t_act
    rss_act = peak_rss_mb()
    lengths = [len(g) for g in policy.act(obs, greedy=True).generated_ids]
    one = [cost_parts(policy, [o], args.repeats) for o in obs]
    enc_n, first_n, step_n = cost_parts(policy, obs, args.repeats)

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
    enc_1, first_1, step_1 = (float(np.mean(c)) for c in zip(*one))
    loop_model = sum(e + f + (n_tok - 1) * s for (e, f, s), n_tok in zip(one, lengths))
    batch_model = enc_n + first_n + (max(lengths) - 1) * step_n
    bound = loop_model / (enc_1 + first_1 + (max(lengths) - 1) * step_n)
    print()
    print(f"where the time goes (reply lengths {lengths}: the loop decodes {sum(lengths)} tokens, "
          f"the batch {max(lengths)} steps of {n} rows)")
    print()
    print("| part | one env (mean) | {n} envs | per row in the batch |".replace("{n}", str(n)))
    print("|---|---|---|---|")
    print(f"| processor (tokenize, {args.images} frames/env) | {enc_1 * 1e3:.1f} ms | {enc_n * 1e3:.1f} ms | {enc_n / n * 1e3:.1f} ms |")
    print(f"| generate set-up + prefill + first token | {first_1 * 1e3:.1f} ms | {first_n * 1e3:.1f} ms | {first_n / n * 1e3:.1f} ms |")
    print(f"| one more decode step | {step_1 * 1e3:.2f} ms | {step_n * 1e3:.2f} ms | {step_n / n * 1e3:.2f} ms |")
    print(f"\nmodelled from the parts: loop {loop_model:.3f} s, batch {batch_model:.3f} s ({loop_model / batch_model:.2f}x); "
          f"at most {bound:.2f}x if the batch's processor + prefill cost no more than one row's")
    print(f"\nsame texts from batched act, bare generate and one-env act: {same}")
    print(f"peak RSS: after load {rss_loaded:.0f} MB, after act runs {rss_act:.0f} MB, at end {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()

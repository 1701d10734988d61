"""Rollout throughput of VLMPolicy.act on the tiny offline model.

Prints five tables:
1. batched ``act`` for N envs (one ``generate``) vs a loop of N one-env ``act`` calls (env-steps/s);
2. ``act`` wall time vs a bare batched ``generate`` on the same prompts (processor + generate +
   decode, with the same forbidden tokens suppressed).
All variants decode greedily, so they produce the same tokens and the times compare like for like
(sampled lengths differ from run to run); measurements are interleaved, best of ``--repeats``.
3. where the time goes: processor, the vision tower on the batch's frames, generate's set-up +
   language-model prefill + first token, the cost of one more decode step, the re-scoring forward of
   ``model.rollout_log_probs=recompute`` and the value forward of a GAE bootstrap, for one env and
   for N envs, and what the speed-up of table 1 could be at most if the N-row processor + prefill
   cost no more than one row's (decoding alone);
4. ``act`` per decoded position against a bare sampled ``generate`` (temperature 1, no processor):
   ``real_size_probe.decode_timing``, the check the GPU smoke test's real-size stage runs (goal 1.15x);
5. an episode's turns, each prompt repeating the env's sweep frames with a new view: ``act`` per
   turn and the frames the tower encodes, with the tower's outputs kept for the episode
   (``VLMPolicy.vision_cache``, ``model.vision_cache_images``) and without.
Plus the process's peak resident memory (``resource.getrusage``).

Usage: ``python bench/bench_rollout.py [--num-envs 8] [--images 4] [--max-new-tokens 32] [--repeats 3]``
On a GPU: ``--device cuda --model-path DIR`` (bf16; DIR e.g. a random real-size build of
``python -m a2c_ppo_acktr.real_size --device cuda``).
"""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import torch

from a2c_ppo_acktr import real_size_probe
from common import add_policy_args, best_interleaved, load_policy, peak_rss_mb, synchronised

EPISODE_TURNS = 4


def observations(n: int, images: int, size: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "images": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(images)],
            "text": f"Env {i}: how many chairs are in this room?" + " Look around." * (i % 3),
        }
        for i in range(n)
    ]


def episode_turn(n: int, images: int, size: int, turn: int) -> list[dict]:
    """Turn ``turn`` of n envs' episodes: ``images - 1`` sweep frames fixed per env, then this turn's view."""

    def frame(seed: int) -> np.ndarray:
        return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)

    return [
        {
            "images": [frame(1000 * i + k) for k in range(images - 1)] + [frame(10**6 + 100 * i + turn)],
            "text": f"Env {i}: how far is the sofa from the door? Turn {turn}.",
        }
        for i in range(n)
    ]


def cost_parts(policy, obs: list[dict], repeats: int, steps: int = 32) -> dict[str, float]:
    """Seconds of one batch's parts: ``processor``, ``tower`` (the vision encoder on the batch's
    frames), ``prefill`` (generate's set-up, the language model's prefill and first token: generate
    of one token less the tower), ``step`` (one more decode step, timed with EOS replaced by a
    forbidden id so that every call decodes exactly ``steps``), ``recompute`` (the re-scoring
    forward of a ``steps``-token reply) and ``values`` (the value forward of a GAE bootstrap)."""
    texts, images = policy._prompts_and_images(obs, blind=False)
    enc = policy._encode(texts, images)
    never = int(policy.forbidden_ids[0])  # suppressed, so never generated: fixed-length decoding

    def gen(n: int):
        cfg = policy.sampler.generation_config(greedy=True)
        cfg.max_new_tokens, cfg.eos_token_id = n, never
        cfg.suppress_tokens = policy.forbidden_ids.tolist()
        return torch.no_grad()(lambda: policy.model.generate(**enc, generation_config=cfg))

    encoder = policy.base_model.model.get_image_features
    tower_inputs = {k: enc[k] for k in inspect.signature(encoder).parameters if k in enc}
    generated = [row[enc["input_ids"].shape[1] :].cpu() for row in gen(steps)()]
    weights = [torch.ones(len(g)) for g in generated]

    @torch.no_grad()
    def recompute() -> None:
        policy._forward_turns(enc, generated, weights, with_kl=False)

    t_enc, t_tower, t_first, t_all, t_recompute, t_values = best_interleaved(
        [
            synchronised(f)
            for f in (
                lambda: policy._encode(texts, images),
                torch.no_grad()(lambda: encoder(**tower_inputs)),
                gen(1),
                gen(steps),
                recompute,
                lambda: policy.get_values(obs),
            )
        ],
        repeats,
    )
    return {
        "processor": t_enc,
        "tower": t_tower,
        "prefill": t_first - t_tower,
        "step": (t_all - t_first) / (steps - 1),
        "recompute": t_recompute,
        "values": t_values,
    }


def episode_costs(policy, n: int, images: int, size: int, repeats: int) -> list[tuple[float, float, int]]:
    """Per turn of an :data:`EPISODE_TURNS`-turn episode: (greedy ``act`` s without the tower's
    outputs kept, with them kept since the episode's first turn, frames the tower encoded with);
    the two episodes alternate, best of ``repeats`` per turn."""
    turns = [episode_turn(n, images, size, t) for t in range(EPISODE_TURNS)]
    plain: list[list[float]] = [[] for _ in turns]
    kept: list[list[float]] = [[] for _ in turns]
    encoded = [n * images] * len(turns)
    policy.act(turns[0], greedy=True)  # warm-up

    def plain_episode() -> None:
        for t, o in enumerate(turns):
            plain[t].append(
                best_interleaved([synchronised(lambda o=o: policy.act(o, greedy=True))], 1, warmup=False)[0]
            )

    def kept_episode() -> None:
        with policy.vision_cache() as cache:
            for t, o in enumerate(turns):
                before = cache.misses if cache is not None else 0
                kept[t].append(
                    best_interleaved([synchronised(lambda o=o: policy.act(o, greedy=True))], 1, warmup=False)[0]
                )
                if cache is not None:
                    encoded[t] = cache.misses - before

    for r in range(repeats):  # the order alternates, so neither episode always runs on a warmer machine
        for episode in (plain_episode, kept_episode) if r % 2 == 0 else (kept_episode, plain_episode):
            episode()
    return [(min(p), min(k), e) for p, k, e in zip(plain, kept, encoded)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_policy_args(ap)
    args = ap.parse_args()
    policy = load_policy(args)
    obs = observations(args.num_envs, args.images, args.image_size, seed=0)
    rss_loaded = peak_rss_mb()

    texts, images = policy._prompts_and_images(obs, blind=False)
    gen_cfg = policy.sampler.generation_config(greedy=True)
    gen_cfg.suppress_tokens = policy.forbidden_ids.tolist()

    @torch.no_grad()
    def bare() -> list[str]:
        enc = policy._encode(texts, images)
        seqs = policy.model.generate(**enc, generation_config=gen_cfg)
        return policy.tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)

    def act_recompute() -> None:
        policy.cfg.rollout_log_probs = "recompute"
        try:
            policy.act(obs, greedy=True)
        finally:
            policy.cfg.rollout_log_probs = "generate"

    # Greedy everywhere: every variant produces the same tokens, so the times compare like for like.
    same = bare() == policy.act(obs, greedy=True).texts == [policy.act([o], greedy=True).texts[0] for o in obs]
    looped, t_act, t_bare, t_act_recompute = best_interleaved(
        [
            synchronised(f)
            for f in (
                lambda: [policy.act([o], greedy=True) for o in obs],
                lambda: policy.act(obs, greedy=True),
                bare,
                act_recompute,
            )
        ],
        args.repeats,
    )
    batched = t_act
    rss_act = peak_rss_mb()
    lengths = [len(g) for g in policy.act(obs, greedy=True).generated_ids]
    one = [cost_parts(policy, [o], args.repeats) for o in obs]
    parts_n = cost_parts(policy, obs, args.repeats)
    sampled = real_size_probe.decode_timing(policy, obs)
    episode = episode_costs(policy, args.num_envs, args.images, args.image_size, args.repeats)

    n = args.num_envs
    print(
        f"\nbench_rollout: {args.model_path}, {n} envs, {args.images} images {args.image_size}px each, "
        f"max_new_tokens={args.max_new_tokens}, threads={args.threads}, {args.device} {policy.base_model.dtype}, best "
        f"of {args.repeats}\n"
    )
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
    one_mean = {k: float(np.mean([c[k] for c in one])) for k in parts_n}
    first_1, first_n = one_mean["tower"] + one_mean["prefill"], parts_n["tower"] + parts_n["prefill"]
    loop_model = sum(
        c["processor"] + c["tower"] + c["prefill"] + (n_tok - 1) * c["step"] for c, n_tok in zip(one, lengths)
    )
    batch_model = parts_n["processor"] + first_n + (max(lengths) - 1) * parts_n["step"]
    bound = loop_model / (one_mean["processor"] + first_1 + (max(lengths) - 1) * parts_n["step"])
    print()
    print(
        f"where the time goes (reply lengths {lengths}: the loop decodes {sum(lengths)} tokens, "
        f"the batch {max(lengths)} steps of {n} rows)"
    )
    print()
    print("| part | one env (mean) | {n} envs | per row in the batch |".replace("{n}", str(n)))
    print("|---|---|---|---|")
    names = {
        "processor": f"processor (tokenize, {args.images} frames/env)",
        "tower": "vision tower (the frames)",
        "prefill": "generate set-up + language-model prefill + first token",
        "step": "one more decode step",
        "recompute": "re-scoring forward, 32-token replies (rollout_log_probs=recompute)",
        "values": "value forward (GAE bootstrap)",
    }
    for key, name in names.items():
        digits = 2 if key == "step" else 1
        print(
            f"| {name} | {one_mean[key] * 1e3:.{digits}f} ms | {parts_n[key] * 1e3:.{digits}f} ms | "
            f"{parts_n[key] / n * 1e3:.{digits}f} ms |"
        )
    print(
        f"\nmodelled from the parts: loop {loop_model:.3f} s, batch {batch_model:.3f} s "
        f"({loop_model / batch_model:.2f}x); "
        f"at most {bound:.2f}x if the batch's processor + prefill cost no more than one row's"
    )
    print()
    print("| sampled, T=1 (real_size_probe.decode_timing) | s | positions | ms per position |")
    print("|---|---|---|---|")
    print(f"| act | {sampled.act_seconds:.3f} | {sampled.act_positions} | {sampled.act_per_token * 1e3:.2f} |")
    print(
        f"| bare generate | {sampled.bare_seconds:.3f} | {sampled.bare_positions} | {sampled.bare_per_token * 1e3:.2f} "
        "|"
    )
    print(f"| act / bare | | | {sampled.ratio:.2f}x |")
    print()
    print(f"an episode's turns ({args.images - 1} sweep frames per env repeated every turn, one new view; greedy act):")
    print()
    print("| turn | act s, tower on every frame | act s, tower outputs kept | speed-up | frames encoded (kept) |")
    print("|---|---|---|---|---|")
    for t, (plain, kept, encoded) in enumerate(episode):
        print(f"| {t} | {plain:.3f} | {kept:.3f} | {plain / kept:.2f}x | {encoded} of {n * args.images} |")
    print(f"\nsame texts from batched act, bare generate and one-env act: {same}")
    print(f"peak RSS: after load {rss_loaded:.0f} MB, after act runs {rss_act:.0f} MB, at end {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()

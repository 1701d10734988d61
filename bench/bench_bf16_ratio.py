"""The first PPO ratio in bf16 on the tiny model, with lm_head's logits in float32 (the code's) and
rounded to bf16 (what a plain bf16 ``lm_head`` gives): every turn of a 2-env x 4-step rollout
re-scored before any update (``gpu_smoke.ratio_check``), per temperature setting.

Prints a Markdown table: turns, the largest ``|ratio - 1|``, the share of turns above 1e-2, and the
share outside the clip range ``[1 - clip, 1 + clip]`` (turns that start an epoch clipped give no
gradient).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_bf16_ratio.py [--seeds 16] [--clip 0.1]
"""

from __future__ import annotations

import argparse
import platform
import statistics

from a2c_ppo_acktr.policy import model as model_module
from a2c_ppo_acktr.gpu_smoke import TEMPERATURE_SETTINGS, TYPICAL_DEV, ratio_check


def measure(seeds: int, head: str) -> dict[str, list[float]]:
    """Per temperature setting, every turn's ``|ratio - 1|`` over ``seeds`` seeds with ``head``'s logits."""
    original = model_module.float32_logits
    if head == "bf16":
        model_module.float32_logits = lambda module: None
    try:
        return {
            name: [
                d
                for s in range(seeds)
                for d in ratio_check("cpu", "bfloat16", model_overrides=temps, setting=name, seed=s).turn_devs
            ]
            for name, temps in TEMPERATURE_SETTINGS.items()
        }
    finally:
        model_module.float32_logits = original


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--clip", type=float, default=0.1, help="ppo.clip_coef of the GPU presets")
    args = p.parse_args()
    rows = []
    for head in ("float32", "bf16"):
        for name, devs in measure(args.seeds, head).items():
            rows.append(
                f"| {head} | {name} | {len(devs)} | {max(devs):.3g} | "
                f"{statistics.mean(d > TYPICAL_DEV for d in devs):.1%} "
                f"| {statistics.mean(d > args.clip for d in devs):.1%} |"
            )
    print(
        f"# bf16 first-minibatch ratio, tiny model on CPU ({args.seeds} seeds; {platform.machine()}, python "
        f"{platform.python_version()})\n"
    )
    print(
        f"| lm_head logits | temperature setting | turns | max abs(ratio-1) | turns > {TYPICAL_DEV:g} | turns outside "
        f"clip {args.clip:g} |"
    )
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

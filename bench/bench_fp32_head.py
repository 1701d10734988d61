"""The float32 ``lm_head``'s cost per decoded token, with and without its weight cast cached for the
call (``temp_predictor.float32_weight_cache``, which ``act`` opens around ``generate``).

A bf16 policy computes its logits in float32 (``model.float32_logits``): ``x.float() @ W.float().T``.
Without a cache the ``V x H`` cast of ``W`` happens at every decoded token; at Qwen's 151,936-row
vocabulary that cast is a large share of a decode step on a narrow model. This builds (or reuses) a
reduced real-vocabulary proxy of a GPU preset's architecture (``python -m a2c_ppo_acktr.real_size``)
and times ``act`` both ways, interleaved, on the same prompts and seeds; it also checks that both
sample the same tokens with bitwise the same log-probs.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_fp32_head.py [--hidden 128 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def build(preset: str, hidden: int, out: Path) -> Path:
    if not (out / "real_size_build.json").is_file():
        cmd = [
            sys.executable,
            "-m",
            "a2c_ppo_acktr.real_size",
            "--preset",
            preset,
            "--out",
            str(out),
            "--dtype",
            "bfloat16",
            "--text-layers",
            "2",
            "--vision-blocks",
            "2",
            "--hidden",
            str(hidden),
            "--vision-hidden",
            "160",
        ]
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return out


def measure(model_path: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.envs.batch import VSIBatchEnv
    from a2c_ppo_acktr.policy import model as policy_model
    from a2c_ppo_acktr.policy import sampling
    from a2c_ppo_acktr.policy.loading import load_vlm

    overrides = {
        "model": {
            "model_path": str(model_path),
            "device": "cpu",
            "dtype": "bfloat16",
            "max_new_tokens": args.max_new_tokens,
            "attn_implementation": "sdpa",
        },
        "env": {"image_size": 112},
        "rollout": {"num_envs": args.num_envs},
    }
    run = load_config(config=str(REPO / "configs/envs/numberline.yaml"), preset=args.preset, overrides=overrides)
    torch.manual_seed(0)
    policy = policy_model.VLMPolicy(run.model, load_vlm(run.model))
    obs = VSIBatchEnv(run.env, args.num_envs, seed=0).reset()
    cached = sampling.float32_weight_cache
    per_token: dict[str, list[float]] = {"per token": [], "per call": []}
    policy.act(obs)  # warm-up
    try:
        for rep in range(args.repeats):
            outs = {}
            for name, cache in (("per token", lambda module: contextlib.nullcontext()), ("per call", cached)):
                sampling.float32_weight_cache = cache
                torch.manual_seed(rep)
                t0 = time.perf_counter()
                outs[name] = policy.act(obs)
                per_token[name].append((time.perf_counter() - t0) / max(len(g) for g in outs[name].generated_ids))
            a, b = outs["per token"], outs["per call"]
            if [g.tolist() for g in a.generated_ids] != [g.tolist() for g in b.generated_ids] or not all(
                torch.equal(x, y) for x, y in zip(a.token_log_probs, b.token_log_probs)
            ):
                raise SystemExit("bench_fp32_head: the cached cast changed the sampled tokens or their log-probs")
    finally:
        sampling.float32_weight_cache = cached
    return per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-vl-3b")
    ap.add_argument("--hidden", type=int, nargs="+", default=[128, 512], help="proxy text widths (multiples of 128)")
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--model-dir", default=None, help="keep the proxies under this directory (default: a temporary one)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(args.model_dir) if args.model_dir else Path(tempfile.mkdtemp(prefix="fp32_head."))
    print(
        f"| proxy of {args.preset} (2 layers, 151,936 rows, bf16) | lm_head cast | ms per decoded position (best of "
        f"{args.repeats}) | speed-up |"
    )
    print("|---|---|---|---|")
    for hidden in args.hidden:
        times = measure(build(args.preset, hidden, root / f"h{hidden}"), args)
        before, after = min(times["per token"]), min(times["per call"])
        print(
            f"| width {hidden}, {args.num_envs} envs x {args.max_new_tokens} tokens | per token (before) | "
            f"{before * 1e3:.1f} | |"
        )
        print(
            f"| width {hidden}, {args.num_envs} envs x {args.max_new_tokens} tokens | once per generate (after) | "
            f"{after * 1e3:.1f} | {before / after:.2f}x |"
        )
    print("(same tokens and bitwise the same log-probs both ways)")


if __name__ == "__main__":
    main()

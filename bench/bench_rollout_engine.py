"""The rollout-engine seam on CPU: one batched turn through ``VLMPolicy.act`` with the in-process HF
engine, against the same turn through a vLLM-protocol server (the loopback server of
``a2c_ppo_acktr/policy/loopback_server.py``, backed by the same tiny model) with 1 and N requests in flight.

    .venv/bin/python bench/bench_rollout_engine.py [--num-envs 8] [--images 4] [--image-size 224] [--repeats 5]

The loopback server decodes one request at a time on the CPU, so its rows cost what it adds per
turn (HTTP, PNG encoding of the frames, its own processor run and generate, the policy's prompt
forward and recompute), not what a real vLLM server on a GPU does: that is ``scripts/gpu_smoke.sh``
stage 3c's. Sampling is seeded (the same replies for every engine), so the rows compare equal work;
the last column is the largest ``|logp_engine - logp_policy|`` of the turn.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_policy_args, best_interleaved, load_policy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_args(ap)
    args = ap.parse_args()
    from a2c_ppo_acktr.common.vllm_compat import server_lora_rank
    from a2c_ppo_acktr.policy.loopback_server import LoopbackServer
    from a2c_ppo_acktr.policy.rollout_engine import VLLMServerEngine

    policy = load_policy(args)
    rng = np.random.default_rng(0)
    obs = [
        {
            "images": [
                rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8) for _ in range(args.images)
            ],
            "text": f"Question {n}: how many chairs are in the room?",
        }
        for n in range(args.num_envs)
    ]
    rows = []
    with (
        LoopbackServer(policy.cfg, max_lora_rank=server_lora_rank(policy.cfg.lora_r)) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        engines = {}
        for flight in (1, args.num_envs):
            eng = VLLMServerEngine(
                server.url,
                Path(tmp) / f"c{flight}",
                max_new_tokens=policy.cfg.max_new_tokens,
                stop_ids=policy.eos_ids,
                forbidden_ids=policy.forbidden_ids.tolist(),
                max_concurrency=flight,
                tag=f"bench{flight}",
            )
            eng.sync_adapter(policy.save_pretrained, 1)
            engines[flight] = eng
        gaps: dict[str, float] = {}

        def hf() -> None:
            torch.manual_seed(0)
            policy.act(obs)

        def through(flight: int):
            def run() -> None:
                torch.manual_seed(0)
                with policy.with_engine(engines[flight]):
                    out = policy.act(obs)
                gaps[f"vLLM protocol, loopback, {flight} in flight"] = float(
                    (out.engine_log_probs - out.log_probs).abs().max()
                )

            return run

        names = ["HF engine (in-process generate)"] + [f"vLLM protocol, loopback, {f} in flight" for f in engines]
        times = best_interleaved([hf, *(through(f) for f in engines)], args.repeats)
        for name, t in zip(names, times):
            rows.append((name, t, t / args.num_envs, t / times[0], gaps.get(name)))
    print(
        f"\n{args.num_envs} envs x {args.images} images of {args.image_size}px, max_new_tokens {args.max_new_tokens}, "
        f"{args.threads} thread(s), best of {args.repeats}; {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}\n"
    )
    print("| engine | s per batched turn | s per env turn | x HF engine | max abs(logp_engine - logp_policy) |")
    print("|---|---:|---:|---:|---:|")
    for name, t, per, ratio, gap in rows:
        print(f"| {name} | {t:.3f} | {per:.4f} | {ratio:.2f} | {'n/a' if gap is None else f'{gap:.2e}'} |")


if __name__ == "__main__":
    main()

"""Time the phases of PPO iterations (collect, advantages, update, checkpoint) and print a table.

    python bench/bench_train_phases.py [--preset debug] [--iterations 4] [--threads 1] [section.key=value ...]

Runs ``run_training`` in a temporary directory and summarises the ``time/*`` columns of its
``metrics.jsonl`` (the first iteration is reported apart: it includes warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="debug")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for the tiny model on a shared box)"
    )
    args, overrides = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.rl.train import run_training

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            preset=args.preset,
            overrides=[
                f"log.output_dir={out}",
                "log.progress_bar=false",
                f"ppo.num_iterations={args.iterations}",
                *overrides,
            ],
        )
        start = time.perf_counter()
        run_training(cfg)
        wall = time.perf_counter() - start
        rows = read_metrics(f"{out}/metrics.jsonl")
    keys = [
        "time/collect",
        "time/collect_act",
        "time/collect_env",
        "time/advantages",
        "time/update",
        "time/checkpoint",
        "time/iteration",
    ]
    print(
        f"preset={args.preset} envs={cfg.rollout.num_envs} steps={cfg.rollout.num_steps} "
        f"max_new_tokens={cfg.model.max_new_tokens} threads={args.threads} iterations={len(rows)} wall={wall:.1f}s "
        "(incl. model load)"
    )
    print(f"{'phase':<18}{'first (s)':>11}{'mean rest (s)':>15}{'min rest (s)':>14}")
    for k in keys:
        vals = [float(r[k]) for r in rows]
        rest = vals[1:] or vals
        print(f"{k:<18}{vals[0]:>11.3f}{statistics.mean(rest):>15.3f}{min(rest):>14.3f}")
    turns = cfg.rollout.batch_size
    mean_iter = statistics.mean([float(r["time/iteration"]) for r in rows[1:]] or [float(rows[0]["time/iteration"])])
    print(f"turns/s (collect+advantages+update, after the first iteration): {turns / mean_iter:.2f}")


if __name__ == "__main__":
    main()

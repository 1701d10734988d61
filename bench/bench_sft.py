"""SFT warm-start pipeline throughput and effect on the tiny model; prints a table.

    python bench/bench_sft.py [--episodes 32] [--steps 160] [--preset debug] [--question-types room_size_estimation]

Rows: oracle labelling (episodes/s, mean benchmark score), preprocessing (samples), collation
(samples/s), SFT training (steps/s, first and last logged loss) and the greedy valid-action rate on
held-out states before and after SFT. Model and sizes come from the preset; LoRA also adapts lm_head
(the tiny model's frozen random lm_head otherwise makes format learning very slow).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        help="greedy budget for the valid-rate check (a full reply is ~35 tiny-model tokens)",
    )
    parser.add_argument("--preset", default="debug")
    parser.add_argument("--out", default="/tmp/bench_sft")
    parser.add_argument(
        "--question-types", default=None, help="comma-separated env.question_types (default: the preset's)"
    )
    args = parser.parse_args()

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, make_env
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.common.prompts import Invalid, parse_action
    from a2c_ppo_acktr.labels.teachers import greedy_generate
    from SFT.data import SFTCollator, SFTDataset, build_sft_dataset
    from SFT.trainer import TRAIN_LOG, run_sft

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(
        preset=args.preset,
        overrides={
            "model": {
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_target_modules": (
                    r".*(language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)|lm_head)"
                ),
            },
            "label": {
                "out_dir": str(out / "labels"),
                "dataset_dir": str(out / "data"),
                "num_episodes": args.episodes,
                "val_fraction": 0.0,
            },
            "sft": {
                "data_path": str(out / "data"),
                "output_dir": str(out / "sft"),
                "max_steps": args.steps,
                "lr": args.lr,
                "per_device_batch_size": 4,
                "logging_steps": 5,
                "save_steps": 10**6,
                "warmup_ratio": 0.0,
            },
            "log": {"progress_bar": False},
            **({"env": {"question_types": args.question_types}} if args.question_types else {}),
        },
    )
    rows = []
    t = time.perf_counter()
    summary = label_trajectories(cfg)
    dt = time.perf_counter() - t
    rows.append(("label (oracle)", f"{args.episodes / dt:.2f} episodes/s", f"mean score {summary['mean_score']:.3f}"))
    stats = build_sft_dataset(out / "labels" / TRAJECTORIES, cfg.label.dataset_dir, cfg.label)
    rows.append(("preprocess", f"{stats['train_samples']} samples", f"{stats['episodes_kept']} episodes"))

    loaded = load_vlm(cfg.model)
    ds = SFTDataset(out / "data" / "train.jsonl")
    collator = SFTCollator(loaded.processor, cfg.sft.max_length)
    t = time.perf_counter()
    batch = collator([ds[i] for i in range(len(ds))])
    dt = time.perf_counter() - t
    rows.append(("collate", f"{len(ds) / dt:.1f} samples/s", f"padded length {batch['input_ids'].shape[1]}"))

    env = make_env(cfg)
    held_out = [env.reset(seed=10_000 + i)[0] for i in range(16)]

    def rate() -> float:
        texts = greedy_generate(loaded.model, loaded.processor, held_out, args.max_new_tokens)
        return float(np.mean([not isinstance(parse_action(x), Invalid) for x in texts]))

    before = rate()
    t = time.perf_counter()
    run_sft(cfg, loaded=loaded)
    dt = time.perf_counter() - t
    losses = [e["loss"] for e in json.loads((out / "sft" / TRAIN_LOG).read_text()) if "loss" in e]
    rows.append(("sft train", f"{args.steps / dt:.2f} steps/s", f"loss {losses[0]:.2f} -> {losses[-1]:.2f}"))
    rows.append(("valid action rate", f"before {before:.2f}", f"after {rate():.2f}"))

    width = [max(len(r[i]) for r in rows) for i in range(3)]
    print(" | ".join(h.ljust(w) for h, w in zip(("stage", "rate", "detail"), width)))
    print("-+-".join("-" * w for w in width))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, width)))


if __name__ == "__main__":
    main()

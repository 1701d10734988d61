"""Labelled trajectories -> SFT dataset:
``python vlm_traj_preprocess.py --preset debug --label.out_dir LABELS --label.dataset_dir DATA``.

Reads ``label.out_dir/trajectories.jsonl`` and writes ``label.dataset_dir/{train,val}.jsonl``
(prompts built by ``prompts.build_messages``, exactly as the RL policy sees them) and
``stats.json``. Filters and shapes with ``label.min_score``, ``label.per_turn``,
``label.history_turns`` and ``label.val_fraction`` (validation split by scene). A dataset already in
``label.dataset_dir`` is refused; ``--overwrite`` moves its files to ``NAME.old-<time>`` first (nothing
is deleted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from a2c_ppo_acktr.config.cli import config_parser, parse_run_config, run_main


def main(argv: list[str] | None = None) -> dict:
    parser = config_parser(__doc__)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="move a dataset already in label.dataset_dir aside to NAME.old-<time> (nothing is deleted)",
    )
    cfg, args = parse_run_config(argv, __doc__, parser)
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES  # imported after parsing: --help stays instant
    from SFT.data import build_sft_dataset

    stats = build_sft_dataset(
        Path(cfg.label.out_dir) / TRAJECTORIES,
        cfg.label.dataset_dir,
        cfg.label,
        seed=cfg.seed,
        overwrite=args.overwrite,
    )
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(sys.argv[1:]), "vlm_traj_preprocess.py"))

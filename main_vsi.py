"""PPO training entry point.

    python main_vsi.py --preset debug [--config X.yaml] [--section.key value ...]
                       [--sft-adapter PATH] [--resume auto|PATH]

Multi-process: ``accelerate launch ... main_vsi.py ...`` or ``torchrun ... main_vsi.py ...``; see
docs/TRAINING.md and scripts/run_vsi_qwen.sh. Parses the config and calls
:func:`a2c_ppo_acktr.rl.train.run_training`; no logic lives here.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence


def parse_config(argv: Optional[Sequence[str]] = None):
    """``RunConfig`` from the command line (``--sft-adapter``/``--resume`` map to config fields)."""
    from a2c_ppo_acktr.config.arguments import config_from_args
    from a2c_ppo_acktr.config.cli import check_flag_typos, config_parser, exit_if_print_config

    parser = config_parser(__doc__)
    parser.add_argument(
        "--sft-adapter", default=None, help="LoRA adapter from train_sft.py to start from (model.sft_adapter)"
    )
    parser.add_argument(
        "--resume",
        default=None,
        help="'auto' (latest complete checkpoint in the output dir) or a checkpoint directory (log.resume)",
    )
    args, extra = parser.parse_known_args(argv)
    check_flag_typos(parser, extra)
    extra = list(extra)
    if args.sft_adapter is not None:
        extra += ["--model.sft_adapter", args.sft_adapter]
    if args.resume is not None:
        extra += ["--log.resume", args.resume]
    cfg = config_from_args(args, extra)
    exit_if_print_config(parser, args, cfg)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg = parse_config(argv)
    from a2c_ppo_acktr.run.distributed import shutdown
    from a2c_ppo_acktr.rl.train import run_training

    try:
        last = run_training(cfg)
    finally:
        shutdown()  # also after a signal's checkpoint (Preempted): every process leaves the group
    logging.getLogger("main_vsi").info("done; last checkpoint: %s", last)
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "main_vsi.py"))

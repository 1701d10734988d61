"""SFT warm start: ``python train_sft.py --preset debug --sft.data_path DATA --sft.output_dir OUT``.

Trains the policy's LoRA adapter on a dataset from ``vlm_traj_preprocess.py`` and writes it to
``OUT/adapter`` (what ``main_vsi.py --sft-adapter OUT/adapter`` loads). Multi-GPU / DeepSpeed:
``bash scripts/run_vsi_sft.sh OUTDIR``.
"""

from __future__ import annotations

import logging
import sys

from a2c_ppo_acktr.config.cli import parse_run_config, run_main


def main(argv: list[str] | None = None) -> str:
    cfg, _ = parse_run_config(argv, __doc__)
    from SFT.trainer import run_sft  # torch/transformers: imported after parsing, so --help is instant

    adapter = run_sft(cfg)
    logging.getLogger("train_sft").info("adapter written to %s", adapter)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Leave the process group explicitly: processes that imported deepspeed can abort at exit otherwise.
        dist.destroy_process_group()
    return str(adapter)


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(sys.argv[1:]), "train_sft.py"))

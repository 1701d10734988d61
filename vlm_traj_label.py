"""Label trajectories with a teacher: ``python vlm_traj_label.py --preset debug --label.teacher oracle``.

Writes ``label.out_dir/trajectories.jsonl`` and its images; a rerun resumes (see
``a2c_ppo_acktr/labeling.py``). For ``--label.teacher openai`` the API key is read from the
environment variable named by ``label.api_key_env`` (default ``OPENAI_API_KEY``).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from a2c_ppo_acktr.arguments import add_config_args, config_from_args
from a2c_ppo_acktr.labeling import label_trajectories


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    args, extra = parser.parse_known_args(argv)
    cfg = config_from_args(args, extra)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = label_trajectories(cfg)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])

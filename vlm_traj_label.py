"""Label trajectories with a teacher: ``python vlm_traj_label.py --preset debug --label.teacher oracle``.

Writes ``label.out_dir/trajectories.jsonl`` and its images; a rerun resumes (see
``a2c_ppo_acktr/labels/labeling.py``). For ``--label.teacher openai`` the API key is read from the
environment variable named by ``label.api_key_env`` (default ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import json
import sys

from a2c_ppo_acktr.config.cli import parse_run_config, run_main


def main(argv: list[str] | None = None) -> dict:
    cfg, _ = parse_run_config(argv, __doc__)
    from a2c_ppo_acktr.labels.labeling import label_trajectories  # imported after parsing: --help stays instant

    summary = label_trajectories(cfg)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(sys.argv[1:]), "vlm_traj_label.py"))

"""Which SFT checkpoint PPO starts from: the latest one that leaves PPO room to improve.

A supervised warm start that already wins almost every validation episode leaves PPO nothing to
show: on one build of the embedded model the quickstart's NumberLine SFT won 98 of 100 held-out
deals after 200 steps, and PPO - SFT could not resolve. The quickstart therefore keeps SFT's
checkpoints, scores them greedily on validation episodes (seeds apart from training and from the
evaluation), latest first, and starts PPO from the first one whose score is at most a cap; when
every checkpoint is above the cap, from the earliest.

``python -m a2c_ppo_acktr.eval.warm_start REPORT --cap 85``: exit status 0 when the report's overall
score is at most the cap, 1 when it is above (one line on stdout either way); 2 on a bad report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence


def overall(report_path: str | Path) -> float:
    """The overall score (0-100) of an ``eval_vsi.py`` report.

    Raises:
        ValueError: The file is not readable JSON or has no finite numeric ``overall``.
    """
    try:
        value = json.loads(Path(report_path).read_text(encoding="utf-8"))["overall"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{report_path} is not an eval_vsi.py report with an overall score ({err!r})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{report_path}: overall is {value!r}, not a number")
    return float(value)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.eval.warm_start",
        description="Exit 0 when a validation report's overall score is at most --cap (this checkpoint is the "
        "warm start), 1 when it is above.",
    )
    parser.add_argument("report", help="report.json of eval_vsi.py")
    parser.add_argument("--cap", type=float, required=True, help="the highest overall score (0-100) kept")
    args = parser.parse_args(argv)
    try:
        score = overall(args.report)
    except ValueError as err:
        print(f"warm_start: {err}", file=sys.stderr)
        return 2
    within = score <= args.cap
    print(f"{args.report}: overall {score:.1f} {'<=' if within else '>'} cap {args.cap:g}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())

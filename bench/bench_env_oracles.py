"""Oracle and chance figures of every env of the registry, through the evaluation loop.

    .venv/bin/python bench/bench_env_oracles.py [--episodes 200] [--envs NumberLine-v0 ...] [--out FILE.md]

Per env (its overlay ``configs/envs/*.yaml`` on the ``cpu-demo`` preset; VSI-v0: the preset alone,
procedural questions): the oracle teacher (``eval_vsi.py --oracle``) and the chance agent
(``--dummy``: uniformly random action tokens for the games) play the same ``--episodes`` held-out
deals (seeds ``eval.seed + i``). The table: success rate with its 95% Wilson interval (VSI: the
benchmark's Overall, and the episodes scoring >= 0.5 as success), mean return, mean episode length,
and the seconds the oracle's episodes took. These are the "Environments" figures of docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from a2c_ppo_acktr.envs.registry import TESTED_IDS, VSI_ID, overlay_path  # noqa: E402


def measure(env_id: str, episodes: int) -> dict:
    """Oracle and chance results of ``env_id`` over ``episodes`` held-out episodes."""
    from a2c_ppo_acktr.eval import evaluation
    from a2c_ppo_acktr import reports
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.labels.teachers import OracleTeacher

    overlay = overlay_path(env_id)
    config = None if overlay is None else str(overlay)
    cfg = load_config(preset="cpu-demo", config=config, overrides={"eval": {"num_episodes": episodes}})
    specs = evaluation.eval_specs(cfg)
    env_cfg = evaluation.eval_env_config(cfg)
    out = {"env_id": env_id}
    for name, agent in (("oracle", OracleTeacher(thoughts="brief")), ("chance", evaluation.DummyAgent(cfg.eval.seed))):
        t0 = time.perf_counter()
        result = evaluation.run_episodes(agent, specs, env_cfg, cfg.eval.batch_size, progress=False)
        seconds = time.perf_counter() - t0
        report = reports.build_report(result.records, name=name)
        out[name] = {
            "overall": report["overall"],
            "ci": report["ci95"]["overall"],
            "agent": report["agent"],
            "seconds": seconds,
        }
    return out


def table(rows: Sequence[dict]) -> str:
    lines = [
        "| env | agent | n | success (%) [95% CI] | mean return | mean length (turns) | s (all episodes) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for name in ("oracle", "chance"):
            m = r[name]
            a = m["agent"]
            lo, hi = m["ci"]
            success = (
                f"{100 * a['success_rate']:.1f}"
                if r["env_id"] == VSI_ID
                else f"{m['overall']:.1f} [{lo:.1f}, {hi:.1f}]"
            )
            if r["env_id"] == VSI_ID:
                success += f" (Overall {m['overall']:.1f})"
            lines.append(
                f"| {r['env_id']} | {name} | {a['num_episodes']} | {success} | {a['mean_reward']:.2f} | "
                f"{a['mean_turns']:.2f} | {m['seconds']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--envs", nargs="+", default=list(TESTED_IDS), choices=list(TESTED_IDS))
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    text = table([measure(e, args.episodes) for e in args.envs])
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return text


if __name__ == "__main__":
    main()

"""The first PPO ratio on a deep CPU proxy of a real-size model: random weights at the real vocabulary,
bf16, per ``ppo.old_log_probs`` mode.

Builds (``python -m a2c_ppo_acktr.real_size``) a reduced copy of a GPU preset's checkpoint
architecture: its depth, its head dimension, a narrow width, a short vision tower, the real
vocabulary's rows, then for each mode runs real PPO iterations (``main_vsi.py``, one process per
seed) and reads ``debug/first_minibatch_ratio_max_dev`` (max |ratio - 1| on the first minibatch of
the first epoch) from each iteration's row of ``metrics.jsonl``. ``--per-turn`` adds every turn's
deviation under today's rollout log-probs (``gpu_smoke.ratio_check``: each minibatch re-scored in its
first-epoch layout before any update).

Prints a Markdown table: configuration, mode, what was measured, turns, the largest |ratio - 1| and
the share outside the clip range (of first minibatches, or of turns with ``--per-turn``).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_deep_ratio.py \\
        [--old-log-probs rollout update] [--seeds 2] [--iterations 2] [--per-turn]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Measured:
    """One table row: every ``|ratio - 1|`` of one mode and what each value covers."""

    mode: str
    ratio_level: str
    what: str
    devs: list[float] = field(default_factory=list)  # one per first minibatch, or per turn
    turns_each: int = 1  # turns behind each value
    seconds: float = 0.0


def reductions(args: argparse.Namespace) -> list[str]:
    return [
        "--text-layers",
        str(args.text_layers),
        "--vision-blocks",
        str(args.vision_blocks),
        "--hidden",
        str(args.hidden),
    ]


def build_proxy(args: argparse.Namespace, out: Path) -> Path:
    """The proxy model directory: ``out`` when it already holds a build, else built there."""
    if (out / "real_size_build.json").is_file():
        return out
    cmd = [
        sys.executable,
        "-m",
        "a2c_ppo_acktr.real_size",
        "--preset",
        args.preset,
        "--out",
        str(out),
        "--dtype",
        "bfloat16",
        *reductions(args),
    ]
    subprocess.run(cmd, cwd=REPO, check=True, env=_env())
    return out


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }


def run_settings(args: argparse.Namespace, model_dir: Path) -> list[str]:
    """``section.key=value`` overrides of the debug preset that every measurement shares."""
    return [
        f"model.model_path={model_dir}",
        "model.dtype=bfloat16",
        f"model.max_new_tokens={args.max_new_tokens}",
        f"model.temperature={args.temperature}",
        f"model.min_temperature={args.min_temperature}",
        "model.max_temperature=1.0",
        f"rollout.num_envs={args.envs}",
        f"rollout.num_steps={args.steps}",
        f"ppo.mini_batch_size={args.mini_batch_size}",
        f"ppo.clip_coef={args.clip}",
        "ppo.ppo_epochs=1",
        "ppo.grad_accum_steps=1",
    ] + ([f"env.image_size={args.image_size}"] if args.image_size else [])


def has_old_log_probs_option() -> bool:
    """Whether this version's PPO config has ``old_log_probs`` (without it, today's rollout log-probs)."""
    from a2c_ppo_acktr.config.arguments import PPOConfig

    return "old_log_probs" in PPOConfig.__dataclass_fields__


def ppo_run(args: argparse.Namespace, model_dir: Path, mode: str, level: str, seed: int, out: Path) -> list[float]:
    """``debug/first_minibatch_ratio_max_dev`` of every iteration of one ``main_vsi.py`` run."""
    from a2c_ppo_acktr.run.logger import read_metrics

    settings = run_settings(args, model_dir) + [
        f"ppo.num_iterations={args.iterations}",
        f"log.output_dir={out}",
        "log.progress_bar=false",
        "log.tensorboard=false",
        f"log.save_interval={args.iterations}",
    ]
    if has_old_log_probs_option():
        settings += [f"ppo.old_log_probs={mode}", f"ppo.ratio_level={level}"]
    overlay = ["--config", args.config] if args.config else []
    cmd = [sys.executable, "main_vsi.py", "--preset", "debug", *overlay, "--seed", str(seed), *settings]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [float(r["debug/first_minibatch_ratio_max_dev"]) for r in read_metrics(out / "metrics.jsonl")]


def per_turn(args: argparse.Namespace, model_dir: Path, seed: int) -> list[float]:
    """Every turn's ``|ratio - 1|`` under the rollout's own log-probs, each minibatch re-scored in its
    first-epoch layout before any update (``gpu_smoke.ratio_check``)."""
    from a2c_ppo_acktr.gpu_smoke import ratio_check

    settings = [
        s
        for s in run_settings(args, model_dir)
        if not s.startswith(("model.dtype=", "ppo.ppo_epochs", "ppo.grad_accum"))
    ]
    r = ratio_check(
        "cpu",
        "bfloat16",
        seed=seed,
        num_envs=args.envs,
        num_steps=args.steps,
        mini_batch_size=args.mini_batch_size,
        config=args.config,
        settings=settings,
    )
    return r.turn_devs


def measure(args: argparse.Namespace, model_dir: Path, work: Path) -> list[Measured]:
    """The table's rows: per mode and ratio level the PPO runs' first minibatches, then
    (``--per-turn``) every turn's reply ratio under rollout log-probs."""
    if not has_old_log_probs_option() and (args.old_log_probs != ["rollout"] or args.ratio_level != ["sequence"]):
        raise SystemExit(
            "this version's PPOConfig has no old_log_probs: only rollout with sequence ratios (today's behaviour) can "
            "be measured"
        )
    rows = []
    for mode in args.old_log_probs:
        for level in args.ratio_level:
            t0 = time.perf_counter()
            row = Measured(mode, level, "first minibatch of each PPO iteration", turns_each=args.mini_batch_size)
            for seed in range(1, args.seeds + 1):
                t_run = time.perf_counter()
                devs = ppo_run(args, model_dir, mode, level, seed, work / f"{mode}-{level}-seed{seed}")
                print(
                    f"bench_deep_ratio: {mode}/{level} seed {seed}: first-minibatch max |ratio-1| per iteration "
                    f"{[round(d, 4) for d in devs]} ({time.perf_counter() - t_run:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                row.devs += devs
            row.seconds = time.perf_counter() - t0
            rows.append(row)
    if args.per_turn:
        t0 = time.perf_counter()
        row = Measured("rollout", "sequence", "every turn, before any update")
        for seed in range(args.seeds):
            row.devs += per_turn(args, model_dir, seed)
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    return rows


def configuration(args: argparse.Namespace) -> str:
    env = (
        "NumberLine"
        if args.config and "numberline" in args.config
        else "VSI (debug frames)"
        if not args.config
        else Path(args.config).stem
    )
    return (
        f"{args.preset} architecture, {args.text_layers} layers x {args.hidden}, {args.vision_blocks} vision blocks, "
        f"bf16; {env}, "
        f"{args.envs} envs x {args.steps} steps, minibatch {args.mini_batch_size}, {args.max_new_tokens}-token "
        f"replies, T {args.temperature:g}"
    )


def table(args: argparse.Namespace, rows: Sequence[Measured]) -> str:
    lines = [
        "| configuration | ppo.old_log_probs | ppo.ratio_level | measured | turns | max abs(ratio-1) | outside clip "
        f"{args.clip:g} | wall s |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        share = sum(d > args.clip for d in r.devs) / max(len(r.devs), 1)
        unit = "of turns" if r.turns_each == 1 else "of first minibatches"
        lines.append(
            f"| {configuration(args)} | {r.mode} | {r.ratio_level} | {r.what} | {len(r.devs) * r.turns_each} | "
            f"{max(r.devs):.3g} | "
            f"{share:.0%} {unit} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen2.5-vl-3b", help="whose checkpoint architecture the proxy reduces")
    p.add_argument("--text-layers", type=int, default=36, help="decoder layers (36: Qwen2.5-VL-3B's own depth)")
    p.add_argument("--hidden", type=int, default=128, help="text width (a multiple of the head dimension, 128)")
    p.add_argument("--vision-blocks", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--mini-batch-size",
        type=int,
        default=8,
        help=(
            "turns per minibatch (default: the whole rollout, so the first minibatch holds every turn of both steps' "
            "layouts)"
        ),
    )
    p.add_argument("--temperature", type=float, default=0.2, help="initial sampling temperature (the GPU presets')")
    p.add_argument("--min-temperature", type=float, default=0.1, help="the GPU presets' model.min_temperature")
    p.add_argument("--clip", type=float, default=0.1, help="ppo.clip_coef (the GPU presets')")
    p.add_argument("--iterations", type=int, default=1, help="PPO iterations per seed")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument(
        "--old-log-probs",
        nargs="+",
        default=["rollout", "update"],
        choices=["rollout", "update"],
        help="passed as --ppo.old_log_probs",
    )
    p.add_argument(
        "--ratio-level",
        nargs="+",
        default=["sequence"],
        choices=["sequence", "token", "sequence_mean"],
        help="passed as --ppo.ratio_level (default sequence: RL4VLM's reply ratio, today's before the token level)",
    )
    p.add_argument(
        "--per-turn",
        action="store_true",
        help="also every turn's deviation under rollout log-probs (gpu_smoke.ratio_check)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="an env overlay (configs/envs/*.yaml); default VSI with the debug preset's frames",
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="env.image_size (default the debug preset's 32 px; the card games need >= 64)",
    )
    p.add_argument(
        "--model-dir", default=None, help="reuse (or build into) this proxy directory instead of a temporary one"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="deep_ratio_") as tmp:
        model_dir = build_proxy(args, Path(args.model_dir) if args.model_dir else Path(tmp) / "model")
        rows = measure(args, model_dir, Path(tmp) / "runs")
    print(
        f"\n# First PPO ratio on a deep real-vocabulary proxy, bf16 on CPU ({platform.machine()}, {os.cpu_count()} "
        "cores, "
        f"python {platform.python_version()}, {args.seeds} seed(s) x {args.iterations} iteration(s))\n"
    )
    print(table(args, rows))


if __name__ == "__main__":
    main()

"""How often the frozen vision tower runs in a PPO iteration, and what share of the time it takes.

    python bench/bench_vision_calls.py [--preset debug] [--iterations 3] [section.key=value ...]

Runs ``run_training`` (tiny model, CPU) with a hook on the vision tower that counts its forward calls
and the images and seconds they take, per phase: the rollout (``act``: generate and the recompute,
the bootstrap values), the update (every minibatch of every epoch, and the KL reference's pass when
``ppo.kl_coef > 0``). Prints a Markdown table per setting; the first iteration is left out (warm-up).

What it shows: with ``model.train_vision=none`` the tower's output is the same every time an image
passes through it. ``model.reuse_vision_outputs`` (default on) keeps each image's output from the
rollout and the update forwards it, so the tower runs in the rollout only (once per step; the
bootstrap values' forward aside) and in the update only for a reference that changes the pixels;
the last row turns it off, the tower running again on every minibatch of every epoch.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time

import torch

SETTINGS = {
    "debug preset": [],
    "+ KL to the reference (ppo.kl_coef 0.05)": ["ppo.kl_coef=0.05"],
    "+ 4 PPO epochs": ["ppo.ppo_epochs=4"],
    "+ 4 PPO epochs, KL, tower outputs not reused (model.reuse_vision_outputs=false)": [
        "ppo.ppo_epochs=4",
        "ppo.kl_coef=0.05",
        "model.reuse_vision_outputs=false",
    ],
    "+ 4 PPO epochs, KL, reused (the default)": ["ppo.ppo_epochs=4", "ppo.kl_coef=0.05"],
}


def measure(preset: str, iterations: int, overrides: list[str]) -> dict[str, float]:
    from a2c_ppo_acktr.policy import model as model_module
    from a2c_ppo_acktr.rl import train
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.run.logger import read_metrics

    phase = ["load"]
    calls: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    iteration = [0]
    original_init = model_module.VLMPolicy.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        tower = getattr(self.base_model, "visual", None) or getattr(
            getattr(self.base_model, "model", None), "visual", None
        )
        if tower is None:
            raise RuntimeError("no vision tower named 'visual' (this bench counts Qwen-VL towers)")
        started: list[float] = []
        tower.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
        tower.register_forward_hook(
            lambda *_: calls[(iteration[0], phase[0])].append(time.perf_counter() - started.pop())
        )

    original_collect = train.collect_rollout

    def collect(*args, **kwargs):
        iteration[0] += 1
        phase[0] = "rollout"
        try:
            return original_collect(*args, **kwargs)
        finally:
            phase[0] = "update"

    model_module.VLMPolicy.__init__ = init
    train.collect_rollout = collect
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = load_config(
                preset=preset,
                overrides=[
                    f"log.output_dir={out}",
                    "log.progress_bar=false",
                    f"ppo.num_iterations={iterations}",
                    "log.tensorboard=false",
                    *overrides,
                ],
            )
            train.run_training(cfg)
            rows = read_metrics(f"{out}/metrics.jsonl")[1:]
    finally:
        model_module.VLMPolicy.__init__ = original_init
        train.collect_rollout = original_collect
    its = range(2, iterations + 1)
    result = {}
    for ph in ("rollout", "update"):
        result[f"{ph}_calls"] = statistics.mean(len(calls[(i, ph)]) for i in its)
        result[f"{ph}_seconds"] = statistics.mean(sum(calls[(i, ph)]) for i in its)
    result["iteration_seconds"] = statistics.mean(r["time/iteration"] for r in rows)
    result["turns"] = cfg.rollout.num_envs * cfg.rollout.num_steps
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="debug")
    parser.add_argument("--iterations", type=int, default=3)
    args, extra = parser.parse_known_args()
    torch.set_num_threads(1)
    print(
        f"# Vision-tower calls per PPO iteration ({args.preset}, tiny model, CPU, 1 thread; iterations "
        f"2-{args.iterations})\n"
    )
    print(
        "| setting | turns | tower calls: rollout | update | tower seconds: rollout | update | iteration seconds | "
        "tower share |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, overrides in SETTINGS.items():
        r = measure(args.preset, args.iterations, [*overrides, *extra])
        share = (r["rollout_seconds"] + r["update_seconds"]) / r["iteration_seconds"]
        print(
            f"| {name} | {r['turns']} | {r['rollout_calls']:.0f} | {r['update_calls']:.0f} | "
            f"{r['rollout_seconds']:.2f} "
            f"| {r['update_seconds']:.2f} | {r['iteration_seconds']:.2f} | {share:.0%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""What a VLM reads from this project's renders: the vision probe as a command.

``python -m a2c_ppo_acktr.vision_probe [--model PATH] [--tasks ...]`` loads any ``model.model_path``
(``tiny:<family>`` included), asks the pre-training questions of :mod:`a2c_ppo_acktr.tiny.vision`
about held-out renders, greedily, with the frames and with every frame zeroed (the same tokens),
and prints a Markdown table.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from a2c_ppo_acktr.tiny.vision import ALL_TASKS, MRA_TASKS, TASKS, chance_levels, probe, probe_samples


def probe_table(
    model_path: str, tasks: Sequence[str] = TASKS, num_scenes: int = 20, image_size: int = 64
) -> list[dict[str, Any]]:
    """The probe of the model at ``model_path`` (any ``model.model_path``, ``tiny:<family>`` included)
    on held-out renders: per task the count, the best constant's accuracy, and the greedy exact-answer
    accuracy with the frames and with every frame zeroed (the same tokens)."""
    import torch

    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm

    loaded = load_vlm(ModelConfig(model_path=model_path, device="cpu", dtype="float32"))
    samples = probe_samples(image_size, num_scenes, tasks)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sighted = probe(loaded.model, loaded.processor, samples)
        zeroed = probe(loaded.model, loaded.processor, samples, zero_images=True)
    finally:
        torch.set_num_threads(threads)
    chance = chance_levels(samples)
    return [
        {
            "task": t,
            "n": sum(s.task == t for s in samples),
            "chance": chance[t],
            "accuracy": sighted[t],
            "zeroed": zeroed[t],
        }
        for t in sorted(sighted)
    ]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """CLI: the vision probe of a model, as a Markdown table."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Probe what a VLM reads from this project's renders (held-out frames, greedy, exact answers)."
    )
    parser.add_argument(
        "--model", default="tiny:qwen2_5_vl", help="model path (default: the embedded default, built on first use)"
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["numberline"],
        choices=ALL_TASKS,
        help=(
            "default: numberline, the default model's pre-training task (bench/bench_vision_pretrain.py tries the "
            "others)"
        ),
    )
    parser.add_argument(
        "--scenes",
        type=int,
        default=20,
        help="held-out procedural scenes for the room tasks (room_size: one sample per scene)",
    )
    args = parser.parse_args(argv)
    rows = probe_table(args.model, args.tasks, args.scenes)
    print("| task | held-out samples | best constant | accuracy | zeroed frames |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['task']} | {r['n']} | {r['chance']:.3f} | {r['accuracy']:.3f} | {r['zeroed']:.3f} |")
    scored = [r["task"] for r in rows if r["task"] in MRA_TASKS]
    if scored:
        print(f"\n{', '.join(scored)}: scores are VSI-Bench's mean relative accuracy of the number, not exact matches.")


if __name__ == "__main__":
    main()

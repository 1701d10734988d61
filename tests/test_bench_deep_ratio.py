"""bench/bench_deep_ratio.py: its table, and a shortened run on a real-vocabulary bf16 proxy where the
first PPO ratio under ``ppo.old_log_probs=update`` is exactly 1. Rollout mode's deviation is this
CPU's rounding, so only its presence is checked, never its size."""

from __future__ import annotations

import math

import pytest

from bench_helpers import bench_module


@pytest.fixture(scope="module")
def bdr():
    yield from bench_module("bench_deep_ratio")


SHORT = [
    "--text-layers",
    "4",
    "--hidden",
    "128",
    "--vision-blocks",
    "2",
    "--max-new-tokens",
    "16",
    "--envs",
    "2",
    "--steps",
    "2",
    "--mini-batch-size",
    "4",
    "--iterations",
    "1",
    "--seeds",
    "1",
    "--config",
    "configs/envs/numberline.yaml",
    "--image-size",
    "64",
]


def test_the_table_counts_turns_and_shares_outside_the_clip(bdr):
    args = bdr.parser().parse_args(SHORT + ["--clip", "0.1"])
    rows = [
        bdr.Measured(
            "rollout", "sequence", "first minibatch of each PPO iteration", [0.05, 0.3], turns_each=4, seconds=12.0
        ),
        bdr.Measured("rollout", "sequence", "every turn, before any update", [0.0, 0.2, 0.1, 0.01]),
    ]
    lines = bdr.table(args, rows).splitlines()
    assert lines[0].startswith("| configuration | ppo.old_log_probs | ppo.ratio_level |") and len(lines) == 4
    assert (
        "| rollout | sequence | first minibatch of each PPO iteration | 8 | 0.3 | 50% of first minibatches | 12 |"
        in lines[2]
    )
    assert "| 4 | 0.2 | 25% of turns |" in lines[3]  # 0.1 itself is inside the clip range
    assert (
        "4 layers x 128, 2 vision blocks, bf16; NumberLine, 2 envs x 2 steps, minibatch 4, 16-token replies, T 0.2"
        in lines[2]
    )


@pytest.mark.slow
def test_update_mode_starts_at_ratio_one_exactly_on_a_deep_bf16_proxy(bdr, tmp_path):
    """A 4-layer proxy of Qwen2.5-VL-3B's architecture (the real vocabulary, its head dimension, bf16)
    trained one PPO iteration per mode through main_vsi.py (~2 min on the 2-core build box)."""
    args = bdr.parser().parse_args(SHORT + ["--old-log-probs", "rollout", "update"])
    model = bdr.build_proxy(args, tmp_path / "model")
    rows = {r.mode: r for r in bdr.measure(args, model, tmp_path / "runs")}
    assert rows["update"].devs == [0.0]  # one forward in one layout: bit for bit on any CPU
    assert len(rows["rollout"].devs) == 1 and math.isfinite(rows["rollout"].devs[0]) and rows["rollout"].devs[0] >= 0.0

"""Counts that validation accepted and memory cannot hold are refused at start with one line, each
against a bound derived from memory (config/arguments.py: HOST_MEMORY_BUDGET and the per-env and
per-frame estimates); a saved rollout is read within bounds on what it decompresses."""

from __future__ import annotations

import gzip
import json
import resource

import pytest

from a2c_ppo_acktr.config.arguments import (
    ENV_BASE_BYTES,
    FRAME_BYTES_PER_PIXEL,
    HOST_MEMORY_BUDGET,
    MAX_EVAL_EPISODES,
    MAX_SWEEP_FRAMES,
    ConfigError,
    load_config,
)
from a2c_ppo_acktr.config.cli import run_main


def _one_line(capsys, rc: int, *fragments: str) -> None:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.num_sweep_frames=100000", f"env.num_sweep_frames=100000 must be in [1, {MAX_SWEEP_FRAMES}]"),
        (
            "rollout.num_envs=1000000",
            f"rollout.num_envs=1000000 must be in [1, {HOST_MEMORY_BUDGET // ENV_BASE_BYTES}] per process",
        ),
        ("eval.num_episodes=1000000000", f"eval.num_episodes=1000000000 must be in [1, {MAX_EVAL_EPISODES}]"),
        ("env.image_history=100000", f"env.image_history=100000 must be in [0, {MAX_SWEEP_FRAMES}]"),
    ],
)
def test_counts_memory_cannot_hold_are_refused_in_one_line_before_anything_is_built(capsys, override, message):
    import main_vsi

    key, value = override.split("=")
    rc = run_main(lambda: main_vsi.main(["--preset", "debug", f"--{key}", value, "--print-config"]), "main_vsi.py")
    _one_line(capsys, rc, message)


def test_frames_and_envs_are_bounded_together_by_their_bytes():
    # 768 frames of 2048 px: ~130 GB for one env.
    with pytest.raises(ConfigError, match=r"need about 1\d\d\.\d GiB per env \(40 bytes per pixel\)"):
        load_config(preset="debug", overrides=["env.image_size=2048", "env.num_sweep_frames=768"])
    # 4096 envs of 448 px frames (sweep 2 + history 1 + the current view): fine alone, not together.
    with pytest.raises(
        ConfigError, match=r"rollout.num_envs=4096 envs of 4 frames at 448x448 need about 1\d\d\.\d GiB"
    ):
        load_config(preset="debug", overrides=["rollout.num_envs=4096", "env.image_size=448"])
    cfg = load_config(preset="qwen2.5-vl-7b")  # the real presets stay far inside
    assert cfg.rollout.num_envs * cfg.env.memory_bytes() < HOST_MEMORY_BUDGET / 50
    assert cfg.env.memory_bytes() == ENV_BASE_BYTES + 11 * 448 * 448 * FRAME_BYTES_PER_PIXEL


@pytest.mark.slow
def test_a_rollout_that_decompresses_past_its_bounds_is_one_line_without_inflating_it(tmp_path, capsys):
    """A 0.5 MB file whose one line inflates to 500 MB is stopped at the row bound; the memory the
    command used stays far below what the line would take."""
    from a2c_ppo_acktr.rl import saved_rollouts as rollouts

    path = tmp_path / "iter-000001-rank0.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"prompt": "')
        block = b"A" * (1 << 20)
        for _ in range(500):
            f.write(block)
        f.write(b'"}\n')
    assert path.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc = run_main(lambda: rollouts.main(["show", str(path)]), "python -m a2c_ppo_acktr.rl.saved_rollouts")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    _one_line(capsys, rc, "row 1 decompresses to more than 16 MiB")
    assert grown_mib < 100, grown_mib
    # Many rows, each small, past the file's bound.
    rows = tmp_path / "many.jsonl.gz"
    turn = {
        "iteration": 1,
        "rank": 0,
        "step": 0,
        "env": 0,
        "env_id": "VSI-v0",
        "episode": "e",
        "continued": False,
        "prompt": "B" * 1000,
        "images": [],
        "reply": "r",
        "action": None,
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "temperature": 1.0,
        "value": 0.0,
        "advantage": None,
        "return": None,
        "log_prob": -1.0,
    }
    row = json.dumps(turn).encode() + b"\n"
    with gzip.open(rows, "wb") as f:
        for _ in range(300):
            f.write(row)
    with pytest.raises(rollouts.RolloutFileError, match=r"decompresses to more than 0 MiB after \d+ rows"):
        rollouts.read_rollouts(rows, max_bytes=100_000)

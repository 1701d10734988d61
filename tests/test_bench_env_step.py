"""The env-step benchmark's pure parts (table, statistics, which config each env is built from, the
timed step loop's auto-reset) and one tiny end-to-end run on NumberLine: no numbers are checked."""

from __future__ import annotations


import numpy as np
import pytest

from a2c_ppo_acktr.common.env_ids import TESTED_IDS, VSI_ID

from bench_helpers import bench_module


@pytest.fixture(scope="module")
def be():
    yield from bench_module("bench_env_step")


def test_markdown_table_and_stats(be):
    assert be.markdown_table(["a", "b"], [[1, "x"], [2.5, "y"]]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | x |",
        "| 2.5 | y |",
    ]
    mean, median, p90 = be.mean_median_p90_ms([0.001] * 9 + [0.011])
    assert (mean, median) == pytest.approx((2.0, 1.0)) and 1.0 <= p90 <= 11.0
    assert be.fmt_ms((0.12345, 1.0, 12.34)) == "0.123 / 1.000 / 12.3"


def test_every_game_of_the_registry_has_its_overlay(be):
    for env_id in TESTED_IDS:
        overlay = be.overlay_for(env_id)
        assert (overlay is None) == (env_id == VSI_ID), env_id
    assert be.overlay_for("gym_cards/NumberLine-v0").name == "numberline.yaml"
    assert be.overlay_for("MiniGrid-FourRooms-v0") is None


def test_env_config_takes_the_overlay_and_the_image_size(be):
    cfg, overlay = be.env_config("Sokoban-v0")
    assert overlay.name == "sokoban.yaml" and cfg.env_id == "Sokoban-v0" and cfg.game["tile_size"] == 16
    assert cfg.image_size == 64  # cpu-demo's
    cfg, _ = be.env_config("NumberLine-v0", image_size=128)
    assert cfg.image_size == 128 and cfg.game == {"max_position": 5}
    cfg, overlay = be.env_config("MiniGrid-FourRooms-v0")
    assert overlay is None and cfg.env_id == "MiniGrid-FourRooms-v0"


class _CountingEnv:
    """Ends an episode every 3 steps; counts resets and the text it was sent."""

    def __init__(self):
        self.resets, self.sent, self.turn = [], [], 0

    def reset(self, *, seed=None, options=None):
        self.resets.append(seed)
        self.turn = 0
        return {"images": (np.zeros((4, 6, 3)),) * 2, "text": "abc"}, {}

    def step(self, text):
        self.sent.append(text)
        self.turn += 1
        return {"images": (np.zeros((4, 6, 3)),) * 2, "text": "abcde", "system": "sys"}, 0.0, self.turn == 3, False, {}


def test_time_steps_resets_untimed_with_new_seeds(be):
    env = _CountingEnv()
    r = be.time_steps(env, lambda: "x", 7, first_seed=10)
    assert len(r["seconds"]) == 7 and env.sent == ["x"] * 7
    assert r["episodes"] == 2 and env.resets == [10, 11, 12]
    assert r["text"] == [5] * 7 and r["system"] == [3] * 7 and r["images"] == "2 x 4x6"


def test_main_prints_one_row_per_env(be, capsys):
    be.main(["--envs", "NumberLine-v0", "Blackjack-v0", "--steps", "5", "--resets", "2"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "-v0" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| NumberLine-v0", "| Blackjack-v0"]
    assert "64x64" in rows[0] and "VSI-v0 detail" not in out
    with pytest.raises(SystemExit):
        be.main(["--envs", "NumberLine-v0", "--image-size", "32"])

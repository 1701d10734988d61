"""The opt-in MiniGrid and EZPoints vision tasks: the default build's tasks and samples do not depend on them,
and their answers are the frame's facts (the triangle's direction, the oracle's next action)."""

from __future__ import annotations

import numpy as np
import pytest

from a2c_ppo_acktr.tiny import build as tiny, vision as tiny_vision


def test_default_tasks_leave_out_the_opt_in_tasks(monkeypatch):
    assert tiny_vision.TASKS == ("numberline", "left_right", "present")
    assert not set(tiny_vision.OPT_IN_TASKS) & set(tiny_vision.TASKS)
    assert not set(tiny_vision.OPT_IN_TASKS) & set(tiny.tiny_spec("qwen2_5_vl").vision_pretrain_tasks)

    def refuse(*a, **k):
        raise AssertionError("the default tasks drew a MiniGrid frame")

    monkeypatch.setattr(tiny_vision, "minigrid_samples", refuse)
    before = tiny_vision.training_samples(64, 0)
    assert {s.task for s in before} == {"numberline"}
    assert len(before) == 2 * len(tiny_vision.numberline_pairs(held_out=False))


def test_minigrid_states_split_into_disjoint_sets_that_cover_every_state():
    train, held = tiny_vision.minigrid_states(held_out=False), tiny_vision.minigrid_states(held_out=True)
    assert set(train).isdisjoint(held) and len(set(train) | set(held)) == 15 * 4
    assert (4, 4, 0) not in set(train) | set(held)  # the goal cell
    assert len(held) >= 10


def test_minigrid_answers_on_known_frames():
    samples = tiny_vision.minigrid_samples([(1, 1, 0), (4, 3, 0), (4, 3, 1)], 64, tiny_vision.OPT_IN_TASKS)
    got = [(s.task, s.answer) for s in samples]
    assert got == [
        ("minigrid_facing", "right"),
        ("minigrid_action", "move forward"),  # top-left, facing right: walk along the top
        ("minigrid_facing", "right"),
        ("minigrid_action", "turn right"),  # above the goal, facing the wall: turn to it
        ("minigrid_facing", "down"),
        ("minigrid_action", "move forward"),  # above the goal, facing it: step on it
    ]
    # The red triangle is drawn in the agent's cell.
    for sample, (x, y) in zip(samples[::2], [(1, 1), (4, 3), (4, 3)]):
        img = sample.image.astype(int)
        red = (img[..., 0] > 150) & (img[..., 1] < 80) & (img[..., 2] < 80)
        rows, cols = np.nonzero(red)
        cell = 64 / 6
        assert red.any() and int(rows.mean() // cell) == y and int(cols.mean() // cell) == x
    # The triangle's direction shows: the frames of (4, 3) facing right and down differ only there.
    assert not np.array_equal(samples[2].image, samples[4].image)


def test_ezpoints_deals_cover_every_dealt_hand_and_answer_the_counted_number():
    from a2c_ppo_acktr.envs.cards.ezpoints import EZPointsEnv

    train, held = tiny_vision.ezpoints_deals(held_out=False), tiny_vision.ezpoints_deals(held_out=True)
    assert set(train).isdisjoint(held) and len(held) >= 30
    # Every dealt (left rank, right rank) is in training; held-out frames are those hands in other suits.
    env = EZPointsEnv(image_size=64)
    dealt = set()
    for seed in range(300):
        env.reset(seed=seed)
        dealt.add(tuple(env.ranks))
    assert dealt == {(a[0], b[0]) for a, b in train}
    samples = tiny_vision.ezpoints_samples([((12, "H"), (2, "S"))], 64)
    assert [(s.question, s.answer) for s in samples] == [
        ("What number does the left card count?", "10"),
        ("What number does the right card count?", "2"),
    ]
    obs, _ = env.reset(seed=5, options={"cards": [(12, "H"), (2, "S")]})
    assert np.array_equal(samples[0].image, obs["images"][0])  # the first deal: the formula still empty
    # The second deal's frame shows the oracle's first unit typed.
    second = tiny_vision.ezpoints_samples([((12, "H"), (2, "S")), ((2, "C"), (10, "D"))], 64)[2]
    env.reset(seed=5, options={"cards": [(2, "C"), (10, "D")]})
    obs, *_ = env.step(env.oracle_reply())
    assert env.formula_text() != "" and np.array_equal(second.image, obs["images"][0])


def test_the_ezpoints_build_is_the_default_spec_with_its_own_vision_pretraining():
    from dataclasses import asdict

    from a2c_ppo_acktr.policy import loading
    from a2c_ppo_acktr.tiny import build as tiny

    default, variant = asdict(tiny.tiny_spec("qwen2_5_vl")), asdict(tiny.tiny_spec("qwen2_5_vl-ezpoints"))
    differ = {k for k in default if default[k] != variant[k]}
    assert differ == {"vision_pretrain_steps", "vision_pretrain_lr", "vision_pretrain_tasks"}
    assert variant["family"] == "qwen2_5_vl" and variant["vision_pretrain_tasks"] == ("ezpoints_cards",)
    assert tiny.spec_hash("qwen2_5_vl-ezpoints", 0) != tiny.spec_hash("qwen2_5_vl", 0)  # its own cache directory
    with pytest.raises(loading.ModelLoadError, match="tiny:qwen2_5_vl-ezpoints"):  # the error lists the builds
        loading.resolve_model_path("tiny:qwen2_5_vl-nope")


def test_the_rooms_build_is_the_default_spec_with_room_size_pretraining_and_hashes_the_room_renderer():
    from dataclasses import asdict

    from a2c_ppo_acktr.tiny import build as tiny

    default, variant = asdict(tiny.tiny_spec("qwen2_5_vl")), asdict(tiny.tiny_spec("qwen2_5_vl-rooms"))
    differ = {k for k in default if default[k] != variant[k]}
    assert differ == {
        "vision_base",
        "vision_pretrain_steps",
        "vision_pretrain_tasks",
        "vision_pretrain_scenes",
    }  # lr: the default 3e-4
    assert variant["vision_base"] == "qwen2_5_vl" and default["vision_base"] is None  # on top of the default build
    assert variant["vision_pretrain_tasks"] == ("room_size",) and variant["vision_pretrain_scenes"] > 0
    assert tiny.spec_hash("qwen2_5_vl-rooms", 0) != tiny.spec_hash("qwen2_5_vl", 0)
    # The modules that draw the rooms are part of this build's hash, and not of the default's.
    rooms = {p.name for p in tiny._vision_sources("qwen2_5_vl-rooms")}
    assert {"renderer.py", "procedural.py", "scene.py"} <= rooms
    assert "renderer.py" not in {p.name for p in tiny._vision_sources("qwen2_5_vl")}

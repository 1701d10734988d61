"""The embedded default model sees: its vision pre-training data, its encoding, and the probe on
held-out renders (sighted against the same prompts with zeroed frames)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.tiny import build as tiny, vision as tiny_vision
from a2c_ppo_acktr.policy.loading import load_vlm


def test_numberline_pairs_split_into_disjoint_sets_that_cover_every_state():
    train, held = tiny_vision.numberline_pairs(held_out=False), tiny_vision.numberline_pairs(held_out=True)
    everything = {(t, c) for t in range(tiny_vision.MAX_DIGIT + 1) for c in range(tiny_vision.MAX_DIGIT + 1) if t != c}
    assert set(train).isdisjoint(held) and set(train) | set(held) == everything
    # Every digit is seen in training in both roles, so a held-out pair is a new combination, not a new digit.
    assert {t for t, _ in train} == {c for _, c in train} == set(range(tiny_vision.MAX_DIGIT + 1))
    assert len(held) >= 15


def test_numberline_samples_ask_about_the_frame_the_env_draws():
    from a2c_ppo_acktr.envs.cards.numberline import NumberLineEnv

    samples = tiny_vision.numberline_samples([(7, 2)], 64)
    assert [(s.question.split()[3], s.answer) for s in samples] == [("current", "2"), ("target", "7")]
    env = NumberLineEnv(max_position=9, image_size=64)
    obs, _ = env.reset(seed=3, options={"start": 2, "target": 7})
    assert np.array_equal(samples[0].image, obs["images"][0])
    assert not np.array_equal(samples[0].image, tiny_vision.numberline_frame(2, 7, 64))


def test_room_samples_are_seeded_and_answer_from_the_id_map():
    a = tiny_vision.room_samples([tiny_vision.SCENE_SEED_TRAIN], 64, frames_per_scene=4)
    b = tiny_vision.room_samples([tiny_vision.SCENE_SEED_TRAIN], 64, frames_per_scene=4)
    assert [(s.question, s.answer) for s in a] == [(s.question, s.answer) for s in b] and a
    for s in a:
        if s.task == "left_right":
            names = s.question.split("picture, the ", 1)[1].rstrip("?").split(" or the ")
            assert s.answer in names and len(set(names)) == 2
        else:
            assert s.task == "present" and s.answer in ("yes", "no")
    with pytest.raises(ValueError, match="unknown vision pre-training task"):
        tiny_vision.training_samples(64, 1, ("colour",))


def test_room_left_right_follows_the_pixel_columns(monkeypatch):
    """A frame whose id map puts a chair on the left and a table on the right asks the left one."""
    from a2c_ppo_acktr.envs.renderer import Frame
    from a2c_ppo_acktr.envs.scene import SceneObject

    ids = np.full((64, 64), -1, dtype=np.int32)
    ids[20:40, 2:14] = 0  # chair, left
    ids[20:40, 44:60] = 1  # table, right
    frame = Frame(rgb=np.zeros((64, 64, 3), np.uint8), depth=np.ones((64, 64), np.float32), object_ids=ids)
    objects = [
        SceneObject(0, "chair", np.zeros(3), np.ones(3)),
        SceneObject(1, "table", np.zeros(3), np.ones(3)),
        SceneObject(2, "bed", np.zeros(3), np.ones(3)),
    ]
    scene = type("S", (), {"objects": objects})()
    monkeypatch.setattr(tiny_vision, "_scene_frames", lambda seed, size, n: (scene, [frame]))
    samples = {s.task: s for s in tiny_vision.room_samples([0], 64)}
    assert samples["left_right"].answer == "chair"
    present = samples["present"]
    assert (present.question, present.answer) in {
        ("Is there a bed in the picture?", "no"),
        ("Is there a chair in the picture?", "yes"),
        ("Is there a table in the picture?", "yes"),
    }


def test_room_size_samples_show_the_envs_sweep_and_answer_the_rounded_floor_area():
    """A ``room_size`` sample holds the 4 sweep frames the VSI env shows for the same scene and pose
    (turning left from the start heading) and answers the scene's floor area in whole square meters."""
    from a2c_ppo_acktr.config.arguments import EnvConfig
    from a2c_ppo_acktr.envs.navigation import sample_free_pose
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene
    from a2c_ppo_acktr.envs.questions import ROOM_SIZE_QUESTION
    from a2c_ppo_acktr.envs.renderer import Pose, Renderer

    (sample,) = tiny_vision.room_size_samples([7], 64)
    assert sample.task == "room_size" and sample.question == ROOM_SIZE_QUESTION
    assert sample.image.shape == (4, 64, 64, 3) and len(sample.frames) == 4
    cfg = EnvConfig(image_size=64)
    scene = make_procedural_scene(7, cfg.procedural_min_room, cfg.procedural_max_room)
    assert sample.answer == str(int(round(scene.room_area)))
    start = sample_free_pose(scene, np.random.default_rng(7), cfg.agent_radius)
    third = Renderer.for_env(scene, cfg).render_many([Pose(start.x, start.y, (start.yaw_deg + 180.0) % 360.0)])[0]
    assert np.array_equal(sample.frames[2], third.rgb)
    assert tiny_vision.room_size_samples([7], 64)[0].answer == sample.answer  # seeded


def test_room_size_is_scored_by_mra_and_its_chance_is_the_best_constants_mra():
    """MRA, not exact match: 12% off scores 0.8 (relative error <= 1 - t for t in 0.50..0.85, 8 of the
    10 thresholds, none at a boundary), a non-number 0."""
    assert tiny_vision._score("room_size", "22.4", "20") == pytest.approx(0.8)
    assert tiny_vision._score("room_size", "20", "20") == 1.0
    assert tiny_vision._score("room_size", "big", "20") == 0.0
    assert tiny_vision._score("numberline", "3", "3") == 1.0 and tiny_vision._score("numberline", "3.0", "3") == 0.0
    frame = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    samples = [tiny_vision.VisionSample(frame, "q", a, "room_size") for a in ("10", "10", "40")]
    # The constant 10: MRA 1, 1 and 0 (75% off) -> 2/3; no whole number does better here.
    assert tiny_vision.chance_levels(samples)["room_size"] == pytest.approx(2 / 3)


def test_multi_frame_samples_put_one_image_block_per_frame(tiny_model_path):
    from a2c_ppo_acktr.config.arguments import ModelConfig

    processor = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu", dtype="float32")).processor
    frames = np.full((3, 64, 64, 3), 255, dtype=np.uint8)
    batch = tiny_vision.encode_batch(processor, [tiny_vision.VisionSample(frames, "How big?", "12", "room_size")])
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert int((batch["input_ids"] == pad).sum()) == 3 * 16 and int((batch["input_ids"] == start).sum()) == 3
    labelled = batch["labels"][0][batch["labels"][0] >= 0]
    assert processor.tokenizer.decode(labelled) == "12<|im_end|>\n"


def test_rows_encoded_once_collate_to_the_batch_encoding(tiny_model_path):
    """Pre-training encodes each sample once and collates draws of rows: every tensor of a draw equals the
    processor's own batch of those samples (1 and 4 frames, answers of 1 to 3 tokens, repeats, any order)."""
    from a2c_ppo_acktr.config.arguments import ModelConfig

    processor = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu", dtype="float32")).processor
    rng = np.random.default_rng(0)
    samples = [
        tiny_vision.VisionSample(
            rng.integers(0, 256, size=(64, 64, 3) if k % 2 else (4, 64, 64, 3), dtype=np.uint8),
            "What is the size of this room?" if k % 2 == 0 else "What is the current number?",
            str(int(rng.integers(1, 400))),
            "room_size" if k % 2 == 0 else "numberline",
        )
        for k in range(6)
    ]
    rows = tiny_vision.encode_each(processor, samples)
    for picked in ([0, 1, 2, 3, 4, 5], [5, 2], [3], [1, 1, 4, 0]):
        want = tiny_vision.encode_batch(processor, [samples[i] for i in picked])
        got = tiny_vision.collate([rows[i] for i in picked], processor.tokenizer.pad_token_id)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), (key, picked)


def test_default_processor_gives_16_tokens_per_frame_and_maps_white_to_zero(tiny_model_path):
    from a2c_ppo_acktr.config.arguments import ModelConfig

    processor = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu", dtype="float32")).processor
    white = np.full((64, 64, 3), 255, dtype=np.uint8)
    batch = tiny_vision.encode_batch(processor, [tiny_vision.VisionSample(white, "What is here?", "7", "numberline")])
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((batch["input_ids"] == pad).sum()) == 16
    assert torch.count_nonzero(batch["pixel_values"]) == 0
    # The loss is on the answer, its end-of-turn token and newline only.
    labelled = batch["labels"][0][batch["labels"][0] >= 0]
    assert processor.tokenizer.decode(labelled) == "7<|im_end|>\n"


def test_vision_pretraining_moves_every_tower_and_merger_weight():
    spec = dataclasses.replace(tiny.tiny_spec("qwen2_5_vl"), pretrain_steps=0)
    tokenizer = tiny.build_tokenizer(spec, tiny.training_corpus())
    processor = tiny.build_processor(spec, tokenizer)
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(tiny.build_config(spec, tokenizer), dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if ".visual." in f".{n}"}
    assert before
    samples = tiny_vision.numberline_samples(tiny_vision.numberline_pairs(held_out=False)[:8], 64)
    losses = tiny_vision.pretrain_vision(
        model,
        processor,
        samples,
        steps=2,
        batch_size=4,
        lr=1e-3,
        seed=0,
        text_docs=tiny.reply_documents(tokenizer, tiny.training_corpus()),
        text_per_batch=2,
    )
    assert len(losses) == 2 and all(np.isfinite(losses))
    still = [n for n, p in model.named_parameters() if n in before and torch.equal(p, before[n])]
    assert not still, f"vision pre-training left these weights unchanged: {still}"


@pytest.mark.parametrize("balance", [False, True])
def test_balanced_batches_draw_every_task_evenly_and_the_default_draws_the_pool(monkeypatch, balance):
    """``balance_tasks``: 16 rows over a 2-task set of 30 + 3 samples are 8 + 3 (a task has no more
    rows than samples); uniform over the pool the small task gets ~16 x 3/33 a batch. Without it the
    draws are the pooled ones, index for index (the default builds do not change)."""
    from a2c_ppo_acktr.tiny import training as tiny_training

    samples = [
        tiny_vision.VisionSample(
            np.zeros((4, 4, 3), np.uint8), f"q{i}", str(i), "numberline" if i < 30 else "room_size"
        )
        for i in range(33)
    ]
    seen: list[list[str]] = []
    monkeypatch.setattr(tiny_vision, "encode_each", lambda _processor, samples: list(samples))
    monkeypatch.setattr(tiny_vision, "collate", lambda picked, _pad: seen.append([x.task for x in picked]) or {})

    def training(_model, batch, steps, _lr, seed):
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            batch(rng)
        return [0.0] * steps

    monkeypatch.setattr(tiny_training, "next_token_training", training)
    processor = type("P", (), {"tokenizer": type("T", (), {"pad_token_id": 0})()})()
    tiny_vision.pretrain_vision(
        None, processor, samples, steps=20, batch_size=16, lr=0.0, seed=0, balance_tasks=balance
    )
    small = [rows.count("room_size") for rows in seen]
    if balance:
        assert all(len(rows) == 11 and rows.count("numberline") == 8 for rows in seen) and small == [3] * 20
    else:
        assert all(len(rows) == 16 for rows in seen) and sum(small) < 20 * 3
        rng = np.random.default_rng(0)
        assert seen == [[samples[i].task for i in rng.choice(33, size=16, replace=False)] for _ in range(20)]


def test_the_default_model_reads_numberline_frames_it_never_saw(tiny_model_path):
    """The probe: greedy answers about held-out (target, current) pairs, >= 90% exact where a
    constant answer gets at most about 11%; the same prompts with zeroed frames stay near chance."""
    from a2c_ppo_acktr.config.arguments import ModelConfig

    loaded = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu", dtype="float32"))
    samples = tiny_vision.probe_samples(64, 0, ("numberline",))
    chance = tiny_vision.chance_levels(samples)["numberline"]
    assert chance <= 0.15
    sighted = tiny_vision.probe(loaded.model, loaded.processor, samples)["numberline"]
    zeroed = tiny_vision.probe(loaded.model, loaded.processor, samples, zero_images=True)["numberline"]
    assert sighted >= 0.9, f"the default model read {sighted:.0%} of held-out NumberLine frames (needs >= 90%)"
    assert zeroed <= chance + 0.15, (
        f"with zeroed frames it still answered {zeroed:.0%}: the answers do not come from the pixels"
    )


@pytest.fixture(scope="module")
def bvp():
    from bench_helpers import bench_module

    yield from bench_module("bench_vision_pretrain")


def test_bench_vision_pretrain_reports_every_probed_task(bvp):
    rows = bvp.run(["numberline"], steps=2, lr=1e-3, scenes=0, probe_scenes=0, reply_steps=2)
    (row,) = rows
    assert row["task"] == "numberline" and row["held_out"] == 2 * len(tiny_vision.numberline_pairs(held_out=True))
    assert row["train_samples"] == 2 * len(tiny_vision.numberline_pairs(held_out=False))
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["zeroed"] <= 1.0 and row["chance"] == pytest.approx(4 / 36)

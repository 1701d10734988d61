"""Object labels on observation frames (``env.object_labels``, ``a2c_ppo_acktr/envs/labels.py``).

Checks are on object-id masks and on pixel differences between labelled and unlabelled images, never
on absolute colours (the renderer's shading and the procedural meshes change independently).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, EnvConfig, load_config
from a2c_ppo_acktr.envs.labels import MODES, draw_labels, interior_pixel, layout_labels
from a2c_ppo_acktr.envs.navigation import sample_free_pose
from a2c_ppo_acktr.envs.procedural import make_procedural_scene
from a2c_ppo_acktr.envs.renderer import Camera, Frame, Pose, Renderer, visible_objects
from a2c_ppo_acktr.envs.vsi_env import VSIEnv
from a2c_ppo_acktr.common.prompts import (
    LABEL_SENTENCES,
    Move,
    build_messages,
    feedback_text,
    format_response,
    observation_text,
)

SIZE = 160
MIN_PIXELS = 30


@pytest.fixture(scope="module")
def scene_frames():
    """(scene, renderer, frames): an 8-frame sweep in each of two procedural rooms' free poses."""
    out = []
    for seed in (3, 11):
        scene = make_procedural_scene(seed)
        renderer = Renderer(scene, Camera(SIZE, SIZE))
        p = sample_free_pose(scene, np.random.default_rng(seed), 0.2)
        frames = renderer.render_many([Pose(p.x, p.y, (p.yaw_deg + 45.0 * k) % 360.0) for k in range(8)])
        out.append((scene, renderer, frames))
    labelled = sum(len(visible_objects(f, MIN_PIXELS)) for _, _, fs in out for f in fs)
    assert labelled >= 10, "the test rooms should show some objects"
    return out


def _changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a != b).any(axis=-1)


def _in_boxes(shape, labels) -> np.ndarray:
    inside = np.zeros(shape[:2], dtype=bool)
    for lab in labels:
        top, left, bottom, right = lab.box
        inside[top:bottom, left:right] = True
    return inside


def test_modes_match_the_config_and_unknown_modes_are_rejected():
    assert MODES == ("none", "names", "ids") and tuple(LABEL_SENTENCES) == MODES
    assert EnvConfig().object_labels == "none"
    for mode in MODES:
        assert EnvConfig(object_labels=mode).object_labels == mode
    with pytest.raises(
        ConfigError, match=r"env\.object_labels='boxes' is not allowed; choose one of \['none', 'names', 'ids'\]"
    ):
        EnvConfig(object_labels="boxes")
    # YAML presets and command-line overrides reach the env config.
    assert load_config(preset="debug", overrides=["--env.object_labels", "names"]).env.object_labels == "names"
    assert load_config(preset="debug", overrides=["env.object_labels=ids"]).env.object_labels == "ids"
    with pytest.raises(ConfigError, match="env.object_labels"):
        load_config(preset="debug", overrides=["--env.object_labels", "Names"])
    with pytest.raises(ValueError, match="object label mode"):
        layout_labels(
            Frame(np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4), np.float32), np.zeros((4, 4), np.int32)),
            None,
            "boxes",
            1,
        )


def test_interior_pixel_is_inside_and_away_from_the_boundary():
    rect = np.zeros((40, 60), dtype=bool)
    rect[10:21, 5:46] = True  # 11 x 41: the middle row is 15
    r, c = interior_pixel(rect)
    assert r == 15 and rect[r, c] and 15 <= c <= 35
    # A U shape: its mean position lies in the gap, the interior pixel must not.
    u = np.zeros((50, 50), dtype=bool)
    u[5:45, 5:15] = u[5:45, 35:45] = u[35:45, 5:45] = True
    r, c = interior_pixel(u)
    assert u[r, c] and u[r - 3 : r + 4, c - 3 : c + 4].all()
    # Cut by the image border: the border counts as boundary.
    edge = np.zeros((30, 30), dtype=bool)
    edge[:, :12] = True
    assert interior_pixel(edge)[1] >= 4
    one = np.zeros((5, 5), dtype=bool)
    one[0, 4] = True
    assert interior_pixel(one) == (0, 4)


@pytest.mark.parametrize("mode", ["names", "ids"])
def test_each_label_is_drawn_on_its_object(scene_frames, mode):
    """Per visible object (others masked out of the id map): the anchor is a pixel of the visible
    mask (the box centre's projection when that pixel is in the mask), and the changed pixels are the
    label's box, centred on a mask pixel unless the box was shifted to stay in the image."""
    checked = 0
    rules = set()
    for scene, renderer, frames in scene_frames:
        for frame in frames:
            for oid in visible_objects(frame, MIN_PIXELS):
                mask = frame.object_ids == oid
                alone = dataclasses.replace(frame, object_ids=np.where(mask, oid, -1).astype(np.int32))
                (lab,) = layout_labels(alone, scene, mode, MIN_PIXELS, renderer)
                assert lab.object_id == oid
                assert lab.text == (scene.object(oid).label if mode == "names" else str(oid))
                assert mask[lab.anchor]
                uv, z = renderer.project(frame.pose, scene.object(oid).center[None])
                u, v = uv[0]
                if z[0] > 0 and 0 <= u < SIZE and 0 <= v < SIZE and mask[int(v), int(u)]:
                    assert lab.anchor == (int(v), int(u))
                    rules.add("projection")
                else:
                    assert lab.anchor == interior_pixel(mask)
                    rules.add("interior")
                top, left, bottom, right = lab.box
                assert 0 <= top < bottom <= SIZE and 0 <= left < right <= SIZE
                changed = _changed(draw_labels(alone, scene, mode, MIN_PIXELS, renderer), frame.rgb)
                rows, cols = np.nonzero(changed)
                assert rows.size > 0 and changed[top:bottom, left:right].sum() == rows.size
                centre = ((rows.min() + rows.max()) // 2, (cols.min() + cols.max()) // 2)
                shifted = (top, left) != (lab.anchor[0] - (bottom - top) // 2, lab.anchor[1] - (right - left) // 2)
                if not shifted:
                    assert centre == lab.anchor and mask[centre]
                checked += 1
    assert checked >= 10 and rules == {"projection", "interior"}


def test_none_leaves_frames_identical(scene_frames):
    scene, renderer, frames = scene_frames[0]
    for frame in frames:
        out = draw_labels(frame, scene, "none", MIN_PIXELS, renderer)
        assert out is not frame.rgb and out.dtype == np.uint8 and np.array_equal(out, frame.rgb)
        assert layout_labels(frame, scene, "none", MIN_PIXELS, renderer) == []


def test_ids_differ_from_names_and_only_visible_objects_are_labelled(scene_frames):
    scene, renderer, frames = scene_frames[0]
    before = [f.rgb.copy() for f in frames]
    differs = 0
    for frame, rgb in zip(frames, before):
        names = draw_labels(frame, scene, "names", MIN_PIXELS, renderer)
        ids = draw_labels(frame, scene, "ids", MIN_PIXELS, renderer)
        assert np.array_equal(frame.rgb, rgb)  # the frame is not modified
        visible = visible_objects(frame, MIN_PIXELS)
        labels = layout_labels(frame, scene, "ids", MIN_PIXELS, renderer)
        assert sorted(lab.object_id for lab in labels) == visible
        assert sorted(lab.text for lab in labels) == sorted(str(i) for i in visible)
        # Nothing changes outside the visible objects' label boxes.
        assert not (_changed(ids, frame.rgb) & ~_in_boxes(ids.shape, labels)).any()
        if visible:
            differs += not np.array_equal(names, ids)
        # An object under the pixel threshold gets no label.
        counts = {i: int((frame.object_ids == i).sum()) for i in visible}
        if len(counts) >= 2:
            small = min(counts, key=lambda i: (counts[i], i))
            fewer = layout_labels(frame, scene, "ids", counts[small] + 1, renderer)
            assert small not in {lab.object_id for lab in fewer}
            assert {lab.object_id for lab in fewer} == {i for i in visible if counts[i] > counts[small]}
    assert differs >= 3
    hidden = [
        o.object_id for o in scene.objects if all(o.object_id not in visible_objects(f, MIN_PIXELS) for f in frames)
    ]
    for frame in frames:
        assert not {lab.object_id for lab in layout_labels(frame, scene, "ids", MIN_PIXELS, renderer)} & set(hidden)


def test_labels_are_deterministic(scene_frames):
    scene, renderer, frames = scene_frames[1]
    for mode in ("names", "ids"):
        for frame in frames:
            a = draw_labels(frame, scene, mode, MIN_PIXELS, renderer)
            b = draw_labels(frame, scene, mode, MIN_PIXELS, renderer)
            assert np.array_equal(a, b)
    again = Renderer(scene, Camera(SIZE, SIZE)).render(frames[0].pose)
    assert np.array_equal(
        draw_labels(again, scene, "names", MIN_PIXELS, renderer),
        draw_labels(frames[0], scene, "names", MIN_PIXELS, renderer),
    )


def test_prompt_mentions_labels_iff_they_are_shown():
    args = ("How many chairs?", None, feedback_text(None))
    plain = observation_text(*args, turns_left=5, num_sweep_frames=8, num_views=2)
    assert observation_text(*args, turns_left=5, num_sweep_frames=8, num_views=2, object_labels="none") == plain
    for mode, sentence in (
        ("names", "Each visible object is marked with its category name."),
        ("ids", "Each visible object is marked with a numeric id that stays the same across frames."),
    ):
        text = observation_text(*args, turns_left=5, num_sweep_frames=8, num_views=2, object_labels=mode)
        assert LABEL_SENTENCES[mode] == sentence and text.count(sentence) == 1
        assert text.replace(sentence + "\n", "") == plain
        assert text.index(sentence) > text.index("Images:") and text.index(sentence) < text.index("Last turn:")
        # A blind evaluation shows no images, so it does not mention marks on them either.
        blind = build_messages({"images": [], "text": text}, blind=True)[1]["content"][0]["text"]
        assert blind == build_messages({"images": [], "text": plain}, blind=True)[1]["content"][0]["text"]
    assert "marked" not in plain
    with pytest.raises(ValueError, match="object_labels='boxes'"):
        observation_text(*args, turns_left=5, object_labels="boxes")


def _episode(mode: str, seed: int = 5):
    env = VSIEnv(image_size=128, num_sweep_frames=4, image_history=2, object_labels=mode, render_mode="rgb_array")
    first, _ = env.reset(seed=seed, options={"scene_index": 2})
    second, *_ = env.step(format_response("look", Move(60.0, 0.5)))
    return env, [first, second]


def test_env_observations_are_labelled_only_near_visible_objects():
    plain_env, plain = _episode("none")
    env, labelled = _episode("names")
    _, again = _episode("names")
    # The env keeps unlabelled frames; questions do not depend on labels.
    assert env.question == plain_env.question and env.appearance_order == plain_env.appearance_order
    for a, b in zip(env.sweep_frames + env.views, plain_env.sweep_frames + plain_env.views):
        assert np.array_equal(a.rgb, b.rgb) and np.array_equal(a.object_ids, b.object_ids)
    # With none the observed images are the renderer's frames, byte for byte.
    assert all(np.array_equal(im, f.rgb) for im, f in zip(plain[1]["images"], plain_env.sweep_frames + plain_env.views))
    assert np.array_equal(plain_env.render(), plain_env.views[-1].rgb)
    sentence = LABEL_SENTENCES["names"]
    frames = env.sweep_frames + env.views  # the images of the second observation, in order
    changed_images = 0
    for obs, obs_plain, obs_again in zip(labelled, plain, again):
        assert sentence not in obs_plain["text"] and obs["text"].replace(sentence + "\n", "") == obs_plain["text"]
        assert obs["text"] == obs_again["text"]
        assert len(obs["images"]) == len(obs_plain["images"])
        for im, im_again in zip(obs["images"], obs_again["images"]):
            assert np.array_equal(im, im_again)  # deterministic
    for im, im_plain, frame in zip(labelled[1]["images"], plain[1]["images"], frames):
        labels = layout_labels(frame, env.scene, "names", env._min_pixels, env.renderer)
        changed = _changed(im, im_plain)
        assert not (changed & ~_in_boxes(im.shape, labels)).any()
        for lab in labels:
            assert frame.object_ids[lab.anchor] == lab.object_id
            top, left, bottom, right = lab.box
            assert changed[top:bottom, left:right].any()
        changed_images += bool(changed.any())
    assert changed_images >= 2
    assert np.array_equal(env.render(), labelled[1]["images"][-1])

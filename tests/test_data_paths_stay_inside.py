"""Paths built from data stay inside their roots: scene names and video names from benchmark rows,
image paths from labelled trajectories. ``..`` and symbolic links that lead out are refused in one
line naming the row or file; links that stay inside, and a root that is itself a link, are fine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.safe_paths import PathOutsideRoot, contained, plain_name_problem
from a2c_ppo_acktr.envs.real_scans import SceneLoadError, find_scene
from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError, load_vsibench_rows, scene_for_row, validate_row
from test_real_scans import make_scannet

ROW = {
    "id": 7,
    "dataset": "scannet",
    "scene_name": "scene0001_00",
    "question_type": "object_counting",
    "question": "How many chairs?",
    "ground_truth": "2",
}


@pytest.mark.parametrize(
    "name", ["../outside/scene0001_00", "..", ".", "a/b", "a\\b", "/etc/passwd", "C:scene", "x\0y", " "]
)
def test_a_scene_name_that_is_a_path_is_refused_when_the_rows_load(tmp_path, name):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "id": 8, "scene_name": name}) + "\n")
    with pytest.raises(VSIBenchRowError) as e:
        load_vsibench_rows(rows)
    message = str(e.value)
    assert "rows.jsonl row 1 (id 8)" in message and "scene_name" in message and "\n" not in message.strip()


def test_a_dotdot_scene_name_cannot_load_a_scan_from_outside_the_data_root(tmp_path):
    """The loaded rows are validated, but find_scene is also called with names from elsewhere: it
    refuses a path itself, before looking anywhere."""
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "scans").mkdir(parents=True)
    make_scannet(outside, binary=True, name="scene0001_00")
    with pytest.raises(SceneLoadError, match="is a path, not a name"):
        find_scene(root / "scans", "scannet", "../outside/scene0001_00")
    with pytest.raises(SceneLoadError, match="is a path, not a name"):
        find_scene(root, "scannet", "../outside/scene0001_00")


def test_a_scene_directory_linked_out_of_the_data_root_is_refused_naming_the_row(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "scans").mkdir(parents=True)
    scene_dir, _, _ = make_scannet(outside, binary=True, name="scene0001_00")
    (root / "scans" / "scene0001_00").symlink_to(scene_dir, target_is_directory=True)
    with pytest.raises(SceneLoadError) as e:
        scene_for_row(validate_row(ROW), root)
    message = str(e.value)
    assert "VSI-Bench row 7" in message and "outside" in message and "symbolic link" in message
    assert isinstance(e.value, UserError) and "\n" not in message


def test_a_scan_file_linked_out_of_the_data_root_is_refused(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    scene_dir, _, _ = make_scannet(root / "scans", binary=True, name="scene0001_00")
    outside.mkdir()
    meta = scene_dir / "scene0001_00.txt"
    (outside / "private.txt").write_text(meta.read_text())
    meta.unlink()
    meta.symlink_to(outside / "private.txt")
    with pytest.raises(SceneLoadError, match=r"scene0001_00\.txt.*outside"):
        find_scene(root, "scannet", "scene0001_00")


def test_links_inside_the_root_and_a_root_that_is_a_link_are_fine(tmp_path):
    real = tmp_path / "real"
    scene_dir, _, _ = make_scannet(real / "store", binary=True, name="scene0001_00")
    (real / "scans").mkdir()
    (real / "scans" / "scene0001_00").symlink_to(scene_dir, target_is_directory=True)  # stays inside
    (tmp_path / "data").symlink_to(real, target_is_directory=True)  # the root itself is a link
    assert find_scene(tmp_path / "data", "scannet", "scene0001_00").scene_id == "scene0001_00"


# ------------------------------------------------------------------------------ videos
def test_a_video_name_or_link_that_leads_out_of_the_video_root_is_refused_naming_the_row(tmp_path):
    from a2c_ppo_acktr.eval.video_protocol import video_file, video_questions

    root, outside = tmp_path / "videos", tmp_path / "outside"
    (root / "scannet").mkdir(parents=True)
    outside.mkdir()
    (outside / "private.mp4").write_bytes(b"\0" * 16)
    with pytest.raises(PathOutsideRoot, match="is a path, not a name"):
        video_file(root, "scannet", "../../outside/private")
    (root / "scannet" / "scene0001_00.mp4").symlink_to(outside / "private.mp4")
    with pytest.raises(PathOutsideRoot) as e:
        video_questions([validate_row(ROW)], root)
    assert "VSI-Bench row 7" in str(e.value) and "symbolic link" in str(e.value) and isinstance(e.value, UserError)
    inside = root / "scannet" / "scene0002_00.mp4"
    inside.write_bytes(b"\0" * 16)
    assert video_file(root, "scannet", "scene0002_00") == inside


# ------------------------------------------------------------------------------ label images
def _episode(images: list[str]) -> dict:
    return {
        "episode_id": "ep00000001",
        "scene_id": "s1",
        "question_type": "object_counting",
        "score": 1.0,
        "env_id": "VSI-v0",
        "turns": [
            {
                "images": images,
                "observation_text": "How many chairs?",
                "teacher_output": "Thought: two.\nAction: answer(2)",
                "executed": "Thought: two.\nAction: answer(2)",
                "teacher_error": None,
                "valid": True,
            }
        ],
    }


def _labels(tmp_path: Path, images: list[str]) -> Path:
    from PIL import Image

    lab = tmp_path / "lab"
    (lab / "images" / "ep00000001").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(lab / "images" / "ep00000001" / "a.png")
    (lab / "trajectories.jsonl").write_text(json.dumps(_episode(images)) + "\n")
    return lab


@pytest.mark.parametrize("link", ["file", "directory"])
def test_a_label_image_linked_out_of_the_label_folder_is_refused_before_anything_is_written(tmp_path, link):
    """The lexical check (no absolute path, no ``..``) passed such a link; resolving it does not."""
    from PIL import Image

    from a2c_ppo_acktr.config.arguments import ConfigError, LabelConfig
    from SFT.data import build_sft_dataset

    outside = tmp_path / "outside"
    outside.mkdir()
    Image.fromarray(np.full((8, 8, 3), 255, np.uint8)).save(outside / "private.png")
    if link == "file":
        lab = _labels(tmp_path, ["images/ep00000001/a.png", "images/ep00000001/b.png"])
        (lab / "images" / "ep00000001" / "b.png").symlink_to(outside / "private.png")
    else:
        lab = _labels(tmp_path, ["images/ep00000001/a.png", "images/elsewhere/private.png"])
        (lab / "images" / "elsewhere").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError) as e:
        build_sft_dataset(lab / "trajectories.jsonl", tmp_path / "data", LabelConfig())
    message = str(e.value)
    assert "trajectories.jsonl (episode 1)" in message and "turns[0].images" in message and "outside" in message
    assert not (tmp_path / "data").exists()


def test_label_images_inside_the_folder_build_a_dataset(tmp_path):
    from a2c_ppo_acktr.config.arguments import LabelConfig
    from SFT.data import build_sft_dataset

    lab = _labels(tmp_path, ["images/ep00000001/a.png", "images/ep00000001/b.png"])
    (lab / "images" / "ep00000001" / "b.png").symlink_to(
        lab / "images" / "ep00000001" / "a.png"
    )  # a link that stays inside
    assert (
        build_sft_dataset(lab / "trajectories.jsonl", tmp_path / "data", LabelConfig(val_fraction=0.0))["train_samples"]
        == 1
    )


def test_contained_and_plain_names():
    assert plain_name_problem("scene0011_00") is None and plain_name_problem("41069025") is None
    assert "absolute" in str(pytest.raises(PathOutsideRoot, contained, "/data", "/etc/passwd", "x").value)

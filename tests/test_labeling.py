"""Labelling: episodes are recorded faithfully, a killed run resumes without duplicates, bad teacher
output is recorded (not fatal), exploration keeps the teacher's labels, and preprocessing builds
RL-identical prompts split by scene."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig, load_config
from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, episode_id, label_trajectories, read_episodes
from a2c_ppo_acktr.common.prompts import Invalid, Move, build_messages, parse_action
from a2c_ppo_acktr.labels.teachers import OracleTeacher, Teacher, TeacherReply
from SFT.data import load_image


def _cfg(out_dir: Path, **label) -> RunConfig:
    overrides = {
        "env": {"image_size": 16, "num_sweep_frames": 2, "image_history": 1, "max_turns": 3, "num_scenes": 6},
        "label": {"out_dir": str(out_dir), "num_episodes": 6, "batch_size": 3, "seed": 100, **label},
        "log": {"progress_bar": False},
    }
    return load_config(preset="debug", overrides=overrides)


class Interrupt(Exception):
    pass


class OracleWrapper(Teacher):
    """The oracle under its own name and description (the label meta stays the oracle's); subclasses
    change what ``generate`` does."""

    name = "oracle"

    def __init__(self) -> None:
        self.inner = OracleTeacher()

    def describe(self):
        return self.inner.describe()


class StopAfter(OracleWrapper):
    """The oracle, but the run is killed (an exception) at the given call."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls = calls

    def generate(self, observations, envs=None):
        self.calls -= 1
        if self.calls < 0:
            raise Interrupt()
        return self.inner.generate(observations, envs)


def test_episodes_are_recorded_with_their_images(tmp_path):
    cfg = _cfg(tmp_path / "lab")
    summary = label_trajectories(cfg)
    assert summary["written"] == 6 and summary["mean_score"] >= 0.95
    episodes = read_episodes(tmp_path / "lab" / TRAJECTORIES)
    assert sorted(e["episode_id"] for e in episodes) == [episode_id(100, i) for i in range(6)]
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

    env = VSIEnv(cfg.env)
    for ep in episodes:
        # Replaying the executed texts from the same seed reproduces every observation exactly.
        obs, _ = env.reset(seed=ep["seed"])
        assert env.unwrapped.question.question == ep["question"] and env.unwrapped.scene.scene_id == ep["scene_id"]
        for turn in ep["turns"]:
            assert turn["observation_text"] == obs["text"]
            stored = [load_image(tmp_path / "lab" / p) for p in turn["images"]]
            assert len(stored) == len(obs["images"]) and all(
                np.array_equal(a, b) for a, b in zip(stored, obs["images"])
            )
            assert not Path(turn["images"][0]).is_absolute()
            assert turn["valid"] and repr(parse_action(turn["teacher_output"])) == turn["action"]
            obs, reward, terminated, truncated, info = env.step(turn["executed"])
            assert reward == turn["reward"]
        assert terminated and info["score"] == ep["score"]
    # Sweep frames repeat every turn but are stored once per episode.
    first = episodes[0]
    all_paths = [p for t in first["turns"] for p in t["images"]]
    assert len(list((tmp_path / "lab" / "images" / first["episode_id"]).iterdir())) == len(set(all_paths))


def test_labelling_resumes_after_interruption_without_duplicates(tmp_path, caplog):
    full = _cfg(tmp_path / "full")
    label_trajectories(full)
    reference = {e["episode_id"]: e for e in read_episodes(tmp_path / "full" / TRAJECTORIES)}

    cfg = _cfg(tmp_path / "lab")
    with pytest.raises(Interrupt):
        label_trajectories(cfg, teacher=StopAfter(calls=3))
    path = tmp_path / "lab" / TRAJECTORIES
    done_before = read_episodes(path)
    assert 0 < len(done_before) < 6
    with open(path, "a", encoding="utf-8") as f:  # a write torn by the kill
        f.write('{"episode_id": "ep00000105", "turns": [{"obs')
    with caplog.at_level(logging.WARNING):
        summary = label_trajectories(cfg)
    assert "torn last line" in caplog.text
    assert summary["skipped"] == len(done_before) and summary["written"] == 6 - len(done_before)
    episodes = read_episodes(path)
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)) == 6
    for e in episodes:  # deterministic: the resumed run wrote what an uninterrupted one did
        assert e == reference[e["episode_id"]]
    assert path.read_text(encoding="utf-8").endswith("\n")
    # A third run has nothing left to do.
    assert label_trajectories(cfg)["written"] == 0


def test_resume_with_other_settings_is_refused(tmp_path):
    label_trajectories(_cfg(tmp_path / "lab", num_episodes=1))
    other = _cfg(tmp_path / "lab", num_episodes=1)
    other.env.max_turns = 5
    with pytest.raises(ConfigError, match=r"different setup \(differs in: \['env.max_turns \(\d+ -> 5\)'\]\)"):
        label_trajectories(other)
    # A directory labelled before a config field existed names the field rather than "env".
    meta_path = tmp_path / "lab" / "label_meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["env"]["look"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"env.look \('missing' -> 'shaded'\)"):
        label_trajectories(_cfg(tmp_path / "lab", num_episodes=1))


class Flaky(Teacher):
    """Garbage on even calls, a failed request on every third observation."""

    name = "flaky"

    def __init__(self) -> None:
        self.oracle = OracleTeacher()
        self.n = 0

    def generate(self, observations, envs=None):
        out = []
        for reply in self.oracle.generate(observations, envs):
            self.n += 1
            if self.n % 3 == 0:
                out.append(TeacherReply("", error="HTTP 503 after 4 attempts", attempts=4))
            elif self.n % 2 == 0:
                out.append(TeacherReply("Sure! The answer is probably B."))
            else:
                out.append(reply)
        return out


def test_malformed_and_failed_teacher_turns_are_recorded(tmp_path):
    cfg = _cfg(tmp_path / "lab")
    summary = label_trajectories(cfg, teacher=Flaky())
    assert summary["written"] == 6
    turns = [t for e in read_episodes(tmp_path / "lab" / TRAJECTORIES) for t in e["turns"]]
    failed = [t for t in turns if t["teacher_error"] is not None]
    garbage = [t for t in turns if t["teacher_error"] is None and not t["valid"]]
    assert failed and garbage
    assert summary["failed_turns"] == len(failed) and summary["invalid_turns"] == len(failed) + len(garbage)
    assert all(t["action"].startswith("Invalid(") and t["executed"] == t["teacher_output"] for t in failed + garbage)
    assert all(t["reward"] == cfg.env.invalid_penalty for t in failed + garbage)


def test_exploration_executes_random_moves_but_keeps_teacher_labels(tmp_path):
    cfg = _cfg(tmp_path / "lab", epsilon=1.0)
    summary = label_trajectories(cfg)
    episodes = read_episodes(tmp_path / "lab" / TRAJECTORIES)
    for ep in episodes:
        turns = ep["turns"]
        assert len(turns) == cfg.env.max_turns  # explored until the last turn, then the oracle answered
        for t in turns[:-1]:
            assert t["explore"] and isinstance(parse_action(t["executed"]), Move)
            assert t["teacher_output"] != t["executed"]
        assert not turns[-1]["explore"] and turns[-1]["executed"] == turns[-1]["teacher_output"]
    assert summary["explore_turns"] == 6 * (cfg.env.max_turns - 1)


def test_preprocess_builds_rl_prompts_and_splits_by_scene(tmp_path):
    from SFT.data import build_sft_dataset

    cfg = _cfg(tmp_path / "lab", num_episodes=8)
    label_trajectories(cfg, teacher=Flaky())
    lab = cfg.label
    lab.val_fraction, lab.min_score, lab.dataset_dir = 0.34, 0.5, str(tmp_path / "data")
    stats = build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, lab.dataset_dir, lab)
    episodes = {e["episode_id"]: e for e in read_episodes(tmp_path / "lab" / TRAJECTORIES)}
    train = [json.loads(x) for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (tmp_path / "data" / "val.jsonl").read_text().splitlines()]
    assert stats["train_samples"] == len(train) and stats["val_samples"] == len(val) and val and train
    assert not {r["scene_id"] for r in train} & {r["scene_id"] for r in val}
    kept = [e for e in episodes.values() if e["score"] >= 0.5]
    usable = sum(t["teacher_error"] is None and t["valid"] for e in kept for t in e["turns"])
    assert len(train) + len(val) == usable  # one sample per usable turn of a kept episode
    for row in train + val:
        turn = episodes[row["episode_id"]]["turns"][row["turn"]]
        obs = {"images": turn["images"], "text": turn["observation_text"]}
        assert row["messages"][:-1] == build_messages(obs)  # exactly the RL prompt's messages
        assert row["messages"][-1]["content"][0]["text"] == turn["teacher_output"]
        assert not isinstance(parse_action(turn["teacher_output"]), Invalid)
        assert all((tmp_path / "data" / p).is_file() for p in row["images"])
    # History: each sample carries up to one earlier turn (user + what was executed) as context.
    lab.history_turns, lab.min_score, lab.val_fraction = 1, 0.0, 0.0
    build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, tmp_path / "hist", lab)
    for row in (json.loads(x) for x in (tmp_path / "hist" / "train.jsonl").read_text().splitlines()):
        turns = episodes[row["episode_id"]]["turns"]
        roles = [m["role"] for m in row["messages"]]
        if row["turn"] == 0:
            assert roles == ["system", "user", "assistant"]
        else:
            assert roles == ["system", "user", "assistant", "user", "assistant"]
            assert row["messages"][2]["content"][0]["text"] == turns[row["turn"] - 1]["executed"]


def test_preprocess_one_sample_per_episode(tmp_path):
    from SFT.data import build_sft_dataset

    cfg = _cfg(tmp_path / "lab", num_episodes=4, epsilon=1.0)  # three turns per episode
    label_trajectories(cfg)
    lab = cfg.label
    lab.per_turn, lab.val_fraction = False, 0.0
    stats = build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, tmp_path / "data", lab)
    rows = [json.loads(x) for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert stats["train_samples"] == len(rows) == 4
    episodes = {e["episode_id"]: e for e in read_episodes(tmp_path / "lab" / TRAJECTORIES)}
    for row in rows:
        turns = episodes[row["episode_id"]]["turns"]
        assert row["turn"] == len(turns) - 1
        assert [m["role"] for m in row["messages"]] == ["system"] + ["user", "assistant"] * len(turns)
        assert [m["content"][0]["text"] for m in row["messages"][2:-1:2]] == [t["executed"] for t in turns[:-1]]
        assert row["images"] and len(row["images"]) == sum(len(t["images"]) for t in turns)


def test_preprocess_refuses_a_missing_or_empty_label_dir_and_keeps_the_dataset(tmp_path, capsys):
    """The faults that emptied a built dataset: a label dir that does not exist, an empty
    trajectories file, a min_score nothing reaches. Each ends in one line (exit 2) and the existing
    train.jsonl is byte-identical after."""
    import vlm_traj_preprocess

    cfg = _cfg(tmp_path / "lab", num_episodes=3)
    label_trajectories(cfg)
    args = [
        "--preset",
        "debug",
        "--label.out_dir",
        str(tmp_path / "lab"),
        "--label.dataset_dir",
        str(tmp_path / "data"),
    ]
    vlm_traj_preprocess.main(args)
    before = (tmp_path / "data" / "train.jsonl").read_bytes()
    assert before
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / TRAJECTORIES).write_text("")
    (tmp_path / "low").mkdir()  # the same episodes, every one scored 0.2
    (tmp_path / "low" / TRAJECTORIES).write_text(
        "".join(json.dumps({**ep, "score": 0.2}) + "\n" for ep in read_episodes(tmp_path / "lab" / TRAJECTORIES))
    )
    from a2c_ppo_acktr.config.cli import run_main

    for bad, message in (
        (["--label.out_dir", str(tmp_path / "nope")], "holds no labelled trajectories"),
        (["--label.out_dir", str(tmp_path / "empty")], "holds no episode"),
        (["--label.out_dir", str(tmp_path / "low"), "--label.min_score", "0.5"], "lower label.min_score"),
    ):
        rc = run_main(lambda: vlm_traj_preprocess.main(args + bad), "vlm_traj_preprocess.py")
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err, err
        assert (tmp_path / "data" / "train.jsonl").read_bytes() == before


class Outage(OracleWrapper):
    """The oracle, or (``fail``) a server that cannot be reached: every reply empty, with an error."""

    def __init__(self, fail: bool) -> None:
        super().__init__()
        self.fail = fail

    def generate(self, observations, envs=None):
        replies = self.inner.generate(observations, envs)
        if not self.fail:
            return replies
        return [
            TeacherReply("", error="cannot reach http://teacher/v1/chat/completions: timed out", attempts=4)
            for _ in replies
        ]


def test_episodes_labelled_during_an_outage_are_labelled_again_and_preprocessing_keeps_the_new_line(tmp_path, caplog):
    from a2c_ppo_acktr.labels.labeling import latest_episodes
    from SFT.data import build_sft_dataset

    cfg = _cfg(tmp_path / "lab")
    label_trajectories(cfg, teacher=Outage(fail=True))
    path = tmp_path / "lab" / TRAJECTORIES
    assert all(t["teacher_error"] for e in read_episodes(path) for t in e["turns"])
    with caplog.at_level(logging.WARNING):
        summary = label_trajectories(cfg, teacher=Outage(fail=False))
    assert summary["written"] == 6 and "6 episode(s)" in caplog.text and "labelling them again" in caplog.text
    latest, superseded = latest_episodes(read_episodes(path))
    assert superseded == 6 and len(latest) == 6 and not any(t["teacher_error"] for e in latest for t in e["turns"])
    assert label_trajectories(cfg, teacher=Outage(fail=False))["written"] == 0  # now done
    stats = build_sft_dataset(path, tmp_path / "data", cfg.label, seed=0)
    assert stats["episodes"] == 6 and stats["superseded_lines"] == 6

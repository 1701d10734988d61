"""One atomic-write helper: the target is its complete old or complete new self, never half."""

from __future__ import annotations

import json
import os

import pytest

from a2c_ppo_acktr.common import atomic


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old", encoding="utf-8")
    atomic.write_json({"x": [1, 2]}, path)
    assert json.loads(path.read_text(encoding="utf-8")) == {"x": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("complete old content\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic.open_atomic(path) as f:
            f.write("half of the new")
            assert atomic.temporary_sibling(path).exists()  # the writes go beside, not into, the target
            raise RuntimeError("disk full")
    assert path.read_text(encoding="utf-8") == "complete old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_durable_writes_fsync_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    path = tmp_path / "r.bin"
    with atomic.open_atomic(path, "wb", durable=True) as f:
        f.write(b"\x00\x01")
    assert synced == [os.path.realpath(atomic.temporary_sibling(path)), os.path.realpath(tmp_path)]
    synced.clear()
    atomic.write_text(tmp_path / "plain.txt", "x")
    assert synced == []  # not durable: no fsync


def test_open_atomic_refuses_append_and_read_modes(tmp_path):
    for mode in ("a", "r", "w+"):
        with pytest.raises(ValueError, match="whole file"):
            with atomic.open_atomic(tmp_path / "x", mode):
                pass


def test_publish_dir_replaces_an_existing_directory(tmp_path):
    target, new = tmp_path / "best", tmp_path / ".tmp-best"
    target.mkdir()
    (target / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    atomic.publish_dir(new, target)
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]

"""The tiny builds that ship with the package (a2c_ppo_acktr/tiny/shipped.py): used only when they are
this code's build, copied file for file, and refused with a reason otherwise (the caller then builds)."""

from __future__ import annotations

import json
import shutil

import pytest

from a2c_ppo_acktr.tiny import build as tiny
from a2c_ppo_acktr.tiny import shipped
from a2c_ppo_acktr.tiny import cli

# The quickstart copies these two instead of building them (2 and 8 minutes on 2 cores).
QUICKSTART_BUILDS = [("qwen2_5_vl", 0), ("qwen2_5_vl-rooms", 0)]


@pytest.mark.parametrize("family,seed", QUICKSTART_BUILDS)
def test_the_quickstarts_builds_ship_and_are_this_codes(family, seed):
    # Fails when an edit of the build or of the code that draws its samples changes the spec hash:
    # ship again with `python -m a2c_ppo_acktr.tiny.shipped --family F --seed 0` (the quickstart would
    # otherwise build for minutes).
    path, reason = shipped.find_shipped(family, seed)
    assert path is not None, reason
    info = json.loads((path / "tiny_build.json").read_text())
    assert (info["build"], info["seed"], info["spec_hash"]) == (family, seed, tiny.spec_hash(family, seed))
    manifest = json.loads((path / shipped.MANIFEST).read_text())
    assert {"model.safetensors", "config.json", "tiny_build.json", "tokenizer.json"} <= set(manifest["files"])
    assert (family, seed) in shipped.shipped_builds()


@pytest.fixture
def root(tmp_path):
    """A shipped root holding a copy of the shipped default build."""
    src, _ = shipped.find_shipped("qwen2_5_vl", 0)
    assert src is not None
    dst = tmp_path / "root"
    shutil.copytree(src, shipped.shipped_path("qwen2_5_vl", 0, dst))
    return dst


def _rewrite(path, name, edit):
    """Edit one shipped file and record its new sha256, as a re-ship with other content would."""
    manifest = json.loads((path / shipped.MANIFEST).read_text())
    edit(path / name)
    manifest["files"][name] = shipped.file_sha256(path / name)
    (path / shipped.MANIFEST).write_text(json.dumps(manifest))


def test_install_copies_every_file_as_shipped(root, tmp_path):
    out = tmp_path / "out"
    assert shipped.install_shipped("qwen2_5_vl", 0, out, root=root) == ""
    src = shipped.shipped_path("qwen2_5_vl", 0, root)
    names = json.loads((src / shipped.MANIFEST).read_text())["files"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert all((out / n).read_bytes() == (src / n).read_bytes() for n in names)
    tiny.check_base_build(out, "qwen2_5_vl", 0)  # what a build on top of it accepts as its base
    # The copy is a model the loaders read, of the size its build recorded.
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(out)
    info = json.loads((out / "tiny_build.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    assert len(AutoProcessor.from_pretrained(out).tokenizer) == info["tokenizer_size"]


def test_a_changed_missing_or_foreign_file_is_refused_with_the_reason(root, tmp_path):
    path = shipped.shipped_path("qwen2_5_vl", 0, root)
    model = path / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    got, reason = shipped.find_shipped("qwen2_5_vl", 0, root)
    assert got is None and "model.safetensors is not the file that was shipped" in reason
    assert shipped.install_shipped("qwen2_5_vl", 0, tmp_path / "out", root=root) == reason
    assert not (tmp_path / "out").exists()  # nothing copied
    model.unlink()
    assert "model.safetensors is missing" in shipped.find_shipped("qwen2_5_vl", 0, root)[1]
    (path / shipped.MANIFEST).unlink()
    assert "not a complete shipped build" in shipped.find_shipped("qwen2_5_vl", 0, root)[1]
    assert "no build of qwen2_5_vl seed 3 ships" in shipped.find_shipped("qwen2_5_vl", 3, root)[1]


def test_a_build_of_other_code_or_another_seed_is_refused(root):
    path = shipped.shipped_path("qwen2_5_vl", 0, root)

    def other_hash(p):
        info = json.loads(p.read_text())
        info["spec_hash"] = "0123456789"
        p.write_text(json.dumps(info))

    _rewrite(path, "tiny_build.json", other_hash)
    got, reason = shipped.find_shipped("qwen2_5_vl", 0, root)
    assert got is None and "built by other build code (spec hash 0123456789" in reason
    assert "python -m a2c_ppo_acktr.tiny.shipped --family qwen2_5_vl --seed 0" in reason
    # The same files under another seed's name: the record says seed 0.
    shutil.copytree(path, shipped.shipped_path("qwen2_5_vl", 1, root))
    assert "holds the build 'qwen2_5_vl' of seed 0" in shipped.find_shipped("qwen2_5_vl", 1, root)[1]


def test_the_recorded_library_versions_define_the_hash_not_the_installed_ones(root, monkeypatch):
    monkeypatch.setattr(tiny, "build_versions", lambda: {"transformers": "9.9.9", "tokenizers": "9.9.9"})
    assert tiny.spec_hash("qwen2_5_vl", 0) != tiny.spec_hash(
        "qwen2_5_vl",
        0,
        json.loads((shipped.shipped_path("qwen2_5_vl", 0, root) / shipped.MANIFEST).read_text())["versions"],
    )
    got, reason = shipped.find_shipped("qwen2_5_vl", 0, root)
    assert got is not None, reason


def test_ship_replaces_the_shipped_copy_and_refuses_another_build(root, tmp_path):
    build = tmp_path / "build"
    shutil.copytree(shipped.shipped_path("qwen2_5_vl", 0, root), build)
    (build / shipped.MANIFEST).unlink()  # a build directory as build_tiny_model writes it
    other = tmp_path / "other_root"
    path = shipped.ship("qwen2_5_vl", 0, build, root=other)
    assert path == shipped.shipped_path("qwen2_5_vl", 0, other)
    assert shipped.find_shipped("qwen2_5_vl", 0, other)[0] == path
    manifest = json.loads((path / shipped.MANIFEST).read_text())
    assert manifest["versions"] == tiny.build_versions() and manifest["build"] == "qwen2_5_vl"
    assert shipped.ship("qwen2_5_vl", 0, build, root=other) == path  # again: replaced, not nested
    assert [p.name for p in other.iterdir()] == ["qwen2_5_vl-seed0"]
    with pytest.raises(ValueError, match="not shipped: .* holds the tiny build 'qwen2_5_vl' of seed 0"):
        shipped.ship("qwen2_5_vl", 1, build, root=other)
    assert shipped.main(["--family", "qwen2_5_vl", "--from", str(tmp_path / "nothing")]) == 2


def test_cli_shipped_copies_else_builds_and_says_why(root, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    out = tmp_path / "model"
    cli.main(["--family", "qwen2_5_vl", "--seed", "0", "--out", str(out), "--shipped"])
    assert capsys.readouterr().err.strip() == "[tiny] the shipped build of qwen2_5_vl seed 0, copied"
    tiny.check_base_build(out, "qwen2_5_vl", 0)
    built = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda family, out, **kw: built.append((family, kw["seed"])) or out)
    cli.main(["--family", "qwen2_5_vl", "--seed", "2", "--out", str(tmp_path / "seed2"), "--shipped"])
    assert built == [("qwen2_5_vl", 2)]
    assert "[tiny] building qwen2_5_vl seed 2: no build of qwen2_5_vl seed 2 ships" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--family", "qwen2_5_vl", "--shipped"])
    assert "--shipped copies into --out" in capsys.readouterr().err


def test_check_reports_every_shipped_build(root, monkeypatch, capsys):
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    assert shipped.main(["--check"]) == 0
    assert capsys.readouterr().out.strip() == "qwen2_5_vl seed 0: current"
    assert shipped.main(["--check", "--family", "qwen2_5_vl", "--seed", "0"]) == 0
    assert shipped.main(["--check", "--family", "qwen2_5_vl-rooms", "--seed", "0"]) == 1  # what the quickstart asks
    assert "no build of qwen2_5_vl-rooms seed 0 ships" in capsys.readouterr().out
    (shipped.shipped_path("qwen2_5_vl", 0, root) / "config.json").write_text("{}")
    assert shipped.main(["--check"]) == 1
    assert "qwen2_5_vl seed 0: NOT CURRENT:" in capsys.readouterr().out

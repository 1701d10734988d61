"""Nothing a user made is deleted or overwritten by surprise: a fresh start in a used run directory
is refused (or, with log.overwrite, moves the old run aside), and resuming from an older checkpoint
sets the newer ones aside instead of letting pruning or --resume auto mix the two runs."""

import json

import pytest
import torch

from a2c_ppo_acktr.config.arguments import load_config
from a2c_ppo_acktr.run.checkpoint import CheckpointError, list_checkpoints
from a2c_ppo_acktr.rl.train import run_training


def _cfg(out, **extra):
    base = {
        "log.output_dir": str(out),
        "log.progress_bar": "false",
        "log.tensorboard": "false",
        "log.save_interval": "1",
        "log.keep_checkpoints": "2",
        "ppo.num_iterations": "2",
    }
    base.update(extra)
    return load_config(preset="debug", overrides=[f"{k}={v}" for k, v in base.items()])


def test_fresh_start_in_a_used_directory_is_refused_then_moved_aside(tmp_path):
    out = tmp_path / "run"
    first = run_training(_cfg(out))
    before = torch.load(first / "trainable.pt")
    with pytest.raises(
        CheckpointError,
        match=(
            r"already holds a run \(checkpoint-000001, checkpoint-000002, metrics.jsonl\).*--resume "
            r"auto.*--log.overwrite true"
        ),
    ):
        run_training(_cfg(out, **{"seed": "7"}))
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [
        "checkpoint-000001",
        "checkpoint-000002",
    ]  # untouched
    run_training(_cfg(out, **{"seed": "7", "log.overwrite": "true"}))
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    kept = torch.load(aside / "checkpoints" / "checkpoint-000002" / "trainable.pt")
    assert all(torch.equal(kept[n], before[n]) for n in before)  # the old run, whole, moved aside
    assert (aside / "metrics.jsonl").is_file()
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["checkpoint-000001", "checkpoint-000002"]


def test_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path, caplog):
    out = tmp_path / "run"
    run_training(_cfg(out, **{"ppo.num_iterations": "4", "log.keep_checkpoints": "4"}))
    older = out / "checkpoints" / "checkpoint-000002"
    with caplog.at_level("INFO"):
        run_training(_cfg(out, **{"ppo.num_iterations": "3", "log.keep_checkpoints": "4", "log.resume": str(older)}))
    assert f"resumed from {older} at iteration 2" in caplog.text
    names = [p.name for p in list_checkpoints(out / "checkpoints")]
    assert names == [
        "checkpoint-000001",
        "checkpoint-000002",
        "checkpoint-000003",
    ]  # the new branch, not the old 000004
    (abandoned,) = (out / "checkpoints").glob("abandoned-*")
    assert sorted(p.name for p in abandoned.iterdir()) == ["checkpoint-000003", "checkpoint-000004", "metrics.jsonl"]
    from a2c_ppo_acktr.run.logger import read_metrics

    assert [r["iteration"] for r in read_metrics(abandoned / "metrics.jsonl")] == [
        3,
        4,
    ]  # the branch's rows, kept with it
    assert [r["iteration"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]


# ------------------------------------------------------------------------ no code from files
class _Exploit:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def test_a_planted_rank_state_file_runs_nothing(tmp_path):
    """A crafted rankNNN.pkl (os.system in __reduce__) is refused before anything runs, by the loader
    and by --resume auto, which names the file."""
    import pickle

    from a2c_ppo_acktr.run.checkpoint import load_pickle

    out = tmp_path / "run"
    last = run_training(_cfg(out))
    marker = tmp_path / "pwned"
    (last / "rank000.pkl").write_bytes(pickle.dumps({"rng": _Exploit(marker)}))
    with pytest.raises(CheckpointError, match=r"rank000.pkl.*refusing to load posix.system"):
        load_pickle(last / "rank000.pkl")
    # A shared checkpoint comes with checksums that match its (crafted) files: the unpickler must hold.
    from a2c_ppo_acktr.run.checkpoint import COMPLETE_MARKER, file_checksums

    meta = json.loads((last / COMPLETE_MARKER).read_text())
    (last / COMPLETE_MARKER).write_text(json.dumps({**meta, "files": file_checksums(last)}))
    with pytest.raises(CheckpointError, match="refusing to load"):
        run_training(_cfg(out, **{"log.resume": "auto", "ppo.num_iterations": "3"}))
    assert not marker.exists()
    for evil in (b"cbuiltins\neval\n(S'1'\ntR.", b"csubprocess\nPopen\n(S'true'\ntR."):
        (last / "rank000.pkl").write_bytes(evil)
        with pytest.raises(CheckpointError, match="refusing to load"):
            load_pickle(last / "rank000.pkl")
    (last / "rank000.pkl").write_bytes(b"\x80\x05garbage")
    with pytest.raises(CheckpointError, match="corrupt|refusing"):
        load_pickle(last / "rank000.pkl")


# ------------------------------------------------------------------------ checkpoints you can trust
def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bit-flipped":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :])
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "missing"])
@pytest.mark.parametrize(
    "name", ["trainable.pt", "optimizer.pt", "rank000.pkl", "trainer_state.json", "policy/adapter_model.safetensors"]
)
def test_resume_auto_skips_a_damaged_checkpoint_naming_the_file(tmp_path, caplog, name, how):
    from a2c_ppo_acktr.run.checkpoint import resolve_resume, verify_checkpoint
    from a2c_ppo_acktr.eval.evaluation import load_checkpoint_into

    root = tmp_path / "checkpoints"
    from a2c_ppo_acktr.run.checkpoint import CheckpointManager

    manager = CheckpointManager(root, keep=3)
    for it in (1, 2):

        def write(tmp, it=it):
            (tmp / "policy").mkdir()
            for n in (
                "trainable.pt",
                "optimizer.pt",
                "rank000.pkl",
                "trainer_state.json",
                "policy/adapter_model.safetensors",
            ):
                (tmp / n).write_bytes(bytes(range(256)) * 4 + str(it).encode())

        manager.save(it, write)
    last = root / "checkpoint-000002"
    assert verify_checkpoint(last) is None
    _damage(last / name, how)
    problem = verify_checkpoint(last)
    assert problem is not None and name in problem
    with caplog.at_level("WARNING"):
        assert resolve_resume("auto", root) == root / "checkpoint-000001"
    assert f"checkpoint {last} is damaged ({name}" in caplog.text
    with pytest.raises(CheckpointError, match=f"is damaged: {name}"):
        resolve_resume(str(last), root)
    with pytest.raises(CheckpointError, match=f"is damaged: {name}"):
        load_checkpoint_into(None, last)  # eval_vsi.py --checkpoint checks before loading anything


def test_every_checkpoint_damaged_and_a_full_disk_give_one_line(tmp_path, monkeypatch):
    import errno

    from a2c_ppo_acktr.run.checkpoint import CheckpointManager, resolve_resume

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep=2)
    manager.save(1, lambda tmp: (tmp / "a.bin").write_bytes(b"x" * 100))
    _damage(root / "checkpoint-000001" / "a.bin", "bit-flipped")
    with pytest.raises(CheckpointError, match="every checkpoint under .* is damaged"):
        resolve_resume("auto", root)

    def full_disk(tmp):
        (tmp / "half.bin").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        CheckpointError,
        match=r"writing checkpoint checkpoint-000002 .* failed: No space left on device .*--resume auto",
    ):
        manager.save(2, full_disk)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001"]  # no .tmp-* left behind

    def torch_full_disk(tmp):  # what torch.save raises when the disk fills mid-write
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError(
            "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: file write "
            "failed"
        )

    def quota(tmp):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp / "optimizer.pt"))

    with pytest.raises(
        CheckpointError, match=r"checkpoint-000002 .* failed: \[enforce fail.*file write failed \(RuntimeError\)"
    ):
        manager.save(2, torch_full_disk)
    with pytest.raises(CheckpointError, match=r"failed: Disk quota exceeded \(.*optimizer.pt\) \(OSError, errno"):
        manager.save(2, quota)
    with pytest.raises(ZeroDivisionError):  # a bug is not a disk problem: re-raised, but no debris either
        manager.save(2, lambda tmp: 1 / 0)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001"]


def test_a_symlinked_checkpoint_is_pruned_as_a_link_and_a_malformed_marker_is_damage(tmp_path):
    import shutil

    from a2c_ppo_acktr.run.checkpoint import COMPLETE_MARKER, CheckpointManager, verify_checkpoint

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep=1)
    manager.save(1, lambda tmp: (tmp / "a.bin").write_bytes(b"1"))
    kept = tmp_path / "elsewhere" / "checkpoint-000001"
    kept.parent.mkdir()
    shutil.move(str(root / "checkpoint-000001"), kept)
    (root / "checkpoint-000001").symlink_to(kept, target_is_directory=True)
    manager.save(2, lambda tmp: (tmp / "a.bin").write_bytes(b"2"))  # prunes the link
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000002"] and (kept / "a.bin").read_bytes() == b"1"
    for marker in ("[1, 2]", '"text"', '{"iteration": 2, "files": ["a.bin"]}', '{"files": {"a.bin": 5}}'):
        (root / "checkpoint-000002" / COMPLETE_MARKER).write_text(marker)
        assert "is malformed" in verify_checkpoint(root / "checkpoint-000002")


# ------------------------------------------------------------------------ damaged model files
@pytest.mark.parametrize("target", ["model", "adapter"])
def test_truncated_safetensors_are_one_line(tmp_path, tiny_model_path, target):
    """A truncated or garbage weights file of the model or of an adapter is a ModelLoadError naming
    the file (one line from the entry scripts), not a safetensors traceback."""
    import shutil

    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import ModelLoadError
    from a2c_ppo_acktr.policy.model import VLMPolicy

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_path, model_dir)
    cfg = ModelConfig(
        model_path=str(model_dir), device="cpu", lora_r=4, lora_alpha=8, value_head_hidden=8, temp_head_hidden=8
    )
    if target == "model":
        w = model_dir / "model.safetensors"
        w.write_bytes(w.read_bytes()[:1000])
        with pytest.raises(ModelLoadError, match="could not load model .*truncated or damaged"):
            VLMPolicy(cfg)
        return
    policy = VLMPolicy(cfg)
    policy.save_pretrained(tmp_path / "adapter")
    w = tmp_path / "adapter" / "adapter_model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="adapter at .* cannot be read"):
        policy.load_adapter(tmp_path / "adapter")
    policy.save_pretrained(tmp_path / "adapter")  # a whole adapter again; now the heads are damaged
    (tmp_path / "adapter" / "heads.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="heads.safetensors cannot be read"):
        policy.load_pretrained(tmp_path / "adapter")


def test_resume_refuses_a_changed_run_definition_applies_a_changed_lr_and_records_it(tmp_path):
    """Model, env, rollout, seed and estimator must match the checkpoint (all differences listed);
    a changed ppo.lr is what the resumed iterations train with (metrics and optimizer), and
    resume_history.jsonl says so; another run's checkpoint goes only into a fresh directory."""
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.rl.run_state import RESUME_HISTORY

    out = tmp_path / "run"
    run_training(
        _cfg(out, **{"ppo.num_iterations": "3", "log.stop_after_iterations": "2", "ppo.lr_schedule": "constant"})
    )
    with pytest.raises(
        CheckpointError,
        match=r"different run definition \(env.max_turns: 3 -> 5; "
        r"model.model_path: .* -> 'tiny:qwen2_vl'; seed: 1 -> 7\)",
    ):
        run_training(
            _cfg(
                out,
                **{
                    "ppo.num_iterations": "3",
                    "log.resume": "auto",
                    "model.model_path": "tiny:qwen2_vl",
                    "env.max_turns": "5",
                    "seed": "7",
                },
            )
        )
    run_training(
        _cfg(out, **{"ppo.num_iterations": "3", "log.resume": "auto", "ppo.lr_schedule": "constant", "ppo.lr": "0.05"})
    )
    rows = read_metrics(out / "metrics.jsonl")
    assert (
        [r["iteration"] for r in rows] == [1, 2, 3]
        and rows[1]["charts/learning_rate"] != 0.05
        and rows[2]["charts/learning_rate"] == 0.05
    )
    (entry,) = [json.loads(line) for line in (out / RESUME_HISTORY).read_text().splitlines()]
    assert entry["iteration"] == 2 and entry["changed"]["ppo.lr"][1] == 0.05
    # another run's checkpoint: refused into a used directory, imported into a fresh one
    other = tmp_path / "other"
    run_training(_cfg(other, **{"ppo.num_iterations": "1"}))
    theirs = list_checkpoints(out / "checkpoints")[0]
    with pytest.raises(CheckpointError, match="another run's checkpoint.*fresh log.output_dir"):
        run_training(
            _cfg(
                other,
                **{
                    "ppo.num_iterations": "3",
                    "log.resume": str(theirs),
                    "ppo.lr_schedule": "constant",
                    "ppo.lr": "0.05",
                },
            )
        )

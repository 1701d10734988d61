"""Nothing a user made is deleted or overwritten by surprise: a fresh start in a used run directory
is refused (or, with log.overwrite, moves the old run aside), and resuming from an older checkpoint
sets the newer ones aside instead of letting pruning or --resume auto mix the two runs."""
import pytest
import torch

from a2c_ppo_acktr.arguments import load_config
from a2c_ppo_acktr.checkpoint import CheckpointError, list_checkpoints
from a2c_ppo_acktr.train import run_training


def _cfg(out, **extra):
    base = {"log.output_dir": str(out), "log.progress_bar": "false", "log.tensorboard": "false", "log.save_interval": "1",
            "log.keep_checkpoints": "2", "ppo.num_iterations": "2"}
    base.update(extra)
    return load_config(preset="debug", overrides=[f"{k}={v}" for k, v in base.items()])


def test_fresh_start_in_a_used_directory_is_refused_then_moved_aside(tmp_path):
    out = tmp_path / "run"
    first = run_training(_cfg(out))
    before = torch.load(first / "trainable.pt")
    with pytest.raises(CheckpointError, match=r"already holds a run \(checkpoint-000001, checkpoint-000002, metrics.jsonl\).*--resume auto.*--log.overwrite true"):
        run_training(_cfg(out, **{"seed": "7"}))
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["checkpoint-000001", "checkpoint-000002"]  # untouched
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
    assert names == ["checkpoint-000001", "checkpoint-000002", "checkpoint-000003"]  # the new branch, not the old 000004
    (abandoned,) = (out / "checkpoints").glob("abandoned-*")
    assert sorted(p.name for p in abandoned.iterdir()) == ["checkpoint-000003", "checkpoint-000004"]


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

    from a2c_ppo_acktr.checkpoint import load_pickle

    out = tmp_path / "run"
    last = run_training(_cfg(out))
    marker = tmp_path / "pwned"
    (last / "rank000.pkl").write_bytes(pickle.dumps({"rng": _Exploit(marker)}))
    with pytest.raises(CheckpointError, match=r"rank000.pkl.*refusing to load posix.system"):
        load_pickle(last / "rank000.pkl")
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

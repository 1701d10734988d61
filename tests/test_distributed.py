"""Accelerator/DeepSpeed configuration, and real two-process CPU runs (gloo) of the training loop.

The multi-process tests start ``torchrun`` / ``accelerate launch`` on ``main_vsi.py`` through a
driver that records, on every process after every update, a SHA-256 of all trainable tensors; the
test then compares the processes' hashes (they must be identical: DDP/DeepSpeed keep replicas in
sync) and, for DeepSpeed, a 3-iteration run against 2 iterations + resume + 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig
from a2c_ppo_acktr.run.distributed import deepspeed_config_dict
from a2c_ppo_acktr.run.logger import read_metrics
from helpers import free_port

REPO = Path(__file__).resolve().parent.parent
DS_JSON = REPO / "scripts" / "ds_config.json"
DS3_JSON = REPO / "scripts" / "ds_config_zero3.json"


def _cfg(**sections) -> RunConfig:
    base = {"rollout": {"num_envs": 2, "num_steps": 2}, "ppo": {"mini_batch_size": 2}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return RunConfig.from_dict(base)


# ------------------------------------------------------------------------------ configuration
def test_ds_config_auto_entries_follow_run_config():
    cfg = _cfg(
        ppo={"max_grad_norm": 0.01, "grad_accum_steps": 2},
        model={"dtype": "bfloat16"},
        dist={"zero_stage": 2, "deepspeed_config": str(DS_JSON)},
    )
    ds = deepspeed_config_dict(cfg)
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["gradient_clipping"] == 0.01  # ppo.max_grad_norm, not accelerate's fallback of 1.0
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False
    assert isinstance(ds["train_micro_batch_size_per_gpu"], int)
    # The file on disk is untouched ("auto" stays there for other runs).
    assert json.loads(DS_JSON.read_text())["gradient_clipping"] == "auto"
    ds3 = deepspeed_config_dict(_cfg(dist={"zero_stage": 3, "deepspeed_config": str(DS3_JSON)}))
    assert ds3["zero_optimization"]["stage"] == 3 and ds3["bf16"]["enabled"] is False


def test_gradients_accumulate_and_travel_in_float32(tmp_path):
    """bf16 sums of 16 micro-batches over 8 ranks keep 2-3 digits: the shipped JSONs, and any JSON
    that says nothing, accumulate and reduce in fp32; an explicit choice is kept."""
    for shipped in (DS_JSON, DS3_JSON):
        on_disk = json.loads(shipped.read_text())
        assert on_disk["data_types"]["grad_accum_dtype"] == "fp32" and on_disk["communication_data_type"] == "fp32"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    ds = deepspeed_config_dict(_cfg(model={"dtype": "bfloat16"}, dist={"zero_stage": 2, "deepspeed_config": str(bare)}))
    assert ds["data_types"]["grad_accum_dtype"] == "fp32" and ds["communication_data_type"] == "fp32"
    bare.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 2},
                "communication_data_type": "bf16",
                "data_types": {"grad_accum_dtype": "bf16"},
            }
        )
    )
    ds = deepspeed_config_dict(_cfg(model={"dtype": "bfloat16"}, dist={"zero_stage": 2, "deepspeed_config": str(bare)}))
    assert ds["data_types"]["grad_accum_dtype"] == "bf16" and ds["communication_data_type"] == "bf16"


def test_ds_config_contradictions_are_refused(tmp_path):
    explicit = json.loads(DS_JSON.read_text())
    explicit["gradient_clipping"] = 1.0
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(explicit))
    with pytest.raises(ConfigError, match="gradient_clipping"):
        deepspeed_config_dict(_cfg(ppo={"max_grad_norm": 0.5}, dist={"zero_stage": 2, "deepspeed_config": str(path)}))
    # Equal values are fine.
    assert (
        deepspeed_config_dict(_cfg(ppo={"max_grad_norm": 1.0}, dist={"zero_stage": 2, "deepspeed_config": str(path)}))[
            "gradient_clipping"
        ]
        == 1.0
    )
    with pytest.raises(ConfigError, match="zero_optimization.stage"):
        deepspeed_config_dict(_cfg(dist={"zero_stage": 3, "deepspeed_config": str(DS_JSON)}))
    with pytest.raises(ConfigError, match="does not exist"):
        deepspeed_config_dict(_cfg(dist={"zero_stage": 2, "deepspeed_config": str(tmp_path / "missing.json")}))


def test_invalid_distributed_configs_rejected_at_start():
    with pytest.raises(ConfigError, match="zero_stage=3"):
        _cfg(dist={"zero_stage": 3}, model={"train_vision": "tower"})
    with pytest.raises(ConfigError, match="zero_stage=3"):
        _cfg(dist={"zero_stage": 3}, model={"use_lora": False})
    with pytest.raises(ConfigError, match="zero_stage=0"):
        _cfg(dist={"zero_stage": 0, "deepspeed_config": str(DS_JSON)})


def test_launcher_and_run_config_must_agree(monkeypatch):
    from a2c_ppo_acktr.run.distributed import build_accelerator

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match="dist.zero_stage=0"):
        build_accelerator(_cfg(model={"device": "cpu"}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(DS3_JSON))
    with pytest.raises(ConfigError, match="dist.deepspeed_config"):
        build_accelerator(_cfg(model={"device": "cpu"}, dist={"zero_stage": 2, "deepspeed_config": str(DS_JSON)}))


def test_launch_scripts_parse():
    for script in ("run_vsi_qwen.sh", "batch_vsi.sh"):
        subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True)
    # Wrong usage prints the header and exits 2 instead of launching anything.
    res = subprocess.run(["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "1"], capture_output=True, text=True)
    assert res.returncode == 2 and "Usage" in res.stderr


def test_batch_script_wires_slurm_into_accelerate(tmp_path):
    """batch_vsi.sh under fake scontrol/srun: node list -> main address, ranks, process counts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\nprintf 'node-a\\nnode-b\\n'\n")
    # Fake srun: run the task once per node with that node's SLURM_NODEID.
    (bin_dir / "srun").write_text(
        '#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
        'for n in 0 1; do SLURM_NODEID=$n "$@"; done\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_NNODES": "2",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_SUBMIT_DIR": str(REPO),
        "PYTHON": "echo",
        "PRESET": "debug",
    }
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "batch_vsi.sh"), "3", "job", str(tmp_path / "out"), "29555"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if "accelerate.commands.launch" in line]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        for piece in (
            "--num_machines 2",
            "--num_processes 16",
            f"--machine_rank {rank}",
            "--main_process_ip node-a",
            "--main_process_port 29555",
            "--seed 3",
            f"--log.output_dir {tmp_path}/out/job",
            "--config_file scripts/config_zero2.yaml",
        ):
            assert piece in line, (piece, line)


def test_batch_script_turns_slurms_signal_into_a_checkpoint_and_a_requeue(tmp_path):
    """batch_vsi.sh asks SLURM for an early SIGTERM; on it, it writes RUN/STOP, waits for the run
    (here a fake launcher that exits 75 once STOP appears, as main_vsi.py does) and requeues the job."""
    import time

    assert "#SBATCH --signal=B:TERM@" in (REPO / "scripts" / "batch_vsi.sh").read_text()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(
        f'#!/usr/bin/env bash\necho "$*" >> {calls}\n[ "$1" = show ] && echo node-a\nexit 0\n'
    )
    (bin_dir / "srun").write_text(
        '#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n'
    )
    run_dir = tmp_path / "out" / "job"
    (bin_dir / "fakepython").write_text(
        f"#!/usr/bin/env bash\ntouch {tmp_path}/started\nwhile [ ! -f {run_dir}/STOP ]; do sleep 0.1; done\nexit 75\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-a",
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_SUBMIT_DIR": str(REPO),
        "PYTHON": str(bin_dir / "fakepython"),
        "PRESET": "debug",
    }
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "batch_vsi.sh"), "3", "job", str(tmp_path / "out")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() - t0 < 60, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "requeue 4242" in calls.read_text() and "STOP" in err


# ------------------------------------------------------------------------------ multi-process runs
DRIVER = r'''
import hashlib, os, sys
from pathlib import Path
import a2c_ppo_acktr.rl.train as T
import main_vsi

_orig = T.param_rank_max_dev
_calls = [0]


def _spy(accelerator, module):
    """After each update: hash every trainable tensor of this process into HASH_DIR (whole tensors:
    gathered from their ZeRO-3 partitions)."""
    from a2c_ppo_acktr.run.distributed import full_trainable

    _calls[0] += 1
    h = hashlib.sha256()
    with full_trainable(module) as params:
        for name, p in sorted(params, key=lambda np: np[0]):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    out = Path(os.environ["HASH_DIR"]) / f"rank{accelerator.process_index}_call{_calls[0]}.sha256"
    out.write_text(h.hexdigest())
    return _orig(accelerator, module)


T.param_rank_max_dev = _spy
from a2c_ppo_acktr.policy.model import VLMPolicy
from tests.numerics import recorded_forwards, widest

with recorded_forwards(VLMPolicy) as _forwards:
    _code = main_vsi.main(sys.argv[1:])
if _forwards:  # this process's widest rounding bound on |ratio - 1| (numerics.forward_bounds)
    _bound = Path(os.environ["HASH_DIR"]) / f"ratio_bound{os.environ.get('RANK', '0')}.txt"
    _bound.write_text(repr(widest(_forwards).ratio))
sys.exit(_code)
'''


def _launch(
    launcher: list[str], out: Path, hashes: Path, extra: list[str], timeout: int = 420, preamble: str = ""
) -> None:
    # The timeout only tells a hang from a slow launch: on a fresh 2-core machine the first launch also
    # builds DeepSpeed's shared-memory comm op, beside the suite's other worker (240 s was exceeded there
    # under extra load; alone the three launches of the ZeRO-2 test take ~125 s together).
    hashes.mkdir(parents=True, exist_ok=True)
    driver = out.parent / "driver.py"
    driver.write_text(preamble + DRIVER)
    env = {
        **os.environ,
        "HASH_DIR": str(hashes),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    args = [
        str(driver),
        "--preset",
        "debug",
        "--log.output_dir",
        str(out),
        "--log.progress_bar",
        "false",
        "--log.tensorboard",
        "false",
        "--model.max_new_tokens",
        "16",
        "--env.max_turns",
        "2",
    ] + extra
    # Own session: a hang is ended by killing the launcher AND its workers (a killed torchrun leaves
    # them waiting in a collective, holding a core and a GB each).
    proc = subprocess.Popen(
        launcher + args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import psutil  # accelerate's dependency

        # torchrun may start its workers in sessions of their own: kill the whole tree, not only the group
        workers = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"launch still running after {timeout} s (a hang?):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}"
    assert "terminate called" not in stderr


def _hashes(d: Path, rank: int) -> list[str]:
    files = sorted(d.glob(f"rank{rank}_call*.sha256"), key=lambda p: int(p.stem.split("call")[1]))
    return [p.read_text() for p in files]


def _ratio_bound(hashes: Path) -> float:
    """The launch's bound on ``|ratio - 1|``: the widest of its processes' training forwards."""
    return max(float(p.read_text()) for p in hashes.glob("ratio_bound*.txt"))


def _torchrun(nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
    ]


def _full_then_split(tmp_path: Path, ds: list[str], stage: str) -> tuple[list[dict], list[dict], Path]:
    """3 iterations uninterrupted, then the same stopped after 2 and resumed for 1 (2 ranks each).

    Asserts what every ZeRO stage must keep: identical ranks after every update, weights that move,
    ``param_rank_max_dev == 0``, and the resumed run equal to the uninterrupted one weight for weight.
    Returns the full run's metric rows, the split run's, and the split run's output directory.
    """
    _launch(_torchrun(), tmp_path / "full" / "out", tmp_path / "full" / "h", ds)
    full0, full1 = _hashes(tmp_path / "full" / "h", 0), _hashes(tmp_path / "full" / "h", 1)
    assert len(full0) == 3 and full0 == full1, f"ranks hold different weights under {stage}"
    assert len(set(full0)) == 3, "weights did not change between updates"
    rows = read_metrics(tmp_path / "full" / "out" / "metrics.jsonl")
    assert [r["debug/param_rank_max_dev"] for r in rows] == [0.0, 0.0, 0.0]
    split = tmp_path / "split"
    _launch(_torchrun(), split / "out", split / "h1", ds + ["--log.stop_after_iterations", "2"])
    _launch(_torchrun(), split / "out", split / "h2", ds + ["--resume", "auto"])
    assert _hashes(split / "h1", 0) == full0[:2]
    assert _hashes(split / "h2", 0) == _hashes(split / "h2", 1) == full0[2:]
    return rows, read_metrics(split / "out" / "metrics.jsonl"), split / "out"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero2_two_processes_identical_and_resumable(tmp_path):
    # 2 minibatches per iteration (2 envs x 2 steps / 2), accumulated into one optimizer step.
    ds = [
        "--dist.zero_stage",
        "2",
        "--dist.deepspeed_config",
        str(DS_JSON),
        "--ppo.num_iterations",
        "3",
        "--ppo.grad_accum_steps",
        "2",
    ]
    rows, resumed, _ = _full_then_split(tmp_path, ds, "ZeRO-2")
    assert [r["optim/steps"] for r in rows] == [1.0, 2.0, 3.0], "one optimizer step per accumulation window"
    ckpt = tmp_path / "full" / "out" / "checkpoints" / "checkpoint-000003"
    assert sorted(p.name for p in (ckpt / "deepspeed" / "state").glob("zero_pp_rank_*_optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert [r["optim/steps"] for r in resumed] == [1.0, 2.0, 3.0], "the step count must survive a resume"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero3_two_processes_identical_and_resumable(tmp_path):
    """ZeRO-3 with every weight really partitioned (threshold 0): rollouts gather once per step
    (ranks decode different lengths and bootstrap truncations independently without hanging),
    ranks stay identical, and 2 iterations + resume + 1 equal 3."""
    ds_json = json.loads(DS3_JSON.read_text())
    ds_json["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(ds_json))
    ds = ["--dist.zero_stage", "3", "--dist.deepspeed_config", str(path), "--ppo.num_iterations", "3"]
    rows, _, split_out = _full_then_split(tmp_path, ds, "ZeRO-3")
    assert [r["optim/steps"] for r in rows] == [2.0, 4.0, 6.0]
    assert rows[0]["debug/first_minibatch_ratio_max_dev"] < _ratio_bound(tmp_path / "full" / "h")
    from safetensors.torch import load_file

    adapter = load_file(split_out / "checkpoints" / "checkpoint-000003" / "policy" / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values()), (
        "the exported adapter must hold whole (gathered) tensors"
    )


# The ZeRO-3 hazards: a few response tokens per logit chunk (model.logits_chunk_tokens 4), so that ranks
# with different response lengths need different numbers of lm_head calls; every call's (needed, made)
# count is recorded.
CHUNK_SPY = r"""
import json, os
from pathlib import Path
import a2c_ppo_acktr.policy.training_forward as M

_stats = M.chunked_token_stats


def _spy(inputs, tokens, temperatures, forbidden_ids, mask, **kw):
    rank = os.environ.get("RANK", "0")
    needed = -(-int(mask.sum()) // kw["chunk_tokens"])
    with open(Path(os.environ["HASH_DIR"]) / f"chunks{rank}.jsonl", "a") as f:
        f.write(json.dumps([needed, kw.get("num_chunks")]) + "\n")
    return _stats(inputs, tokens, temperatures, forbidden_ids, mask, **kw)


M.chunked_token_stats = _spy
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero3_ranks_with_unequal_chunks_and_validation_work_do_not_hang(tmp_path):
    """ZeRO-3, every weight partitioned: ranks whose responses need different numbers of lm_head
    chunks (update, KL to the reference) make the same number of calls, and validation with one
    episode (the second rank has none) does not wait in generate's per-token all-reduce. A hang
    fails at the launch's time bound instead of stalling the suite."""
    ds_json = json.loads(DS3_JSON.read_text())
    ds_json["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(ds_json))
    ds = [
        "--dist.zero_stage",
        "3",
        "--dist.deepspeed_config",
        str(path),
        "--ppo.num_iterations",
        "2",
        "--ppo.kl_coef",
        "0.05",
        "--log.val_interval",
        "1",
        "--log.val_episodes",
        "1",
        "--model.logits_chunk_tokens",
        "4",
    ]
    hashes = tmp_path / "h"
    _launch(_torchrun(), tmp_path / "out", hashes, ds, timeout=300, preamble=CHUNK_SPY)
    calls = [[json.loads(line) for line in (hashes / f"chunks{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert len(calls[0]) == len(calls[1]) > 0
    assert any(a[0] != b[0] for a, b in zip(*calls)), (
        "the ranks never needed different chunk counts: the hazard was not exercised"
    )
    for (need0, made0), (need1, made1) in zip(*calls):
        assert made0 == made1 == max(need0, need1)
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2] and all("val/score" in r for r in rows)
    assert rows[0]["debug/first_minibatch_ratio_max_dev"] < _ratio_bound(hashes)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero3_bf16_recompute_in_validation_does_not_hang(tmp_path):
    """ZeRO-3 in bf16 with act re-scoring its replies (``model.rollout_log_probs=recompute``, what bf16 with
    ``ppo.old_log_probs=rollout`` resolves to): validation gives the ranks different numbers of act calls
    (one episode: the second rank has none), and each recompute is a training forward that makes logit
    chunks. Forwards inside a rollout step are local (weights gathered), so their chunk count must not be
    agreed with a collective the other rank never enters. A hang fails at the launch's time bound."""
    ds_json = json.loads(DS3_JSON.read_text())
    ds_json["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(ds_json))
    ds = [
        "--dist.zero_stage",
        "3",
        "--dist.deepspeed_config",
        str(path),
        "--ppo.num_iterations",
        "2",
        "--model.dtype",
        "bfloat16",
        "--model.rollout_log_probs",
        "recompute",
        "--ppo.old_log_probs",
        "rollout",
        "--ppo.reference",
        "base",
        "--log.val_interval",
        "1",
        "--log.val_episodes",
        "1",
        "--model.logits_chunk_tokens",
        "4",
    ]
    _launch(_torchrun(), tmp_path / "out", tmp_path / "h", ds, timeout=300)
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2] and all("val/score" in r for r in rows)
    assert [r["debug/param_rank_max_dev"] for r in rows] == [0.0, 0.0]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_output_directory_some_processes_cannot_see_stops_every_process_in_one_line(tmp_path):
    """A multi-node run on a node-local path: the second process is given another directory of the
    same name (what a node-local /tmp looks like from another node). Both stop before loading the
    model, with one line naming the process that could not see the probe; no probe file remains."""
    shared, local = tmp_path / "shared" / "run", tmp_path / "node1" / "run"
    preamble = (
        "import os, sys\n"
        "if os.environ.get('RANK') == '1':\n"
        f"    sys.argv[sys.argv.index('--log.output_dir') + 1] = {str(local)!r}\n"
    )
    driver = tmp_path / "driver.py"
    driver.write_text(preamble + DRIVER)
    env = {
        **os.environ,
        "HASH_DIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    res = subprocess.run(
        [
            *_torchrun(),
            str(driver),
            "--preset",
            "debug",
            "--log.output_dir",
            str(shared),
            "--log.progress_bar",
            "false",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if "is not on a filesystem every process sees" in line]
    assert lines and "process(es) 1 on" in lines[0], res.stderr[-3000:]
    assert not list(shared.parent.glob(".run.probe-*")) and not (shared / "metrics.jsonl").exists()


FAKE_SRUN = """#!/usr/bin/env bash
# Fake srun for tests: start the task once per "node" as a local background process with that
# node's SLURM_NODEID/SLURM_PROCID/SLURM_LOCALID, wait for all, fail if any failed.
while [ "${1#--}" != "$1" ]; do shift; done
pids=()
for n in $(seq 0 $((SLURM_NNODES - 1))); do
  SLURM_NODEID=$n SLURM_PROCID=$n SLURM_LOCALID=0 "$@" > "$FAKE_SRUN_LOGS/node$n.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""


def _repo_files() -> set[str]:
    skip = {".git", ".venv", ".cache", ".pytest_cache", "__pycache__", "outputs", "vsi_ppo.egg-info"}
    out = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip]
        out |= {os.path.relpath(os.path.join(root, f), REPO) for f in files}
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sbatch_two_nodes_is_one_job(tmp_path):
    """sbatch --nodes 2 scripts/batch_vsi.sh: two "nodes" on loopback (one CPU process each, gloo,
    DeepSpeed ZeRO-2) started by a fake srun through the real batch_vsi.sh -> run_vsi_qwen.sh ->
    accelerate launch path must form ONE world of 2 ranks writing one run directory."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\nprintf '127.0.0.1\\n127.0.0.1\\n'\n")
    (bin_dir / "srun").write_text(FAKE_SRUN)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SRUN_LOGS": str(logs),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_NNODES": "2",
        "SLURM_SUBMIT_DIR": str(REPO),
        "GPUS_PER_NODE": "1",
        "PRESET": "debug",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "DS_ACCELERATOR": "cpu",
        "EXTRA_ARGS": (
            "--log.progress_bar false --log.tensorboard false --ppo.num_iterations 2 --model.max_new_tokens 16 "
            "--env.max_turns 2"
        ),
    }
    before = _repo_files()
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "batch_vsi.sh"), "4", "job", str(tmp_path / "out"), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    node_logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(logs.glob("*.log")))
    assert res.returncode == 0, f"{res.stderr[-2000:]}\n{node_logs}"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".job.lock", "job"], (
        "one run directory (and its lock file)"
    )
    run_dir = tmp_path / "out" / "job"
    rows = read_metrics(run_dir / "metrics.jsonl")
    # One world: 2 envs x 2 steps x 2 ranks per iteration, and ranks that agree on the weights.
    assert [r["charts/turns"] for r in rows] == [8.0, 16.0]
    assert [r["debug/param_rank_max_dev"] for r in rows] == [0.0, 0.0]
    ckpt = run_dir / "checkpoints" / "checkpoint-000002"
    assert sorted(p.name for p in ckpt.glob("rank*.pkl")) == ["rank000.pkl", "rank001.pkl"]
    from a2c_ppo_acktr.run.checkpoint import load_pickle

    obs = [load_pickle(ckpt / f"rank{r:03d}.pkl")["observations"] for r in (0, 1)]
    assert [o["text"] for o in obs[0]] != [o["text"] for o in obs[1]], "ranks must see different env streams"
    assert _repo_files() == before, f"written into the repository: {sorted(_repo_files() - before)}"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_multi_process_cpu_identical(tmp_path):
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "scripts" / "accelerate_cpu.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
    ]
    _launch(launcher, tmp_path / "out", tmp_path / "h", ["--ppo.num_iterations", "2"])
    h0, h1 = _hashes(tmp_path / "h", 0), _hashes(tmp_path / "h", 1)
    assert len(h0) == 2 and h0 == h1 and h0[0] != h0[1]
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    # Both processes' envs are counted: 2 envs x 2 steps x 2 processes turns per iteration.
    assert [r["charts/turns"] for r in rows] == [8.0, 16.0]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_run_vsi_qwen_script_on_cpu(tmp_path):
    """The user-facing launch script, on 2 CPU processes (NUM_GPUS overrides the GPU count)."""
    env = {
        **os.environ,
        "NUM_GPUS": "2",
        "PRESET": "debug",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "EXTRA_ARGS": "--log.progress_bar false --log.tensorboard false --ppo.num_iterations 1 "
        "--model.max_new_tokens 16",
    }
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "5", "smoke", str(tmp_path), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-6000:]
    run_dir = tmp_path / "smoke"
    cfg = RunConfig.from_yaml(run_dir / "config.yaml")
    assert (cfg.seed, cfg.log.run_name, cfg.dist.zero_stage, cfg.log.resume) == (5, "smoke", 2, "auto")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert len(rows) == 1 and rows[0]["debug/param_rank_max_dev"] == 0.0 and rows[0]["charts/turns"] == 8.0
    assert (run_dir / "checkpoints" / "checkpoint-000001" / "COMPLETE").is_file()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero2_bf16_two_processes(tmp_path):
    """The GPU presets' combination (ZeRO-2 + bf16 weights) on CPU: must train and keep ranks identical."""
    ds = [
        "--dist.zero_stage",
        "2",
        "--dist.deepspeed_config",
        str(DS_JSON),
        "--ppo.num_iterations",
        "1",
        "--model.dtype",
        "bfloat16",
    ]
    _launch(_torchrun(), tmp_path / "out", tmp_path / "h", ds)
    h0, h1 = _hashes(tmp_path / "h", 0), _hashes(tmp_path / "h", 1)
    assert len(h0) == 1 and h0 == h1, f"ranks must hold the same weights after the one update: {h0} vs {h1}"
    row = read_metrics(tmp_path / "out" / "metrics.jsonl")[0]
    assert row["debug/param_rank_max_dev"] == 0.0 and row["optim/steps"] == 2.0


def test_launch_hygiene_fetches_the_model_once_then_runs_offline(tmp_path, tiny_model_path):
    """scripts/common.sh: the model is made loadable offline before the ranks start (a local path needs
    nothing, a hub id not in the cache while offline is one line), the ranks then get
    HF_HUB_OFFLINE=1, expandable segments and OMP_NUM_THREADS = cores / processes; a caller's own
    values are kept."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF")
    }
    env["PYTHON"] = sys.executable
    script = (
        '. scripts/common.sh; vsi_prefetch_model --model-path "$1"; vsi_gpu_env 2; '
        'echo "offline=$HF_HUB_OFFLINE alloc=$PYTORCH_CUDA_ALLOC_CONF omp=$OMP_NUM_THREADS"'
    )
    res = subprocess.run(
        ["bash", "-c", script, "x", tiny_model_path], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert f"{tiny_model_path}: local" in res.stderr
    assert res.stdout.strip() == f"offline=1 alloc=expandable_segments:True omp={max(1, os.cpu_count() // 2)}"
    mine = {**env, "OMP_NUM_THREADS": "3", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        ["bash", "-c", script, "x", "Org/not-cached-anywhere"],
        cwd=REPO,
        env=mine,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.stdout.strip() == "offline=1 alloc=max_split_size_mb:128 omp=3"  # already offline: nothing fetched
    res = subprocess.run(
        [sys.executable, "-m", "a2c_ppo_acktr.prefetch", "--model-path", "Org/not-cached-anywhere"],
        cwd=REPO,
        env=mine,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    for launcher in ("run_vsi_qwen.sh", "batch_vsi.sh"):
        text = (REPO / "scripts" / launcher).read_text()
        assert text.index("vsi_prefetch_model") < text.index(
            "srun" if launcher == "batch_vsi.sh" else "accelerate.commands.launch"
        )
    run = (REPO / "scripts" / "run_vsi_qwen.sh").read_text()
    assert run.index("vsi_gpu_env") < run.index("accelerate.commands.launch")


# Each game's wrappers and the overlay they must reach (scripts/<run|eval>_<env>_qwen.sh, run_<env>_sft.sh).
WRAPPER_OVERLAYS = {
    "nl": "numberline",
    "ezp": "ezpoints",
    "p24": "points24",
    "bj": "blackjack",
    "sokoban": "sokoban",
    "minigrid": "minigrid-doorkey",
}


@pytest.mark.parametrize("env", sorted(WRAPPER_OVERLAYS))
def test_every_wrapper_reaches_its_overlay_and_entry_script(env, tmp_path):
    """A dry run of the 18 per-env wrappers with a fake interpreter that records its argv: each one
    reaches its env overlay and the right entry script, takes the launches' SEED NAME OUTDIR PORT
    (eval too), and resolves a relative OUTDIR against the caller's directory, not the repository."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> "$ARGV_LOG"\necho ---- >> "$ARGV_LOG"\n')
    fake.chmod(0o755)
    caller = tmp_path / "caller"
    caller.mkdir()
    (caller / "data").mkdir()
    overlay = str((REPO / "configs" / "envs" / f"{WRAPPER_OVERLAYS[env]}.yaml").resolve())
    calls = {
        f"run_{env}_qwen.sh": (
            ["3", "run", "outs", "29555"],
            "main_vsi.py",
            ["--log.output_dir", str(caller / "outs" / "run")],
        ),
        f"run_{env}_sft.sh": (
            ["sftout"],
            "train_sft.py",
            ["--sft.output_dir", str(caller / "sftout"), "--sft.data_path", str(caller / "data")],
        ),
        f"eval_{env}_qwen.sh": (
            ["3", "run", "outs", "0"],
            "eval_vsi.py",
            ["--out", str(caller / "outs" / "run" / "eval"), "--eval.seed", "3"],
        ),
    }
    for script, (args, entry, expected) in calls.items():
        log = tmp_path / f"{script}.argv"
        env_vars = {
            **os.environ,
            "PYTHON": str(fake),
            "ARGV_LOG": str(log),
            "NUM_GPUS": "1",
            "HF_HUB_OFFLINE": "1",
            "DATA_PATH": "data",
        }
        env_vars.pop("ENV_CONFIG", None)
        res = subprocess.run(
            ["bash", str(REPO / "scripts" / script), *args],
            cwd=caller,
            env=env_vars,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, (script, res.stderr)
        argv = log.read_text().split("----\n")[-2].split("\n")
        assert entry in argv, (script, argv)
        config = argv[argv.index("--config") + 1]
        assert str(Path(config).resolve()) == overlay, (script, config)
        joined = "\n".join(argv)
        for i in range(0, len(expected), 2):
            assert "\n".join(expected[i : i + 2]) in joined, (script, expected[i : i + 2], argv)
    # eval without the four arguments and without OUT: refused, nothing written in the repository
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / f"eval_{env}_qwen.sh")],
        cwd=caller,
        env={**os.environ, "PYTHON": str(fake), "ARGV_LOG": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "SEED NAME OUTDIR PORT" in res.stderr

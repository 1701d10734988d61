"""The node's vLLM rollout servers as the launcher starts them (``ROLLOUT_SERVER=1``): the plan
(servers per GPU or per tensor-parallel group, ports, devices, context length, LoRA rank), the
version check, and the launch itself through a fake ``vllm`` that records its command line and
environment and then runs the loopback server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from a2c_ppo_acktr.common.vllm_compat import (
    LORA_RANKS,
    VLLMVersionError,
    check_version,
    server_lora_rank,
    temperature_problem,
)
from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.policy.rollout_engine import EngineError, server_index
from a2c_ppo_acktr.rollout_servers import ServerPlan, ServerPlanError, context_length, plan_servers
from helpers import free_port

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ pure parts
def test_ranks_round_up_to_what_every_supported_vllm_accepts():
    assert [server_lora_rank(r) for r in (1, 4, 8, 9, 32, 100, 128, 300, 512)] == [8, 8, 8, 16, 32, 128, 128, 320, 512]
    assert all(server_lora_rank(r) in LORA_RANKS for r in range(1, 513))
    with pytest.raises(VLLMVersionError, match="lower model.lora_r"):
        server_lora_rank(513)


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.10.2", True),
        ("0.11.0", True),
        ("0.33.0", True),
        ("0.33.4+cu129", True),
        ("0.10.1.1", False),
        ("0.9.2", False),
        ("0.34.0", False),
        ("1.0.0", False),
    ],
)
def test_supported_versions(version, ok):
    if ok:
        check_version(version, "here")
    else:
        with pytest.raises(VLLMVersionError, match=r"0\.10\.2 to 0\.33\.x") as e:
            check_version(version, "here")
        assert "\n" not in str(e.value) and "pip install 'vllm>=0.10.2,<0.34'" in str(e.value)
    with pytest.raises(VLLMVersionError, match="cannot read"):
        check_version("unknown", "here")


def test_servers_split_the_gpus_and_ranks_map_to_them_the_same_way():
    assert plan_servers(4, 1, 8000) == [
        ServerPlan(0, 8000, "0"),
        ServerPlan(1, 8001, "1"),
        ServerPlan(2, 8002, "2"),
        ServerPlan(3, 8003, "3"),
    ]
    assert plan_servers(4, 2, 9000, ["4", "5", "6", "7"]) == [ServerPlan(0, 9000, "4,5"), ServerPlan(1, 9001, "6,7")]
    with pytest.raises(ServerPlanError, match="ROLLOUT_TP=3 must divide"):
        plan_servers(4, 3, 8000)
    with pytest.raises(ServerPlanError, match="lists 1 GPUs"):
        plan_servers(2, 1, 8000, ["0"])
    # The trainer's local ranks use the server on their own GPUs; the first of each group loads the adapter.
    assert [server_index(r, 4, 4) for r in range(4)] == [(0, True), (1, True), (2, True), (3, True)]
    assert [server_index(r, 4, 2) for r in range(4)] == [(0, True), (0, False), (1, True), (1, False)]
    assert [server_index(r, 4, 1) for r in range(4)] == [(0, True), (0, False), (0, False), (0, False)]
    with pytest.raises(EngineError, match="lists 3 servers for 4 processes"):
        server_index(0, 4, 3)


def test_context_length_covers_prompt_margin_and_reply():
    assert context_length(508, 32) == 768  # 635 + 32 = 667, up to a multiple of 256
    assert context_length(1000, 256) % 256 == 0 and context_length(1000, 256) >= 1250 + 256


def test_vllm_engine_config_turns_tis_on_and_refuses_temperatures_vllm_does_not_serve():
    vllm = ["rollout.engine=vllm", "rollout.engine_url=http://x:1"]
    assert load_config(preset="debug", overrides=vllm).ppo.tis_cap == 2.0
    assert load_config(preset="debug").ppo.tis_cap is None
    assert load_config(preset="debug", overrides=[*vllm, "ppo.tis_cap=0"]).ppo.tis_cap == 0  # off on request
    assert load_config(preset="debug", overrides=[*vllm, "ppo.tis_cap=5"]).ppo.tis_cap == 5
    with pytest.raises(ConfigError, match="max_temperature=2.5 is above 2"):
        load_config(preset="debug", overrides=[*vllm, "model.max_temperature=2.5"])
    assert (
        load_config(preset="debug", overrides=["model.max_temperature=2.5"]).model.max_temperature == 2.5
    )  # hf samples anything
    assert temperature_problem(0.005, 1.5) and temperature_problem(0.1, 2.0) is None


# ------------------------------------------------------------------------------ the launcher
def _fake_vllm(tmp_path: Path) -> Path:
    """A `vllm` on PATH: `--version` prints $FAKE_VLLM_VERSION; `serve MODEL ...` records its arguments
    and environment in $FAKE_VLLM_RECORD/<pid>.json and runs the loopback server with them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(f"""#!{sys.executable}
import json, os, sys
sys.path.insert(0, {str(REPO)!r})
if sys.argv[1:] == ["--version"]:
    print(os.environ["FAKE_VLLM_VERSION"])
    sys.exit(0)
names = ("CUDA_VISIBLE_DEVICES", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")
record = {{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in names}}}}
with open(os.path.join(os.environ["FAKE_VLLM_RECORD"], f"{{os.getpid()}}.json"), "w") as f:
    json.dump(record, f)
assert sys.argv[1] == "serve"
from a2c_ppo_acktr.policy.loopback_server import main
sys.exit(main([*sys.argv[2:], "--preset", "debug"]))
""")
    fake.chmod(0o755)
    return bin_dir


def _shim(tmp_path: Path) -> Path:
    """The interpreter the launcher runs, with `accelerate launch` replaced by `echo`."""
    shim = tmp_path / "python"
    shim.write_text(
        '#!/usr/bin/env bash\nif [ "$2" = accelerate.commands.launch ]; then echo "$@"; exit 0; fi\nexec '
        f'{sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    return shim


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.slow
def test_run_vsi_qwen_starts_one_server_per_gpu_and_stops_them(tmp_path):
    """ROLLOUT_SERVER=1 on a node of 2 GPUs (CUDA_VISIBLE_DEVICES=4,5): two servers, one per GPU,
    each on its own device and port (base + index), bound to 127.0.0.1, with --max-model-len from the
    preset, the preset's LoRA rank 4 rounded up to 8, runtime LoRA updating on; the run gets both URLs
    (its ranks pick by local rank); the servers stop with the launcher. A server log left by an
    earlier job is appended to."""
    record = tmp_path / "record"
    record.mkdir()
    base = free_port()
    while free_port() == base + 1:  # the second server's port must be free too (best effort)
        base = free_port()
    run_dir = tmp_path / "out" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "rollout_server-0.log").write_text("the log of a server that failed before\n")
    env = {
        **os.environ,
        "PATH": f"{_fake_vllm(tmp_path)}:{os.environ['PATH']}",
        "FAKE_VLLM_VERSION": "0.33.0",
        "FAKE_VLLM_RECORD": str(record),
        "PYTHON": str(_shim(tmp_path)),
        "PRESET": "debug",
        "CUDA_VISIBLE_DEVICES": "4,5",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ROLLOUT_SERVER": "1",
        "ROLLOUT_PORT": str(base),
        "ROLLOUT_START_TIMEOUT": "240",
        "EXTRA_ARGS": "--model.max_new_tokens 40",
    }
    env.pop("NUM_GPUS", None)
    env.pop("VLLM_PYTHON", None)
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "1", "run", str(tmp_path / "out"), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    urls = [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    assert f"--rollout.engine vllm --rollout.engine_url {','.join(urls)}" in res.stdout
    calls = sorted(
        (json.loads(p.read_text()) for p in record.glob("*.json")), key=lambda c: int(_flag(c["argv"], "--port"))
    )
    assert len(calls) == 2
    for i, call in enumerate(calls):
        argv = call["argv"]
        assert call["env"] == {"CUDA_VISIBLE_DEVICES": ["4", "5"][i], "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        assert argv[0] == "serve" and Path(argv[1]).is_dir()  # the tiny model's built directory
        assert _flag(argv, "--port") == str(base + i) and _flag(argv, "--host") == "127.0.0.1"
        assert _flag(argv, "--max-lora-rank") == "8" and int(_flag(argv, "--max-lora-rank")) in LORA_RANKS
        assert _flag(argv, "--max-loras") == "1" and _flag(argv, "--tensor-parallel-size") == "1"
        assert _flag(argv, "--logprobs-mode") == "processed_logprobs" and _flag(argv, "--generation-config") == "vllm"
        assert "--enable-lora" in argv and _flag(argv, "--gpu-memory-utilization") == "0.3"
        length = int(_flag(argv, "--max-model-len"))
        assert length % 256 == 0 and length >= 40 + 256  # EXTRA_ARGS' max_new_tokens reached the plan
    log = (run_dir / "rollout_server-0.log").read_text()
    assert log.startswith("the log of a server that failed before\n== ") and "loopback rollout server on" in log
    assert "loopback rollout server on" in (run_dir / "rollout_server-1.log").read_text()
    for url in urls:  # stopped with the launcher
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=5)
    # ROLLOUT_URL alone only passes the URL list.
    env = {**env, "ROLLOUT_SERVER": "0", "ROLLOUT_URL": "http://gpu-node-3:8000,http://gpu-node-3:8001"}
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "1", "run2", str(tmp_path / "out"), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        res.returncode == 0
        and "--rollout.engine vllm --rollout.engine_url http://gpu-node-3:8000,http://gpu-node-3:8001" in res.stdout
    )


def test_launcher_refuses_an_unsupported_vllm_and_a_bad_tp_before_starting_anything(tmp_path):
    """VLLM_PYTHON names the server's own interpreter (here a fake one that reports vLLM 0.10.1 and
    records that it was asked); the launcher refuses it in one line, and ROLLOUT_TP=3 on 2 GPUs too,
    before any server or rank starts."""
    asked = tmp_path / "asked"
    fake_python = tmp_path / "vllm-env-python"
    fake_python.write_text(
        f'#!/usr/bin/env bash\necho "$@" >> {asked}\nif [ "$1" = -c ]; then echo 0.10.1; exit 0; fi\nexit 3\n'
    )
    fake_python.chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(_shim(tmp_path)),
        "PRESET": "debug",
        "NUM_GPUS": "2",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ROLLOUT_SERVER": "1",
        "VLLM_PYTHON": str(fake_python),
    }
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "1", "run", str(tmp_path / "out"), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "accelerate.commands.launch" not in res.stdout
    line = res.stderr.strip().splitlines()[-1]
    assert "vLLM 0.10.1, outside the supported 0.10.2 to 0.33.x (return_token_ids needs >= 0.10.2)" in line
    assert (
        "importlib.metadata" in asked.read_text() and "serve" not in asked.read_text()
    )  # the version was read, nothing started
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_vsi_qwen.sh"), "1", "run", str(tmp_path / "out"), str(free_port())],
        env={**env, "ROLLOUT_TP": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "ROLLOUT_TP=3 must divide the node's NUM_GPUS=2" in res.stderr

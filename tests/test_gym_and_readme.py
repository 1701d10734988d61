"""The installed package from outside: gymnasium makes every registered env by its bare id in a fresh
interpreter that never imported a2c_ppo_acktr.envs (the installed import hook,
a2c_ppo_acktr/gymnasium_plugin.py), registration imports nothing heavy, and the Python snippets of
README.md and docs/USAGE.md (found by their ``<!-- snippet: NAME -->`` markers) run as written."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from a2c_ppo_acktr import gymnasium_plugin
from a2c_ppo_acktr.envs import ENV_IDS, GYMNASIUM_IDS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
USAGE = REPO / "docs" / "USAGE.md"


def _run(code: str, cwd: Path, timeout: int = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """``python -c code`` in ``cwd`` (not the checkout: the installed package is what gets imported)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    env.pop("PYTHONPATH", None)
    env.pop(gymnasium_plugin.DISABLE_ENV, None)
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def readme_snippet(name: str, doc: Path = README) -> str:
    """The code block right after ``<!-- snippet: NAME -->`` in ``doc`` (README.md unless named)."""
    text = doc.read_text(encoding="utf-8")
    m = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"{doc.relative_to(REPO)} has no ```python block after <!-- snippet: {name} -->"
    return m.group(1)


HEAVY = ("torch", "transformers", "open3d", "a2c_ppo_acktr.envs.vsi_env")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_makes_the_env_in_a_fresh_interpreter(env_id, tmp_path):
    code = (
        "import sys\n"
        "import gymnasium as gym\n"
        "assert 'a2c_ppo_acktr.envs' not in sys.modules\n"
        f"env = gym.make('a2c_ppo_acktr.envs:{env_id}', image_size=32, num_sweep_frames=4, num_scenes=1, max_turns=2)\n"
        "obs, info = env.reset(seed=0)\n"
        "assert obs['images'][0].shape == (32, 32, 3) and obs['text']\n"
        f"assert env.spec.id == {env_id!r}\n"
        f"gym.make({env_id!r}, image_size=32).close()\n"
        "print('ok')\n"
    )
    # Without the hook the module-qualified id still works (a checkout on sys.path, not installed).
    res = _run(code, tmp_path, **{gymnasium_plugin.DISABLE_ENV: "1"})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_import_gymnasium_registers_every_id_and_nothing_heavy(tmp_path):
    """The installed hook: `import gymnasium` alone registers every id, imports no env module, torch or
    open3d, and takes itself out of sys.meta_path; with VSI_PPO_NO_GYMNASIUM_PLUGIN=1 nothing is
    registered (so it is the hook that registers them, not some other import)."""
    code = (
        "import sys\n"
        "import gymnasium as gym\n"
        f"print(sorted(i for i in {GYMNASIUM_IDS!r} if i in gym.registry))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(sum(type(f).__name__ == 'GymnasiumImportHook' for f in sys.meta_path))\n"
        "print(gym.__spec__.loader is gym.__loader__ and type(gym.__loader__).__name__ != '_RegisterAfterLoad')\n"
    )
    res = _run(code, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:4] == [str(sorted(GYMNASIUM_IDS)), "[]", "0", "True"]
    assert "could not register" not in res.stderr
    # Off, importing the package registers them (idempotently), still without anything heavy.
    explicit = "import a2c_ppo_acktr.envs as envs\nenvs.register_envs()\n"
    off = _run(code + explicit + code.split("\n", 2)[2], tmp_path, **{gymnasium_plugin.DISABLE_ENV: "1"})
    assert off.returncode == 0, off.stderr[-3000:]
    assert off.stdout.split("\n")[:6] == ["[]", "[]", "0", "True", str(sorted(GYMNASIUM_IDS)), "[]"]


@pytest.mark.parametrize("env_id", GYMNASIUM_IDS)
def test_bare_id_in_a_fresh_interpreter(env_id, tmp_path):
    """The README's promise: gymnasium.make with the bare id, nothing of this package imported by hand."""
    kwargs = "image_size=32, num_sweep_frames=4, num_scenes=1, max_turns=2" if env_id == "VSI-v0" else ""
    code = (
        "import numpy as np\n"
        "import gymnasium as gym\n"
        f"env = gym.make({env_id!r}, {kwargs})\n"
        "obs, info = env.reset(seed=0)\n"
        "obs, reward, terminated, truncated, info = env.step(env.unwrapped.random_reply(np.random.default_rng(0)))\n"
        f"assert env.spec.id == {env_id!r} and isinstance(reward, float), (env.spec.id, reward)\n"
        "print('ok', info['valid'])\n"
    )
    res = _run(code, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok True", res.stderr[-3000:]


def test_a_failing_registration_warns_and_gymnasium_still_imports(tmp_path):
    code = (
        "import sys, warnings\n"
        "import builtins\n"
        "real_import = builtins.__import__\n"
        "def broken(name, *a, **k):\n"
        "    if name == 'a2c_ppo_acktr.envs':  # the hook's import of register_envs\n"
        "        raise ImportError('simulated')\n"
        "    return real_import(name, *a, **k)\n"
        "builtins.__import__ = broken\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import gymnasium as gym\n"
        "builtins.__import__ = real_import\n"
        "print('VSI-v0' in gym.registry, any('could not register' in str(w.message) for w in caught))\n"
    )
    res = _run(code, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "False True"


def test_the_installation_put_the_hook_in_site_packages():
    """setup.py's build_py wrote the .pth beside the installed packages (scripts/setup.sh installs
    editable, the wheel path is tested below)."""
    import site

    found = [
        Path(d) / "vsi_ppo_gymnasium.pth"
        for d in site.getsitepackages()
        if (Path(d) / "vsi_ppo_gymnasium.pth").is_file()
    ]
    assert found, f"no vsi_ppo_gymnasium.pth in {site.getsitepackages()}: run scripts/setup.sh (pip install -e .)"
    assert found[0].read_text().strip() == "import a2c_ppo_acktr.gymnasium_plugin"


@pytest.mark.slow
def test_a_built_wheel_ships_the_hook(tmp_path):
    """`pip install .` (a regular wheel) installs the .pth at the root of site-packages too."""
    import shutil
    import zipfile

    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("a2c_ppo_acktr", "SFT"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    for path in [REPO / "setup.py", REPO / "README.md", *REPO.glob("*.py")]:
        shutil.copy2(path, src / path.name)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = tmp_path.glob("vsi_ppo-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("vsi_ppo_gymnasium.pth").decode().strip() == "import a2c_ppo_acktr.gymnasium_plugin"
        assert "a2c_ppo_acktr/gymnasium_plugin.py" in z.namelist()
        entry_points = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[gymnasium.envs]" in entry_points and "a2c_ppo_acktr.envs:register_envs" in entry_points


def test_readme_gymnasium_snippet_runs(tmp_path):
    code = readme_snippet("gymnasium")
    assert 4 <= len(code.strip().splitlines()) <= 6 and "import a2c_ppo_acktr" not in code
    res = _run(code + "print('reward', reward, terminated)\n", tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("True")  # the answer ended the episode


@pytest.mark.slow
def test_readme_policy_snippet_runs(tmp_path):
    """The snippet of docs/USAGE.md (linked from the README) loads a main_vsi.py-style checkpoint (a tiny
    one, made here like tests/test_eval.py does) from the path it names, and plays one episode on the env
    the checkpoint was trained on."""
    import torch

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.model import VLMPolicy

    code = readme_snippet("policy", USAGE)
    m = re.search(r'ckpt = "([^"]+)"', code)
    assert m, 'the policy snippet names its checkpoint as ckpt = "..."'
    ckpt = tmp_path / m.group(1)
    cfg = load_config(
        preset="debug", overrides=["--env.image_size", "32", "--env.max_turns", "2", "--model.max_new_tokens", "8"]
    )
    torch.manual_seed(0)
    VLMPolicy(cfg.model).save_pretrained(ckpt / "policy")
    cfg.save(ckpt / "config.yaml")
    probe = (
        "\nassert env.unwrapped.cfg == cfg.env and env.unwrapped.cfg.image_size == 32\nprint('turns', "
        "env.unwrapped.turn)\n"
    )
    res = _run(code + probe, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    turns = int(res.stdout.strip().splitlines()[-1].split()[-1])
    assert 1 <= turns <= 2


def _fake_nvidia_smi(tmp_path, driver: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/usr/bin/env bash\necho '{driver}'\n")
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the driver floor belongs to the x86_64 pin (a CUDA 13 build)"
)
def test_setup_stops_on_a_gpu_node_whose_driver_cannot_run_the_pinned_torch(tmp_path):
    """A driver older than the pinned build needs (CUDA 13: >= 580): one line naming the driver and
    the build, before anything is installed; a recent driver, or a TORCH_PINS of one's own, goes on."""
    repo = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    env = {**_fake_nvidia_smi(tmp_path, "550.54.15"), "VSI_VENV": str(venv)}
    env.pop("TORCH_PINS", None)
    res = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and not venv.exists()
    lines = res.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "NVIDIA driver 550.54.15 cannot run the default torch==2.14.1" in lines[0]
        and "TORCH_PINS" in lines[0]
    )
    ok = {**_fake_nvidia_smi(tmp_path, "580.65.06"), "VSI_VENV": str(repo / ".venv")}
    ok.pop("TORCH_PINS", None)
    res = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=ok, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "cannot run" not in res.stderr

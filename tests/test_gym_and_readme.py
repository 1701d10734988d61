"""The installed package from outside: gymnasium makes every registered env in a fresh interpreter
that never imported a2c_ppo_acktr, registration imports nothing heavy, and the README's Python
snippets (found by their ``<!-- snippet: NAME -->`` markers) run as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from a2c_ppo_acktr.envs import ENV_IDS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _run(code: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c code`` in ``cwd`` (not the checkout: the installed package is what gets imported)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def readme_snippet(name: str) -> str:
    """The code block right after ``<!-- snippet: NAME -->`` in README.md."""
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README.md has no ```python block after <!-- snippet: {name} -->"
    return m.group(1)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_makes_the_env_in_a_fresh_interpreter(env_id, tmp_path):
    code = (
        "import sys\n"
        "import gymnasium as gym\n"
        "assert 'a2c_ppo_acktr' not in sys.modules\n"
        f"env = gym.make('a2c_ppo_acktr.envs:{env_id}', image_size=32, num_sweep_frames=4, num_scenes=1, max_turns=2)\n"
        "obs, info = env.reset(seed=0)\n"
        "assert obs['images'][0].shape == (32, 32, 3) and obs['text']\n"
        f"assert env.spec.id == {env_id!r}\n"
        # Once registered, the bare id works too.
        f"gym.make({env_id!r}, image_size=32).close()\n"
        "print('ok')\n"
    )
    res = _run(code, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_registration_is_side_effect_light(tmp_path):
    code = (
        "import sys\n"
        "import gymnasium as gym\n"
        "import a2c_ppo_acktr.envs as envs\n"
        "assert all(i in gym.registry for i in envs.ENV_IDS)\n"
        "envs.register_envs()  # idempotent\n"
        "print(sorted(m for m in ('torch', 'transformers', 'open3d', 'a2c_ppo_acktr.envs.vsi_env') if m in sys.modules))\n"
    )
    res = _run(code, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[]"


def test_readme_gymnasium_snippet_runs(tmp_path):
    code = readme_snippet("gymnasium")
    assert 4 <= len(code.strip().splitlines()) <= 6 and "import a2c_ppo_acktr" not in code
    res = _run(code + "print('reward', reward, terminated)\n", tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("True")  # the answer ended the episode


@pytest.mark.slow
def test_readme_policy_snippet_runs(tmp_path):
    """The snippet loads a main_vsi.py-style checkpoint (a tiny one, made here like tests/test_eval.py
    does) from the path it names, and plays one episode on the env the checkpoint was trained on."""
    import torch

    from a2c_ppo_acktr.arguments import load_config
    from a2c_ppo_acktr.model import VLMPolicy

    code = readme_snippet("policy")
    m = re.search(r'ckpt = "([^"]+)"', code)
    assert m, "the policy snippet names its checkpoint as ckpt = \"...\""
    ckpt = tmp_path / m.group(1)
    cfg = load_config(preset="debug", overrides=["--env.image_size", "32", "--env.max_turns", "2", "--model.max_new_tokens", "8"])
    torch.manual_seed(0)
    VLMPolicy(cfg.model).save_pretrained(ckpt / "policy")
    cfg.save(ckpt / "config.yaml")
    probe = "\nassert env.unwrapped.cfg == cfg.env and env.unwrapped.cfg.image_size == 32\nprint('turns', env.unwrapped.turn)\n"
    res = _run(code + probe, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    turns = int(res.stdout.strip().splitlines()[-1].split()[-1])
    assert 1 <= turns <= 2

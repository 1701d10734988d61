"""Entry scripts turn user-fixable errors into one line on stderr and exit code 2 (no traceback)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("main_vsi.py", ["--preset", "debug", "--ppo.lrr", "3"], "main_vsi.py: error: unknown config key 'ppo.lrr'. Did you mean 'ppo.lr'?"),
        ("eval_vsi.py", ["--model-path", "/nonexistent/model", "--out", "{tmp}/e"], "does not exist"),
        ("train_sft.py", ["--preset", "debug", "--sft.data_path", "{tmp}/missing"], "sft.data_path="),
        ("vlm_traj_label.py", ["--preset", "debug", "--label.teacher", "bogus"], "label.teacher='bogus' is not allowed"),
        ("vlm_traj_preprocess.py", ["--preset", "debug", "--rollout.num_envs", "zero"], "rollout.num_envs must be an integer"),
    ],
)
def test_user_errors_exit_2_with_one_clear_line(tmp_path, script, args, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("VSI_DEBUG", None)
    res = subprocess.run(
        [sys.executable, str(REPO / script), *[a.format(tmp=tmp_path) for a in args]],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr

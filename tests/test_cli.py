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
        (
            "main_vsi.py",
            ["--preset", "debug", "--ppo.lrr", "3"],
            "main_vsi.py: error: unknown config key 'ppo.lrr'. Did you mean 'ppo.lr'?",
        ),
        ("eval_vsi.py", ["--model-path", "/nonexistent/model", "--out", "{tmp}/e"], "does not exist"),
        ("train_sft.py", ["--preset", "debug", "--sft.data_path", "{tmp}/missing"], "sft.data_path="),
        (
            "vlm_traj_label.py",
            ["--preset", "debug", "--label.teacher", "bogus"],
            "label.teacher='bogus' is not allowed",
        ),
        (
            "vlm_traj_preprocess.py",
            ["--preset", "debug", "--rollout.num_envs", "zero"],
            "rollout.num_envs must be an integer",
        ),
    ],
)
def test_user_errors_exit_2_with_one_clear_line(tmp_path, script, args, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("VSI_DEBUG", None)
    res = subprocess.run(
        [sys.executable, str(REPO / script), *[a.format(tmp=tmp_path) for a in args]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_wrong_files_and_environment_errors_are_one_line(tmp_path, capsys):
    """--compare given a file that is not a report (JSON of another shape, or not JSON), and the
    operating system refusing a write (permissions, read-only, full disk): one line, exit 2. Other
    OSErrors (a bug's) keep their traceback."""
    import errno
    import json

    from a2c_ppo_acktr.config.cli import run_main

    sys.path.insert(0, str(REPO))
    import eval_vsi

    (tmp_path / "other.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "text.json").write_text("not json")
    for bad in ("other.json", "text.json"):
        rc = run_main(
            lambda: eval_vsi.main(
                ["--compare", str(tmp_path / bad), str(tmp_path / bad), "--out", str(tmp_path / "c")]
            ),
            "eval_vsi.py",
        )
        err = capsys.readouterr().err
        assert rc == 2 and "is not a report.json written by eval_vsi.py" in err and "Traceback" not in err, err

    for code in (errno.EACCES, errno.EROFS, errno.ENOSPC):

        def fail(code=code):
            raise OSError(code, os.strerror(code), str(tmp_path / "out"))

        assert run_main(fail, "x.py") == 2
        assert os.strerror(code) in capsys.readouterr().err
    with pytest.raises(OSError):
        run_main(lambda: (_ for _ in ()).throw(OSError(errno.EBADF, "bad fd")), "x.py")

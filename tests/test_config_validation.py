"""Every config mistake a user can make ends in one ConfigError naming the key and the fix: non-finite
numbers, out-of-range values, bad regexes, duplicate YAML keys, non-UTF-8 files, hex/underscore
numbers on the command line; an empty section keeps the preset's values; a mistyped script flag gets
a suggestion."""

import subprocess
import sys
from pathlib import Path

import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "override, message",
    [
        ("ppo.lr=nan", "ppo.lr must be a finite number"),
        ("env.step_cost=nan", "env.step_cost must be a finite number"),
        ("env.invalid_penalty=inf", "env.invalid_penalty must be a finite number"),
        ("ppo.head_lr=-1", "ppo.head_lr=-1.0 must be > 0"),
        ("ppo.warmup_iterations=-1", "ppo.warmup_iterations=-1 must be >= 0"),
        ("ppo.target_kl=-0.1", "ppo.target_kl=-0.1 must be > 0"),
        ("ppo.weight_decay=-1", "ppo.weight_decay=-1.0 must be >= 0"),
        ("ppo.adam_eps=-1", "ppo.adam_eps=-1.0 must be > 0"),
        ("env.eye_height=100", "env.eye_height=100.0 must be in"),
        ("model.min_pixels=-5", "model.min_pixels=-5 must be >= 1"),
        ("model.max_pixels=0", "model.max_pixels=0 must be >= 1"),
        ("log.output_dir=", "log.output_dir is empty"),
        ("model.lora_target_modules=([", "not a valid regular expression"),
        ("ppo.num_iterations=0x10", "write a plain decimal number"),
        ("ppo.num_iterations=1_0", "write a plain decimal number"),
    ],
)
def test_bad_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(preset="debug", overrides=[override])


def test_yaml_files_duplicate_keys_encoding_and_empty_sections(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("ppo:\n  lr: 1.0e-4\n  lr: 1.0e-3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="found the key 'lr' twice"):
        load_config(config=str(dup))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("log:\n  run_name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(config=str(latin))
    empty = tmp_path / "empty.yaml"
    empty.write_text("ppo:\nenv:\n  max_turns: 2\n", encoding="utf-8")
    cfg = load_config(preset="debug", config=str(empty))
    preset = load_config(preset="debug")
    assert cfg.ppo == preset.ppo and cfg.env.max_turns == 2  # the empty ppo: kept the preset's section
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfppo:\n  lr: 2.0e-4\n")
    assert load_config(config=str(bom)).ppo.lr == 2e-4


def test_a_mistyped_flag_gets_a_suggestion_and_exit_2():
    out = subprocess.run(
        [sys.executable, "main_vsi.py", "--preset", "debug", "--resum", "auto"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "unrecognized argument --resum; did you mean --resume?" in out.stderr
    assert "Traceback" not in out.stderr

"""Config discoverability: every entry script's --help-all lists every config key (type, default, the
comment from arguments.py) quickly and without heavy imports; --help is short and shows the common keys
with the values the command line resolves to; --print-config prints the resolved
config as YAML that loads back as the same config."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import yaml

from a2c_ppo_acktr.config import arguments, cli
from a2c_ppo_acktr.config.arguments import RunConfig, load_config

REPO = Path(__file__).resolve().parent.parent
# Every script that reads config overrides; (argv prefix, how it is launched).
SCRIPTS = {
    "main_vsi.py": [str(REPO / "main_vsi.py")],
    "train_sft.py": [str(REPO / "train_sft.py")],
    "eval_vsi.py": [str(REPO / "eval_vsi.py")],
    "vlm_traj_label.py": [str(REPO / "vlm_traj_label.py")],
    "vlm_traj_preprocess.py": [str(REPO / "vlm_traj_preprocess.py")],
    "memory": ["-m", "a2c_ppo_acktr.memory"],
}
HEAVY = ("torch", "transformers", "open3d", "peft", "deepspeed", "accelerate")


def _env() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("VSI_DEBUG", None)
    return env


def _fields(cls: type = RunConfig, prefix: str = ""):
    """(dotted key, type, default) of every config field, straight from the dataclasses."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            yield prefix + f.name, hints[f.name], default


def _inline_comments() -> dict[str, str]:
    """``{"section.key": comment}`` for fields written ``name: type = value  # comment`` in arguments.py,
    read with a regular expression (independently of the tokenizer the help uses)."""
    hints = typing.get_type_hints(RunConfig)
    section_of = {
        hints[f.name].__name__: f.name for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(hints[f.name])
    }
    out, section = {}, None
    for line in Path(arguments.__file__).read_text(encoding="utf-8").splitlines():
        m = re.match(r"class (\w+)", line)
        if m:
            section = section_of.get(m.group(1))
            continue
        m = re.match(r"    (\w+): [^=]+= .*?  # (.*)$", line)
        if section and m:
            out[f"{section}.{m.group(1)}"] = m.group(2).strip()
    return out


def _help_entries(text: str) -> dict[str, tuple[str, str, str]]:
    """``{key: (type, default text, comment)}`` parsed from the config part of a help text."""
    entries: dict[str, list] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"  --([\w.]+)  (.+?) = (.*)$", line)
        if m:
            current = m.group(1)
            entries[current] = [m.group(2), m.group(3), ""]
        elif current and line.startswith("      "):
            entries[current][2] = (entries[current][2] + " " + line.strip()).strip()
        else:
            current = None
    return {k: tuple(v) for k, v in entries.items()}


def test_help_lists_every_key_with_its_type_default_and_comment():
    text = cli.config_parser("x").format_help_all()
    entries = _help_entries(text)
    fields = list(_fields())
    assert len(fields) > 100 and [k for k, _, _ in fields] == list(entries)  # every key, in declaration order
    for key, tp, default in fields:
        type_text, default_text, _ = entries[key]
        # The default, as written, reads back as the field's default.
        assert yaml.safe_load(default_text) == default, (key, default_text, default)
        base = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Union else tp
        assert getattr(base, "__name__", str(base)).split("[")[0] in type_text, (key, type_text)
        if type(None) in typing.get_args(tp):
            assert type_text.endswith("or null"), key
    comments = _inline_comments()
    assert len(comments) > 50
    for key, comment in comments.items():
        assert " ".join(comment.split()) in entries[key][2], (key, comment, entries[key][2])
    # Comments written on the lines above a field are part of its entry too.
    assert entries["rollout.group_size"][2].startswith("Envs per group: the envs of a group play every episode")
    assert (
        entries["label.model_path"][2]
        == "hf teacher: any local HF VLM through loading.load_vlm; None = model.model_path"
    )
    assert entries["env.image_size"] == ("int", "224", "rendered frames are image_size x image_size")
    assert entries["ppo.head_lr"][:2] == ("float or null", "null")
    # Grouped by section, each headed by its docstring.
    config_part = text[text.index("config keys") :]
    heads = [line.split(":")[0] for line in config_part.splitlines() if re.match(r"^[a-z]+( level)?: ", line)]
    assert heads == ["top level", "env", "model", "rollout", "ppo", "sft", "label", "eval", "log", "dist"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_of_every_script_is_fast_complete_and_imports_nothing_heavy(script):
    cmd = [sys.executable, *SCRIPTS[script], "--help-all"]
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert res.returncode == 0, res.stderr
    assert set(_help_entries(res.stdout)) == {k for k, _, _ in _fields()}
    assert "--print-config" in res.stdout
    # Under 2 s on a quiet machine (about 0.1 s measured); 4 s leaves room for a loaded CI runner.
    assert seconds < 4.0, f"{script} --help took {seconds:.1f} s"
    # The deterministic half of "fast": asking for help imports no torch/transformers/open3d.
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{(SCRIPTS[script][-1] if script != 'memory' else 'memory')!r}, '--help']\n"
        "try:\n"
        f"    runpy.{'run_module' if script == 'memory' else 'run_path'}({SCRIPTS[script][-1]!r}, "
        "run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout[-300:]


def test_help_is_short_and_shows_the_values_the_command_line_resolves_to():
    res = subprocess.run(
        [sys.executable, str(REPO / "main_vsi.py"), "--preset", "debug", "--ppo.lr", "3e-4", "--help"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) < 70 and "--sft-adapter" in res.stdout  # the script's own flags stay
    assert "  --ppo.lr = 0.0003   (code default 1.0e-05)" in lines  # an override
    assert "  --env.image_size = 32   (code default 224)" in lines  # the preset's value
    assert "  --ppo.advantage_estimator = gae" in lines  # a key the preset leaves at its default: no note
    assert lines[-1].startswith("all ") and "--help-all" in lines[-1]
    section = subprocess.run(
        [sys.executable, str(REPO / "main_vsi.py"), "--help-section", "rollout"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    shown = [line.split(" = ")[0].strip() for line in section.stdout.splitlines() if line.startswith("  --rollout.")]
    assert shown == [f"--{k}" for k, _, _ in _fields() if k.startswith("rollout.")]
    bad = subprocess.run(
        [sys.executable, str(REPO / "main_vsi.py"), "--help-section", "nope"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr


ARGS = [
    "--preset",
    "debug",
    "--ppo.lr",
    "3e-4",
    "env.max_turns=5",
    "--model.top_p",
    "0.9",
    "--env.question_types",
    "route_planning,object_counting",
]


@pytest.mark.parametrize("script", ["main_vsi", "train_sft", "eval_vsi", "vlm_traj_label", "vlm_traj_preprocess"])
def test_print_config_prints_the_resolved_config_and_it_round_trips(script, tmp_path, capsys):
    sys.path.insert(0, str(REPO))
    module = __import__(script)
    extra = ["--sft-adapter", "adapters/a"] if script == "main_vsi" else []
    with pytest.raises(SystemExit) as exit_info:
        module.main([*ARGS, *extra, "--print-config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    want = load_config(preset="debug", overrides=ARGS[2:] + (["--model.sft_adapter", "adapters/a"] if extra else []))
    assert RunConfig.from_dict(yaml.safe_load(printed)) == want
    # Loaded back as a config file it is the same config, and printing that prints the same YAML.
    (tmp_path / "printed.yaml").write_text(printed)
    assert load_config(config=str(tmp_path / "printed.yaml")) == want
    with pytest.raises(SystemExit):
        module.main(["--config", str(tmp_path / "printed.yaml"), "--print-config"])
    assert capsys.readouterr().out == printed


def test_print_config_in_a_subprocess_exits_0_with_yaml_only_on_stdout(tmp_path):
    res = subprocess.run(
        [sys.executable, str(REPO / "main_vsi.py"), *ARGS, "--print-config"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    (tmp_path / "c.yaml").write_text(res.stdout)
    assert load_config(config=str(tmp_path / "c.yaml")) == load_config(preset="debug", overrides=ARGS[2:])
    assert not (tmp_path / "outputs").exists()  # nothing run, nothing written

"""No secret is ever written: a key passed where a variable's name belongs is refused before
anything is written, URL passwords never reach config.yaml, checkpoints, tensorboard or wandb, and
a teacher's reply that echoes the key in any spelling a server can produce is redacted."""

from __future__ import annotations

import base64
import json
import logging
import sys
import types
import urllib.parse

import pytest

from a2c_ppo_acktr.common.redaction import MIN_ECHO, key_env_problem, redact, redact_all, redact_url, redact_urls
from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig, load_config

KEY = "sk-proj-7fA3c9E1b5D2f4A6c8E0b2D4"
PASSWORD = "hunter2-Pa55word"
ENGINE_PASSWORD = "s3cret,Engine"  # a comma: engine_url is a comma-separated list of URLs


# ------------------------------------------------------------------------------ *_key_env
@pytest.mark.parametrize(
    "value", [KEY, "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "a3f29c1e5b2d4f6a8c0e11aa", "Bearer abc", "sk-x", ""]
)
def test_a_key_passed_as_api_key_env_is_refused_without_being_repeated(value):
    with pytest.raises(ConfigError) as e:
        load_config(preset="debug", overrides={"label": {"api_key_env": value}})
    message = str(e.value)
    assert "label.api_key_env" in message and "NAME" in message and "\n" not in message
    assert not value or value not in message


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "MY_TEACHER_KEY_2", "openai_key", "VERYLONGVARIABLENAMEFORTHEKEY"])
def test_variable_names_are_accepted(name):
    assert key_env_problem(name) is None
    assert load_config(preset="debug", overrides={"label": {"api_key_env": name}}).label.api_key_env == name


def test_a_key_on_the_command_line_stops_the_labeller_in_one_line_and_writes_nothing(tmp_path, capsys):
    from a2c_ppo_acktr.config.cli import run_main

    import vlm_traj_label

    out = tmp_path / "labels"
    argv = [
        "--preset",
        "debug",
        "--label.teacher",
        "openai",
        "--label.model",
        "m",
        "--label.api_key_env",
        KEY,
        "--label.out_dir",
        str(out),
    ]
    rc = run_main(lambda: vlm_traj_label.main(argv), "vlm_traj_label.py")
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "label.api_key_env" in err
    assert KEY not in err and KEY[:MIN_ECHO] not in err
    assert not out.exists()


def test_the_openai_teacher_refuses_a_key_as_api_key_env_too():
    from a2c_ppo_acktr.labels.teachers import OpenAITeacher

    with pytest.raises(ConfigError, match="NAME") as e:
        OpenAITeacher(base_url="http://127.0.0.1:1/v1", model="m", api_key_env=KEY)
    assert KEY not in str(e.value)


# ------------------------------------------------------------------------------ URL userinfo
def _cfg(tmp_path, **log) -> RunConfig:
    return load_config(
        preset="debug",
        overrides={
            "label": {"base_url": f"http://alice:{PASSWORD}@teacher.example:8000/v1?api_key={KEY}"},
            "rollout": {
                "engine_url": f"http://bob:{ENGINE_PASSWORD}@gpu1:8000, http://bob:{ENGINE_PASSWORD}@gpu2:8000"
            },
            "log": {"output_dir": str(tmp_path / "run"), "tensorboard": False, "wandb_mode": "disabled", **log},
        },
    )


def _leaks(text: str) -> list[str]:
    return [s for s in (PASSWORD, ENGINE_PASSWORD, "s3cret", KEY, "alice", "bob:") if s in text]


def test_url_passwords_never_reach_the_saved_config_and_the_run_keeps_them(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.save(tmp_path / "config.yaml")
    written = (tmp_path / "config.yaml").read_text()
    assert _leaks(written) == [] and _leaks(cfg.to_yaml()) == [] and _leaks(json.dumps(cfg.to_dict())) == []
    assert "http://***@teacher.example:8000/v1?api_key=***" in written
    assert "http://***@gpu1:8000, http://***@gpu2:8000" in written
    # The objects the run builds read the fields themselves: the credentials are still there to send.
    assert PASSWORD in cfg.label.base_url and cfg.rollout.engine_url.count(ENGINE_PASSWORD) == 2
    # The written config loads again (eval reads a checkpoint's), and a resume compares equal to it.
    again = RunConfig.from_yaml(tmp_path / "config.yaml")
    assert again.label.base_url.startswith("http://***@")
    from a2c_ppo_acktr.rl.run_state import config_changes

    (tmp_path / "ckpt").mkdir()
    cfg.save(tmp_path / "ckpt" / "config.yaml")
    assert config_changes(tmp_path / "ckpt", cfg) == {}


def test_url_passwords_never_reach_tensorboard_or_wandb(tmp_path, monkeypatch):
    from a2c_ppo_acktr.run.logger import RunLogger

    cfg = _cfg(tmp_path, tensorboard=True)
    RunLogger(cfg, tmp_path / "run").close()
    events = b"".join(p.read_bytes() for p in (tmp_path / "run" / "tensorboard").rglob("*") if p.is_file())
    assert events and _leaks(events.decode("latin-1")) == []

    seen = {}
    monkeypatch.setitem(
        sys.modules,
        "wandb",
        types.SimpleNamespace(init=lambda **kw: seen.update(kw) or types.SimpleNamespace(id="x", finish=lambda: None)),
    )
    cfg = _cfg(tmp_path, wandb_mode="offline")
    RunLogger(cfg, tmp_path / "run2")
    assert _leaks(json.dumps(seen["config"])) == [] and seen["config"]["label"]["base_url"].startswith("http://***@")


def test_print_config_redacts_url_passwords(capsys):
    from a2c_ppo_acktr.config.cli import parse_run_config

    argv = ["--preset", "debug", "--print-config", "--label.base_url", f"http://alice:{PASSWORD}@h/v1"]
    with pytest.raises(SystemExit):
        parse_run_config(argv, "d")
    printed = capsys.readouterr().out
    assert "base_url: http://***@h/v1" in printed and _leaks(printed) == []


def test_a_redacted_url_from_a_written_config_is_refused_where_it_would_be_used(tmp_path):
    from a2c_ppo_acktr.labels.teachers import OpenAITeacher

    with pytest.raises(ConfigError, match=r"\*\*\* where its password was"):
        OpenAITeacher(base_url="http://***@h:8000/v1", model="m")


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://u:p@h:1/v1", "http://***@h:1/v1"),
        ("https://user@h/v1", "https://***@h/v1"),
        ("http://h:8000/v1", "http://h:8000/v1"),
        ("http://h/v1?token=abc&model=x", "http://h/v1?token=***&model=x"),
        ("http://u:p@[::1]:8000", "http://***@[::1]:8000"),
        ("http://u:p@h:notaport/v1", "http://***@h:notaport/v1"),
        ("outputs/run", "outputs/run"),
        ("--url=http://u:p@h:1/v1 then https://v:q@g/x.", "--url=http://***@h:1/v1 then https://***@g/x."),
    ],
)
def test_redact_url_cases(url, expected):
    assert redact_urls(url) == expected
    if " " not in url:
        assert redact_url(url) == expected


# ------------------------------------------------------------------------------ echoes of the key
def _spellings(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "spaced": " ".join(secret),
        "spaced_without_dashes": secret.replace("-", " "),
        "line_broken": "\n".join(secret[i : i + 5] for i in range(0, len(secret), 5)),
        "zero_width": "\u200b".join(secret),
        "percent_every_byte": "".join(f"%{b:02X}" for b in raw),
        "percent_lower_case": urllib.parse.quote(secret + "/", safe="").lower(),
        "json_unicode_escapes": "".join(f"\\u{ord(c):04x}" for c in secret),
        "html_references": "".join(f"&#{ord(c)};" for c in secret),
        "upper_case": secret.upper(),
        "hex": raw.hex(),
        "base64": base64.b64encode(raw).decode(),
        "base64_after_1_byte": base64.b64encode(b"k" + raw).decode(),
        "base64_after_2_bytes": base64.b64encode(b"k:" + raw).decode(),
        "base64_of_the_header": base64.b64encode(b"Authorization: Bearer " + raw).decode(),
        "base64_url_safe": base64.urlsafe_b64encode(b"xx" + raw + b"\xff\xfe").decode(),
        "base64_wrapped": "\n".join(base64.b64encode(raw).decode()[i : i + 8] for i in range(0, 44, 8)),
        "cut_off": secret[: MIN_ECHO + 2],
    }


@pytest.mark.parametrize("spelling", sorted(_spellings(KEY)))
def test_every_spelling_of_an_echoed_key_is_redacted(spelling):
    echo = _spellings(KEY)[spelling]
    out = redact(f"Sure. Your key is {echo} - anything else?", KEY)
    assert "***" in out and echo not in out
    assert out.startswith("Sure. Your key is ") and out.endswith(" - anything else?")


def test_redaction_leaves_ordinary_replies_alone():
    text = (
        "Thought: the chair is 1.5 m left of the table.\nAction: answer(B) sk-proj is a prefix; dGhlIGNoYWly is base64 "
        "too."
    )
    assert redact_all(text, [KEY, PASSWORD]) == text


def test_a_labelling_run_stores_no_spelling_of_an_echoed_key(monkeypatch, tmp_path):
    """The teacher's reply echoes the key in every spelling above: the labels hold none of them."""
    from test_teachers import FakeServer

    from a2c_ppo_acktr.common.prompts import Answer, format_response
    from a2c_ppo_acktr.labels.labeling import label_trajectories, read_episodes

    monkeypatch.setenv("VSI_TEST_KEY", KEY)
    spellings = _spellings(KEY)
    reply = format_response("Echo: " + " | ".join(spellings.values()), Answer("A"))
    with FakeServer(reply=reply) as server:
        cfg = load_config(
            preset="debug",
            overrides={
                "env": {"image_size": 16, "num_sweep_frames": 1, "image_history": 1, "max_turns": 1},
                "label": {
                    "teacher": "openai",
                    "base_url": server.url,
                    "model": "m",
                    "api_key_env": "VSI_TEST_KEY",
                    "out_dir": str(tmp_path / "lab"),
                    "num_episodes": 1,
                    "batch_size": 1,
                    "backoff_s": 0.0,
                },
                "log": {"progress_bar": False},
            },
        )
        label_trajectories(cfg)
    (episode,) = read_episodes(tmp_path / "lab" / "trajectories.jsonl")
    stored = " ".join(t["teacher_output"] + (t["action"] or "") for t in episode["turns"])
    assert "Echo:" in stored and "***" in stored
    for name, echo in spellings.items():
        assert echo not in stored, name
    for p in (tmp_path / "lab").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes()


def test_the_teacher_log_carries_no_spelling_of_an_echoed_key_in_an_error(monkeypatch, caplog):
    from test_teachers import ReplyServer, _observations

    from a2c_ppo_acktr.labels.teachers import OpenAITeacher

    monkeypatch.setenv("VSI_TEST_KEY", KEY)
    echo = _spellings(KEY)["base64_of_the_header"]
    with caplog.at_level(logging.DEBUG), ReplyServer(lambda auth: (500, f"trace: {echo}".encode())) as server:
        (reply,) = OpenAITeacher(
            base_url=server.url, model="m", api_key_env="VSI_TEST_KEY", retries=1, sleep=lambda s: None
        ).generate(_observations(1))
    assert echo not in reply.error and echo not in caplog.text and "***" in reply.error


def test_the_run_lock_records_the_command_line_without_url_passwords(tmp_path, monkeypatch):
    from a2c_ppo_acktr.run.rundir import RunLock

    argv = [
        "main_vsi.py",
        "--rollout.engine_url",
        f"http://bob:{ENGINE_PASSWORD}@gpu1:8000,http://bob:{ENGINE_PASSWORD}@gpu2:8000",
        f"--label.base_url=http://alice:{PASSWORD}@h/v1",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with RunLock(tmp_path / "run") as lock:
        record = json.loads(lock.path.read_text())
    assert _leaks(record["command"]) == [] and record["command"].count("http://***@") == 3

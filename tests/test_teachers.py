"""Teachers: the oracle scores the benchmark on every question type (which also checks the env's
ground truth), its moves face the target and its reasons are true; the OpenAI-compatible teacher
speaks the protocol to a real local HTTP server, retries what it should and never leaks the key."""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import EnvConfig, QUESTION_TYPES
from a2c_ppo_acktr.common.prompts import Answer, Move, build_messages, format_response, parse_action
from a2c_ppo_acktr.envs.oracle import bearing_to, format_number
from a2c_ppo_acktr.common.prompts import openai_messages
from a2c_ppo_acktr.labels.teachers import OpenAITeacher, OracleTeacher, make_teacher
from helpers import observation_rows

SECRET = "sk-test-7f3a9c1e5b2d4f6a8c0e"


@pytest.fixture(scope="module")
def env():
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

    # Four sweep frames so appearance-order questions exist; tiny frames keep it fast.
    return VSIEnv(EnvConfig(image_size=16, num_sweep_frames=4, image_history=1, max_turns=3, num_scenes=8))


def _run_oracle(env, teacher, seed):
    obs, _ = env.reset(seed=seed)
    texts = []
    while True:
        text = teacher.act([obs], [env])[0]
        texts.append(text)
        obs, _, terminated, truncated, info = env.step(text)
        if terminated or truncated:
            return texts, info, terminated


def test_oracle_scores_the_benchmark_on_every_type(env):
    teacher = OracleTeacher(max_moves=1)
    scores = defaultdict(list)
    for seed in range(200):
        texts, info, terminated = _run_oracle(env, teacher, seed)
        assert terminated, f"seed {seed}: the oracle must answer before truncation, wrote {texts}"
        assert all(not type(parse_action(t)).__name__ == "Invalid" for t in texts)
        assert len(texts) <= 2  # at most one move, then the answer
        scores[info["question_type"]].append(info["score"])
    assert set(scores) == set(QUESTION_TYPES), f"types not drawn in 200 episodes: {set(QUESTION_TYPES) - set(scores)}"
    mean = float(np.mean([s for v in scores.values() for s in v]))
    assert mean >= 0.95, {k: float(np.mean(v)) for k, v in scores.items()}


def test_oracle_move_faces_the_first_target(env):
    teacher = OracleTeacher(max_moves=1, face_tolerance_deg=20.0)
    moved = 0
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        base = env.unwrapped
        if not base.question.object_ids:
            continue
        target = base.scene.object(base.question.object_ids[0])
        before = bearing_to(base.pose, np.asarray(target.center)[:2])
        action = parse_action(teacher.act([obs], [env])[0])
        if abs(before) <= 20.0:
            assert isinstance(action, Answer)
            continue
        assert isinstance(action, Move) and action.forward_m == 0.0
        env.step(format_response("turn", action))
        assert abs(bearing_to(env.unwrapped.pose, np.asarray(target.center)[:2])) <= 0.5 + 1e-6
        moved += 1
    assert moved >= 10


def test_oracle_reasons_are_true(env):
    """Numbers in the oracle's thoughts agree with the question's exact values (meta)."""
    teacher = OracleTeacher(max_moves=0)
    checked = defaultdict(int)
    for seed in range(120):
        obs, _ = env.reset(seed=seed)
        q = env.unwrapped.question
        thoughts = json.loads(teacher.act([obs], [env])[0])["thoughts"]
        numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", thoughts)]
        if q.question_type == "object_abs_distance":
            assert any(abs(x - q.meta["distance_m"]) <= 0.006 for x in numbers), thoughts
        elif q.question_type == "object_size_estimation":
            assert any(abs(x - q.meta["longest_side_cm"]) <= 0.5 for x in numbers), thoughts
        elif q.question_type == "room_size_estimation":
            assert any(abs(x - q.meta["area_m2"]) <= 0.05 for x in numbers), thoughts
        elif q.question_type == "object_counting":
            assert q.meta["count"] in numbers, thoughts
        elif q.question_type == "object_rel_distance":
            for label, d in q.meta["distances_m"].items():
                assert f"{label} {d:.1f} m" in thoughts
        else:
            continue
        checked[q.question_type] += 1
    assert len(checked) == 5, checked


def test_format_number_is_within_half_a_percent():
    rng = np.random.default_rng(0)
    for v in np.concatenate([rng.uniform(0.01, 1, 200), rng.uniform(1, 10, 200), rng.uniform(10, 5000, 200)]):
        text = format_number(v)
        assert abs(float(text) - v) / v <= 0.005, (v, text)
        assert " " not in text and "e" not in text
    assert format_number(3.0) == "3" and format_number(12) == "12" and format_number(2.5) == "2.5"
    with pytest.raises(ValueError):
        format_number(math.nan)


def test_make_teacher_rejects_unknown_names():
    from a2c_ppo_acktr.config.arguments import LabelConfig, ModelConfig

    label = LabelConfig()
    label.teacher = "gpt-oracle"
    with pytest.raises(ValueError, match="known teachers"):
        make_teacher(label, ModelConfig())


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible server
# ---------------------------------------------------------------------------------------------
class _Loopback:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port), serving while the ``with`` block runs."""

    def serve(self, handler) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeServer(_Loopback):
    """A chat-completions endpoint on 127.0.0.1 whose replies follow a script of status codes."""

    def __init__(self, script=(), reply: str = "", delay_s: float = 0.0) -> None:
        self.script = list(script)  # statuses (or "garbage"/"sleep") served before the normal reply
        self.reply = reply
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                    step = server.script.pop(0) if server.script else 200
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s if step != "sleep" else 1.0)
                    if step == "garbage":
                        payload, status = b"<html>oops</html>", 200
                    elif step in (200, "sleep"):
                        payload, status = (
                            json.dumps(
                                {"choices": [{"message": {"role": "assistant", "content": server.reply}}]}
                            ).encode(),
                            200,
                        )
                    else:
                        payload, status = json.dumps({"error": {"message": f"scripted {step}"}}).encode(), step
                finally:
                    # Done before the reply is sent: once the client has its answer it may send the
                    # next request, which this handler must no longer count as in flight.
                    with server.lock:
                        server.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.serve(Handler)


def _observations(n: int, n_images: int = 2) -> list[dict]:
    texts = [f"Question {i}?" for i in range(n)]
    return observation_rows(np.random.default_rng(0), texts, [n_images] * n, shape=lambda k: (8, 8))


def _decode_png(url: str) -> np.ndarray:
    from PIL import Image

    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :]))).convert("RGB"))


def _teacher(server, **kw) -> OpenAITeacher:
    delays: list[float] = []
    kw.setdefault("sleep", delays.append)
    t = OpenAITeacher(base_url=server.url, model="teacher-72b", api_key_env="VSI_TEST_KEY", **kw)
    t.delays = delays  # type: ignore[attr-defined]
    return t


def test_openai_teacher_sends_images_and_retries_5xx(monkeypatch, caplog, capsys):
    monkeypatch.setenv("VSI_TEST_KEY", SECRET)
    reply = format_response("It is B.", Answer("B"))
    obs = _observations(1, n_images=2)
    with caplog.at_level(logging.DEBUG), FakeServer(script=[503, 500], reply=reply) as server:
        teacher = _teacher(server, retries=3, backoff_s=0.5)
        (out,) = teacher.generate(obs)
    assert out.text == reply and out.error is None and out.attempts == 3
    assert len(server.requests) == 3 and teacher.delays == [0.5, 1.0]  # exponential backoff
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {SECRET}"
    assert req["body"]["model"] == "teacher-72b" and req["body"]["temperature"] == 0.0
    user = req["body"]["messages"][1]["content"]
    urls = [p["image_url"]["url"] for p in user if p["type"] == "image_url"]
    assert len(urls) == 2
    for url, img in zip(urls, obs[0]["images"]):
        assert np.array_equal(_decode_png(url), img)  # lossless, in order
    assert user[-1] == {"type": "text", "text": obs[0]["text"]}
    assert req["body"]["messages"][0]["content"] == build_messages(obs[0])[0]["content"][0]["text"]
    captured = capsys.readouterr()
    assert SECRET not in caplog.text and SECRET not in captured.out + captured.err
    assert SECRET not in json.dumps(teacher.describe())


def test_openai_teacher_does_not_retry_4xx_but_retries_429_and_garbage(monkeypatch):
    monkeypatch.delenv("VSI_TEST_KEY", raising=False)
    with FakeServer(script=[400], reply="x") as server:
        (out,) = _teacher(server, retries=3).generate(_observations(1))
    assert out.error is not None and "400" in out.error and out.text == ""
    assert len(server.requests) == 1 and server.requests[0]["auth"] is None  # no key, no header
    with FakeServer(script=[429, "garbage"], reply="ok") as server:
        (out,) = _teacher(server, retries=2).generate(_observations(1))
    assert out.text == "ok" and out.attempts == 3 and len(server.requests) == 3
    with FakeServer(script=[502, 502, 502], reply="never") as server:
        (out,) = _teacher(server, retries=2).generate(_observations(1))
    assert out.text == "" and "502" in out.error and len(server.requests) == 3


def test_openai_teacher_times_out_then_records_failure():
    with FakeServer(script=["sleep", "sleep"], reply="late") as server:
        (out,) = _teacher(server, retries=1, timeout_s=0.2).generate(_observations(1))
    assert out.text == "" and out.error is not None and out.attempts == 2


def test_openai_teacher_bounds_concurrency_and_keeps_order():
    with FakeServer(reply="same", delay_s=0.15) as server:
        teacher = _teacher(server, max_concurrency=2)
        outs = teacher.generate(_observations(6, n_images=1))
    assert [o.text for o in outs] == ["same"] * 6
    assert server.max_in_flight == 2
    texts = [r["body"]["messages"][1]["content"][-1]["text"] for r in server.requests]
    assert sorted(texts) == [f"Question {i}?" for i in range(6)]


def test_openai_messages_mirror_the_policy_prompt():
    obs = _observations(1, n_images=3)[0]
    msgs = openai_messages(obs)
    policy = build_messages(obs)
    assert [m["role"] for m in msgs] == [m["role"] for m in policy]
    kinds = [p["type"] for p in msgs[1]["content"]]
    assert kinds == ["image_url"] * 3 + ["text"]


def test_hf_teacher_batched_greedy_equals_one_by_one(tiny_model_path):
    """Left padding and per-row images must not change a row's greedy reply."""
    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.labels.teachers import HFTeacher

    cfg = ModelConfig(model_path=tiny_model_path, device="cpu")
    teacher = HFTeacher(cfg, max_new_tokens=12, loaded=load_vlm(cfg))
    rng = np.random.default_rng(1)
    obs = [
        {
            "images": [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(k)],
            "text": "Question: how far?" + " more" * (3 * k),
        }
        for k in (1, 3, 2)
    ]
    batched = teacher.generate(obs)
    single = [teacher.generate([o])[0] for o in obs]
    assert [r.text for r in batched] == [r.text for r in single]
    assert all(r.error is None for r in batched)
    assert teacher.describe()["model_path"] == tiny_model_path


def test_openai_teacher_labelling_run_never_writes_the_key(monkeypatch, tmp_path, caplog, capsys):
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.labels.labeling import label_trajectories

    monkeypatch.setenv("VSI_TEST_KEY", SECRET)
    reply = format_response("Guessing.", Answer("A"))
    with caplog.at_level(logging.DEBUG), FakeServer(script=[503, 401], reply=reply) as server:
        cfg = load_config(
            preset="debug",
            overrides={
                "env": {"image_size": 16, "num_sweep_frames": 1, "image_history": 1, "max_turns": 2},
                "label": {
                    "teacher": "openai",
                    "base_url": server.url,
                    "model": "m",
                    "api_key_env": "VSI_TEST_KEY",
                    "out_dir": str(tmp_path / "lab"),
                    "num_episodes": 3,
                    "batch_size": 2,
                    "backoff_s": 0.0,
                },
                "log": {"progress_bar": False},
            },
        )
        summary = label_trajectories(cfg)
    assert summary["written"] == 3 and summary["failed_turns"] == 1  # the 401 is recorded, not retried
    assert all(r["auth"] == f"Bearer {SECRET}" for r in server.requests)
    captured = capsys.readouterr()
    assert "503" in caplog.text and SECRET not in caplog.text and SECRET not in captured.out + captured.err
    files = [p for p in (tmp_path / "lab").rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in files)
    for p in files:
        assert SECRET.encode() not in p.read_bytes(), p


def test_brief_oracle_thoughts_are_fixed_per_type_and_actions_match_full(env):
    """``thoughts="brief"`` changes only the reason: one fixed sentence per type, same actions."""
    from a2c_ppo_acktr.config.arguments import LabelConfig
    from a2c_ppo_acktr.envs.oracle import BRIEF_MOVE_THOUGHTS, BRIEF_THOUGHTS

    assert set(BRIEF_THOUGHTS) == set(QUESTION_TYPES)
    full, brief = OracleTeacher(max_moves=1), make_teacher(LabelConfig(oracle_thoughts="brief"), None)
    assert brief.describe()["thoughts"] == "brief"
    seen = set()
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        qt = env.unwrapped.question.question_type
        for _ in range(3):
            a, b = json.loads(full.act([obs], [env])[0]), json.loads(brief.act([obs], [env])[0])
            assert a["action"] == b["action"]
            expected = BRIEF_THOUGHTS[qt] if "answer" in b["action"] else BRIEF_MOVE_THOUGHTS
            assert b["thoughts"] == expected and not re.search(r"\d", b["thoughts"])
            seen.add(qt)
            obs, _, terminated, truncated, _ = env.step(json.dumps(b))
            if terminated or truncated:
                break
    assert len(seen) >= 5
    with pytest.raises(ValueError, match="oracle_thoughts"):
        LabelConfig(oracle_thoughts="long")
    with pytest.raises(ValueError, match="thoughts"):
        OracleTeacher(thoughts="long")


def _oom_teacher(tiny_model_path, fits: int, retry: bool, error=None):
    """An HF teacher on the tiny model whose ``generate`` runs out of memory on batches larger than
    ``fits`` (raising ``error``, default a CUDA-style ``torch.OutOfMemoryError``); ``teacher.sizes``
    records every batch size tried."""
    import torch

    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.labels.teachers import HFTeacher

    cfg = ModelConfig(model_path=tiny_model_path, device="cpu")
    loaded = load_vlm(cfg)
    real_generate = loaded.model.generate
    sizes = []

    def generate(**kwargs):
        sizes.append(int(kwargs["input_ids"].shape[0]))
        if sizes[-1] > fits:
            raise error or torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"
            )
        return real_generate(**kwargs)

    loaded.model.generate = generate  # an instance attribute shadows the method for greedy_generate
    teacher = HFTeacher(cfg, max_new_tokens=8, loaded=loaded, oom_retry_smaller=retry)
    teacher.sizes = sizes
    return teacher


def _label_cfg(tmp_path, name, batch_size, retry):
    from a2c_ppo_acktr.config.arguments import load_config

    return load_config(
        preset="debug",
        overrides={
            "env": {"image_size": 16, "num_sweep_frames": 1, "image_history": 1, "max_turns": 2},
            "label": {
                "teacher": "hf",
                "out_dir": str(tmp_path / name),
                "num_episodes": 3,
                "batch_size": batch_size,
                "oom_retry_smaller": retry,
            },
            "log": {"progress_bar": False},
        },
    )


def test_hf_teacher_out_of_memory_stops_labelling_with_a_clear_error(tmp_path, tiny_model_path):
    """A teacher that does not fit raises one actionable line instead of recording failed turns."""
    from a2c_ppo_acktr.config.arguments import ConfigError
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories
    from a2c_ppo_acktr.labels.teachers import TeacherOutOfMemoryError

    teacher = _oom_teacher(tiny_model_path, fits=1, retry=False)
    with pytest.raises(TeacherOutOfMemoryError) as info:
        label_trajectories(_label_cfg(tmp_path, "lab", batch_size=3, retry=False), teacher=teacher)
    message = str(info.value)
    assert isinstance(info.value, ConfigError)  # entry scripts print it as one line (cli.run_main)
    assert "\n" not in message and "out of memory" in message and "3 observation" in message
    for fix in ("label.batch_size", "label.oom_retry_smaller=true", "label.model_path", "more GPUs"):
        assert fix in message, (fix, message)
    assert teacher.sizes == [3]  # no silent retry when the option is off
    jsonl = tmp_path / "lab" / TRAJECTORIES
    assert not jsonl.exists() or jsonl.read_text() == ""  # nothing recorded, in particular no failed turns

    # With retries down to one observation, a model that fits nothing still stops with the error.
    single = _oom_teacher(tiny_model_path, fits=0, retry=True)
    with pytest.raises(TeacherOutOfMemoryError, match="not even one observation fits"):
        single.generate([{"images": [np.zeros((16, 16, 3), np.uint8)], "text": "How many chairs?"}] * 2)
    assert single.sizes == [2, 1]


def test_hf_teacher_other_errors_and_oom_messages_from_other_backends(tiny_model_path):
    """Errors other than out-of-memory still record the batch's turns as failed; a plain
    RuntimeError saying "out of memory" (cuBLAS, MPS, kernels) counts as out of memory."""
    from a2c_ppo_acktr.labels.teachers import TeacherOutOfMemoryError, is_out_of_memory

    obs = [{"images": [np.zeros((16, 16, 3), np.uint8)], "text": "How many chairs?"}] * 2
    other = _oom_teacher(
        tiny_model_path, fits=0, retry=False, error=RuntimeError("CUDA error: device-side assert triggered")
    )
    replies = other.generate(obs)
    assert [r.text for r in replies] == ["", ""] and all("device-side assert" in r.error for r in replies)
    plain = _oom_teacher(
        tiny_model_path, fits=1, retry=False, error=RuntimeError("MPS backend out of memory (MPS allocated: 9 GB)")
    )
    with pytest.raises(TeacherOutOfMemoryError, match="MPS backend out of memory"):
        plain.generate(obs)
    assert not is_out_of_memory(ValueError("out of memory"))  # only runtime (allocator) errors


def test_hf_teacher_oom_retry_labels_in_halves_like_batch_size_one(tmp_path, tiny_model_path):
    """``label.oom_retry_smaller``: the batch is split in halves until it fits, later batches start
    at the size that fit, and the labelled trajectories equal a batch-size-1 run's."""
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, read_episodes

    retry = _oom_teacher(tiny_model_path, fits=1, retry=True)
    summary = label_trajectories(_label_cfg(tmp_path, "retry", batch_size=3, retry=True), teacher=retry)
    assert summary["written"] == 3 and summary["failed_turns"] == 0
    assert retry.sizes[:5] == [3, 2, 1, 1, 1]  # 3 -> halves of 2 and 1 -> 2 splits again
    assert retry.fit_batch_size == 1 and max(retry.sizes[5:]) == 1  # later turns start at the size that fit

    single = _oom_teacher(tiny_model_path, fits=1, retry=False)
    label_trajectories(_label_cfg(tmp_path, "single", batch_size=1, retry=False), teacher=single)
    assert max(single.sizes) == 1

    def turns(name):
        episodes = sorted(read_episodes(tmp_path / name / TRAJECTORIES), key=lambda e: e["episode_id"])
        return [
            (e["episode_id"], [(t["observation_text"], t["teacher_output"], t["teacher_error"]) for t in e["turns"]])
            for e in episodes
        ]

    assert turns("retry") == turns("single")
    assert any(t[1] for _, ts in turns("retry") for t in ts)  # the replies compared are real text


def EchoServer(status: int = 500, location: str | None = None) -> "ReplyServer":
    """Answers every POST with ``status`` and a body that echoes the request's Authorization header,
    or with a redirect to ``location``: what a hostile or misconfigured server may do."""

    def respond(auth: str):
        if location is not None:
            return 302, b"", {"Location": location}
        return status, f"error: bad header {auth}".encode()

    return ReplyServer(respond)


def test_openai_teacher_never_follows_a_redirect_with_the_key(monkeypatch, caplog):
    """A 302 to another port is refused: the second server sees no request, the key stays home, and
    the turn is recorded as a failure that says to fix label.base_url."""
    monkeypatch.setenv("VSI_TEST_KEY", SECRET)
    with FakeServer(reply="x") as elsewhere, EchoServer(location=elsewhere.url + "/chat/completions") as redirecting:
        with caplog.at_level(logging.WARNING):
            (reply,) = _teacher(redirecting, retries=2).generate(_observations(1))
    assert len(redirecting.requests) == 1 and elsewhere.requests == []
    assert reply.text == "" and "redirects to http://127.0.0.1" in reply.error and "label.base_url" in reply.error
    assert SECRET not in reply.error and SECRET not in caplog.text


@pytest.mark.parametrize("status", [401, 500, 200])
def test_openai_teacher_redacts_an_echoed_key_everywhere(monkeypatch, caplog, capsys, status):
    """Error bodies that echo the Authorization header (a 4xx, a 5xx retried, a non-JSON 200) reach
    neither the reply's error, nor the log, nor stdout/stderr."""
    monkeypatch.setenv("VSI_TEST_KEY", SECRET)
    with caplog.at_level(logging.DEBUG), EchoServer(status=status) as server:
        (reply,) = _teacher(server, retries=1).generate(_observations(1))
    assert all(r["auth"] == f"Bearer {SECRET}" for r in server.requests)  # the key did go to its own server
    captured = capsys.readouterr()
    assert reply.error and "***" in reply.error
    assert SECRET not in reply.error and SECRET not in caplog.text and SECRET not in captured.out + captured.err


def test_redact_catches_cut_off_and_encoded_echoes_of_the_key():
    import urllib.parse

    from a2c_ppo_acktr.common.redaction import MIN_ECHO, redact

    cases = {
        f"echo {SECRET} end": "echo *** end",
        f"cut: {SECRET[:12]}": "cut: ***",  # a server truncated its echo
        f"url: {urllib.parse.quote('Bearer ' + SECRET)}": "url: Bearer%20***",
        f"b64: {base64.b64encode(SECRET.encode()).decode()}": "b64: ***",
        f"auth: {base64.b64encode(('Bearer ' + SECRET).encode()).decode()}": "auth: ***",
        "sk-test is a prefix too short to be an echo": "sk-test is a prefix too short to be an echo",
    }
    for text, expected in cases.items():
        assert redact(text, SECRET) == expected, text
    assert len("sk-test") < MIN_ECHO
    quoted = json.dumps('{"k": "a\\"b' + SECRET + '"}')
    assert SECRET not in redact(quoted, SECRET) and redact("x", "") == "x"


class ReplyServer(_Loopback):
    """Answers every POST with ``respond(authorization header)`` -> ``(status, body[, headers])``, all
    at once or one byte every ``drip_s`` seconds; ``requests`` records each request's header."""

    def __init__(self, respond, drip_s: float = 0.0) -> None:
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                auth = self.headers.get("Authorization")
                server.requests.append({"auth": auth})
                status, body, *headers = respond(auth or "")
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for start in range(0, len(body), 1 if drip_s else max(1, len(body))):
                        self.wfile.write(body[start : start + (1 if drip_s else len(body))])
                        self.wfile.flush()
                        time.sleep(drip_s)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up
                    pass

        self.serve(Handler)


def _header_echo(status: int):
    """A server's reply that echoes the Authorization header: in a 200 chat reply, or in an error
    body that puts the header across the message's cut at 200 characters."""

    def respond(auth: str) -> tuple[int, bytes]:
        if status == 200:
            return 200, json.dumps({"choices": [{"message": {"content": f"your header was {auth}"}}]}).encode()
        prefix = "x" * (200 - len("Bearer ") - 10)  # the key starts 10 characters before the cut
        return status, f"{prefix}{auth} and more".encode()

    return respond


@pytest.mark.parametrize("status", [200, 400])
def test_a_reply_or_a_cut_error_never_carries_the_key(monkeypatch, status):
    monkeypatch.setenv("VSI_TEST_KEY", SECRET)
    with ReplyServer(_header_echo(status)) as server:
        (reply,) = _teacher(server, retries=0).generate(_observations(1))
    assert [r["auth"] for r in server.requests] == [f"Bearer {SECRET}"]
    text = reply.text + (reply.error or "")
    assert "***" in text and not any(SECRET[i : i + 8] in text for i in range(len(SECRET) - 7))


def test_a_password_in_base_url_is_sent_as_basic_auth_and_written_nowhere(monkeypatch, tmp_path, caplog):
    from a2c_ppo_acktr.labels.teachers import OpenAITeacher

    monkeypatch.delenv("VSI_TEST_KEY", raising=False)
    password = "hunter2-Pa55word"
    with caplog.at_level(logging.DEBUG), ReplyServer(_header_echo(400)) as server:
        url = server.url.replace("http://", f"http://alice:{password}@")
        teacher = OpenAITeacher(base_url=url, model="m", api_key_env="VSI_TEST_KEY", retries=0)
        (reply,) = teacher.generate(_observations(1))
    assert [r["auth"] for r in server.requests] == ["Basic " + base64.b64encode(f"alice:{password}".encode()).decode()]
    described = json.dumps(teacher.describe())
    assert password not in described and "alice" not in described and server.url.split("//")[1] in described
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    assert reply.error and "Basic ***" in reply.error
    assert password not in reply.error + caplog.text and basic[:8] not in reply.error + caplog.text


@pytest.mark.parametrize("case", ["deep", "huge", "drip"])
def test_hostile_replies_are_bounded_failed_turns(case):
    """A reply nested 50,000 deep, one larger than MAX_REPLY_BYTES, and one dripped a byte at a time
    past label.timeout_s: each is a failed turn within its bound, never a crash or a stored blob."""
    from a2c_ppo_acktr.labels.teachers import MAX_REPLY_BYTES

    body = {"deep": b"[" * 50000 + b"]" * 50000, "huge": b" " * (MAX_REPLY_BYTES + 10), "drip": b'{"choices": []}' * 4}[
        case
    ]
    with ReplyServer(lambda auth: (200, body), drip_s=0.2 if case == "drip" else 0.0) as server:
        t0 = time.monotonic()
        (reply,) = _teacher(server, retries=0, timeout_s=1.0).generate(_observations(1))
        elapsed = time.monotonic() - t0
    assert reply.text == "" and reply.error
    expected = {"deep": "unreadable response", "huge": "larger than", "drip": "longer than label.timeout_s"}[case]
    assert expected in reply.error and len(reply.error) < 600
    assert elapsed < 5.0

"""Every network call ends by its total deadline, a stop request ends it sooner, and the rollout
server's reply is checked before use. Loopback servers that stall or trickle their status line,
headers, body or error body, and a stand-in vLLM server that answers impossible token ids."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from a2c_ppo_acktr.common.bounded_read import (
    Deadline,
    ReplyTooSlow,
    RequestAborted,
    error_body,
    open_within,
    read_within,
    timed_out,
)
from a2c_ppo_acktr.labels.teachers import OpenAITeacher
from a2c_ppo_acktr.policy.rollout_engine import (
    BadReplyError,
    EngineError,
    EngineInterrupted,
    EngineStopped,
    EngineUnavailable,
    VLLMServerEngine,
    adapter_name,
)
from a2c_ppo_acktr.run.preemption import PREEMPTED_EXIT_CODE, Preempted, StopOnSignal

PLAIN = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"


class StallingServer:
    """A raw TCP server on 127.0.0.1 that reads each request, then plays ``script``: a list of
    ``(bytes, seconds[, drip])`` steps, each bytes sent (one at a time when ``drip``) then a pause. The
    connection is held open until the server stops, so a client waiting on it waits on silence."""

    def __init__(self, script: list[tuple[bytes, float]], drip: bool = False, max_seconds: float = 30.0) -> None:
        self.script, self.drip, self.max_seconds = script, drip, max_seconds
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._play, args=(conn,), daemon=True).start()

    def _play(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.max_seconds  # the old client hangs at most this long
        try:
            conn.settimeout(2.0)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            for chunk, pause, *drip in self.script:
                pieces = [chunk[i : i + 1] for i in range(len(chunk))] if (drip[0] if drip else self.drip) else [chunk]
                for piece in pieces:
                    if self.done.is_set() or time.monotonic() > end:
                        return
                    conn.sendall(piece)
                    if self.drip:
                        time.sleep(0.2)
                self.done.wait(min(pause, max(0.0, end - time.monotonic())))
        except OSError:
            pass
        finally:
            conn.close()

    def __enter__(self) -> "StallingServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.sock.close()


# What a server may do after reading the request, and nothing else for 30 s.
STALLS = {
    "silent": [(b"", 30.0)],  # accepts and never answers
    "headers_trickled": [(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200, 30.0)],  # drips a header, byte by byte
    "body_stalled": [(PLAIN.encode() + b"{", 30.0)],  # headers, then silence mid-body
    "body_trickled": [(PLAIN.encode() + b" " * 200, 30.0)],
    "error_body_trickled": [(b"HTTP/1.1 503 Busy\r\nContent-Length: 1000\r\n\r\n" + b"e" * 200, 30.0)],
    "status_line_trickled": [(b"HTTP/1.1 200 OK" + b" " * 200, 30.0)],
}
DRIPPED = {"headers_trickled", "body_trickled", "error_body_trickled", "status_line_trickled"}


@pytest.mark.parametrize("stall", sorted(STALLS))
def test_an_engine_request_ends_by_its_total_deadline_whatever_the_server_stalls(stall, tmp_path):
    """rollout.engine_timeout_s bounds the whole request: a server that drips its status line or
    headers a byte at a time (each byte well within any socket timeout), stalls mid-body, or drips an
    error body ends in EngineUnavailable after the deadline, not minutes later."""
    with StallingServer(STALLS[stall], drip=stall in DRIPPED) as server:
        engine = VLLMServerEngine(
            server.url, tmp_path, max_new_tokens=8, timeout_s=1.0, retries=1, backoff_s=0.0, should_stop=None
        )
        t0 = time.monotonic()
        with pytest.raises(EngineUnavailable, match="did not answer GET /health after 1 tries") as e:
            engine.check_health()
        elapsed = time.monotonic() - t0
    assert elapsed < 2.5, f"{stall}: {elapsed:.1f} s for a 1 s deadline"
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("stall", sorted(STALLS))
def test_a_teacher_request_ends_by_label_timeout_s_whatever_the_server_stalls(stall):
    """label.timeout_s bounds the whole attempt, headers and error bodies included: each stall is a
    failed turn that names the timeout (or the error status), within the deadline."""
    with StallingServer(STALLS[stall], drip=stall in DRIPPED) as server:
        teacher = OpenAITeacher(
            base_url=server.url + "/v1", model="m", api_key_env="VSI_UNSET_KEY", timeout_s=1.0, retries=0
        )
        t0 = time.monotonic()
        (reply,) = teacher.generate([{"images": [], "text": "q"}])
        elapsed = time.monotonic() - t0
    assert reply.text == "" and reply.error
    assert ("label.timeout_s=1" in reply.error) or ("HTTP 503" in reply.error), reply.error
    assert elapsed < 2.5, f"{stall}: {elapsed:.1f} s for a 1 s deadline"


def test_a_slow_error_body_does_not_hold_a_fatal_teacher_reply():
    """A 401 whose body drips is still recorded at once as a failed, not retried, turn."""
    script = [(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 5000\r\n\r\n", 0.0, False), (b"x" * 300, 30.0, True)]
    with StallingServer(script) as server:
        teacher = OpenAITeacher(
            base_url=server.url + "/v1", model="m", api_key_env="VSI_UNSET_KEY", timeout_s=1.0, retries=3
        )
        t0 = time.monotonic()
        (reply,) = teacher.generate([{"images": [], "text": "q"}])
        elapsed = time.monotonic() - t0
    assert "HTTP 401" in reply.error and "not retried" in reply.error and server.connections == 1
    assert elapsed < 2.5


def test_a_deadline_covers_connect_to_a_host_that_never_answers():
    """A connection that is never accepted (a full backlog: the SYN is not answered) ends at the
    deadline, and a stop request ends it sooner."""
    import urllib.request

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    fillers = []
    try:
        for _ in range(64):  # fill the accept queue; later connects hang in SYN_SENT
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(sock.getsockname())
            fillers.append(s)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/health"
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            open_within(urllib.request.Request(url), Deadline(0.8))
        assert time.monotonic() - t0 < 2.0
        assert timed_out(e.value)
    finally:
        for s in fillers:
            s.close()
        sock.close()


def test_a_stop_request_ends_a_waiting_request_within_the_poll_interval():
    flag = threading.Event()
    with StallingServer(STALLS["silent"]) as server:
        threading.Timer(0.3, flag.set).start()
        t0 = time.monotonic()
        with pytest.raises(RequestAborted, match="stop requested"):
            import urllib.request

            open_within(
                urllib.request.Request(server.url + "/health"),
                Deadline(600.0, lambda: "test" if flag.is_set() else None),
            )
        assert time.monotonic() - t0 < 1.5


def test_error_body_and_read_within_share_the_request_deadline():
    import urllib.error
    import urllib.request

    with StallingServer(STALLS["error_body_trickled"], drip=False) as server:
        deadline = Deadline(0.8)
        with pytest.raises(urllib.error.HTTPError) as e:
            open_within(urllib.request.Request(server.url + "/x"), deadline)
        t0 = time.monotonic()
        assert error_body(e.value, 65536) == "e" * 200  # what came before the silence
        assert time.monotonic() - t0 < 1.2
    with StallingServer(STALLS["body_stalled"]) as server:
        deadline = Deadline(0.8)
        with open_within(urllib.request.Request(server.url + "/x"), deadline) as resp, pytest.raises(ReplyTooSlow):
            read_within(resp, deadline, 1 << 20)


# ------------------------------------------------------------------------------ a stop signal
def _stop_soon(how: str, stop_file: Path) -> threading.Timer:
    def fire() -> None:
        if how == "signal":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            stop_file.touch()

    timer = threading.Timer(0.4, fire)
    timer.start()
    return timer


@pytest.mark.parametrize("how", ["signal", "stop_file"])
def test_sigterm_or_the_stop_file_interrupts_a_hung_engine_request_within_seconds(how, tmp_path):
    """With the defaults (600 s x 3 tries) a hung server would outlast SLURM's notice: the run's
    SIGTERM (or the STOP file batch_vsi.sh writes) ends the waiting request within a second, and
    the run's stop is a preemption's (exit 75), which the launch script requeues."""
    stop_file = tmp_path / "STOP"
    with StallingServer(STALLS["headers_trickled"], drip=True) as server, StopOnSignal(stop_file) as stop:
        engine = VLLMServerEngine(server.url, tmp_path, max_new_tokens=8)  # default timeout 600 s, 3 tries
        _stop_soon(how, stop_file)
        t0 = time.monotonic()
        with pytest.raises(EngineInterrupted, match="stop requested") as e:
            engine.check_health()
        assert time.monotonic() - t0 < 2.0
        assert stop.requested()
        # Before the first rollout (the health check) the run ends as a stop does: exit 75, requeued.
        assert (
            isinstance(e.value, Preempted)
            and e.value.exit_code == PREEMPTED_EXIT_CODE
            and "--resume auto" in str(e.value)
        )
        stopped = EngineStopped("the rollout server failed", 3, tmp_path / "checkpoint-000003")
    assert stopped.exit_code == PREEMPTED_EXIT_CODE and "stopped by" in str(stopped) and "--resume auto" in str(stopped)
    assert (
        EngineStopped("the rollout server failed", 3, tmp_path / "c").exit_code == 69
    )  # no stop asked: a server failure


def test_a_stop_during_the_retry_backoff_ends_it(tmp_path):
    flag = threading.Event()
    with StallingServer([(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", 0.0)]) as server:
        engine = VLLMServerEngine(
            server.url,
            tmp_path,
            max_new_tokens=8,
            retries=3,
            backoff_s=30.0,
            should_stop=lambda: flag.is_set() and "test",
        )
        threading.Timer(0.5, flag.set).start()
        t0 = time.monotonic()
        with pytest.raises(EngineInterrupted):
            engine.check_health()
        assert time.monotonic() - t0 < 1.5


# ------------------------------------------------------------------------------ bad replies
class FakeVLLM:
    """A stand-in vLLM server without a model: adapters load, and every chat completion answers
    ``reply`` (a dict) as JSON."""

    def __init__(self, reply: dict) -> None:
        self.reply = reply
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                payload = json.dumps(server.reply if self.path == "/v1/chat/completions" else {}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> "FakeVLLM":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


VOCAB, MAX_TOKENS, BANNED = 1000, 16, [900, 901]


def _reply(ids, logprobs=None, prompt=(1, 2, 3), finish="length", stop_reason=None) -> dict:
    content = (
        [{"token": f"token_id:{i}", "logprob": lp} for i, lp in zip(ids, logprobs)] if logprobs is not None else None
    )
    return {
        "model": adapter_name(1),
        "prompt_token_ids": list(prompt),
        "choices": [
            {
                "token_ids": ids,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "logprobs": {"content": content} if content else None,
            }
        ],
    }


BAD_REPLIES = {
    "id_out_of_vocabulary": _reply([5, VOCAB]),
    "negative_id": _reply([5, -1]),
    "float_id": _reply([5, 7.5]),
    "string_id": _reply([5, "7"]),
    "boolean_id": _reply([5, True]),
    "banned_id": _reply([5, BANNED[0]]),
    # Thousands of times the reply length: refused before anything is sized by it.
    "far_too_many_ids": _reply([5] * (MAX_TOKENS * 5000)),
    "one_id_too_many": _reply([5] * (MAX_TOKENS + 1)),
    "logprob_not_a_number": _reply([5, 6], logprobs=[-0.1, "abc"]),
    "positive_logprob": _reply([5, 6], logprobs=[-0.1, 3.0]),
    "prompt_id_out_of_vocabulary": _reply([5, 6], prompt=(1, VOCAB + 7)),
    "token_ids_not_a_list": {"model": adapter_name(1), "choices": [{"token_ids": 12}]},
    "logprob_entry_not_an_object": {
        "model": adapter_name(1),
        "prompt_token_ids": [1],
        "choices": [{"token_ids": [5], "logprobs": {"content": ["x"]}}],
    },
}


def _row():
    from a2c_ppo_acktr.policy.rollout_engine import EngineRow

    return EngineRow(messages=[{"role": "user", "content": "q"}], prompt_ids=[1, 2, 3], temperature=1.0, seed=0)


@pytest.mark.parametrize("case", sorted(BAD_REPLIES))
def test_an_impossible_reply_is_an_engine_error_not_a_traceback(case, tmp_path):
    """Token ids out of [0, vocab), banned, of another type, or more than max_tokens, and log-probs
    that are not log-probabilities: each is the EngineError family (what the trainer turns into a
    checkpoint and exit 69, as for a dead server), one line, and the id list is never used."""
    with FakeVLLM(BAD_REPLIES[case]) as server:
        engine = VLLMServerEngine(
            server.url,
            tmp_path,
            max_new_tokens=MAX_TOKENS,
            forbidden_ids=BANNED,
            vocab_size=VOCAB,
            retries=1,
            backoff_s=0.0,
            timeout_s=10.0,
            should_stop=None,
        )
        engine.sync_adapter(lambda path: path.mkdir(parents=True, exist_ok=True), 1)
        with pytest.raises(EngineError) as e:
            engine.generate([_row()])
    assert "\n" not in str(e.value) and "rollout server" in str(e.value)
    if case != "token_ids_not_a_list":
        assert isinstance(e.value, BadReplyError)


def test_a_good_reply_passes_and_a_stop_token_may_be_the_one_past_max_tokens(tmp_path):
    good = _reply(
        [5] * MAX_TOKENS, logprobs=[-0.5] * MAX_TOKENS, finish="stop", stop_reason=999
    )  # a server that strips the stop token
    with FakeVLLM(good) as server:
        engine = VLLMServerEngine(
            server.url,
            tmp_path,
            max_new_tokens=MAX_TOKENS,
            stop_ids=[999],
            forbidden_ids=BANNED,
            vocab_size=VOCAB,
            retries=1,
            should_stop=None,
        )
        engine.sync_adapter(lambda path: path.mkdir(parents=True, exist_ok=True), 1)
        (reply,) = engine.generate([_row()])
    assert reply.token_ids == [5] * MAX_TOKENS + [999] and len(reply.token_log_probs) == MAX_TOKENS + 1


def test_a_password_in_engine_url_is_sent_as_basic_auth_and_named_nowhere(tmp_path):
    import base64

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            body = f"bad credentials {self.headers.get('Authorization')}".encode()
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://vsi:s3cret-Pa55@127.0.0.1:{httpd.server_address[1]}"
        engine = VLLMServerEngine(url, tmp_path, max_new_tokens=8, retries=1, should_stop=None)
        with pytest.raises(EngineUnavailable) as e:
            engine.check_health()
    finally:
        httpd.shutdown()
        httpd.server_close()
    basic = base64.b64encode(b"vsi:s3cret-Pa55").decode()
    assert seen == [f"Basic {basic}"]
    assert "s3cret" not in str(e.value) and basic not in str(e.value) and "vsi:" not in engine.base
    with pytest.raises(EngineError, match=r"\*\*\* where its password was"):
        VLLMServerEngine("http://***@127.0.0.1:1", tmp_path, max_new_tokens=8)


@pytest.mark.slow
def test_training_stops_with_exit_69_and_a_checkpoint_when_the_server_answers_impossible_ids(tmp_path):
    """End to end: a server whose replies hold 5,000 times max_tokens ids stops the run as a dead
    one does (checkpoint of the last finished iteration, EngineStopped, exit 69, one line), before
    anything is sized by the reply."""
    import torch
    from test_rollout_engine import _overrides

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.loopback_server import LoopbackServer
    from a2c_ppo_acktr.rl.train import run_training

    class HugeReplies(LoopbackServer):
        def chat(self, body: dict) -> dict:
            out = super().chat(body)
            out["choices"][0]["token_ids"] = [5] * (int(body["max_tokens"]) * 5000)
            return out

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with HugeReplies(load_config(preset="debug").model) as srv:
            with pytest.raises(EngineStopped) as stopped:
                run_training(
                    load_config(
                        preset="debug", overrides=_overrides(tmp_path / "run", srv.url, **{"ppo.num_iterations": "1"})
                    )
                )
    finally:
        torch.set_num_threads(threads)
    assert stopped.value.exit_code == 69 and stopped.value.checkpoint.name.endswith("000000")
    assert "max_tokens" in str(stopped.value) and "\n" not in str(stopped.value)


@pytest.mark.slow
def test_sigterm_while_the_server_hangs_mid_rollout_ends_the_run_with_a_checkpoint_and_exit_75(tmp_path):
    """End to end: the server accepts a chat request and never answers (rollout.engine_timeout_s is
    600 s); a SIGTERM then ends the run within seconds with the checkpoint of the last finished
    iteration and the preemption exit code, not after 600 s x 3 tries."""
    import torch
    from test_rollout_engine import _overrides

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.loopback_server import LoopbackServer
    from a2c_ppo_acktr.rl.train import run_training

    entered, release = threading.Event(), threading.Event()

    class Hangs(LoopbackServer):
        def chat(self, body: dict) -> dict:
            entered.set()
            release.wait(120)
            return {}  # released at the end of the test: no model work left running at exit

    def signal_when_hung() -> None:
        if entered.wait(300):
            time.sleep(0.3)
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    signalled: list[float] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Hangs(load_config(preset="debug").model) as srv:
            threading.Thread(target=signal_when_hung, daemon=True).start()
            over = _overrides(
                tmp_path / "run",
                srv.url,
                **{"ppo.num_iterations": "1", "rollout.engine_timeout_s": "600", "rollout.engine_retries": "3"},
            )
            with pytest.raises(EngineStopped) as stopped:
                run_training(load_config(preset="debug", overrides=over))
            ended = time.monotonic()
    finally:
        release.set()
        torch.set_num_threads(threads)
    assert signalled and ended - signalled[0] < 5.0
    assert stopped.value.exit_code == PREEMPTED_EXIT_CODE and stopped.value.checkpoint.name.endswith("000000")
    assert "stopped by SIGTERM" in str(stopped.value)

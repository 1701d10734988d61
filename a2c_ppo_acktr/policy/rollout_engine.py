"""Rollout engines: what samples the replies of a PPO rollout (``rollout.engine``).

``hf`` (the default) samples inside :meth:`VLMPolicy.act <a2c_ppo_acktr.policy.model.VLMPolicy.act>` with
Hugging Face ``generate``: one prefill per turn gives the temperature head's and the value head's
inputs and the first token's logits.

``vllm`` sends each turn to a vLLM server speaking its OpenAI-compatible protocol (``vllm serve MODEL
--enable-lora --max-lora-rank R``, with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), the way VAGEN,
verl and TRL's ``use_vllm`` roll out: continuous batching and prefix caching on the server. A turn
through this engine is three steps (:meth:`VLMPolicy.act <a2c_ppo_acktr.policy.model.VLMPolicy.act>`):

1. a prompt-only forward of the policy gives each row's temperature (the head predicts before
   anything is sampled) and value;
2. :meth:`VLLMServerEngine.generate` asks the server for one reply per row at that row's
   temperature, under the adapter of this iteration, and gets token ids back, never re-tokenised text;
3. the policy's own forward recomputes the replies' log-probs (``model.rollout_log_probs=recompute``
   semantics), so PPO's ratio compares the policy with itself; the server's log-probs are kept
   only for the off-policy monitor and truncated importance sampling (``ppo.tis_cap``).

The contract, each part enforced here and tested against a loopback server
(:mod:`a2c_ppo_acktr.policy.loopback_server`):

* **Weight sync.** Every iteration's adapter is one name, ``policy-<run>-v<iteration>``
  (``<run>`` hashes the run directory, so trainers sharing a server keep apart), shared by every
  rank: after each update all ranks hold the same LoRA weights. The trainer's rank 0 saves it once,
  into a fresh directory per version and launch (vLLM 0.33 keys its prefix cache on the adapter's
  name and path, so a reload of changed weights from the same path could reuse stale blocks); one
  rank per server loads it (``/v1/load_lora_adapter``, whose success reply is plain text) and
  unloads the previous one; no rank samples before every server holds it. A server batches
  requests of one adapter only (``--max-loras`` 1), so one name per iteration is also what keeps
  its batches whole. A reply whose ``model`` is another name was produced by a stale adapter and
  is refused (:class:`StaleAdapterError`).
* **Servers.** ``rollout.engine_url`` lists the servers of one node, the same list on every node;
  a rank uses the one its local rank maps to (:func:`server_index`: one server per GPU, or per
  group of ``k`` GPUs for tensor parallelism). The health check reads ``GET /version`` and refuses a
  server outside the supported versions (:mod:`a2c_ppo_acktr.common.vllm_compat`).
* **Sampling.** Per row: ``temperature`` (0 = greedy), ``seed`` (drawn from torch's generator, so a
  resumed run draws the same ones), and for every row ``top_k``, ``top_p``, ``max_tokens``
  (``model.max_new_tokens``), ``stop_token_ids`` (the policy's EOS ids) and a ``logit_bias`` of -100
  on the ids the policy never samples (image and video pads). Penalties and ``min_p`` are neutral
  (sent, so that no generation_config.json default applies), and special tokens are kept, as in the HF engine.
* **Token alignment.** ``return_token_ids`` asks the server for its prompt ids; they must equal the
  processor's, or the run stops naming the chat template (:class:`TokenAlignmentError`).
* **Replies are checked before use.** Every sampled id is an integer in ``[0, vocab)`` and not one
  of the ids the request banned, there are at most ``max_tokens`` of them (one more when the stop
  token is appended here), and log-probs are numbers <= 0; a reply cut before ``max_tokens`` for
  want of context (vLLM 0.33 shortens ``max_tokens`` to what ``--max-model-len`` leaves) is refused
  too. Anything else is a :class:`BadReplyError`, never a traceback or an allocation sized by the server.
* **Failures.** Every request has a total deadline (``rollout.engine_timeout_s``) over connect,
  headers and body, an error's body included; a server that cannot be reached after
  ``rollout.engine_retries`` tries raises :class:`EngineUnavailable`, a stop signal (or the run's
  ``STOP`` file) ends a waiting request within a second (:class:`EngineInterrupted`), and in every
  case the trainer writes a resumable checkpoint and stops with one line (exit 69, or 75 when a
  stop was asked for).
* **Credentials.** A ``user:password@`` in ``rollout.engine_url`` is sent as HTTP basic
  authentication and never appears in a message or a written config.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import secrets
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from a2c_ppo_acktr.common.bounded_read import (
    Deadline,
    ReplyTooLarge,
    RequestAborted,
    error_body,
    open_within,
    read_within,
    timed_out,
    wait,
)
from a2c_ppo_acktr.common.choices import ROLLOUT_ENGINES
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.redaction import (
    basic_auth,
    has_redacted_credentials,
    redact_all,
    strip_credentials,
    url_secrets,
)
from a2c_ppo_acktr.common.vllm_compat import SUPPORTED_RANGE, VLLMVersionError, check_version
from a2c_ppo_acktr.run.preemption import PREEMPTED_EXIT_CODE, Preempted, stop_requested

logger = logging.getLogger(__name__)

ENGINES = ROLLOUT_ENGINES
# OpenAI's logit_bias range is [-100, 100]; -100 is how a server is told never to sample a token.
BAN_BIAS = -100
MAX_REPLY_BYTES = 16 * 1024 * 1024


class EngineStopped(Preempted):
    """The run stopped because its rollout server failed, after writing a checkpoint of the last
    finished iteration; ``exit_code`` 69 (EX_UNAVAILABLE): continue with ``--resume auto``. When a
    stop was asked for meanwhile (a signal, the ``STOP`` file: what interrupted the request), the
    exit is a preemption's, 75, which the launch scripts requeue."""

    exit_code = 69

    def __init__(self, error: str, iteration: int, checkpoint: Path) -> None:
        stop = stop_requested()
        if stop:
            Exception.__init__(
                self,
                f"stopped by {stop} while waiting for the rollout server; checkpoint {checkpoint} holds the "
                f"{iteration} iterations done: continue with --resume auto",
            )
            self.exit_code = PREEMPTED_EXIT_CODE
        else:
            Exception.__init__(
                self,
                f"{error}; checkpoint {checkpoint} holds the {iteration} iterations done: "
                "continue with --resume auto once the server answers",
            )
        self.checkpoint = checkpoint


class EngineError(RuntimeError, UserError):
    """A rollout engine failed in a way the user fixes (one line through the entry script)."""


class EngineUnavailable(EngineError):
    """The server did not answer (dead, unreachable, or past its deadline after every retry)."""


class EngineRefused(EngineError):
    """The server answered a request with its refusal (a 4xx, or a 500 where that is its verdict)."""


class StaleAdapterError(EngineError):
    """A reply came from another adapter than this iteration's."""


class TokenAlignmentError(EngineError):
    """The server's prompt token ids are not the processor's."""


class BadReplyError(EngineError):
    """The server's reply cannot be what it was asked for (ids out of the vocabulary or banned, more
    tokens than ``max_tokens``, log-probs that are not log-probabilities)."""


class EngineInterrupted(EngineError, Preempted):
    """A stop signal (or the run's ``STOP`` file) ended a request while it waited for the server.

    Inside a rollout the trainer turns it into :class:`EngineStopped` after a checkpoint; raised
    anywhere else (the health check before the first iteration) it still ends the run as a stop
    does, exit 75, so that a launcher requeues the job."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, message: str) -> None:
        Exception.__init__(self, f"{message}; continue with --resume auto (from the last checkpoint, if any)")
        self.checkpoint = None


@dataclass
class EngineRow:
    """One turn to sample: its chat messages in OpenAI format (images inline), the processor's
    prompt ids, and its own sampling temperature (0: greedy) and seed."""

    messages: list[dict]
    prompt_ids: list[int]
    temperature: float
    seed: int


@dataclass
class EngineReply:
    """The server's answer to one row: the sampled ids (the stop token included when it stopped on
    one), its per-token log-probs when it returned them, the adapter that answered, the prompt ids
    it saw."""

    token_ids: list[int]
    token_log_probs: Optional[list[float]]
    model: str
    prompt_ids: Optional[list[int]] = None
    finish_reason: Optional[str] = None


@dataclass
class EngineStats:
    """What the engine did since the last :meth:`VLLMServerEngine.pop_stats` (logged per iteration)."""

    sync_seconds: float = 0.0
    generate_seconds: float = 0.0
    requests: int = 0
    retries: int = 0
    version: float = float("nan")


def adapter_name(version: int, tag: str = "policy") -> str:
    """The server-side name of the adapter of iteration ``version``: ``<tag>-v<version>``."""
    return f"{tag}-v{int(version)}"


class VLLMServerEngine:
    """A client of one vLLM OpenAI-compatible server (see the module docstring).

    Args:
        url: The server's base URL (``http://host:8000``; a trailing ``/v1`` is accepted).
        adapter_dir: Where each iteration's adapter is saved for the servers to load (a directory
            every server can read: the run directory).
        max_new_tokens, top_k, top_p, stop_ids, forbidden_ids: The policy's sampling settings.
        chat_template: What to name in a token-alignment error (the processor's template source).
        timeout_s: Total deadline of one request (connect, headers, generate, body).
        retries: Tries per request before :class:`EngineUnavailable`.
        max_concurrency: Requests in flight at once (the server batches them).
        vocab_size: The policy's vocabulary (its embedding rows); sampled ids must lie below it.
        should_stop: Polled while a request waits; something true ends it (:class:`EngineInterrupted`).
            Default: :func:`~a2c_ppo_acktr.run.preemption.stop_requested`, the training run's signal or STOP file.
        session: Names this launch in the adapters' paths (the same on every rank; default: a fresh token).
        loads_adapter: Whether this client loads each version into its server (one rank per server
            does; the others only ask for it).
    """

    def __init__(
        self,
        url: str,
        adapter_dir: str | Path,
        max_new_tokens: int,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_ids: Sequence[int] = (),
        forbidden_ids: Sequence[int] = (),
        chat_template: str = "the processor's chat template",
        timeout_s: float = 600.0,
        retries: int = 3,
        max_concurrency: int = 64,
        backoff_s: float = 1.0,
        tag: str = "policy",
        vocab_size: Optional[int] = None,
        should_stop: Optional[Callable[[], Any]] = stop_requested,
        session: Optional[str] = None,
        loads_adapter: bool = True,
    ) -> None:
        if has_redacted_credentials(url):
            raise EngineError(
                "rollout.engine_url holds *** where its password was (configs are written without it): "
                "pass the URL with its user:password again"
            )
        base = url.rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        # The password travels as basic authentication; names and messages carry the address only.
        self._auth, self._secrets = basic_auth(base), url_secrets(base)
        self.base = strip_credentials(base)
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self.should_stop = should_stop
        self.adapter_dir = Path(adapter_dir)
        self.max_new_tokens, self.top_k, self.top_p = int(max_new_tokens), int(top_k), float(top_p)
        self.stop_ids, self.forbidden_ids = [int(i) for i in stop_ids], [int(i) for i in forbidden_ids]
        self.chat_template = chat_template
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), max(1, int(retries)), float(backoff_s)
        self.max_concurrency = max(1, int(max_concurrency))
        self.version: Optional[int] = None
        self.tag = tag
        self.session = session or secrets.token_hex(4)
        self.loads_adapter = bool(loads_adapter)
        self.stats = EngineStats()

    # ------------------------------------------------------------------ HTTP
    def _request(
        self,
        method: str,
        path: str,
        payload: Optional[dict] = None,
        timeout_s: Optional[float] = None,
        text_reply: bool = False,
        retry_500: bool = True,
    ) -> Any:
        """One request with retries, each try within its own total deadline.

        Args:
            method, path, payload: The request (``payload`` sent as JSON).
            timeout_s: Each try's total deadline (default ``rollout.engine_timeout_s``).
            text_reply: Accept a 2xx body that is not JSON and return it as text (vLLM's LoRA routes
                answer ``Success: ...`` in plain text).
            retry_500: Retry an HTTP 500. Off where a 500 is the server's verdict on the request
                (vLLM 0.33 answers a LoRA load its engine refused with 500): retrying cannot help.

        Returns:
            The decoded JSON (or the text, see ``text_reply``); None for an empty body.

        Raises:
            EngineUnavailable: every try failed to get an answer.
            EngineRefused: a 4xx (a request the server refuses: retrying cannot help).
            EngineInterrupted: a stop was asked for while waiting.
        """
        url = self.base + path
        timeout = self.timeout_s if timeout_s is None else timeout_s
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            **({"Authorization": "Basic " + self._auth} if self._auth else {}),
        }
        last = ""
        try:
            for attempt in range(self.retries):
                if attempt:
                    self.stats.retries += 1
                    wait(self.backoff_s * 2 ** (attempt - 1), self.should_stop)
                req = urllib.request.Request(url, data=body, method=method, headers=headers)
                deadline = Deadline(timeout, self.should_stop)  # the whole request: connect, headers, body
                try:
                    with open_within(req, deadline) as resp:
                        raw = read_within(resp, deadline, MAX_REPLY_BYTES)
                except ReplyTooLarge:
                    raise EngineError(f"the reply from {url} is larger than {MAX_REPLY_BYTES} bytes: refused") from None
                except urllib.error.HTTPError as e:
                    detail = redact_all(error_body(e, 2000), self._secrets)[:300]
                    if (400 <= e.code < 500 and e.code != 429) or (e.code == 500 and not retry_500):
                        raise EngineRefused(
                            f"the rollout server refused {method} {path} with HTTP {e.code}: {detail}"
                        ) from None
                    last = f"HTTP {e.code}: {detail}"
                    continue
                except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                    if timed_out(e):
                        last = f"no complete reply within rollout.engine_timeout_s={timeout:g}"
                    else:
                        last = redact_all(
                            f"{type(getattr(e, 'reason', e)).__name__}: {getattr(e, 'reason', e)}", self._secrets
                        )
                    continue
                if not raw:
                    return None
                try:
                    return json.loads(raw)
                except (ValueError, RecursionError) as e:
                    if text_reply:
                        return raw.decode("utf-8", errors="replace")
                    last = f"unreadable reply ({type(e).__name__})"
        except RequestAborted as e:
            raise EngineInterrupted(
                f"{e} while waiting for {method} {path} from the rollout server {self.base}"
            ) from None
        raise EngineUnavailable(
            f"the rollout server {self.base} did not answer {method} {path} after {self.retries} tries ({last}); "
            "check that it is running (rollout.engine_url, ROLLOUT_URL) and resume with --resume auto"
        )

    def check_health(self) -> list[str]:
        """``GET /health``, ``GET /version`` and ``GET /v1/models``; returns the served model ids. Called
        before the first rollout, so that a wrong URL or an unsupported server stops the run before
        minutes of work.

        Raises:
            EngineError: the server is not a supported vLLM (:data:`~a2c_ppo_acktr.common.vllm_compat.SUPPORTED_RANGE`)
                or answers without a model list.
        """
        short = min(self.timeout_s, 30.0)
        self._request("GET", "/health", timeout_s=short)
        try:
            version = self._request("GET", "/version", timeout_s=short)
        except EngineRefused:
            version = None
        where = f"the rollout server {self.base}"
        if not isinstance(version, dict) or not isinstance(version.get("version"), str):
            raise EngineError(
                f'{where} does not answer GET /version with {{"version": ...}}: is it vLLM {SUPPORTED_RANGE}?'
            )
        try:
            check_version(version["version"], where)
        except VLLMVersionError as e:
            raise EngineError(str(e)) from None
        models = self._request("GET", "/v1/models", timeout_s=short)
        try:
            return [str(m["id"]) for m in models["data"]]
        except (TypeError, KeyError) as e:
            raise EngineError(f"{where} answered /v1/models without a model list ({type(e).__name__})") from None

    # ------------------------------------------------------------------ weights
    def adapter_path(self, version: int) -> Path:
        """Where the adapter of ``version`` is saved for the servers: fresh for every version and
        every launch (``session``), so no server reloads changed weights from a path it has seen."""
        return (self.adapter_dir / f"{adapter_name(version, self.tag)}-{self.session}").resolve()

    def publish_adapter(self, save: Callable[[Path], Any], version: int) -> Path:
        """Save the current adapter with ``save(dir)`` into :meth:`adapter_path` (rank 0's part of a
        sync: ``save`` writes the directory whole or not at all). Returns the path."""
        t0 = time.perf_counter()
        path = self.adapter_path(version)
        try:
            save(path)
        except OSError as e:
            raise EngineError(
                f"could not write the adapter for the rollout server to {path}: {e.strerror or e}; "
                "free space there and resume with --resume auto"
            ) from None
        self.stats.sync_seconds += time.perf_counter() - t0
        return path

    def load_adapter(self, version: int) -> None:
        """Load the published adapter of ``version`` into this rank's server and unload the previous
        version (the part of one rank per server). A name left loaded by an earlier launch of the
        same run (a resumption against a server that kept running) is replaced, from the new path."""
        t0 = time.perf_counter()
        name = adapter_name(version, self.tag)
        load = {"lora_name": name, "lora_path": str(self.adapter_path(version))}
        route = "/v1/load_lora_adapter"
        try:
            self._request("POST", route, load, text_reply=True, retry_500=False)
        except EngineRefused as e:
            if "already" not in str(e):
                raise EngineError(
                    f"{e}: the server needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, --enable-lora, a --max-lora-rank "
                    "of at least model.lora_r and read access to the run directory (its log says which is missing)"
                ) from None
            self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, text_reply=True)
            self._request("POST", route, load, text_reply=True, retry_500=False)
        previous = self.version
        self.use_adapter(version)
        if previous is not None and previous != version:
            old = adapter_name(previous, self.tag)
            try:
                self._request("POST", "/v1/unload_lora_adapter", {"lora_name": old}, text_reply=True)
            except EngineError as e:  # the new adapter is loaded; a leftover old one only costs server memory
                logger.warning("could not unload %s from the rollout server: %s", old, e)
        self.stats.sync_seconds += time.perf_counter() - t0

    def use_adapter(self, version: int) -> None:
        """Ask for the adapter of ``version`` from now on (every rank, once its server holds it)."""
        self.version = int(version)
        self.stats.version = float(version)

    def discard_adapters(self, keep: int) -> None:
        """Delete every adapter this run saved but the one of version ``keep`` (rank 0, once every
        server holds it), earlier launches' and half-written ones included."""
        kept = self.adapter_path(keep)
        ours = (f"{self.tag}-v", f".tmp-{self.tag}-v")
        for entry in self.adapter_dir.iterdir() if self.adapter_dir.is_dir() else ():
            if entry.name.startswith(ours) and entry.resolve() != kept:
                shutil.rmtree(entry, ignore_errors=True)

    def sync_adapter(self, save: Callable[[Path], Any], version: int) -> float:
        """All of a sync in one process (one rank, one server): publish, load, and discard the other
        versions' directories. Returns the seconds it took."""
        t0 = time.perf_counter()
        self.publish_adapter(save, version)
        self.load_adapter(version)
        self.discard_adapters(keep=version)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ sampling
    def request_body(self, row: EngineRow) -> dict[str, Any]:
        """The chat-completions request of one row (vLLM's extensions named in the module docstring)."""
        if self.version is None:
            raise EngineError("no adapter was loaded into the rollout server (sync_adapter before generate)")
        body: dict[str, Any] = {
            "model": adapter_name(self.version, self.tag),
            "messages": row.messages,
            "max_tokens": self.max_new_tokens,
            "temperature": float(row.temperature),
            "top_p": self.top_p if row.temperature > 0 else 1.0,
            "top_k": self.top_k if (self.top_k > 0 and row.temperature > 0) else -1,
            "seed": int(row.seed),
            "n": 1,
            "stop_token_ids": self.stop_ids,
            "logit_bias": {str(i): BAN_BIAS for i in self.forbidden_ids},
            "logprobs": True,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "min_p": 0.0,
            "min_tokens": 0,
        }
        return body

    def _one(self, row: EngineRow) -> EngineReply:
        data = self._request("POST", "/v1/chat/completions", self.request_body(row))
        reply = parse_reply(
            data,
            self.stop_ids,
            vocab_size=self.vocab_size,
            banned_ids=self.forbidden_ids,
            max_tokens=self.max_new_tokens,
        )
        expected = adapter_name(self.version, self.tag)  # type: ignore[arg-type]
        if reply.model != expected:
            raise StaleAdapterError(
                f"the rollout server answered with adapter {reply.model!r} where this iteration loaded {expected!r}: "
                "a reply from stale weights is refused (another trainer or a restarted server shares it?)"
            )
        if reply.prompt_ids is None:
            raise TokenAlignmentError(
                f"the rollout server {self.base} returned no prompt_token_ids: it needs return_token_ids (vLLM >= "
                "0.10.2)"
            )
        if reply.prompt_ids != list(row.prompt_ids):
            first = next(
                (i for i, (a, b) in enumerate(zip(reply.prompt_ids, row.prompt_ids)) if a != b),
                min(len(reply.prompt_ids), len(row.prompt_ids)),
            )
            raise TokenAlignmentError(
                f"the rollout server tokenised a prompt into {len(reply.prompt_ids)} ids where the processor made "
                f"{len(row.prompt_ids)} "
                f"(first difference at position {first}): serve the same checkpoint with {self.chat_template} "
                "(vllm serve --chat-template) and the processor's pixel budget (--mm-processor-kwargs "
                "min_pixels/max_pixels)"
            )
        return reply

    def generate(self, rows: Sequence[EngineRow]) -> list[EngineReply]:
        """One reply per row, in order; requests run concurrently (the server batches them)."""
        t0 = time.perf_counter()
        if len(rows) == 1 or self.max_concurrency == 1:
            replies = [self._one(r) for r in rows]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(rows))) as pool:
                replies = list(pool.map(self._one, rows))
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.requests += len(rows)
        return replies

    def pop_stats(self) -> EngineStats:
        stats, self.stats = self.stats, EngineStats(version=self.stats.version)
        return stats


def parse_reply(
    data: Any,
    stop_ids: Sequence[int] = (),
    vocab_size: Optional[int] = None,
    banned_ids: Sequence[int] = (),
    max_tokens: Optional[int] = None,
) -> EngineReply:
    """An :class:`EngineReply` from a chat-completions response with ``return_token_ids`` and
    ``logprobs`` (``return_tokens_as_token_ids``: each logprob entry names its token as
    ``token_id:N``). A reply that stopped on a listed stop token (``stop_reason``) without returning
    it gets that token appended: stopping is part of the action, as in the HF engine.

    Args:
        data: The decoded JSON response.
        stop_ids: The request's stop token ids.
        vocab_size: Sampled and prompt ids must lie in ``[0, vocab_size)`` (None: not checked).
        banned_ids: Ids the request banned (``logit_bias`` -100): a reply holding one is refused.
        max_tokens: The request's ``max_tokens``: a reply holding more ids is refused, and so is one
            that ended for length with fewer (the server's context was too short for it).

    Raises:
        EngineError: the response is not of that shape (:class:`BadReplyError`: its values are impossible).
    """
    try:
        choice = data["choices"][0]
        raw_ids = choice["token_ids"]
        model = str(data["model"])
        if not isinstance(raw_ids, list):
            raise TypeError("token_ids is not a list")
    except (TypeError, KeyError, IndexError) as e:
        raise EngineError(
            f"the rollout server's reply has no choices[0].token_ids ({type(e).__name__}): it needs return_token_ids "
            "(vLLM >= 0.10.2)"
        ) from None
    if max_tokens is not None and len(raw_ids) > max_tokens:
        raise BadReplyError(
            f"the rollout server returned {len(raw_ids)} token ids for a request of max_tokens={max_tokens}: a broken "
            "or foreign server"
        )
    ids = _checked_ids(raw_ids, "choices[0].token_ids", vocab_size)
    banned = set(banned_ids).intersection(ids)
    if banned:
        raise BadReplyError(
            f"the rollout server sampled token id(s) {sorted(banned)[:5]} that the request banned (logit_bias -100): "
            "a server that ignores logit_bias, or another model than the policy's"
        )
    prompt = data.get("prompt_token_ids") if isinstance(data, dict) else None
    prompt_ids = _checked_ids(prompt, "prompt_token_ids", vocab_size) if isinstance(prompt, list) else None
    log_probs: Optional[list[float]] = None
    content = ((choice.get("logprobs") or {}).get("content")) if isinstance(choice.get("logprobs"), dict) else None
    if isinstance(content, list) and not all(isinstance(e, dict) for e in content[: len(ids)]):
        raise BadReplyError("the rollout server's choices[0].logprobs.content holds entries that are not objects")
    if isinstance(content, list) and len(content) >= len(ids) > 0:
        named = [_token_id(entry.get("token")) for entry in content[: len(ids)]]
        if all(n is None or n == i for n, i in zip(named, ids)):
            log_probs = [
                _checked_log_prob(entry.get("logprob", math.nan), k) for k, entry in enumerate(content[: len(ids)])
            ]
    finish = choice.get("finish_reason")
    stop_reason = choice.get("stop_reason")
    if finish == "length" and max_tokens is not None and len(ids) < max_tokens:
        raise BadReplyError(
            f"the rollout server cut a reply at {len(ids)} of max_tokens={max_tokens} tokens (finish_reason length): "
            "its --max-model-len leaves less than model.max_new_tokens after the prompt; restart it with a longer "
            "--max-model-len (ROLLOUT_MAX_MODEL_LEN)"
        )
    # vLLM keeps the token it stopped on in token_ids (an EOS of the tokenizer or generation_config that
    # is not among stop_ids included, and stop_reason is then None); only a server that strips a listed
    # stop token, and names it in stop_reason, gets it back here.
    if (
        finish == "stop"
        and isinstance(stop_reason, int)
        and not isinstance(stop_reason, bool)
        and stop_reason in stop_ids
        and (not ids or ids[-1] != stop_reason)
    ):
        ids.append(int(stop_reason))
        if log_probs is not None:
            log_probs.append(math.nan)  # the server did not score the token it stopped on
    return EngineReply(
        token_ids=ids,
        token_log_probs=log_probs,
        model=model,
        prompt_ids=prompt_ids,
        finish_reason=finish if isinstance(finish, str) else None,
    )


def _checked_ids(values: list, field: str, vocab_size: Optional[int]) -> list[int]:
    """``values`` as token ids: integers (not floats, strings or booleans) in ``[0, vocab_size)``."""
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadReplyError(
                f"the rollout server's {field}[{k}] is {type(v).__name__} {str(v)[:40]!r}, not a token id"
            )
        if v < 0 or (vocab_size is not None and v >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise BadReplyError(
                f"the rollout server's {field}[{k}] = {v} is outside the policy's vocabulary {bound}: "
                "is it serving another model than rollout's policy (model.model_path)?"
            )
    return list(values)


def _checked_log_prob(value: Any, k: int) -> float:
    """A log-prob the server returned for the ``k``-th sampled token: a number <= 0 (NaN: unscored)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReplyError(
            f"the rollout server's logprob of token {k} is {type(value).__name__} {str(value)[:40]!r}, not a number"
        )
    value = float(value)
    # A sampled token has a probability in (0, 1]: its log is finite and <= 0 (up to rounding).
    if not math.isnan(value) and not (-math.inf < value <= 1e-4):
        raise BadReplyError(
            f"the rollout server's logprob of token {k} is {value}, not the log of a probability of a sampled token"
        )
    return value


def _token_id(token: Any) -> Optional[int]:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token.split(":", 1)[1])
        except ValueError:
            return None
    return None


def sequence_log_probs(replies: Sequence[EngineReply], weights: Sequence[Any]) -> list[float]:
    """Each reply's engine log-prob weighted like the policy's (``thought_prob_coef`` on thought
    tokens): ``sum_t w_t * logp_t`` over the tokens the engine scored; NaN when it returned none or
    left a weighted token unscored."""
    out = []
    for reply, w in zip(replies, weights):
        lps = reply.token_log_probs
        wl = [float(x) for x in (w.tolist() if hasattr(w, "tolist") else w)]
        if lps is None or len(lps) < len(wl) or any(math.isnan(lp) and wt != 0.0 for lp, wt in zip(lps, wl)):
            out.append(math.nan)
            continue
        out.append(sum(wt * lp for lp, wt in zip(lps, wl) if wt != 0.0))
    return out


def server_index(local_rank: int, local_world_size: int, servers: int) -> tuple[int, bool]:
    """Which of a node's ``servers`` the process of ``local_rank`` uses, and whether it is the one
    that loads each adapter into that server (the first process of its group).

    The servers split the node's processes into equal, contiguous groups, as the launcher splits
    its GPUs: server ``i`` of ``k`` GPUs runs on the GPUs of local ranks ``i*k .. i*k+k-1``.

    Raises:
        EngineError: ``servers`` does not divide ``local_world_size``.
    """
    if servers < 1 or local_world_size % servers:
        raise EngineError(
            f"rollout.engine_url lists {servers} servers for {local_world_size} processes on this node: list the "
            "node's "
            f"servers, one per process or one per group of processes (a count that divides {local_world_size})"
        )
    group = local_world_size // servers
    return local_rank // group, local_rank % group == 0


def make_engine(
    cfg: Any,
    policy: Any,
    output_dir: str | Path,
    local_rank: int = 0,
    local_world_size: int = 1,
    session: Optional[str] = None,
) -> Optional[VLLMServerEngine]:
    """The engine of ``cfg.rollout`` for ``policy`` (None for ``hf``: the policy samples itself).

    ``rollout.engine_url`` lists the servers of one node (comma-separated, the same list on every
    node); the process of ``local_rank`` among ``local_world_size`` uses the one :func:`server_index`
    picks. ``session`` must be the same on every process of the run (the adapters' paths hold it).
    """
    if cfg.rollout.engine == "hf":
        return None
    urls = [u.strip() for u in str(cfg.rollout.engine_url or "").split(",") if u.strip()]
    if not urls:
        raise EngineError(
            "rollout.engine=vllm needs rollout.engine_url (the server's http://host:port; ROLLOUT_URL in the launch "
            "scripts)"
        )
    import hashlib

    index, loads = server_index(local_rank, local_world_size, len(urls))
    # One name space per run directory: trainers sharing a server never answer with each other's adapters.
    tag = "policy-" + hashlib.sha256(str(Path(output_dir).resolve()).encode()).hexdigest()[:8]
    template = getattr(policy.processor, "chat_template", None)
    where = f"the chat template of {policy.cfg.model_path}" + (
        " (the processor's chat_template.jinja)" if template else ""
    )
    return VLLMServerEngine(
        urls[index],
        Path(output_dir) / "engine_adapters",
        max_new_tokens=policy.cfg.max_new_tokens,
        top_k=policy.cfg.top_k,
        top_p=policy.cfg.top_p,
        stop_ids=policy.eos_ids,
        forbidden_ids=[int(i) for i in policy.forbidden_ids.tolist()],
        chat_template=where,
        timeout_s=cfg.rollout.engine_timeout_s,
        retries=cfg.rollout.engine_retries,
        max_concurrency=cfg.rollout.engine_max_concurrency,
        tag=tag,
        vocab_size=policy.vocab_size,
        session=session,
        loads_adapter=loads,
    )

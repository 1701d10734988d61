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

* **Weight sync.** Before every rollout the current adapter is saved and loaded into the server
  by name, ``policy-<run>-v<iteration>`` (``/v1/load_lora_adapter``; ``<run>`` hashes the run
  directory, so trainers sharing a server keep apart); a reply whose ``model`` is another
  name was produced by a stale adapter and is refused (:class:`StaleAdapterError`).
* **Sampling.** Per row: ``temperature`` (0 = greedy), ``seed`` (drawn from torch's generator, so a
  resumed run draws the same ones), and for every row ``top_k``, ``top_p``, ``max_tokens``
  (``model.max_new_tokens``), ``stop_token_ids`` (the policy's EOS ids) and a ``logit_bias`` of -100
  on the ids the policy never samples (image and video pads). Penalties are neutral, and special
  tokens are kept, as in the HF engine.
* **Token alignment.** ``return_token_ids`` asks the server for its prompt ids; they must equal the
  processor's, or the run stops naming the chat template (:class:`TokenAlignmentError`).
* **Replies are checked before use.** Every sampled id is an integer in ``[0, vocab)`` and not one
  of the ids the request banned, there are at most ``max_tokens`` of them (one more when the stop
  token is appended here), and log-probs are numbers <= 0; anything else is a
  :class:`BadReplyError`, never a traceback or an allocation sized by the server.
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
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from a2c_ppo_acktr.common.bounded_read import Deadline, ReplyTooLarge, RequestAborted, error_body, open_within, read_within, timed_out, wait
from a2c_ppo_acktr.common.choices import ROLLOUT_ENGINES
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.redaction import basic_auth, has_redacted_credentials, redact_all, strip_credentials, url_secrets
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
            Exception.__init__(self, f"stopped by {stop} while waiting for the rollout server; checkpoint {checkpoint} holds the "
                                     f"{iteration} iterations done: continue with --resume auto")
            self.exit_code = PREEMPTED_EXIT_CODE
        else:
            Exception.__init__(self, f"{error}; checkpoint {checkpoint} holds the {iteration} iterations done: "
                                     "continue with --resume auto once the server answers")
        self.checkpoint = checkpoint


class EngineError(RuntimeError, UserError):
    """A rollout engine failed in a way the user fixes (one line through the entry script)."""


class EngineUnavailable(EngineError):
    """The server did not answer (dead, unreachable, or past its deadline after every retry)."""


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
        adapter_dir: Where each iteration's adapter is saved for the server to load (a directory
            the server can read: on one node, the run directory).
        max_new_tokens, top_k, top_p, stop_ids, forbidden_ids: The policy's sampling settings.
        chat_template: What to name in a token-alignment error (the processor's template source).
        timeout_s: Total deadline of one request (connect, headers, generate, body).
        retries: Tries per request before :class:`EngineUnavailable`.
        max_concurrency: Requests in flight at once (the server batches them).
        vocab_size: The policy's vocabulary (its embedding rows); sampled ids must lie below it.
        should_stop: Polled while a request waits; something true ends it (:class:`EngineInterrupted`).
            Default: :func:`~a2c_ppo_acktr.run.preemption.stop_requested`, the training run's signal or STOP file.
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
    ) -> None:
        if has_redacted_credentials(url):
            raise EngineError("rollout.engine_url holds *** where its password was (configs are written without it): "
                              "pass the URL with its user:password again")
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
        self.stats = EngineStats()

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, payload: Optional[dict] = None, timeout_s: Optional[float] = None) -> Any:
        """One JSON request with retries, each try within its own total deadline; :class:`EngineUnavailable`
        when every try failed to get an answer, :class:`EngineError` on a 4xx (a request the server
        refuses: retrying cannot help), :class:`EngineInterrupted` when a stop is asked for."""
        url = self.base + path
        timeout = self.timeout_s if timeout_s is None else timeout_s
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", **({"Authorization": "Basic " + self._auth} if self._auth else {})}
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
                    if 400 <= e.code < 500 and e.code != 429:
                        raise EngineError(f"the rollout server refused {method} {path} with HTTP {e.code}: {detail}") from None
                    last = f"HTTP {e.code}: {detail}"
                    continue
                except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                    if timed_out(e):
                        last = f"no complete reply within rollout.engine_timeout_s={timeout:g}"
                    else:
                        last = redact_all(f"{type(getattr(e, 'reason', e)).__name__}: {getattr(e, 'reason', e)}", self._secrets)
                    continue
                if not raw:
                    return None
                try:
                    return json.loads(raw)
                except (ValueError, RecursionError) as e:
                    last = f"unreadable reply ({type(e).__name__})"
        except RequestAborted as e:
            raise EngineInterrupted(f"{e} while waiting for {method} {path} from the rollout server {self.base}") from None
        raise EngineUnavailable(
            f"the rollout server {self.base} did not answer {method} {path} after {self.retries} tries ({last}); "
            "check that it is running (rollout.engine_url, ROLLOUT_URL) and resume with --resume auto"
        )

    def check_health(self) -> list[str]:
        """``GET /health`` then ``GET /v1/models``; returns the served model ids. Called before the
        first rollout, so that a wrong URL stops the run before minutes of work."""
        self._request("GET", "/health", timeout_s=min(self.timeout_s, 30.0))
        models = self._request("GET", "/v1/models", timeout_s=min(self.timeout_s, 30.0))
        try:
            return [str(m["id"]) for m in models["data"]]
        except (TypeError, KeyError) as e:
            raise EngineError(f"the rollout server {self.base} answered /v1/models without a model list ({type(e).__name__})") from None

    # ------------------------------------------------------------------ weights
    def sync_adapter(self, save: Callable[[Path], Any], version: int) -> float:
        """Save the current adapter with ``save(dir)`` and load it into the server as
        :func:`adapter_name` ``(version)``; the previous version is unloaded. Returns the seconds it took."""
        t0 = time.perf_counter()
        name = adapter_name(version, self.tag)
        path = (self.adapter_dir / name).resolve()
        save(path)
        load = {"lora_name": name, "lora_path": str(path)}
        try:
            self._request("POST", "/v1/load_lora_adapter", load)
        except EngineError as e:
            if "already" not in str(e):
                raise
            # A resumed run loads its first version again (the stopped run had loaded it): replace it.
            self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
            self._request("POST", "/v1/load_lora_adapter", load)
        previous, self.version = self.version, int(version)
        if previous is not None and previous != version:
            try:
                self._request("POST", "/v1/unload_lora_adapter", {"lora_name": adapter_name(previous, self.tag)})
            except EngineError as e:  # the new adapter is loaded; a leftover old one only costs server memory
                logger.warning("could not unload %s from the rollout server: %s", adapter_name(previous, self.tag), e)
            shutil.rmtree(self.adapter_dir / adapter_name(previous, self.tag), ignore_errors=True)
        seconds = time.perf_counter() - t0
        self.stats.sync_seconds += seconds
        self.stats.version = float(version)
        return seconds

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
            "min_tokens": 0,
        }
        return body

    def _one(self, row: EngineRow) -> EngineReply:
        data = self._request("POST", "/v1/chat/completions", self.request_body(row))
        reply = parse_reply(data, self.stop_ids, vocab_size=self.vocab_size, banned_ids=self.forbidden_ids, max_tokens=self.max_new_tokens)
        expected = adapter_name(self.version, self.tag)  # type: ignore[arg-type]
        if reply.model != expected:
            raise StaleAdapterError(
                f"the rollout server answered with adapter {reply.model!r} where this iteration loaded {expected!r}: "
                "a reply from stale weights is refused (another trainer or a restarted server shares it?)"
            )
        if reply.prompt_ids is None:
            raise TokenAlignmentError(
                f"the rollout server {self.base} returned no prompt_token_ids: it needs return_token_ids (vLLM >= 0.10.2)"
            )
        if reply.prompt_ids != list(row.prompt_ids):
            first = next((i for i, (a, b) in enumerate(zip(reply.prompt_ids, row.prompt_ids)) if a != b), min(len(reply.prompt_ids), len(row.prompt_ids)))
            raise TokenAlignmentError(
                f"the rollout server tokenised a prompt into {len(reply.prompt_ids)} ids where the processor made {len(row.prompt_ids)} "
                f"(first difference at position {first}): serve the same checkpoint with {self.chat_template} "
                "(vllm serve --chat-template) and the processor's pixel budget (--mm-processor-kwargs min_pixels/max_pixels)"
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
    ``token_id:N``). A reply that stopped on a stop token it did not list gets that token appended:
    stopping is part of the action, as in the HF engine.

    Args:
        data: The decoded JSON response.
        stop_ids: The request's stop token ids.
        vocab_size: Sampled and prompt ids must lie in ``[0, vocab_size)`` (None: not checked).
        banned_ids: Ids the request banned (``logit_bias`` -100): a reply holding one is refused.
        max_tokens: The request's ``max_tokens``: a reply holding more ids is refused.

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
        raise EngineError(f"the rollout server's reply has no choices[0].token_ids ({type(e).__name__}): it needs return_token_ids (vLLM >= 0.10.2)") from None
    if max_tokens is not None and len(raw_ids) > max_tokens:
        raise BadReplyError(f"the rollout server returned {len(raw_ids)} token ids for a request of max_tokens={max_tokens}: a broken or foreign server")
    ids = _checked_ids(raw_ids, "choices[0].token_ids", vocab_size)
    banned = set(banned_ids).intersection(ids)
    if banned:
        raise BadReplyError(f"the rollout server sampled token id(s) {sorted(banned)[:5]} that the request banned (logit_bias -100): "
                            "a server that ignores logit_bias, or another model than the policy's")
    prompt = data.get("prompt_token_ids") if isinstance(data, dict) else None
    prompt_ids = _checked_ids(prompt, "prompt_token_ids", vocab_size) if isinstance(prompt, list) else None
    log_probs: Optional[list[float]] = None
    content = ((choice.get("logprobs") or {}).get("content")) if isinstance(choice.get("logprobs"), dict) else None
    if isinstance(content, list) and not all(isinstance(e, dict) for e in content[: len(ids)]):
        raise BadReplyError("the rollout server's choices[0].logprobs.content holds entries that are not objects")
    if isinstance(content, list) and len(content) >= len(ids) > 0:
        named = [_token_id(entry.get("token")) for entry in content[: len(ids)]]
        if all(n is None or n == i for n, i in zip(named, ids)):
            log_probs = [_checked_log_prob(entry.get("logprob", math.nan), k) for k, entry in enumerate(content[: len(ids)])]
    finish = choice.get("finish_reason")
    stop_reason = choice.get("stop_reason")
    if finish == "stop" and stop_ids and (not ids or ids[-1] not in stop_ids):
        stop = int(stop_reason) if isinstance(stop_reason, int) and stop_reason in stop_ids else int(stop_ids[0])
        ids.append(stop)
        if log_probs is not None:
            log_probs.append(math.nan)  # the server did not score the token it stopped on
    return EngineReply(token_ids=ids, token_log_probs=log_probs, model=model, prompt_ids=prompt_ids,
                       finish_reason=finish if isinstance(finish, str) else None)


def _checked_ids(values: list, field: str, vocab_size: Optional[int]) -> list[int]:
    """``values`` as token ids: integers (not floats, strings or booleans) in ``[0, vocab_size)``."""
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadReplyError(f"the rollout server's {field}[{k}] is {type(v).__name__} {str(v)[:40]!r}, not a token id")
        if v < 0 or (vocab_size is not None and v >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise BadReplyError(f"the rollout server's {field}[{k}] = {v} is outside the policy's vocabulary {bound}: "
                                "is it serving another model than rollout's policy (model.model_path)?")
    return list(values)


def _checked_log_prob(value: Any, k: int) -> float:
    """A log-prob the server returned for the ``k``-th sampled token: a number <= 0 (NaN: unscored)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReplyError(f"the rollout server's logprob of token {k} is {type(value).__name__} {str(value)[:40]!r}, not a number")
    value = float(value)
    # A sampled token has a probability in (0, 1]: its log is finite and <= 0 (up to rounding).
    if not math.isnan(value) and not (-math.inf < value <= 1e-4):
        raise BadReplyError(f"the rollout server's logprob of token {k} is {value}, not the log of a probability of a sampled token")
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


def make_engine(cfg: Any, policy: Any, output_dir: str | Path, rank: int = 0) -> Optional[VLLMServerEngine]:
    """The engine of ``cfg.rollout`` for ``policy`` (None for ``hf``: the policy samples itself).
    With several processes each rank uses ``rollout.engine_url``'s comma-separated entry
    ``rank % count`` and its own adapter directory."""
    if cfg.rollout.engine == "hf":
        return None
    urls = [u.strip() for u in str(cfg.rollout.engine_url or "").split(",") if u.strip()]
    if not urls:
        raise EngineError("rollout.engine=vllm needs rollout.engine_url (the server's http://host:port; ROLLOUT_URL in the launch scripts)")
    import hashlib

    # One name space per run directory and rank: trainers sharing a server never answer with each other's adapters.
    tag = "policy-" + hashlib.sha256(str(Path(output_dir).resolve()).encode()).hexdigest()[:8] + (f"-r{rank}" if rank else "")
    template = getattr(policy.processor, "chat_template", None)
    where = f"the chat template of {policy.cfg.model_path}" + (" (the processor's chat_template.jinja)" if template else "")
    return VLLMServerEngine(
        urls[rank % len(urls)],
        Path(output_dir) / "engine_adapters" / f"rank{rank}",
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
    )

"""Teachers: given an observation, the text the policy should have written.

Three teachers share one interface, chosen by name from :data:`TEACHERS`:

- ``oracle``: reads the environment's privileged state (scene, question, pose), turns toward the
  object the question is about, then answers with the ground truth and a short truthful reason
  computed from the geometry. No model; it also checks the environment's ground truth end to end.
- ``hf``: any local HF VLM loaded through :func:`a2c_ppo_acktr.policy.loading.load_vlm`, batched greedy
  generation on exactly the prompts the policy sees.
- ``openai``: any OpenAI-compatible chat-completions server (vLLM, SGLang, hosted). Images go
  inline as base64 PNG data URLs; the API key is read from an environment variable only and is
  never logged or written. Bounded concurrency, timeouts, retries with exponential backoff.

Every teacher returns :class:`TeacherReply` objects; a reply whose ``error`` is set is a failed
turn (the labelling run records it and goes on). One failure is not a turn's but the setup's: a
local teacher that runs out of memory raises :class:`TeacherOutOfMemoryError` (or, with
``label.oom_retry_smaller``, first retries in smaller batches), because recording every turn of a
model that does not fit as failed would silently produce a dataset of failures.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from a2c_ppo_acktr.common import choices
from a2c_ppo_acktr.config.arguments import ConfigError, LabelConfig, ModelConfig
from a2c_ppo_acktr.common.choices import check_registry
from a2c_ppo_acktr.envs.protocol import OracleStyle
from a2c_ppo_acktr.common.bounded_read import (
    Deadline,
    ReplyTooLarge,
    ReplyTooSlow,
    error_body,
    open_within,
    read_within,
    timed_out,
)
from a2c_ppo_acktr.common.redaction import (
    basic_auth,
    has_redacted_credentials,
    key_env_problem,
    redact_all,
    strip_credentials,
    url_secrets,
)
from a2c_ppo_acktr.common.prompts import build_messages, openai_messages, render_prompt

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherReply:
    """One teacher output.

    Attributes:
        text: The response text (``""`` when the teacher failed).
        error: None on success, else why the teacher failed (after its retries).
        attempts: How many requests/generations were made.
    """

    text: str
    error: Optional[str] = None
    attempts: int = 1


class Teacher(ABC):
    """Maps a batch of observations (and, for privileged teachers, their envs) to responses."""

    name: str = "teacher"

    @abstractmethod
    def generate(self, observations: Sequence[dict], envs: Sequence[Any] | None = None) -> list[TeacherReply]:
        """One reply per observation, in order.

        Args:
            observations: ``{"images": [uint8 HxWx3, ...], "text": str}`` per env.
            envs: The envs the observations came from (privileged teachers read their
                ``unwrapped.scene/question/pose``); model teachers ignore them.
        """

    def act(self, observations: Sequence[dict], envs: Sequence[Any] | None = None) -> list[str]:
        """The response texts (``""`` for a failed turn); see :meth:`generate`."""
        return [r.text for r in self.generate(observations, envs)]

    def describe(self) -> dict:
        """What identifies this teacher in the labelled data (no secrets)."""
        return {"teacher": self.name}


class OracleTeacher(Teacher):
    """Privileged teacher: the env's own oracle reply (:mod:`a2c_ppo_acktr.envs.oracle`): a game's
    solver; in VSI, face the question's first object, then answer with the ground truth."""

    name = "oracle"

    def __init__(self, max_moves: int = 1, face_tolerance_deg: float = 20.0, thoughts: str = "full") -> None:
        """
        Args:
            max_moves: Turns toward the target before answering (0 answers at once).
            face_tolerance_deg: The target counts as faced when within this angle of the view axis.
            thoughts: ``"full"`` (a reason with the scene's names and numbers) or ``"brief"`` (one
                fixed sentence per question type); see :class:`~a2c_ppo_acktr.envs.protocol.OracleStyle`.
        """
        self.style = OracleStyle(thoughts=thoughts, max_moves=max_moves, face_tolerance_deg=face_tolerance_deg)

    @property
    def thoughts(self) -> str:
        return self.style.thoughts

    def describe(self) -> dict:
        return {
            "teacher": self.name,
            "max_moves": self.style.max_moves,
            "face_tolerance_deg": self.style.face_tolerance_deg,
            "thoughts": self.style.thoughts,
        }

    def generate(self, observations: Sequence[dict], envs: Sequence[Any] | None = None) -> list[TeacherReply]:
        if envs is None or len(envs) != len(observations):
            raise ValueError(
                "the oracle teacher reads the privileged state of each env: pass envs (one per observation) "
                f"to generate(); got {None if envs is None else len(envs)} envs for {len(observations)} observations"
            )
        return [TeacherReply(self.respond(env)) for env in envs]

    def respond(self, env: Any) -> str:
        """The oracle's response for one env's current state."""
        return env.unwrapped.oracle_reply(self.style)


# ---------------------------------------------------------------------------------------------
# Local HF model
# ---------------------------------------------------------------------------------------------
def _pad_token_id(processor: Any) -> int:
    tok = getattr(processor, "tokenizer", processor)
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    if tok.eos_token_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token before generation")
    return tok.eos_token_id


def greedy_generate(
    model: Any, processor: Any, observations: Sequence[dict], max_new_tokens: int, blind: bool = False
) -> list[str]:
    """Batched greedy decoding on the policy's prompts (left padding).

    Args:
        model: A HF VLM (optionally a PEFT model).
        processor: Its processor.
        observations: Env observations.
        max_new_tokens: Generation budget per reply.
        blind: Build text-only prompts (see :func:`a2c_ppo_acktr.common.prompts.build_messages`).

    Returns:
        The decoded new text per observation, special tokens removed.
    """
    import torch
    from transformers import GenerationConfig

    if not observations:
        return []
    texts = [render_prompt(processor, build_messages(o, blind=blind)) for o in observations]
    images = [img for o in observations for img in o["images"]] if not blind else []
    inputs = processor(text=texts, images=images or None, padding=True, padding_side="left", return_tensors="pt")
    device = next(model.parameters()).device
    inputs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
    # The policy's own list (vision placeholders, other specials, unused rows), so greedy replies
    # here and from VLMPolicy.act(greedy=True) agree.
    from a2c_ppo_acktr.policy.loading import forbidden_token_ids

    bad = forbidden_token_ids(processor, vocab_size=model.config.get_text_config().vocab_size)
    # Every decoding knob explicit: a checkpoint's generation_config.json (Qwen ships
    # repetition_penalty=1.05) would otherwise change the argmax path.
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=_pad_token_id(processor),
        bad_words_ids=[[i] for i in bad] if bad else None,
    )
    with torch.no_grad():
        out = model.generate(**inputs, generation_config=gen)
    new = out[:, inputs["input_ids"].shape[1] :]
    tok = getattr(processor, "tokenizer", processor)
    return tok.batch_decode(new, skip_special_tokens=True)


class TeacherOutOfMemoryError(ConfigError):
    """The local teacher does not fit in memory at the batch size it was given.

    A :class:`~a2c_ppo_acktr.config.arguments.ConfigError` because the fix is a setting (``label.batch_size``,
    ``label.model_path``, ``label.oom_retry_smaller``, or an ``openai`` teacher served on more GPUs),
    so the entry scripts report it as one line instead of a traceback.
    """


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an accelerator (or allocator) out-of-memory error.

    ``torch.OutOfMemoryError`` (alias ``torch.cuda.OutOfMemoryError``) covers CUDA's caching
    allocator; other backends and kernels (cuBLAS, MPS, flash-attn workspaces) raise a plain
    ``RuntimeError`` whose message says "out of memory".
    """
    import torch

    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if t is not None
    )
    if oom_types and isinstance(error, oom_types):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _free_accelerator_memory() -> None:
    import gc

    import torch

    gc.collect()  # drop the failed call's tensors before asking the allocator to release its cache
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class HFTeacher(Teacher):
    """A local HF VLM (through the shared loader), batched greedy generation."""

    name = "hf"

    def __init__(
        self, model_cfg: ModelConfig, max_new_tokens: int, loaded: Any = None, oom_retry_smaller: bool = False
    ) -> None:
        """
        Args:
            model_cfg: Which model to load and how (``model_path``, ``dtype``, ``device``...).
            max_new_tokens: Generation budget per reply.
            loaded: An already loaded ``LoadedVLM`` (tests); None loads ``model_cfg``.
            oom_retry_smaller: On out-of-memory, retry the batch in halves down to one observation
                (and cap later batches at the size that fit) instead of raising at once.
        """
        if loaded is None:
            from a2c_ppo_acktr.policy.loading import load_vlm

            loaded = load_vlm(model_cfg)
        self.model = loaded.model
        self.processor = loaded.processor
        self.model_path = str(getattr(loaded, "path", model_cfg.model_path))
        self.max_new_tokens = max_new_tokens
        self.oom_retry_smaller = oom_retry_smaller
        # Largest batch known to fit after an out-of-memory retry; None until one happened. Later
        # calls start at this size instead of failing at the full size again every turn.
        self.fit_batch_size: Optional[int] = None
        self.model.eval()

    def describe(self) -> dict:
        # oom_retry_smaller is left out: greedy replies do not depend on how a batch is split, so a
        # labelling run may resume with it switched on.
        return {"teacher": self.name, "model_path": self.model_path, "max_new_tokens": self.max_new_tokens}

    def generate(self, observations: Sequence[dict], envs: Sequence[Any] | None = None) -> list[TeacherReply]:
        """One greedy reply per observation.

        Raises:
            TeacherOutOfMemoryError: The model ran out of memory (with ``oom_retry_smaller``: even on
                a single observation). Nothing is returned for the batch, so no turn is recorded as failed.
        """
        observations = list(observations)
        try:
            size = self.fit_batch_size or len(observations) or 1
            texts = [
                t for i in range(0, len(observations), size) for t in self._generate_fitting(observations[i : i + size])
            ]
        except (
            RuntimeError
        ) as e:  # any other failure on one batch (OOM is a ConfigError): record its turns as failed, go on
            logger.error("hf teacher failed on a batch of %d observations: %s", len(observations), e)
            return [TeacherReply("", error=f"generation failed: {e}") for _ in observations]
        return [TeacherReply(t) for t in texts]

    def _generate_fitting(self, observations: list[dict]) -> list[str]:
        """Greedy replies for ``observations``; on out-of-memory split in halves or raise (see ``generate``)."""
        n = len(observations)
        try:
            return greedy_generate(self.model, self.processor, observations, self.max_new_tokens)
        except RuntimeError as e:
            if not is_out_of_memory(e):
                raise
            if not self.oom_retry_smaller or n <= 1:
                raise TeacherOutOfMemoryError(self._oom_message(n, e)) from e
            cause = _first_line(e)
        # Retried outside the except block: the traceback holds the failed call's frames (and
        # their tensors) until the block is left.
        _free_accelerator_memory()
        half = (n + 1) // 2
        logger.warning(
            "hf teacher out of memory on a batch of %d observations (%s); retrying in batches of %d", n, cause, half
        )
        texts = self._generate_fitting(observations[:half]) + self._generate_fitting(observations[half:])
        self.fit_batch_size = min(self.fit_batch_size or half, half)
        return texts

    def _oom_message(self, n: int, error: BaseException) -> str:
        what = (
            f"the hf teacher {self.model_path!r} ran out of memory generating replies for {n} observation(s) "
            f"({_first_line(error)})"
        )
        if n <= 1:
            return (
                f"{what}; not even one observation fits. Use a smaller teacher (label.model_path), fewer or smaller "
                "frames (env.num_sweep_frames, model.max_pixels), a lower label.max_new_tokens, or serve the model on "
                "more GPUs (e.g. vLLM with tensor parallelism) and label with label.teacher=openai"
            )
        return (
            f"{what}. Lower label.batch_size below {n}, set label.oom_retry_smaller=true to retry in smaller "
            "batches automatically, use a smaller teacher (label.model_path), or serve the model on more GPUs "
            "(e.g. vLLM with tensor parallelism) and label with label.teacher=openai"
        )


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible server
# ---------------------------------------------------------------------------------------------
class _Retryable(Exception):
    """A failure worth retrying (timeout, connection error, 429, 5xx, unreadable body)."""


class _Fatal(Exception):
    """A failure that retrying cannot fix (4xx other than 429)."""


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}"


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are never followed: the request carries the API key, and urllib would send it to
    whatever origin a 30x names (and turn the POST into a GET without its body)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        raise _Fatal(
            f"HTTP {code} from {strip_credentials(req.full_url)} redirects to {_origin(newurl)}; redirects are not "
            "followed (the request "
            "carries the API key): set label.base_url to the server's final address"
        )


# How much of an error body is read before it is redacted and cut to ERROR_BODY_CHARS.
_MAX_ERROR_BODY = 65536
ERROR_BODY_CHARS = 200


class OpenAITeacher(Teacher):
    """An OpenAI-compatible ``/chat/completions`` endpoint, standard library HTTP only.

    The key (``api_key_env``) goes only to ``base_url``'s origin: redirects are refused, and every
    error text is redacted of the key before it is logged, returned or written to a label file (a
    server may echo request headers in an error body).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_concurrency: int = 8,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_tokens: int = 256,
        temperature: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """
        Args:
            base_url: Server root including the API version, e.g. ``http://host:8000/v1``.
            model: Served model name.
            api_key_env: Environment variable holding the key; unset or empty sends no
                ``Authorization`` header (local vLLM/SGLang servers need none).
            timeout_s: Total deadline of one attempt: connect, headers, body, an error's body.
            max_concurrency: Requests in flight at once.
            retries: Extra attempts after the first on retryable failures.
            backoff_s: Delay before the first retry; doubles each retry.
            max_tokens: Completion budget.
            temperature: Sampling temperature sent to the server (0 = greedy).
            sleep: Injected for tests.

        Raises:
            ConfigError: ``api_key_env`` holds a key rather than a variable's name (the key is not
                repeated), or ``base_url`` holds the ``***`` a written config has for a password.
        """
        problem = key_env_problem(api_key_env)
        if problem:
            raise ConfigError(
                f"label.api_key_env {problem}; pass the NAME of the environment variable that holds the key "
                "(export OPENAI_API_KEY=...; --label.api_key_env OPENAI_API_KEY), never the key itself"
            )
        if has_redacted_credentials(base_url):
            raise ConfigError(
                "label.base_url holds *** where its password was (configs are written without it): "
                "pass the URL with its user:password again"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.display_url = strip_credentials(self.url)  # what messages and label files name
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._sleep = sleep

    def describe(self) -> dict:
        # The key's variable name is fine to record; its value never is.
        return {
            "teacher": self.name,
            "base_url": self.display_url,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    def _secrets(self) -> list[str]:
        """What no message, log line or label may contain: the key, and base_url's password and the
        basic-auth value made of it."""
        return [s for s in (os.environ.get(self.api_key_env, ""), *url_secrets(self.url)) if s]

    def generate(self, observations: Sequence[dict], envs: Sequence[Any] | None = None) -> list[TeacherReply]:
        if not observations:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(observations))) as pool:
            return list(pool.map(self._one, observations))

    def _one(self, observation: dict) -> TeacherReply:
        body = json.dumps(
            {
                "model": self.model,
                "messages": openai_messages(observation),
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode("utf-8")
        error = "no attempt made"
        secrets = self._secrets()
        for attempt in range(1, self.retries + 2):
            try:
                # A reply may echo the request's headers too: it is redacted like an error.
                return TeacherReply(redact_all(self._post(body), secrets), attempts=attempt)
            except _Retryable as e:
                error = redact_all(str(e), secrets)
            except _Fatal as e:
                error = redact_all(str(e), secrets)
                logger.warning("openai teacher: request failed without retry: %s", error)
                return TeacherReply("", error=error, attempts=attempt)
            if attempt <= self.retries:
                delay = self.backoff_s * (2 ** (attempt - 1))
                logger.warning("openai teacher: attempt %d failed (%s); retrying in %.2fs", attempt, error, delay)
                self._sleep(delay)
        logger.warning("openai teacher: giving up after %d attempts: %s", self.retries + 1, error)
        return TeacherReply("", error=error, attempts=self.retries + 1)

    def _post(self, body: bytes) -> str:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        elif basic_auth(self.url):  # user:password in base_url: HTTP basic authentication
            headers["Authorization"] = "Basic " + basic_auth(self.url)
        request = urllib.request.Request(self.display_url, data=body, headers=headers, method="POST")
        # One deadline for the whole attempt: connect, status line and headers, body, and an error's body.
        deadline = Deadline(self.timeout_s)
        try:
            with open_within(request, deadline, _RefuseRedirects()) as resp:
                raw = _read_bounded(resp, deadline, self.display_url)
        except urllib.error.HTTPError as e:
            # Messages carry the status and a slice of the body only (redacted, then cut), never the request headers.
            detail = self._cut(error_body(e, _MAX_ERROR_BODY))
            if e.code == 429 or e.code >= 500:
                raise _Retryable(f"HTTP {e.code} from {self.display_url}: {detail}") from None
            raise _Fatal(
                f"HTTP {e.code} from {self.display_url}: {detail} (not retried; check label.model and label.base_url)"
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # OSError covers timeouts and resets
            if timed_out(e):
                raise _Retryable(
                    f"the reply from {self.display_url} took longer than label.timeout_s={self.timeout_s:g}"
                ) from None
            reason = getattr(e, "reason", e)
            raise _Retryable(f"cannot reach {self.display_url}: {type(reason).__name__}: {reason}") from None
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
            raw_text = raw[:_MAX_ERROR_BODY].decode("utf-8", "replace")
            raise _Retryable(
                f"unreadable response from {self.display_url} ({type(e).__name__}): {self._cut(raw_text)!r}"
            ) from None
        if isinstance(content, list):  # some servers return content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise _Retryable(f"response content from {self.display_url} is not text: {type(content).__name__}")
        return content

    def _cut(self, text: str) -> str:
        """Redact first, then cut: a cut made first could leave a key's prefix that no longer matches it whole."""
        return redact_all(text, self._secrets())[:ERROR_BODY_CHARS]


# A chat reply of max_tokens is kilobytes; megabytes are a misbehaving server (stored per turn, per episode).
MAX_REPLY_BYTES = 4 * 1024 * 1024


def _read_bounded(resp: Any, deadline: Deadline, url: str) -> bytes:
    """The response body within ``deadline`` (the whole request's, not each read's) and :data:`MAX_REPLY_BYTES`."""
    try:
        return read_within(resp, deadline, MAX_REPLY_BYTES)
    except ReplyTooSlow:
        raise _Retryable(f"the reply from {url} took longer than label.timeout_s={deadline.seconds:g}") from None
    except ReplyTooLarge:
        raise _Fatal(f"the reply from {url} is larger than {MAX_REPLY_BYTES} bytes: refused (not retried)") from None


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
def _make_oracle(label: LabelConfig, model: ModelConfig) -> Teacher:
    return OracleTeacher(
        max_moves=label.oracle_max_moves,
        face_tolerance_deg=label.oracle_face_tolerance_deg,
        thoughts=label.oracle_thoughts,
    )


def _make_hf(label: LabelConfig, model: ModelConfig) -> Teacher:
    import dataclasses

    cfg = dataclasses.replace(model, model_path=label.model_path or model.model_path)
    return HFTeacher(cfg, max_new_tokens=label.max_new_tokens, oom_retry_smaller=label.oom_retry_smaller)


def _make_openai(label: LabelConfig, model: ModelConfig) -> Teacher:
    if not label.model:
        raise ValueError("label.teacher=openai needs label.model (the served model name)")
    return OpenAITeacher(
        base_url=label.base_url,
        model=label.model,
        api_key_env=label.api_key_env,
        timeout_s=label.timeout_s,
        max_concurrency=label.max_concurrency,
        retries=label.retries,
        backoff_s=label.backoff_s,
        max_tokens=label.max_new_tokens,
        temperature=label.request_temperature,
    )


TEACHERS: dict[str, Callable[[LabelConfig, ModelConfig], Teacher]] = {
    "oracle": _make_oracle,
    "hf": _make_hf,
    "openai": _make_openai,
}
check_registry("label.teacher", TEACHERS, choices.TEACHERS)


def make_teacher(label: LabelConfig, model: ModelConfig) -> Teacher:
    """The teacher named by ``label.teacher``.

    Raises:
        ValueError: For an unknown name (the message lists the known ones).
    """
    if label.teacher not in TEACHERS:
        raise ValueError(f"unknown teacher {label.teacher!r}; known teachers: {sorted(TEACHERS)}")
    return TEACHERS[label.teacher](label, model)

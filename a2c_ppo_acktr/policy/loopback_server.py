"""A loopback stand-in for a vLLM OpenAI-compatible server, backed by a Hugging Face model on the CPU.

It speaks the endpoints :class:`~a2c_ppo_acktr.policy.rollout_engine.VLLMServerEngine` uses, with vLLM's
request and reply fields, and refuses what vLLM refuses, the way the fake ``srun`` stands in for
SLURM: the engine's contract (per-row temperature, adapters loaded by name, stale replies refused,
token ids in and out, a server that dies) and the launcher's flags are tested through it on machines
without a GPU. What only a real vLLM shows (its kernels, its chat-template handling of a real
checkpoint, its memory) is ``scripts/gpu_smoke.sh``'s.

* ``GET /health``, ``GET /version`` (``{"version": ...}``), ``GET /v1/models`` (the base model and
  every loaded adapter);
* ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (``lora_name``, ``lora_path``: a
  directory :meth:`VLMPolicy.save_pretrained <a2c_ppo_acktr.policy.model.VLMPolicy.save_pretrained>`
  wrote), answered in plain text as vLLM does; a name already loaded is a 400, an unknown one a
  404, an adapter whose rank exceeds ``--max-lora-rank`` a 500 (0.33's status for a load its engine
  refuses);
* ``POST /v1/chat/completions``: OpenAI messages with ``image_url`` data URLs; the server applies
  the processor's chat template to them itself, samples with ``temperature`` (0: greedy; above 2
  refused with 400, as 0.33 does), ``top_k``, ``top_p``, ``seed``, ``max_tokens``,
  ``stop_token_ids`` and ``logit_bias``, and answers ``prompt_token_ids``, ``choices[0].token_ids``
  (through the stop token, which ``stop_reason`` names), ``logprobs.content`` (``token_id:N``, the
  processed distribution's log-probs) and ``model`` (the adapter that answered). A prompt plus
  ``max_tokens`` longer than ``--max-model-len`` is refused with 400, as vLLM 0.10 and 0.11 do
  (0.33 shortens ``max_tokens`` instead, which the engine refuses when it reads the cut reply).

Adapters per batch: vLLM batches requests of at most ``--max-loras`` adapters (default 1), so
requests that name other adapters wait for the batch to change; here requests are served one at a
time (a lock) and :attr:`LoopbackServer.adapter_swaps` counts each request whose adapter was not
among the last ``max_loras`` used, the batch changes such a server would make. Each request samples
from its own seed without touching the process's random state, so a trainer in the same process
draws exactly what it would alone.

    python -m a2c_ppo_acktr.policy.loopback_server outputs/quickstart/model --port 8000 [--preset cpu-demo]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)


def _image_from_data_url(url: str) -> np.ndarray:
    from PIL import Image

    if not url.startswith("data:image/") or ";base64," not in url:
        raise ValueError("only data:image/...;base64 URLs are served here")
    raw = base64.b64decode(url.split(";base64,", 1)[1])
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


def hf_messages(messages: list[dict]) -> tuple[list[dict], list[np.ndarray]]:
    """OpenAI chat messages -> the processor's messages (``{"type": "image"}`` parts) and the images
    in order, as a server applying the chat template itself sees them."""
    out, images = [], []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        else:
            parts = []
            for part in content or []:
                if part.get("type") == "image_url":
                    images.append(_image_from_data_url(part["image_url"]["url"]))
                    parts.append({"type": "image"})
                else:
                    parts.append({"type": "text", "text": part.get("text", "")})
        out.append({"role": msg["role"], "content": parts})
    return out, images


class LoopbackServer:
    """The server (see the module docstring) on ``host:port`` (0: a free port), in a thread.

    Args:
        model_cfg: A :class:`~a2c_ppo_acktr.config.arguments.ModelConfig` whose LoRA settings match the
            adapters it will load.
        served_name: The base model's name in ``/v1/models``.
        max_lora_rank: vLLM's ``--max-lora-rank`` (one of 0.33's values; default 16, vLLM's).
        max_model_len: vLLM's ``--max-model-len`` (None: unlimited).
        max_loras: vLLM's ``--max-loras``, adapters in one batch (default 1, vLLM's).
        version: What ``GET /version`` answers.

    Raises:
        ValueError: ``max_lora_rank`` is not a value vLLM accepts, or ``max_loras`` < 1.
    """

    def __init__(
        self,
        model_cfg: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        served_name: str = "base",
        max_lora_rank: int = 16,
        max_model_len: Optional[int] = None,
        max_loras: int = 1,
        version: str = "0.33.0",
    ) -> None:
        from a2c_ppo_acktr.common.vllm_compat import LORA_RANKS
        from a2c_ppo_acktr.policy.model import VLMPolicy

        if max_lora_rank not in LORA_RANKS:
            raise ValueError(
                f"--max-lora-rank {max_lora_rank}: invalid choice (choose from {', '.join(map(str, LORA_RANKS))})"
            )
        if max_loras < 1:
            raise ValueError(f"--max-loras {max_loras} must be >= 1")
        self.policy = VLMPolicy(model_cfg)
        self.policy.eval()
        self.served_name = served_name
        self.max_lora_rank, self.max_model_len, self.max_loras, self.version = (
            int(max_lora_rank),
            max_model_len,
            int(max_loras),
            version,
        )
        self.adapters: dict[str, str] = {}  # name -> path
        self.active: Optional[str] = None  # the adapter whose weights are in the model now
        self.batch_adapters: list[
            str
        ] = []  # the adapters the current batch holds, most recent last (at most max_loras)
        self.adapter_swaps = 0  # requests that could not join the current batch's adapters
        self.loads: list[str] = []  # every adapter name loaded, in order
        self.requests: list[dict[str, Any]] = []  # every chat request's sampling fields (no messages)
        self.answer_as: Optional[str] = None  # tests: answer under this adapter name instead of the one asked
        self.fail_after: Optional[int] = None  # tests: answer HTTP 503 to every chat request past this many
        self.replies: list[list[int]] = []  # the token ids of every reply, in order
        self.lock = threading.Lock()
        handler = _make_handler(self)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="loopback-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LoopbackServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and close the socket (a dead server, to its clients)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "LoopbackServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ endpoints
    def models(self) -> dict:
        ids = [self.served_name, *self.adapters]
        return {
            "object": "list",
            "data": [{"id": i, "object": "model", "max_model_len": self.max_model_len} for i in ids],
        }

    def version_info(self) -> dict:
        return {"version": self.version}

    def load_adapter(self, body: dict) -> str:
        name, path = str(body["lora_name"]), str(body["lora_path"])
        with self.lock:
            if name in self.adapters:
                raise _HTTPError(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                    "set 'load_inplace' to True.",
                )
            config = Path(path) / "adapter_config.json"
            if not config.is_file():
                raise _HTTPError(404, f"Loading lora {name} failed: No adapter found for {path}")
            settings = json.loads(config.read_text())
            rank = max([int(settings.get("r", 0)), *(int(v) for v in (settings.get("rank_pattern") or {}).values())])
            if rank > self.max_lora_rank:
                raise _HTTPError(500, f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
            self.adapters[name] = path
            self.loads.append(name)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, body: dict) -> str:
        name = str(body["lora_name"])
        with self.lock:
            if self.adapters.pop(name, None) is None:
                raise _HTTPError(404, f"The lora adapter '{name}' cannot be found.")
            if self.active == name:
                self.active = None
            if name in self.batch_adapters:
                self.batch_adapters.remove(name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _join_batch(self, name: str) -> None:
        """Account for a request of adapter ``name`` as vLLM's scheduler would: it joins the batch
        when its adapter is among the batch's (at most ``max_loras``), else the batch changes."""
        if name in self.batch_adapters:
            self.batch_adapters.remove(name)
        elif len(self.batch_adapters) >= self.max_loras:
            self.batch_adapters.pop(0)  # the least recently used adapter's requests must finish first
            self.adapter_swaps += 1
        self.batch_adapters.append(name)

    def chat(self, body: dict) -> dict:
        from a2c_ppo_acktr.common import prompts

        name = str(body.get("model", self.served_name))
        messages, images = hf_messages(body["messages"])
        fields = {
            k: body.get(k)
            for k in (
                "model",
                "temperature",
                "top_p",
                "top_k",
                "seed",
                "max_tokens",
                "stop_token_ids",
                "logit_bias",
                "return_token_ids",
                "logprobs",
            )
        }
        temperature = float(body.get("temperature", 1.0))
        if temperature > 2.0:
            raise _HTTPError(400, f"temperature must be in [0, 2], got {temperature}.")
        with self.lock:
            if name != self.served_name and name not in self.adapters:
                raise _HTTPError(404, f"The model `{name}` does not exist.")
            if self.fail_after is not None and len(self.requests) >= self.fail_after:
                raise _HTTPError(503, "the loopback server is down (fail_after)")
            pol = self.policy
            text = prompts.render_prompt(pol.processor, messages)
            enc = pol._encode([text], [images])
            prompt_ids = enc["input_ids"][0].tolist()
            max_tokens = int(body.get("max_tokens") or 16)
            if self.max_model_len is not None and len(prompt_ids) + max_tokens > self.max_model_len:
                raise _HTTPError(
                    400,
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                    f"length is {self.max_model_len} tokens and your request has {len(prompt_ids)} input tokens "
                    f"({max_tokens} > {self.max_model_len} - {len(prompt_ids)}).",
                )
            self.requests.append(fields)
            self._join_batch(name)
            if name != self.active and name in self.adapters:
                pol.load_pretrained(self.adapters[name])
                self.active = name
            bias = torch.zeros(pol.vocab_size)
            for tok, b in (body.get("logit_bias") or {}).items():
                bias[int(tok)] = float(b)
            stops = [int(t) for t in body.get("stop_token_ids") or []] or list(pol.eos_ids)
            top_k = int(body.get("top_k") or -1)
            top_p = float(body.get("top_p") or 1.0)
            ids, lps = _sample(pol, enc, bias, stops, temperature, top_k, top_p, int(body.get("seed") or 0), max_tokens)
            finish, stop_reason = ("stop", ids[-1]) if ids and ids[-1] in stops else ("length", None)
            answered = self.answer_as or (name if name in self.adapters else self.served_name)
            self.replies.append(list(ids))
        content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, lps)]
        text_out = pol.tokenizer.decode(ids, skip_special_tokens=False)
        return {
            "id": f"chatcmpl-loopback-{len(self.requests)}",
            "object": "chat.completion",
            "model": answered,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text_out},
                    "logprobs": {"content": content} if body.get("logprobs") else None,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "token_ids": ids if body.get("return_token_ids") else None,
                }
            ],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)},
        }


def _sample(
    pol: Any,
    enc: dict,
    bias: torch.Tensor,
    stops: list[int],
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    max_tokens: int,
) -> tuple[list[int], list[float]]:
    """One reply with ``generate``: the bias added to the logits, then the policy's own
    :func:`~a2c_ppo_acktr.policy.distributions.process_logits` (temperature, top-k, top-p) as the only
    processor; sampled from ``seed`` with the process's random state put back afterwards. Returns
    the ids (through the stop token) and each one's log-prob under the processed distribution."""
    from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

    from a2c_ppo_acktr.policy.distributions import process_logits

    greedy = temperature <= 0.0

    class Process(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            t = torch.full((scores.shape[0],), 1.0 if greedy else temperature)
            return process_logits(
                scores.float() + bias.to(scores.device),
                t,
                None,
                top_k if (top_k > 0 and not greedy) else 0,
                top_p if not greedy else 1.0,
            )

    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=not greedy,
        num_beams=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        repetition_penalty=1.0,
        eos_token_id=stops,
        pad_token_id=pol.pad_id,
        use_cache=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = pol.model.generate(**enc, generation_config=config, logits_processor=LogitsProcessorList([Process()]))
    P = enc["input_ids"].shape[1]
    ids = out.sequences[0, P:].tolist()
    ids = ids[: len(out.scores)]
    lps = [float(torch.log_softmax(score[0].float(), -1)[tok]) for score, tok in zip(out.scores, ids)]
    for k, tok in enumerate(ids):
        if tok in stops:
            return ids[: k + 1], lps[: k + 1]
    return ids, lps


class _HTTPError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _make_handler(server: LoopbackServer) -> type[BaseHTTPRequestHandler]:
    routes_get = {"/health": lambda: None, "/version": server.version_info, "/v1/models": server.models}
    routes_post = {
        "/v1/chat/completions": server.chat,
        "/v1/load_lora_adapter": server.load_adapter,
        "/v1/unload_lora_adapter": server.unload_adapter,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests read the server's state instead
            logger.debug(fmt, *args)

        def _send(self, code: int, payload: Any) -> None:
            # vLLM answers its LoRA routes with a plain-text body, everything else with JSON.
            text = isinstance(payload, str)
            raw = b"" if payload is None else (payload.encode("utf-8") if text else json.dumps(payload).encode("utf-8"))
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _dispatch(self, routes: dict, body: Optional[dict]) -> None:
            route = routes.get(self.path)
            if route is None:
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                self._send(200, route(body) if body is not None else route())
            except _HTTPError as e:
                self._send(
                    e.code,
                    {
                        "error": {
                            "message": str(e),
                            "type": "BadRequestError" if e.code == 400 else "Error",
                            "param": None,
                            "code": e.code,
                        }
                    },
                )
            except (KeyError, ValueError, TypeError) as e:
                self._send(400, {"error": {"message": f"{type(e).__name__}: {e}"}})

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._dispatch(routes_get, None)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, {"error": {"message": "body is not JSON"}})
                return
            self._dispatch(routes_post, body)

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    """``vllm serve``'s command line as far as the launch scripts use it (``MODEL --host H --port P
    --enable-lora --max-lora-rank R --max-model-len L --max-loras N --gpu-memory-utilization F
    --tensor-parallel-size K --logprobs-mode processed_logprobs --generation-config vllm``; the GPU
    options are ignored), with ``--preset`` naming the config whose model section (LoRA settings)
    the adapters have. A fake ``vllm`` that runs it stands in for ``vllm serve`` in the tests."""
    from a2c_ppo_acktr.common.vllm_compat import LORA_RANKS
    from a2c_ppo_acktr.config.arguments import load_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the model directory or tiny:<family>")
    p.add_argument(
        "--preset", default="cpu-demo", help="the preset whose model section (LoRA settings) the adapters have"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--max-lora-rank", type=int, default=16, choices=LORA_RANKS, help="the largest adapter rank a load accepts"
    )
    p.add_argument(
        "--max-model-len", type=int, default=None, help="the longest prompt + max_tokens a request may ask for"
    )
    p.add_argument(
        "--max-loras", type=int, default=1, help="adapters in one batch (requests of others wait: counted as swaps)"
    )
    p.add_argument("--enable-lora", action="store_true", help="accepted for vllm serve's command line (always on)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None, help="accepted and ignored (CPU)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="accepted and ignored (CPU)")
    p.add_argument(
        "--generation-config", default="auto", help="accepted: this server has no generation_config defaults"
    )
    p.add_argument(
        "--logprobs-mode",
        default="processed_logprobs",
        choices=["processed_logprobs"],
        help="accepted: this server's log-probs are always the processed (sampled) distribution's",
    )
    p.add_argument("--served-version", default="0.33.0", help="what GET /version answers")
    args = p.parse_args(argv)
    cfg = load_config(
        preset=args.preset, overrides=[f"model.model_path={args.model}", "model.device=cpu", "model.dtype=float32"]
    )
    logging.basicConfig(level=logging.INFO)
    server = LoopbackServer(
        cfg.model,
        args.host,
        args.port,
        served_name=args.model,
        max_lora_rank=args.max_lora_rank,
        max_model_len=args.max_model_len,
        max_loras=args.max_loras,
        version=args.served_version,
    )
    logger.info("loopback rollout server on %s", server.url)
    server.httpd.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A loopback stand-in for a vLLM OpenAI-compatible server, backed by a Hugging Face model on the CPU.

It speaks the endpoints :class:`~a2c_ppo_acktr.policy.rollout_engine.VLLMServerEngine` uses, with vLLM's
request and reply fields, the way the fake ``srun`` stands in for SLURM: the engine's contract
(per-row temperature, adapters loaded by name, stale replies refused, token ids in and out, a
server that dies) is tested through it on machines without a GPU. What only a real vLLM shows
(its kernels, its chat-template handling of a real checkpoint) is ``scripts/gpu_smoke.sh``'s.

* ``GET /health``, ``GET /v1/models`` (the base model and every loaded adapter);
* ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (``lora_name``, ``lora_path``: a
  directory :meth:`VLMPolicy.save_pretrained <a2c_ppo_acktr.policy.model.VLMPolicy.save_pretrained>` wrote);
* ``POST /v1/chat/completions``: OpenAI messages with ``image_url`` data URLs; the server applies
  the processor's chat template to them itself, samples with ``temperature`` (0: greedy),
  ``top_k``, ``top_p``, ``seed``, ``max_tokens``, ``stop_token_ids`` and ``logit_bias``, and answers
  ``prompt_token_ids``, ``choices[0].token_ids`` (through the stop token, which ``stop_reason``
  names), ``logprobs.content`` (``token_id:N``, the processed distribution's log-probs) and
  ``model`` (the adapter that answered).

Requests are served one at a time (a lock); each samples from its own seed without touching the
process's random state, so a trainer in the same process draws exactly what it would alone.

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
            adapters it will load (as a vLLM server's ``--max-lora-rank`` must).
        served_name: The base model's name in ``/v1/models``.
    """

    def __init__(self, model_cfg: Any, host: str = "127.0.0.1", port: int = 0, served_name: str = "base") -> None:
        from a2c_ppo_acktr.policy.model import VLMPolicy

        self.policy = VLMPolicy(model_cfg)
        self.policy.eval()
        self.served_name = served_name
        self.adapters: dict[str, str] = {}  # name -> path
        self.active: Optional[str] = None  # the adapter whose weights are in the model now
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
        return {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}

    def load_adapter(self, body: dict) -> dict:
        name, path = str(body["lora_name"]), str(body["lora_path"])
        with self.lock:
            if name in self.adapters:
                raise _HTTPError(400, f"The lora adapter '{name}' has already been loaded.")
            self.adapters[name] = path
        return {}

    def unload_adapter(self, body: dict) -> dict:
        name = str(body["lora_name"])
        with self.lock:
            if self.adapters.pop(name, None) is None:
                raise _HTTPError(404, f"The lora adapter '{name}' cannot be found.")
            if self.active == name:
                self.active = None
        return {}

    def chat(self, body: dict) -> dict:
        from a2c_ppo_acktr.common import prompts

        name = str(body.get("model", self.served_name))
        messages, images = hf_messages(body["messages"])
        fields = {k: body.get(k) for k in ("model", "temperature", "top_p", "top_k", "seed", "max_tokens", "stop_token_ids",
                                           "logit_bias", "return_token_ids", "logprobs")}
        with self.lock:
            if name != self.served_name and name not in self.adapters:
                raise _HTTPError(404, f"The model `{name}` does not exist.")
            if self.fail_after is not None and len(self.requests) >= self.fail_after:
                raise _HTTPError(503, "the loopback server is down (fail_after)")
            self.requests.append(fields)
            pol = self.policy
            if name != self.active and name in self.adapters:
                pol.load_pretrained(self.adapters[name])
                self.active = name
            text = prompts.render_prompt(pol.processor, messages)
            enc = pol._encode([text], [images])
            prompt_ids = enc["input_ids"][0].tolist()
            temperature = float(body.get("temperature", 1.0))
            bias = torch.zeros(pol.vocab_size)
            for tok, b in (body.get("logit_bias") or {}).items():
                bias[int(tok)] = float(b)
            stops = [int(t) for t in body.get("stop_token_ids") or []] or list(pol.eos_ids)
            top_k = int(body.get("top_k") or -1)
            top_p = float(body.get("top_p") or 1.0)
            max_tokens = int(body.get("max_tokens") or 16)
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
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text_out},
                "logprobs": {"content": content} if body.get("logprobs") else None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": ids if body.get("return_token_ids") else None,
            }],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)},
        }


def _sample(pol: Any, enc: dict, bias: torch.Tensor, stops: list[int], temperature: float, top_k: int, top_p: float,
            seed: int, max_tokens: int) -> tuple[list[int], list[float]]:
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
            return process_logits(scores.float() + bias.to(scores.device), t, None,
                                  top_k if (top_k > 0 and not greedy) else 0, top_p if not greedy else 1.0)

    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=not greedy, num_beams=1, temperature=1.0, top_k=0, top_p=1.0,
                              min_p=None, repetition_penalty=1.0, eos_token_id=stops, pad_token_id=pol.pad_id, use_cache=True,
                              output_scores=True, return_dict_in_generate=True)
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
    routes_get = {"/health": lambda: None, "/v1/models": server.models}
    routes_post = {"/v1/chat/completions": server.chat, "/v1/load_lora_adapter": server.load_adapter,
                   "/v1/unload_lora_adapter": server.unload_adapter}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests read the server's state instead
            logger.debug(fmt, *args)

        def _send(self, code: int, payload: Any) -> None:
            raw = b"" if payload is None else json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
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
                self._send(e.code, {"error": {"message": str(e)}})
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
    """``vllm serve``'s command line as far as the launch scripts use it (``MODEL --port P
    --enable-lora --max-lora-rank R --gpu-memory-utilization F --logprobs-mode processed_logprobs``;
    the GPU options are ignored), so
    ``ROLLOUT_SERVER_CMD="python -m a2c_ppo_acktr.policy.loopback_server"`` stands in for ``vllm serve``."""
    from a2c_ppo_acktr.config.arguments import load_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the model directory or tiny:<family>")
    p.add_argument("--preset", default="cpu-demo", help="the preset whose model section (LoRA settings) the adapters have")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-lora-rank", type=int, default=None, help="the adapters' LoRA rank (default: the preset's)")
    p.add_argument("--enable-lora", action="store_true", help="accepted for vllm serve's command line (always on)")
    p.add_argument("--gpu-memory-utilization", default=None, help="accepted and ignored (CPU)")
    p.add_argument("--logprobs-mode", default="processed_logprobs", choices=["processed_logprobs"],
                   help="accepted: this server's log-probs are always the processed (sampled) distribution's")
    args = p.parse_args(argv)
    over = [f"model.model_path={args.model}", "model.device=cpu", "model.dtype=float32"]
    if args.max_lora_rank is not None:
        over.append(f"model.lora_r={args.max_lora_rank}")
    cfg = load_config(preset=args.preset, overrides=over)
    logging.basicConfig(level=logging.INFO)
    server = LoopbackServer(cfg.model, args.host, args.port, served_name=args.model)
    logger.info("loopback rollout server on %s", server.url)
    server.httpd.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

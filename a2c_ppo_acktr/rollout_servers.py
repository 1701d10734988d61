"""The vLLM rollout servers of one node, planned for the launch scripts (``ROLLOUT_SERVER=1``).

    python -m a2c_ppo_acktr.rollout_servers --gpus 8 [--tp 1] [--port 8000] [--gpu-memory 0.3]
        [--vllm-python PY] [--max-model-len N] [--devices 0,1,...] [main_vsi.py's config options]

``scripts/common.sh`` evaluates what this prints (shell assignments, every value quoted) and starts
one ``vllm serve`` per entry of ``ROLLOUT_PORTS``:

* **Servers.** ``gpus / tp`` of them: server ``i`` runs on GPUs ``i*tp .. i*tp+tp-1`` of the node
  (``CUDA_VISIBLE_DEVICES`` for it) beside the trainer processes of the same local ranks, on port
  ``port + i``, bound to 127.0.0.1 (the runtime-LoRA routes must not face the network). The trainer
  processes map to them the same way (:func:`a2c_ppo_acktr.policy.rollout_engine.server_index`).
* **Interpreter.** ``--vllm-python`` (``VLLM_PYTHON``) runs ``python -m vllm.entrypoints.cli.main
  serve``, so the server can live in its own environment (vLLM pins its own torch); without it the
  ``vllm`` on ``PATH`` runs. Its version is read first and must lie in
  :data:`~a2c_ppo_acktr.common.vllm_compat.SUPPORTED_RANGE`.
* **Flags.** ``--max-lora-rank``: the run's ``model.lora_r`` (a warm start's own rank when
  ``--sft-adapter`` is given) rounded up to a rank every supported vLLM accepts. ``--max-model-len``:
  the longest prompt the run makes (:func:`a2c_ppo_acktr.memory.preset_shapes`: the most images a turn
  carries and a long question, counted by the model's processor when it is on disk) plus
  :data:`PROMPT_MARGIN` of it, plus ``model.max_new_tokens``, rounded up to :data:`LEN_STEP`;
  without it vLLM takes the model's own context (128k and more for Qwen-VL), whose KV cache does not
  fit beside a trainer. ``--max-loras 1``: one adapter per iteration, shared by every rank.
  ``--logprobs-mode processed_logprobs`` (log-probs after temperature, top-k and top-p) and
  ``--generation-config vllm`` (no sampling defaults from the checkpoint's generation_config.json).
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.vllm_compat import check_version, server_lora_rank

# The planned prompt is one long turn; real turns vary in question length and feedback, and a model
# not on disk is counted at ~4 characters per token: a quarter more leaves room for both.
PROMPT_MARGIN = 0.25
LEN_STEP = 256
VERSION_TIMEOUT_S = 120  # importing vLLM's metadata only; a cold file system can take a while


class ServerPlanError(ValueError, UserError):
    """The node's servers cannot be planned as asked (GPUs, tensor parallelism, the interpreter)."""


@dataclass(frozen=True)
class ServerPlan:
    """One server: its index, port and the GPUs it runs on (``CUDA_VISIBLE_DEVICES``)."""

    index: int
    port: int
    devices: str


def plan_servers(gpus: int, tp: int, port: int, devices: Optional[Sequence[str]] = None) -> list[ServerPlan]:
    """``gpus / tp`` servers of ``tp`` GPUs each, on ports ``port, port+1, ...``.

    Args:
        gpus: Trainer processes (one per GPU) on this node.
        tp: GPUs per server (vLLM's ``--tensor-parallel-size``).
        port: The first server's port.
        devices: The node's GPU ids as ``CUDA_VISIBLE_DEVICES`` lists them (default ``0 .. gpus-1``).

    Raises:
        ServerPlanError: ``tp`` does not divide ``gpus``, or fewer devices than GPUs are listed.
    """
    if gpus < 1 or tp < 1 or gpus % tp:
        raise ServerPlanError(
            f"ROLLOUT_TP={tp} must divide the node's NUM_GPUS={gpus} (one server per group of ROLLOUT_TP GPUs)"
        )
    ids = [str(i) for i in range(gpus)] if not devices else [d.strip() for d in devices if d.strip()]
    if len(ids) < gpus:
        raise ServerPlanError(f"CUDA_VISIBLE_DEVICES lists {len(ids)} GPUs for NUM_GPUS={gpus}: list one per process")
    return [ServerPlan(i, port + i, ",".join(ids[i * tp : (i + 1) * tp])) for i in range(gpus // tp)]


def context_length(prompt_tokens: int, max_new_tokens: int) -> int:
    """``--max-model-len`` for prompts of up to ``prompt_tokens`` and replies of ``max_new_tokens``:
    the prompt plus :data:`PROMPT_MARGIN` of it, plus the reply, rounded up to :data:`LEN_STEP`."""
    need = math.ceil(prompt_tokens * (1 + PROMPT_MARGIN)) + int(max_new_tokens)
    return LEN_STEP * math.ceil(need / LEN_STEP)


def serve_command(vllm_python: Optional[str]) -> tuple[list[str], list[str]]:
    """``(serve, version)``: the command that starts a server and the one that prints vLLM's version,
    for the interpreter ``vllm_python`` (None: the ``vllm`` on ``PATH``).

    Raises:
        ServerPlanError: neither is found.
    """
    if vllm_python:
        python = shutil.which(vllm_python)
        if python is None:
            raise ServerPlanError(
                f"VLLM_PYTHON={vllm_python} is not an executable: point it at the python of vLLM's environment"
            )
        return (
            [python, "-m", "vllm.entrypoints.cli.main", "serve"],
            [python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        )
    vllm = shutil.which("vllm")
    if vllm is None:
        raise ServerPlanError(
            "no `vllm` on PATH: install vLLM (pip install -e .[vllm]) or set VLLM_PYTHON to the python of its "
            "environment"
        )
    return [vllm, "serve"], [vllm, "--version"]


def installed_version(version_cmd: Sequence[str]) -> str:
    """The version ``version_cmd`` prints (its last line), checked against the supported range.

    Raises:
        ServerPlanError: the command fails.
        VLLMVersionError: the version is not supported.
    """
    try:
        res = subprocess.run(list(version_cmd), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServerPlanError(f"could not run {shlex.join(version_cmd)}: {e}") from None
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise ServerPlanError(
            f"{shlex.join(version_cmd)} failed (exit {res.returncode}: {last}); is vLLM installed in that environment?"
        )
    version = lines[-1].strip()
    check_version(version, version_cmd[0])
    return version


def server_flags(run: Any, max_model_len: int, gpu_memory: float, tp: int) -> tuple[list[str], dict[str, Any]]:
    """The flags every server of the node gets, and what they were derived from (for the log line)."""
    rank = server_lora_rank(run.model.lora_r)
    flags = [
        "--host",
        "127.0.0.1",
        "--enable-lora",
        "--max-lora-rank",
        str(rank),
        "--max-loras",
        "1",
        "--max-model-len",
        str(max_model_len),
        "--gpu-memory-utilization",
        f"{gpu_memory:g}",
        "--tensor-parallel-size",
        str(tp),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
    ]
    return flags, {"lora_r": run.model.lora_r, "max_lora_rank": rank}


def prompt_tokens(run: Any) -> tuple[int, bool]:
    """The longest prompt of ``run`` in tokens and whether the model's processor counted it."""
    from a2c_ppo_acktr.memory import model_dims, preset_shapes

    shapes = preset_shapes(run, model_dims(run.model))
    return shapes.prompt_tokens, shapes.text_exact


def _assign(name: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{name}=({' '.join(shlex.quote(str(v)) for v in value)})"
    return f"{name}={shlex.quote(str(value))}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from a2c_ppo_acktr.config.arguments import config_from_args
    from a2c_ppo_acktr.config.cli import check_flag_typos, config_parser

    parser = config_parser(__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, required=True, help="trainer processes (GPUs) on this node")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per server (--tensor-parallel-size; ROLLOUT_TP)")
    parser.add_argument("--port", type=int, default=8000, help="the first server's port (ROLLOUT_PORT)")
    parser.add_argument(
        "--gpu-memory", type=float, default=0.3, help="the fraction of each GPU a server takes (ROLLOUT_GPU_MEMORY)"
    )
    parser.add_argument(
        "--vllm-python", default=None, help="the python of vLLM's environment (VLLM_PYTHON; default: `vllm` on PATH)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the servers' context (ROLLOUT_MAX_MODEL_LEN; default: from the run)",
    )
    parser.add_argument("--devices", default=None, help="the node's GPU ids (CUDA_VISIBLE_DEVICES)")
    parser.add_argument(
        "--sft-adapter", default=None, help="as main_vsi.py: the warm start whose LoRA rank the servers must hold"
    )
    parser.add_argument("--resume", default=None, help="as main_vsi.py (accepted, not used)")
    args, extra = parser.parse_known_args(argv)
    check_flag_typos(parser, extra)
    if not 0 < args.gpu_memory < 1:
        raise ServerPlanError(
            f"ROLLOUT_GPU_MEMORY={args.gpu_memory} must be a fraction of each GPU in (0, 1), e.g. 0.3"
        )
    servers = plan_servers(args.gpus, args.tp, args.port, args.devices.split(",") if args.devices else None)
    serve, version_cmd = serve_command(args.vllm_python)
    version = installed_version(version_cmd)
    # The run as the trainer will see it, with the engine's own checks (temperatures vLLM serves).
    run = config_from_args(args, [*extra, "--rollout.engine", "vllm", "--rollout.engine_url", "http://127.0.0.1:1"])
    if args.sft_adapter:
        from a2c_ppo_acktr.policy.loading import adopt_adapter_settings

        adopt_adapter_settings(run.model, args.sft_adapter)
    if args.max_model_len is not None:
        if args.max_model_len <= run.model.max_new_tokens:
            raise ServerPlanError(
                f"ROLLOUT_MAX_MODEL_LEN={args.max_model_len} leaves no room for a prompt before "
                f"model.max_new_tokens={run.model.max_new_tokens}"
            )
        length, why = args.max_model_len, "ROLLOUT_MAX_MODEL_LEN"
    else:
        prompt, exact = prompt_tokens(run)
        length = context_length(prompt, run.model.max_new_tokens)
        why = (
            f"a prompt of {prompt} tokens ({'counted' if exact else 'estimated'}) + {PROMPT_MARGIN:.0%} "
            f"+ model.max_new_tokens={run.model.max_new_tokens}"
        )
    flags, derived = server_flags(run, length, args.gpu_memory, args.tp)
    from a2c_ppo_acktr.policy.loading import resolve_model_path

    model = run.model.model_path
    served = resolve_model_path(model) if model.startswith("tiny:") else model  # a tiny model's built directory
    lines = [
        _assign("ROLLOUT_VLLM_VERSION", version),
        _assign("ROLLOUT_SERVE", serve),
        _assign("ROLLOUT_MODEL", served),
        _assign("ROLLOUT_FLAGS", flags),
        _assign("ROLLOUT_DEVICES", [s.devices for s in servers]),
        _assign("ROLLOUT_PORTS", [s.port for s in servers]),
    ]
    print("\n".join(lines))
    print(
        f"[rollout] {len(servers)} vLLM {version} server(s) of {args.tp} GPU(s) on ports "
        f"{servers[0].port}-{servers[-1].port}; "
        f"--max-model-len {length} ({why}); --max-lora-rank {derived['max_lora_rank']} "
        f"(model.lora_r={derived['lora_r']})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(run_main(main, "python -m a2c_ppo_acktr.rollout_servers"))

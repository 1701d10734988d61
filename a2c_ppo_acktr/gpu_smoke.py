"""The checks behind ``scripts/gpu_smoke.sh``: what to run first on a GPU node.

``python -m a2c_ppo_acktr.gpu_smoke STAGE [...]`` runs one stage; the shell script runs the launches
(``scripts/run_vsi_qwen.sh``, ``vlm_traj_label.py``, ``train_sft.py`` ...) between them. Stages:

- ``info``: Python, torch, CUDA, the GPUs, bf16 support, flash-attn, DeepSpeed.
- ``ratio``: the tiny model (``tiny:qwen2_5_vl``) acts on procedural VSI scenes, the rollout is
  stored, and :meth:`~a2c_ppo_acktr.policy.model.VLMPolicy.evaluate_actions` re-scores every minibatch
  before any update: ``max |ratio - 1|`` must stay under :func:`ratio_bound` (float32: 1e-4; bf16
  and fp16: a fraction of ``ppo.clip_coef``; docs/TRAINING.md, "The first ratio"), and
  the share of turns outside the clip range is reported. On CUDA: bf16 with sdpa, and with flash_attention_2 when
  ``flash_attn`` imports.
  Also measures the peak GPU memory of acting plus one backward (the training loop does not log it).
- ``check-ppo``: reads a short training run's ``metrics.jsonl``: the first minibatch's ratio deviation
  (exactly 0 with ``ppo.old_log_probs=update``; with ``rollout`` the same bound),
  ``debug/param_rank_max_dev`` (must be exactly 0: ranks hold the same weights) and steps/s.
- ``check-sft``: one SFT step wrote a finite loss and the adapter.
- ``real``: ``--model PATH --preset P``: the ratio check on a real local checkpoint with the preset's
  settings; checks the share of turns outside the clip range, the prompt length against the model's
  positions and (CUDA) peak reserved memory against ``python -m a2c_ppo_acktr.memory``; logs per-phase
  seconds (:func:`real_checkpoint_check`).
- ``real-size``: ``--model DIR --preset P``: on a :mod:`a2c_ppo_acktr.real_size` build, ``act`` against a
  bare ``generate`` (seconds per decoded position) and (CUDA) the peak memory of a rollout and two
  training steps against the memory formula (:func:`real_size_check`); ``check-real-size``: its PPO
  run, as ``check-ppo`` plus the phases' seconds (:func:`check_real_size_run`).
- ``summary``: one table of everything measured; ``free-port``: a free TCP port for a launch.

Each stage writes its numbers to a JSON file for ``summary``, prints what it checked, and on a failed
check prints ``GPU SMOKE FAILED: ...`` to stderr and exits 1. ``--device cpu`` (or
``GPU_SMOKE_DEVICE=cpu``) runs the same stages on CPU in float32, which is how the test suite
exercises this module and the script end to end on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

# Largest allowed |ratio - 1| of any turn on the first PPO minibatch (before any update).
# float32: the ratio-1 invariant (docs/CONTRACTS.md), a fixed 1e-4. bfloat16/float16: the ratio is 1 only up to rounding
# that depends on the batch layout (left padding changes the kernels' accumulation), divided by the
# temperature; the bound is a fraction of the run's ppo.clip_coef, since a turn that starts an epoch
# outside the clip range gives no gradient. Measured on CPU with the tiny model, lm_head in float32,
# 16 seeds (bench/bench_bf16_ratio.py): largest 0.011 at T = 1 and 0.064 at T = 0.2, none outside
# the GPU presets' clip 0.1 (with bf16-rounded logits: 0.065, 0.31 and 1.6% of turns outside).
RATIO_BOUNDS = {"float32": 1e-4}
LOW_PRECISION_CLIP_FRACTION = 0.8
# Informational, not a bound: the "typical" level; the share of turns above it is reported.
TYPICAL_DEV = 1e-2

# Sampling temperatures the ratio stage runs: the debug preset's own, and the GPU presets' (low
# temperatures divide the logits' rounding error by T, so they are the harder case).
TEMPERATURE_SETTINGS = {
    "preset": {},
    "gpu-preset (T=0.2 in [0.1, 1])": {"temperature": 0.2, "min_temperature": 0.1, "max_temperature": 1.0},
}

FAILED = "GPU SMOKE FAILED"


class SmokeFailure(RuntimeError):
    """A smoke check failed; the message says what was measured and what was expected."""


def smoke_dtype(device: str) -> str:
    """The dtype a stage runs in: bf16 on CUDA (what the GPU presets train in), float32 on CPU."""
    return "bfloat16" if device == "cuda" else "float32"


def ratio_bound(dtype: str, clip_coef: float) -> float:
    """The bound on ``max |ratio - 1|`` for ``dtype``: :data:`RATIO_BOUNDS` in float32,
    :data:`LOW_PRECISION_CLIP_FRACTION` of ``clip_coef`` in bfloat16 and float16."""
    if dtype in RATIO_BOUNDS:
        return RATIO_BOUNDS[dtype]
    if dtype in ("bfloat16", "float16"):
        return LOW_PRECISION_CLIP_FRACTION * float(clip_coef)
    raise ValueError(f"no ratio bound for dtype {dtype!r}; known: float32, bfloat16, float16")


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------
def flash_attn_available() -> bool:
    """Whether ``import flash_attn`` works (flash_attention_2 is then tested too)."""
    try:
        import flash_attn  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken build raises all sorts (ImportError, OSError, RuntimeError)
        return False
    return True


def environment_info(device: str) -> dict[str, Any]:
    """Versions and devices (see :func:`check_environment` for what must hold)."""
    import platform

    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "flash_attn": flash_attn_available(),
    }
    try:
        import deepspeed

        info["deepspeed"] = deepspeed.__version__
    except Exception as e:  # noqa: BLE001 - reported, not fatal here (the PPO stage needs it on CUDA)
        info["deepspeed"] = f"not importable ({type(e).__name__}: {e})"
    if torch.cuda.is_available():
        info["cudnn"] = torch.backends.cudnn.version()
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        info["gpus"] = [
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
            }
            for i in range(torch.cuda.device_count())
        ]
    return info


def check_environment(info: dict[str, Any], device: str) -> None:
    """Raise :class:`SmokeFailure` when ``device=cuda`` cannot work with ``info`` (:func:`environment_info`)."""
    if device != "cuda":
        return
    if info["torch_cuda_build"] is None:
        raise SmokeFailure(
            f"torch {info['torch']} is a CPU-only build; install the CUDA build (scripts/setup.sh, docs/TRAINING.md)"
        )
    if not info["cuda_available"]:
        raise SmokeFailure(
            f"torch {info['torch']} (CUDA {info['torch_cuda_build']}) sees no GPU: check nvidia-smi, the driver "
            "version and "
            "CUDA_VISIBLE_DEVICES, or run GPU_SMOKE_DEVICE=cpu for the CPU checks"
        )
    if not info["bf16_supported"]:
        raise SmokeFailure(
            f"GPU {info['gpus'][0]['name']} does not support bfloat16, which the GPU presets train in; use an Ampere "
            "or newer GPU"
        )
    if not str(info["deepspeed"])[:1].isdigit():
        raise SmokeFailure(f"deepspeed is {info['deepspeed']}; the PPO launch (ZeRO-2) needs it: pip install deepspeed")


# ---------------------------------------------------------------------------------------------
# ratio
# ---------------------------------------------------------------------------------------------
@dataclass
class RatioResult:
    """One ratio measurement (see :func:`ratio_check`)."""

    device: str
    dtype: str
    attn_implementation: str
    rollout_log_probs: str  # the resolved mode the policy used
    setting: str  # which temperature setting
    seed: int
    ratio_max_dev: float  # max |exp(new - old) - 1| over every minibatch, before any update
    bound: float
    peak_memory_gib: Optional[float]  # torch.cuda.max_memory_allocated during act + one backward; None on CPU
    seconds: float
    turn_devs: list[float] = field(default_factory=list)  # |ratio - 1| of every turn (ratio_max_dev is their max)
    clip_coef: float = 0.2  # the run's ppo.clip_coef (the share of turns outside the clip range is reported)
    prompt_tokens_max: int = 0  # the longest prompt of the rollout (images expanded)
    context_limit: Optional[int] = None  # the model's max_position_embeddings
    reserved_gib: Optional[float] = None  # torch.cuda.max_memory_reserved; None on CPU
    phase_seconds: dict[str, float] = field(default_factory=dict)  # load, collect, rescore

    @property
    def share_outside_clip(self) -> float:
        return sum(d > self.clip_coef for d in self.turn_devs) / max(len(self.turn_devs), 1)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.ratio_max_dev) and self.ratio_max_dev < self.bound


def turn_ratio_deviations(
    policy: Any, storage: Any, mini_batch_size: int, seed: int = 0, backward_first: bool = False
) -> list[float]:
    """``|exp(log_prob - old_log_prob) - 1|`` of every stored turn, re-scored before any update.

    Each minibatch is re-scored in training mode exactly as the first PPO epoch would (its own
    padding layout), so the first-minibatch invariant is checked on every minibatch.

    Args:
        policy: A :class:`~a2c_ppo_acktr.policy.model.VLMPolicy` that filled ``storage`` (returns computed).
        storage: The :class:`~a2c_ppo_acktr.algo.storage.RolloutStorage`.
        mini_batch_size: Turns per minibatch (must divide the rollout).
        seed: Seeds the minibatch shuffle.
        backward_first: Run a PPO-shaped loss's backward on the first minibatch (memory
            measurement; gradients are then zeroed and no optimizer step is taken).

    Returns:
        One deviation per turn, in the storage's flat (step-major) order.
    """
    import torch

    policy.train()
    devs = [math.nan] * (storage.num_steps * storage.num_envs)
    gen = torch.Generator().manual_seed(seed)
    for i, mb in enumerate(storage.minibatches(mini_batch_size, gen)):
        grad = backward_first and i == 0
        with torch.set_grad_enabled(grad):
            out = policy.evaluate_actions(mb, with_kl=False)
            ratio = (out.log_probs - mb.old_log_probs.to(out.log_probs.device)).exp()
            if grad:
                adv, ret = mb.advantages.to(ratio.device), mb.returns.to(ratio.device)
                loss = -(ratio * adv).mean() + 0.5 * (out.values - ret).pow(2).mean()
                loss.backward()
                policy.zero_grad(set_to_none=True)
        for index, dev in zip(mb.indices.tolist(), (ratio.detach().float() - 1.0).abs().cpu().tolist()):
            devs[index] = dev
    return devs


def collect(policy: Any, env_cfg: Any, num_envs: int, num_steps: int, seed: int) -> Any:
    """``num_steps`` turns of ``num_envs`` procedural VSI envs (env ``i`` seeded ``seed * 1000 + i``)
    with ``policy``, through the training loop's own rollout; returns the storage, returns computed."""
    from a2c_ppo_acktr.envs.batch import VSIBatchEnv
    from a2c_ppo_acktr.algo.storage import RolloutStorage
    from a2c_ppo_acktr.rl.train import collect_rollout

    envs = VSIBatchEnv(env_cfg, num_envs, seed=seed * 1000)
    storage = RolloutStorage(num_steps, num_envs)
    stats = collect_rollout(policy, envs, storage, envs.reset(), num_steps)[1]
    storage.compute_returns(stats.next_value)
    return storage


def ratio_check(
    device: str,
    dtype: str,
    attn_implementation: str = "sdpa",
    model_overrides: Optional[dict[str, Any]] = None,
    setting: str = "preset",
    seed: int = 0,
    num_envs: int = 2,
    num_steps: int = 4,
    mini_batch_size: int = 2,
    preset: str = "debug",
    config: Optional[str] = None,
    settings: Sequence[str] = (),
) -> RatioResult:
    """Act with the tiny model, then re-score the rollout: the ratio-1 invariant in ``dtype``.

    Args:
        device: ``cpu`` or ``cuda``.
        dtype: ``model.dtype``.
        attn_implementation: ``model.attn_implementation``.
        model_overrides: More ``model.*`` fields (temperatures, ``rollout_log_probs``...); the
            default mode is the config's own (``auto``).
        setting: A name for the table.
        seed: Seeds the policy heads, the sampling and the scenes.
        num_envs, num_steps, mini_batch_size: Rollout shape.
        preset: The config preset the env and model settings come from.
        config: An overlay merged over the preset (an env overlay under ``configs/envs/``: the check
            on another env than VSI, e.g. on a node without open3d).
        settings: More overrides, ``section.key=value`` words (``model.*`` ones yield to the above).
    """
    import torch

    from a2c_ppo_acktr.config.arguments import load_config, merge_dicts, parse_overrides
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.policy.model import VLMPolicy

    model = {"device": device, "dtype": dtype, "attn_implementation": attn_implementation, **(model_overrides or {})}
    # What this measures is the rollout's own log-probs against the update's forward: the old
    # log-probs of ppo.old_log_probs=rollout (the default recomputes them in the update's layout).
    rollout_old = {"ppo": {"old_log_probs": "rollout"}}
    cfg = load_config(
        config=config,
        preset=preset,
        overrides=merge_dicts(merge_dicts(rollout_old, parse_overrides(settings)), {"model": model}),
    )
    t0 = time.perf_counter()
    on_cuda = device == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    policy = VLMPolicy(cfg.model, load_vlm(cfg.model))
    t1 = time.perf_counter()
    storage = collect(policy, cfg.env, num_envs, num_steps, seed)
    t2 = time.perf_counter()
    devs = turn_ratio_deviations(policy, storage, mini_batch_size, seed=seed, backward_first=True)
    t3 = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None
    reserved = torch.cuda.max_memory_reserved() / 2**30 if on_cuda else None
    worst = max(devs) if all(math.isfinite(d) for d in devs) else math.nan  # max() alone may skip a NaN
    return RatioResult(
        device=device,
        dtype=dtype,
        attn_implementation=attn_implementation,
        rollout_log_probs=cfg.model.rollout_log_probs,
        setting=setting,
        seed=seed,
        ratio_max_dev=worst,
        bound=ratio_bound(dtype, cfg.ppo.clip_coef),
        peak_memory_gib=peak,
        seconds=time.perf_counter() - t0,
        turn_devs=devs,
        clip_coef=cfg.ppo.clip_coef,
        prompt_tokens_max=max(len(p) for p in storage.prompt_ids),
        context_limit=policy.context_limit,
        reserved_gib=reserved,
        phase_seconds={"load": t1 - t0, "collect": t2 - t1, "rescore": t3 - t2},
    )


# A real checkpoint's first-minibatch turns may lie outside the clip range at most this often: turns
# that start an epoch clipped give no gradient, and a few percent is where bf16 noise starts to cost.
REAL_OUTSIDE_CLIP_LIMIT = 0.05
# Measured peak reserved memory may exceed python -m a2c_ppo_acktr.memory's peak with its assumed
# overheads (CUDA context, allocator fragmentation) by this factor before the check fails.
REAL_MEMORY_SLACK = 1.1


def real_checkpoint_check(device: str, model_path: str, preset: str, seed: int = 0) -> dict[str, Any]:
    """The ratio check on a real local checkpoint with ``preset``'s settings (dtype, pixels, frames,
    temperatures, clip), at the preset's rollout width (at most 4 envs) for 2 steps.

    Checks: the ratio bound; the share of turns outside the clip range (:data:`REAL_OUTSIDE_CLIP_LIMIT`);
    the longest prompt plus ``max_new_tokens`` against the model's positions; on CUDA, peak reserved
    memory against ``python -m a2c_ppo_acktr.memory``'s peak for the preset on one GPU (times
    :data:`REAL_MEMORY_SLACK`). Returns the numbers, per-phase seconds included.

    Raises:
        SmokeFailure: a check failed; the message has the numbers.
    """
    from a2c_ppo_acktr import memory
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.loading import ContextLengthError

    run = load_config(preset=preset, overrides={"model": {"model_path": model_path, "device": device}})
    envs = min(run.rollout.num_envs, 4)
    try:  # the policy's own guard: a prompt past the model's positions stops act with ContextLengthError
        r = ratio_check(
            device,
            run.model.dtype,
            run.model.attn_implementation,
            model_overrides={"model_path": model_path},
            setting=f"{preset} @ {model_path}",
            seed=seed,
            num_envs=envs,
            num_steps=2,
            mini_batch_size=envs,
            preset=preset,
        )
    except ContextLengthError as e:
        raise SmokeFailure(str(e)) from e
    dims = memory.model_dims(run.model)
    estimate = memory.estimate(dims, memory.preset_shapes(run, dims), memory.setup_from_run(run, 1))
    estimate_gib = memory.totals(estimate)["peak_with_overhead"] / memory.GIB
    result = {
        "model_path": model_path,
        "preset": preset,
        "dtype": run.model.dtype,
        "turns": len(r.turn_devs),
        "ratio_max_dev": r.ratio_max_dev,
        "bound": r.bound,
        "share_outside_clip": r.share_outside_clip,
        "clip_coef": r.clip_coef,
        "prompt_tokens_max": r.prompt_tokens_max,
        "max_new_tokens": run.model.max_new_tokens,
        "context_limit": r.context_limit,
        "reserved_gib": r.reserved_gib,
        "estimate_gib": estimate_gib,
        "phase_seconds": r.phase_seconds,
    }
    problems = []
    if not r.ok:
        problems.append(f"max |ratio - 1| {r.ratio_max_dev:.3g} is not below {r.bound:g}")
    if r.share_outside_clip > REAL_OUTSIDE_CLIP_LIMIT:
        problems.append(
            f"{r.share_outside_clip:.1%} of turns start outside the clip range {r.clip_coef:g} (limit "
            f"{REAL_OUTSIDE_CLIP_LIMIT:.0%})"
        )
    if r.reserved_gib is not None and r.reserved_gib > REAL_MEMORY_SLACK * estimate_gib:
        problems.append(
            f"peak reserved {r.reserved_gib:.1f} GiB exceeds python -m a2c_ppo_acktr.memory's {estimate_gib:.1f} GiB "
            f"by more than {REAL_MEMORY_SLACK:g}x: the estimate misses a term"
        )
    if problems:
        raise SmokeFailure(f"real checkpoint {model_path} ({preset}): " + "; ".join(problems))
    return result


def attention_implementations(device: str) -> list[str]:
    """sdpa always; flash_attention_2 on CUDA when ``flash_attn`` imports."""
    return ["sdpa"] + (["flash_attention_2"] if device == "cuda" and flash_attn_available() else [])


def run_ratio_stage(
    device: str, seeds: int, config: Optional[str] = None, settings: Sequence[str] = ()
) -> list[RatioResult]:
    """:func:`ratio_check` for every attention implementation, temperature setting and seed
    (``config``, ``settings``: an env overlay and more overrides, see :func:`ratio_check`)."""
    dtype = smoke_dtype(device)
    results = []
    for attn in attention_implementations(device):
        for name, temps in TEMPERATURE_SETTINGS.items():
            for seed in range(seeds):
                r = ratio_check(
                    device,
                    dtype,
                    attn,
                    model_overrides=temps,
                    setting=name,
                    seed=seed,
                    config=config,
                    settings=settings,
                )
                print(
                    f"ratio  {dtype} {attn:17s} {name:32s} seed {seed} mode={r.rollout_log_probs:9s} "
                    f"max|ratio-1|={r.ratio_max_dev:.3g} (bound {r.bound:g}) {r.seconds:.1f}s",
                    flush=True,
                )
                results.append(r)
    return results


def ratio_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results (as dicts) grouped by attention implementation and setting, seeds pooled:
    ``max_dev``, ``turns``, ``share_over_typical`` (of turns above :data:`TYPICAL_DEV`), peak memory."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["attn_implementation"], r["setting"]), []).append(r)
    rows = []
    for (attn, setting), rs in groups.items():
        turns = [d for r in rs for d in r["turn_devs"]]
        peaks = [r["peak_memory_gib"] for r in rs if r["peak_memory_gib"] is not None]
        rows.append(
            {
                "attn_implementation": attn,
                "setting": setting,
                "dtype": rs[0]["dtype"],
                "rollout_log_probs": rs[0]["rollout_log_probs"],
                "seeds": len(rs),
                "turns": len(turns),
                "max_dev": max(r["ratio_max_dev"] for r in rs),
                "bound": rs[0]["bound"],
                "share_over_typical": sum(d > TYPICAL_DEV for d in turns) / max(len(turns), 1),
                "peak_memory_gib": max(peaks) if peaks else None,
                "share_outside_clip": sum(d > r.get("clip_coef", 0.2) for r in rs for d in r["turn_devs"])
                / max(len(turns), 1),
                "clip_coef": rs[0].get("clip_coef", 0.2),
            }
        )
    return rows


def check_ratio_results(results: Sequence[RatioResult]) -> None:
    """Raise :class:`SmokeFailure` naming every measurement over its bound."""
    bad = [r for r in results if not r.ok]
    if bad:
        worst = "; ".join(
            f"{r.attn_implementation}/{r.setting}/seed {r.seed}: {r.ratio_max_dev:.3g} >= {r.bound:g}" for r in bad
        )
        raise SmokeFailure(
            f"first-minibatch ratio deviates from 1 ({worst}) in {bad[0].dtype}, mode {bad[0].rollout_log_probs}: "
            "rollout and update "
            "disagree about the log-probs; compare model.rollout_log_probs=recompute and generate, and attention "
            "implementations (docs/TRAINING.md, 'The first ratio')"
        )


# ---------------------------------------------------------------------------------------------
# check-ppo, check-sft
# ---------------------------------------------------------------------------------------------
def check_ppo_run(run_dir: str | os.PathLike, iterations: int) -> dict[str, Any]:
    """Read ``run_dir/metrics.jsonl`` and ``config.yaml`` of a short training run and check them.

    Returns:
        ``ratio_max_dev`` (max over iterations), ``param_rank_max_dev``, ``iterations``,
        ``seconds_per_iteration`` (mean of ``time/iteration`` after the first, which includes
        warm-up), ``env_steps_per_s`` (turns of all processes per second), ``processes``,
        ``old_log_probs``.

    Raises:
        SmokeFailure: Missing rows, a first ratio off 1 (with ``ppo.old_log_probs=update`` by any
            amount, with ``rollout`` by the dtype's bound), or ranks whose weights differ.
    """
    import yaml

    from a2c_ppo_acktr.run.logger import read_metrics

    run_dir = Path(run_dir)
    try:
        rows = read_metrics(run_dir / "metrics.jsonl")
    except (FileNotFoundError, ValueError) as e:
        raise SmokeFailure(f"the PPO run wrote no readable metrics: {e}") from e
    if len(rows) < iterations:
        raise SmokeFailure(f"{run_dir}/metrics.jsonl has {len(rows)} rows, expected {iterations} iterations")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    dtype = cfg["model"]["dtype"]
    processes = _processes(run_dir)

    def column(key: str) -> list[float]:
        missing = [r.get("iteration") for r in rows if key not in r]
        if missing:
            raise SmokeFailure(f"metrics.jsonl lacks {key!r} in iterations {missing}")
        return [float(r[key]) for r in rows]

    ratio = column("debug/first_minibatch_ratio_max_dev")
    rank_dev = column("debug/param_rank_max_dev")
    times = column("time/iteration")
    steady = times[1:] or times
    sec = sum(steady) / len(steady)
    turns = cfg["rollout"]["num_envs"] * cfg["rollout"]["num_steps"] * processes
    result = {
        "dtype": dtype,
        "rollout_log_probs": cfg["model"]["rollout_log_probs"],
        "iterations": len(rows),
        "processes": processes,
        "old_log_probs": cfg["ppo"].get("old_log_probs", "rollout"),  # a config without the field predates update
        "ratio_max_dev": max(ratio),
        "bound": ratio_bound(dtype, cfg["ppo"]["clip_coef"]),
        "param_rank_max_dev": max(rank_dev),
        "seconds_per_iteration": sec,
        "iterations_per_s": 1.0 / sec,
        "env_steps_per_s": turns / sec,
    }
    if result["old_log_probs"] == "update" and any(x != 0.0 for x in ratio):
        raise SmokeFailure(
            f"PPO run: debug/first_minibatch_ratio_max_dev per iteration {ratio} is not exactly 0 with "
            f"ppo.old_log_probs=update ({dtype}): "
            "the update's old log-probs and its first minibatch must be one forward in one layout (docs/TRAINING.md, "
            "'The first ratio')"
        )
    if not all(math.isfinite(x) and x < result["bound"] for x in ratio):
        raise SmokeFailure(
            f"PPO run: debug/first_minibatch_ratio_max_dev per iteration {ratio} is not below {result['bound']:g} "
            f"({dtype}, "
            f"mode {result['rollout_log_probs']}): rollout and update disagree under the launcher (DeepSpeed casts, "
            "padding, devices)"
        )
    if cfg["ppo"].get("perception_weighting"):
        dep = column("perception/dependency_mean")
        if not all(math.isfinite(x) and x >= 0 for x in dep):
            raise SmokeFailure(
                f"PPO run: perception/dependency_mean per iteration {dep} is not finite and >= 0 (the masked-image "
                "pass)"
            )
        result["perception_dependency_mean"] = sum(dep) / len(dep)
    if cfg["log"].get("val_interval", 0) > 0:
        val = [float(r["val/score"]) for r in rows if "val/score" in r]
        if not val or not (run_dir / "best" / "val.json").is_file():
            raise SmokeFailure(
                "PPO run: log.val_interval is set but no validation was logged or no best/val.json was written in "
                f"{run_dir}"
            )
        result["val_score"] = val[-1]
    if any(x != 0.0 for x in rank_dev):
        raise SmokeFailure(
            f"PPO run: debug/param_rank_max_dev per iteration {rank_dev} is not 0: the processes' trainable weights "
            "differ, "
            "so gradients are not all-reduced (check the DeepSpeed/accelerate launch)"
        )
    return result


# bf16 engine kernels against the policy's own recompute: a gap of a whole nat in a reply's weighted
# log-prob means the server samples another distribution (sampling settings, chat template, weights).
ENGINE_GAP_LIMIT = 1.0


def check_engine_run(run_dir: str | os.PathLike, hf_run_dir: Optional[str | os.PathLike] = None) -> dict[str, Any]:
    """A run through the rollout engine (``rollout.engine=vllm``): the adapter version the server
    answered with advanced every iteration, the off-policy gap ``|logp_engine - logp_policy|``
    stayed under :data:`ENGINE_GAP_LIMIT`, and turns/s of its rollouts beside the HF run's.

    Raises:
        SmokeFailure: versions that did not advance, no engine log-probs, or a gap over the limit.
    """
    from a2c_ppo_acktr.run.logger import read_metrics

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    versions = [float(r.get("engine/adapter_version", float("nan"))) for r in rows]
    if versions != [float(i) for i in range(1, len(rows) + 1)]:
        raise SmokeFailure(
            f"engine/adapter_version per iteration {versions}: the adapter did not advance with the iterations"
        )
    gaps = [float(r.get("engine/logp_gap_max", float("nan"))) for r in rows]
    if not all(math.isfinite(g) for g in gaps):
        raise SmokeFailure(
            f"engine/logp_gap_max per iteration {gaps}: the server returned no log-probs (logprobs, "
            "return_tokens_as_token_ids)"
        )
    if max(gaps) > ENGINE_GAP_LIMIT:
        raise SmokeFailure(
            f"engine/logp_gap_max {max(gaps):.3g} > {ENGINE_GAP_LIMIT}: the server samples another distribution than "
            "the policy"
        )

    def turns_per_s(path: Path) -> float:
        rs = read_metrics(path / "metrics.jsonl")[1:] or read_metrics(path / "metrics.jsonl")
        turns = [b["charts/turns"] - a["charts/turns"] for a, b in zip(rs, rs[1:])] or [rs[0]["charts/turns"]]
        collect = [r["time/collect"] for r in rs[-len(turns) :]]
        return sum(turns) / sum(collect)

    result = {
        "logp_gap_max": max(gaps),
        "logp_gap_mean": sum(float(r["engine/logp_gap_mean"]) for r in rows) / len(rows),
        "sync_seconds": sum(float(r.get("time/engine_sync", 0.0)) for r in rows) / len(rows),
        "engine_turns_per_s": turns_per_s(Path(run_dir)),
    }
    if hf_run_dir is not None and (Path(hf_run_dir) / "metrics.jsonl").is_file():
        result["hf_turns_per_s"] = turns_per_s(Path(hf_run_dir))
    return result


def _processes(run_dir: Path) -> int:
    """Processes the run used (``trainer_state.json`` of its latest checkpoint; 1 when unknown)."""
    from a2c_ppo_acktr.run.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir / "checkpoints")
    state = Path(ckpt) / "trainer_state.json" if ckpt is not None else None
    if state is None or not state.is_file():
        return 1
    data = json.loads(state.read_text(encoding="utf-8"))
    return int(data.get("num_processes", data.get("world_size", 1)))


def check_sft_run(out_dir: str | os.PathLike) -> dict[str, Any]:
    """One SFT step: a finite loss in ``train_log.json`` and the adapter files under ``adapter/``."""
    out = Path(out_dir)
    log_path = out / "train_log.json"
    if not log_path.is_file():
        raise SmokeFailure(f"SFT wrote no {log_path}; see its log")
    losses = [e for e in json.loads(log_path.read_text(encoding="utf-8")) if "loss" in e]
    if not losses or not all(math.isfinite(float(e["loss"])) for e in losses):
        raise SmokeFailure(f"SFT logged no finite loss: {losses}")
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors") if not (out / "adapter" / n).is_file()]
    if missing:
        raise SmokeFailure(f"SFT adapter is incomplete: {missing} missing under {out / 'adapter'}")
    return {"steps": int(losses[-1]["step"]), "loss": float(losses[-1]["loss"])}


# ---------------------------------------------------------------------------------------------
# real-size, check-real-size: a preset's architecture with random weights (a2c_ppo_acktr.real_size)
# ---------------------------------------------------------------------------------------------
# act's seconds per decoded position over a bare batched generate's: the goal, reported beside the
# measured ratio (act's own prompt forward and forbidden ids cost something; how much is the question).
ACT_GENERATE_GOAL = 1.15
# The peak allocated memory of a rollout and two training steps may differ from
# python -m a2c_ppo_acktr.memory's formula, evaluated at the shapes that ran, by this share.
REAL_SIZE_MEMORY_TOLERANCE = 0.25
# Phases of a training iteration the real-size PPO run reports (metrics.jsonl keys; old log-probs
# only where the update recomputes them).
REAL_SIZE_PHASES = ("time/collect", "time/old_log_probs", "time/update", "time/iteration")


def real_size_check(
    device: str,
    model_path: str,
    preset: str,
    config: Optional[str] = None,
    settings: Sequence[str] = (),
    seed: int = 0,
    profile: Optional[str] = None,
) -> dict[str, Any]:
    """Speed and memory of a :mod:`a2c_ppo_acktr.real_size` build under ``preset``'s settings (plus the
    overlay ``config`` and the ``settings`` overrides, which set the stage's small rollout).

    Measures one batched turn of ``act`` against a bare ``generate`` on the same prompts (seconds per
    decoded position), then on CUDA the peak allocated memory of a rollout of ``rollout.num_envs`` x
    ``num_steps`` turns and two training steps on its first minibatch (the second with the optimizer's
    moments allocated), against the memory formula at the shapes that rollout had (within
    :data:`REAL_SIZE_MEMORY_TOLERANCE`).

    Raises:
        SmokeFailure: the peak memory is outside the tolerance; the message has both numbers.
    """
    import torch

    from a2c_ppo_acktr import real_size_probe as probe
    from a2c_ppo_acktr.config.arguments import load_config, merge_dicts, parse_overrides
    from a2c_ppo_acktr.envs.batch import VSIBatchEnv
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.policy.model import VLMPolicy

    run = load_config(
        config=config,
        preset=preset,
        overrides=merge_dicts(parse_overrides(settings), {"model": {"model_path": model_path, "device": device}}),
    )
    on_cuda = device == "cuda"
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    policy = VLMPolicy(run.model, load_vlm(run.model))
    t1 = time.perf_counter()
    observations = VSIBatchEnv(run.env, run.rollout.num_envs, seed=seed * 1000).reset()
    timing = probe.decode_timing(policy, observations)
    tower_s, kept_s = probe.kept_frames_timing(policy, observations)
    if profile:  # where act's time per token goes, beside a bare generate's (GPU_SMOKE_PROFILE=1)
        probe.profile_decoders(policy, observations, PROFILE_TOKENS, profile)
    t2 = time.perf_counter()
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    storage = collect(policy, run.env, run.rollout.num_envs, run.rollout.num_steps, seed)
    first = next(iter(storage.minibatches(run.ppo.mini_batch_size, torch.Generator().manual_seed(seed))))
    probe.training_steps(policy, first, run.ppo.lr)
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None
    t3 = time.perf_counter()
    shapes = probe.measured_shapes(policy, storage, run.ppo.mini_batch_size, run.model.max_new_tokens)
    estimate = probe.estimated_peak_bytes(run, shapes) / 2**30
    preset_estimate = probe.preset_peak_bytes(run) / 2**30
    build = Path(model_path) / "real_size_build.json"
    result = {
        "model_path": model_path,
        "preset": preset,
        "dtype": run.model.dtype,
        "env_id": run.env.env_id,
        "build": json.loads(build.read_text(encoding="utf-8")) if build.is_file() else None,
        "num_envs": run.rollout.num_envs,
        "num_steps": run.rollout.num_steps,
        "mini_batch_size": run.ppo.mini_batch_size,
        "max_new_tokens": run.model.max_new_tokens,
        "image_size": run.env.image_size,
        "rollout_log_probs": policy.cfg.rollout_log_probs,
        "act_seconds": timing.act_seconds,
        "act_positions": timing.act_positions,
        "bare_seconds": timing.bare_seconds,
        "bare_positions": timing.bare_positions,
        "act_per_token_s": timing.act_per_token,
        "bare_per_token_s": timing.bare_per_token,
        "act_over_bare": timing.ratio,
        "act_goal": ACT_GENERATE_GOAL,
        "act_greedy_s": tower_s,
        "act_greedy_frames_kept_s": kept_s,
        "shapes": asdict(shapes),
        "peak_allocated_gib": peak,
        "estimate_gib": estimate,
        "memory_tolerance": REAL_SIZE_MEMORY_TOLERANCE,
        "preset_estimate_gib": preset_estimate,
        "phase_seconds": {"load": t1 - t0, "act_vs_generate": t2 - t1, "rollout_and_step": t3 - t2},
    }
    if peak is not None and abs(peak / estimate - 1.0) > REAL_SIZE_MEMORY_TOLERANCE:
        raise SmokeFailure(
            f"real size {preset}: peak allocated {peak:.2f} GiB over a rollout and two training steps is not within "
            f"{REAL_SIZE_MEMORY_TOLERANCE:.0%} of python -m a2c_ppo_acktr.memory's {estimate:.2f} GiB at the shapes "
            "that ran "
            f"({shapes.batch} turns x {shapes.seq} tokens, {shapes.images} images x {shapes.image_tokens} tokens): a "
            "term of the formula is off"
        )
    return result


# Decoded positions of each profiled call (a profile of the whole reply would be mostly repetition).
PROFILE_TOKENS = 16


def check_real_size_run(run_dir: str | os.PathLike, iterations: int) -> dict[str, Any]:
    """:func:`check_ppo_run` on the real-size PPO run (with ``ppo.old_log_probs=update`` its first
    ratio must be exactly 1), plus the seconds of each phase in :data:`REAL_SIZE_PHASES` (mean over
    the iterations after the first) and the ratio level.

    Raises:
        SmokeFailure: as :func:`check_ppo_run`.
    """
    import yaml

    from a2c_ppo_acktr.run.logger import read_metrics

    run_dir = Path(run_dir)
    result = check_ppo_run(run_dir, iterations)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    rows = read_metrics(run_dir / "metrics.jsonl")
    steady = rows[1:] or rows
    phases = {
        k: sum(float(r[k]) for r in steady) / len(steady) for k in REAL_SIZE_PHASES if all(k in r for r in steady)
    }
    return {
        **result,
        "ratio_level": cfg["ppo"].get("ratio_level", "sequence"),
        "phase_seconds": phases,
        "clip_coef": cfg["ppo"]["clip_coef"],
        "turns_per_iteration": cfg["rollout"]["num_envs"] * cfg["rollout"]["num_steps"],
    }


# ---------------------------------------------------------------------------------------------
# summary and the command line
# ---------------------------------------------------------------------------------------------
def summary_table(work: str | os.PathLike, device: str) -> str:
    """A markdown table of the stages' JSON files under ``work``."""
    work = Path(work)
    lines = ["| check | value | expected |", "|---|---|---|"]

    def load(name: str) -> Any:
        path = work / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    info = load("info.json") or {}
    gpus = info.get("gpus") or []
    lines.append(f"| device | {', '.join(g['name'] for g in gpus) if device == 'cuda' else 'cpu'} | |")
    lines.append(
        f"| torch / CUDA / flash-attn | {info.get('torch')} / {info.get('torch_cuda_build')} / "
        f"{info.get('flash_attn')} | |"
    )
    peaks = []
    ratio = load("ratio.json")
    for r in ratio_rows(ratio or []):
        lines.append(
            f"| ratio dev, tiny {r['dtype']} {r['attn_implementation']}, {r['setting']}, mode "
            f"{r['rollout_log_probs']}, {r['seeds']} seed(s) "
            f"| max {r['max_dev']:.3g}; {r['share_over_typical']:.0%} of {r['turns']} turns > {TYPICAL_DEV:g}, "
            f"{r['share_outside_clip']:.1%} outside the clip range {r['clip_coef']:g} | max < {r['bound']:g} |"
        )
        if r["peak_memory_gib"] is not None:
            peaks.append(r["peak_memory_gib"])
    if ratio is not None:
        lines.append(
            "| peak GPU memory (tiny model: act + one backward, own step) | "
            f"{f'{max(peaks):.2f} GiB' if peaks else 'n/a (cpu)'} | |"
        )
    ppo = load("ppo.json")
    if ppo:
        expected = "0 exactly" if ppo.get("old_log_probs") == "update" else f"< {ppo['bound']:g}"
        lines.append(
            f"| PPO ratio dev ({ppo['processes']} processes, {ppo['dtype']}, old log-probs "
            f"{ppo.get('old_log_probs', 'rollout')}) "
            f"| {ppo['ratio_max_dev']:.3g} | {expected} |"
        )
        lines.append(f"| PPO debug/param_rank_max_dev | {ppo['param_rank_max_dev']:g} | 0 |")
        lines.append(
            f"| PPO speed (time/iteration after the first) | {ppo['seconds_per_iteration']:.2f} s/it, "
            f"{ppo['env_steps_per_s']:.1f} env steps/s | |"
        )
    zero3 = load("ppo_zero3.json")
    if zero3:
        expected = "0 exactly" if zero3.get("old_log_probs") == "update" else f"< {zero3['bound']:g}"
        lines.append(
            f"| PPO ZeRO-3 ({zero3['processes']} processes, {zero3['dtype']}, 4-token logit chunks, validation) ratio "
            "dev "
            f"| {zero3['ratio_max_dev']:.3g} | {expected} |"
        )
    engine = load("engine.json")
    if engine:
        hf = f", HF engine {engine['hf_turns_per_s']:.1f}" if "hf_turns_per_s" in engine else ""
        version = f" {engine['vllm_version']}" if engine.get("vllm_version") else ""
        lines.append(
            f"| vLLM{version} engine: max abs(logp_engine - logp_policy) | {engine['logp_gap_max']:.3g} (mean "
            f"{engine['logp_gap_mean']:.3g}) "
            f"| <= {ENGINE_GAP_LIMIT:g} |"
        )
        lines.append(
            f"| vLLM engine: rollout turns/s (adapter sync {engine['sync_seconds']:.2f} s/it) | "
            f"{engine['engine_turns_per_s']:.1f}{hf} | |"
        )
    sft = load("sft.json")
    if sft:
        lines.append(f"| SFT loss after {sft['steps']} step(s) | {sft['loss']:.3f} | finite |")
    real = load("real.json")
    if real:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in real["phase_seconds"].items())
        lines.append(
            f"| real checkpoint {real['model_path']} ({real['preset']}): ratio dev | max {real['ratio_max_dev']:.3g}; "
            f"{real['share_outside_clip']:.1%} of {real['turns']} turns outside the clip {real['clip_coef']:g} | max < "
            f"{real['bound']:g}; "
            f"<= {REAL_OUTSIDE_CLIP_LIMIT:.0%} outside |"
        )
        lines.append(
            f"| real checkpoint: longest prompt + new tokens | {real['prompt_tokens_max']} + {real['max_new_tokens']} "
            f"| <= {real['context_limit']} positions |"
        )
        reserved = "n/a (cpu)" if real["reserved_gib"] is None else f"{real['reserved_gib']:.1f} GiB"
        lines.append(
            f"| real checkpoint: peak reserved memory (one GPU) | {reserved} | <= {REAL_MEMORY_SLACK:g} x estimate "
            f"{real['estimate_gib']:.1f} GiB |"
        )
        lines.append(f"| real checkpoint: phases | {phases} | |")
    lines += real_size_rows(load("real_size.json"), load("real_size_ppo.json"))
    return "\n".join(lines)


def real_size_rows(probe: Optional[dict[str, Any]], ppo: Optional[dict[str, Any]]) -> list[str]:
    """Summary rows of the real-size stage (its ``real-size`` and ``check-real-size`` JSON files)."""
    lines = []
    if probe:
        build = probe.get("build") or {}
        what = (
            f"real size {probe['preset']} ({build.get('architecture_of', '?')}'s architecture, "
            f"{build.get('num_parameters', 0):.3g} params, "
            f"{probe['dtype']}, random weights)"
        )
        lines.append(
            f"| {what}: act vs bare generate, {probe['num_envs']} envs x {probe['max_new_tokens']} tokens, s per "
            "decoded position "
            f"| act {probe['act_per_token_s'] * 1e3:.1f} ms, bare {probe['bare_per_token_s'] * 1e3:.1f} ms: "
            f"{probe['act_over_bare']:.2f}x "
            f"| goal <= {probe['act_goal']:g}x |"
        )
        if "act_greedy_frames_kept_s" in probe:
            lines.append(
                "| real size: greedy act, the tower on every frame / the frames' tower outputs kept "
                "(model.vision_cache_images) "
                f"| {probe['act_greedy_s']:.2f} s / {probe['act_greedy_frames_kept_s']:.2f} s | |"
            )
        s = probe["shapes"]
        peak = "n/a (cpu)" if probe["peak_allocated_gib"] is None else f"{probe['peak_allocated_gib']:.2f} GiB"
        lines.append(
            f"| real size: peak allocated, rollout {probe['num_envs']}x{probe['num_steps']} + two training steps "
            f"({s['batch']} turns x {s['prompt_tokens'] + s['response_tokens']} tokens, {s['images']} images x "
            f"{s['image_tokens']} tokens) "
            f"| {peak} | within {probe['memory_tolerance']:.0%} of the formula's {probe['estimate_gib']:.2f} GiB (the "
            "preset's own "
            f"table, its longest VSI turn: {probe['preset_estimate_gib']:.2f} GiB) |"
        )
        if build:
            lines.append(
                f"| real size: build (random weights on {build.get('device')}) + write | {build['build_seconds']:.1f} "
                f"s + {build['write_seconds']:.1f} s | |"
            )
    if ppo:
        expected = "0 exactly" if ppo["old_log_probs"] == "update" else f"< {ppo['bound']:g}"
        lines.append(
            f"| real size PPO ({ppo['processes']} process(es), {ppo['dtype']}, old log-probs {ppo['old_log_probs']}, "
            f"{ppo['ratio_level']} ratios): first-minibatch max abs(ratio-1) | {ppo['ratio_max_dev']:.3g} | {expected} "
            "|"
        )
        phases = ", ".join(f"{k.split('/', 1)[1]} {v:.1f} s" for k, v in ppo["phase_seconds"].items())
        lines.append(
            f"| real size PPO: s per iteration after the first ({ppo['turns_per_iteration']} turns) | {phases} | |"
        )
    return lines


def free_port() -> int:
    """A TCP port free on this host right now (for a launcher's main process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_json(path: Optional[str], data: Any) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.gpu_smoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "stage",
        choices=[
            "info",
            "ratio",
            "real",
            "real-size",
            "check-ppo",
            "check-real-size",
            "check-engine",
            "check-sft",
            "summary",
            "free-port",
        ],
    )
    p.add_argument(
        "--model",
        default=None,
        help="real: a local checkpoint directory (GPU_SMOKE_MODEL); real-size: the built directory",
    )
    p.add_argument(
        "--preset", default="qwen2.5-vl-3b", help="real, real-size: the preset whose settings the model runs with"
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default=os.environ.get("GPU_SMOKE_DEVICE", "cuda"))
    p.add_argument("--out", default=None, help="JSON file for this stage's numbers")
    p.add_argument(
        "--run-dir",
        default=None,
        help="check-ppo: the training run's directory (metrics.jsonl); check-sft: sft.output_dir",
    )
    p.add_argument("--iterations", type=int, default=2, help="check-ppo: iterations the run must have logged")
    p.add_argument("--hf-run-dir", default=None, help="check-engine: the HF-engine run to compare turns/s with")
    p.add_argument(
        "--profile", default=None, help="real-size: also profile act and a bare generate into this text file"
    )
    p.add_argument(
        "--vllm-version", default=None, help="check-engine: the server's vLLM version (reported in the summary)"
    )
    p.add_argument("--seeds", type=int, default=None, help="ratio: seeds per setting (default 4 on cuda, 1 on cpu)")
    p.add_argument("--work", default=None, help="summary: the directory holding the stages' JSON files")
    p.add_argument(
        "--config",
        default=None,
        help="ratio, real-size: an env overlay (configs/envs/*.yaml, ENV_CONFIG) merged over the preset",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="ratio, real-size: one more config override (repeatable)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one stage; prints ``GPU SMOKE FAILED: ...`` and returns 1 on a failed check."""
    args = _parser().parse_args(argv)
    try:
        if args.stage == "free-port":
            print(free_port())
        elif args.stage == "info":
            info = environment_info(args.device)
            for key, value in info.items():
                if key == "gpus":
                    for g in value:
                        print(
                            f"gpu {g['index']:<14d} {g['name']}, {g['memory_gib']} GiB, compute capability "
                            f"{g['capability']}"
                        )
                else:
                    print(f"{key:18s} {value}")
            _write_json(args.out, info)
            check_environment(info, args.device)
        elif args.stage == "ratio":
            results = run_ratio_stage(
                args.device,
                args.seeds if args.seeds is not None else (4 if args.device == "cuda" else 1),
                args.config,
                args.set,
            )
            _write_json(args.out, [asdict(r) for r in results])
            check_ratio_results(results)
        elif args.stage == "real":
            if not args.model:
                raise SmokeFailure("real needs --model (a local checkpoint directory)")
            result = real_checkpoint_check(args.device, args.model, args.preset)
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "real-size":
            if not args.model:
                raise SmokeFailure("real-size needs --model (a directory written by python -m a2c_ppo_acktr.real_size)")
            result = real_size_check(args.device, args.model, args.preset, args.config, args.set, profile=args.profile)
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "check-real-size":
            if not args.run_dir:
                raise SmokeFailure("check-real-size needs --run-dir (the run's output directory)")
            result = check_real_size_run(args.run_dir, args.iterations)
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "check-ppo":
            if not args.run_dir:
                raise SmokeFailure("check-ppo needs --run-dir (the run's output directory)")
            result = check_ppo_run(args.run_dir, args.iterations)
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "check-engine":
            if not args.run_dir:
                raise SmokeFailure("check-engine needs --run-dir (the run's output directory)")
            result = check_engine_run(args.run_dir, args.hf_run_dir)
            if args.vllm_version:
                result["vllm_version"] = args.vllm_version
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "check-sft":
            if not args.run_dir:
                raise SmokeFailure("check-sft needs --run-dir (sft.output_dir)")
            result = check_sft_run(args.run_dir)
            _write_json(args.out, result)
            print(json.dumps(result))
        elif args.stage == "summary":
            print(summary_table(args.work or ".", args.device))
    except SmokeFailure as e:
        print(f"{FAILED}: {args.stage}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

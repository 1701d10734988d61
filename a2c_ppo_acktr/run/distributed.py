"""Accelerator construction (plain, multi-process, DeepSpeed ZeRO), cross-rank metric reduction, shutdown.

The run config is the single source of truth for DeepSpeed: ``dist.zero_stage`` turns it on and
``dist.deepspeed_config`` names the JSON. ``"auto"`` entries of that JSON are filled from the run
config here, before accelerate sees them, because accelerate's own fallbacks are wrong for PPO
(it would set ``gradient_clipping`` to 1.0 instead of ``ppo.max_grad_norm``). Numeric entries that
contradict the run config are rejected at start.

Facts this module encodes: on CPU, DeepSpeed needs ``DS_ACCELERATOR=cpu`` and gloo; under
DeepSpeed the Accelerator must not get ``cpu=True``; the JSON must give
``train_micro_batch_size_per_gpu``; processes that imported DeepSpeed can abort at interpreter exit
unless the process group is destroyed first (:func:`shutdown`).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig

_DTYPE_TO_MIXED_PRECISION = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}


def use_cpu(cfg: RunConfig) -> bool:
    """Whether this run computes on CPU (asked for, or no CUDA device present)."""
    return cfg.model.device == "cpu" or not torch.cuda.is_available()


def _fill(ds: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Set ``ds[key]`` to ``value`` when missing or "auto"; reject a different explicit number."""
    current = ds.get(key, "auto")
    if current == "auto":
        ds[key] = value
    elif float(current) != float(value):
        raise ConfigError(
            f"DeepSpeed config sets {key}={current!r} but the run config has {source}={value!r}; "
            f'set {key} to "auto" in the JSON (the run config then wins) or make them equal'
        )


def deepspeed_config_dict(cfg: RunConfig) -> dict[str, Any]:
    """The DeepSpeed config for this run: ``dist.deepspeed_config`` with "auto" entries resolved.

    Resolved from the run config: ``zero_optimization.stage`` (``dist.zero_stage``),
    ``gradient_clipping`` (``ppo.max_grad_norm``: under DeepSpeed the engine clips, so the JSON value
    is the one that acts; they must agree), ``gradient_accumulation_steps``
    (``ppo.grad_accum_steps``), ``train_micro_batch_size_per_gpu`` (``ppo.mini_batch_size`` when
    "auto"; DeepSpeed only uses it for its throughput accounting),
    ``bf16``/``fp16`` ``enabled`` (``model.dtype``). ``data_types.grad_accum_dtype`` and
    ``communication_data_type`` default to ``fp32``.

    Raises:
        ConfigError: missing/invalid JSON or a value contradicting the run config.
    """
    if cfg.dist.deepspeed_config is None:
        ds: dict[str, Any] = {"zero_optimization": {"stage": cfg.dist.zero_stage}}
    else:
        path = Path(cfg.dist.deepspeed_config)
        if not path.is_file():
            raise ConfigError(
                f"dist.deepspeed_config={str(path)!r} does not exist; use scripts/ds_config.json or "
                "scripts/ds_config_zero3.json"
            )
        try:
            ds = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"dist.deepspeed_config={str(path)!r} is not valid JSON: {e}") from e
        ds = copy.deepcopy(ds)
    zero = ds.setdefault("zero_optimization", {})
    stage = zero.get("stage", "auto")
    if stage == "auto":
        zero["stage"] = cfg.dist.zero_stage
    elif int(stage) != cfg.dist.zero_stage:
        raise ConfigError(
            f"{cfg.dist.deepspeed_config} sets zero_optimization.stage={stage} but "
            f"dist.zero_stage={cfg.dist.zero_stage}; "
            "make them equal (scripts/ds_config.json is stage 2, scripts/ds_config_zero3.json stage 3)"
        )
    _fill(ds, "gradient_clipping", cfg.ppo.max_grad_norm, "ppo.max_grad_norm")
    _fill(ds, "gradient_accumulation_steps", cfg.ppo.grad_accum_steps, "ppo.grad_accum_steps")
    # Bookkeeping only for DeepSpeed (PPO cuts its own minibatches), so an explicit value is kept;
    # accelerate refuses "auto" without a dataloader to read it from.
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = cfg.ppo.mini_batch_size
    for key, want in (("bf16", cfg.model.dtype == "bfloat16"), ("fp16", cfg.model.dtype == "float16")):
        section = ds.setdefault(key, {"enabled": "auto"})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = want
        elif bool(section["enabled"]) != want:
            raise ConfigError(
                f"DeepSpeed config sets {key}.enabled={section['enabled']} but model.dtype={cfg.model.dtype!r}; set it "
                'to "auto"'
            )
    # Gradients summed over micro-batches and reduced over ranks in float32 unless the JSON says
    # otherwise: in bf16, 16 micro-batches x 8 ranks of sums keep 2-3 significant digits.
    ds.setdefault("data_types", {}).setdefault("grad_accum_dtype", "fp32")
    ds.setdefault("communication_data_type", "fp32")
    # accelerate recomputes train_batch_size from the micro batch and the world size.
    ds["train_batch_size"] = "auto"
    return ds


def build_accelerator(cfg: RunConfig):
    """Create the ``accelerate.Accelerator`` for this run.

    Single process, ``torchrun``/``accelerate launch`` multi-process (gloo on CPU), or DeepSpeed
    ZeRO (``dist.zero_stage > 0``) with the plugin built from :func:`deepspeed_config_dict`.

    Raises:
        ConfigError: the launcher and the run config disagree about DeepSpeed, or ``DS_ACCELERATOR``
            names a device other than the one the run uses.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    cpu = use_cpu(cfg)
    launched_with_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if launched_with_ds and cfg.dist.zero_stage == 0:
        raise ConfigError(
            "accelerate launch was given a DeepSpeed config but dist.zero_stage=0; pass "
            "--dist.zero_stage 2 --dist.deepspeed_config scripts/ds_config.json (or launch without the DeepSpeed "
            "config)"
        )
    handlers = []
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # gloo on CPU (NCCL needs GPUs; accelerate's default on GPU is right). Only under a launcher:
        # a backend given to a single process makes accelerate wait for a process group. The
        # timeout covers the first-run DeepSpeed op compilation on the other ranks.
        group_kwargs: dict[str, Any] = {"timeout": datetime.timedelta(minutes=30)}
        if cpu:
            group_kwargs["backend"] = "gloo"
        handlers.append(InitProcessGroupKwargs(**group_kwargs))
    launcher_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if launched_with_ds and launcher_file and launcher_file != "none":
        mine = cfg.dist.deepspeed_config
        if mine is None or Path(mine).resolve() != Path(launcher_file).resolve():
            raise ConfigError(
                f"accelerate launch uses DeepSpeed config {launcher_file!r} but dist.deepspeed_config={mine!r}; "
                f"pass --dist.deepspeed_config {launcher_file} so the run config records the file that is used"
            )
    plugin = None
    if cfg.dist.zero_stage > 0:
        if cpu:
            ds_acc = os.environ.get("DS_ACCELERATOR")
            if ds_acc is None:
                # Must be set before deepspeed is first imported, which happens inside accelerate below.
                os.environ["DS_ACCELERATOR"] = "cpu"
            elif ds_acc != "cpu":
                raise ConfigError(f"DS_ACCELERATOR={ds_acc!r} but this run is on CPU; export DS_ACCELERATOR=cpu")
        from accelerate.utils import DeepSpeedPlugin

        plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config_dict(cfg))
    return Accelerator(
        # DeepSpeed picks its device from DS_ACCELERATOR; accelerate must not be told cpu=True then.
        cpu=cpu and plugin is None,
        deepspeed_plugin=plugin,
        # The weights are already in model.dtype. Without DeepSpeed, "bf16"/"fp16" would make
        # accelerate autocast the update's forward but not the rollout's generate (which runs on
        # the unwrapped module), breaking ratio == 1 on the first minibatch. DeepSpeed needs the
        # flag to keep fp32 master weights of bf16/fp16 parameters; it does not autocast.
        mixed_precision=_DTYPE_TO_MIXED_PRECISION[cfg.model.dtype] if plugin is not None and not cpu else "no",
        # PPO steps every grad_accum_steps minibatches and checks this value (DeepSpeed gets the same).
        gradient_accumulation_steps=cfg.ppo.grad_accum_steps,
        kwargs_handlers=handlers,
    )


def is_deepspeed(accelerator) -> bool:
    """Whether ``accelerator`` runs DeepSpeed."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def zero_stage(policy: Any) -> int:
    """The ZeRO stage of a prepared policy (0 when it is not a DeepSpeed engine)."""
    stage = getattr(policy, "zero_optimization_stage", None)
    return int(stage()) if callable(stage) else 0


# > 0 while a gathered_for_rollout block runs: forwards are local there (each rank its own number of
# act calls, validation's episodes included), so nothing inside may be agreed with a collective.
_LOCAL_FORWARDS = 0


@contextlib.contextmanager
def gathered_for_rollout(policy: Any) -> Iterator[None]:
    """Hold the whole model on every rank for one rollout step (ZeRO-3); a no-op otherwise.

    Under ZeRO-3 every forward all-gathers the partitioned weights and is therefore a collective:
    ``generate`` would gather all weights once per decoded token, and ranks that decode different
    numbers of tokens, or run a forward that another rank skips (the value of a truncated episode's
    last observation), would fall out of step and hang. Inside this block the weights are gathered
    once and the engine's partitioning hooks are removed, so forwards are local and may differ
    between ranks; the hooks are restored on exit. The price is one full copy of the weights per
    rank while the block runs (the same as ZeRO-2 holds all the time).

    Args:
        policy: the module as prepared by accelerate (a ``DeepSpeedEngine`` under DeepSpeed).
    """
    if zero_stage(policy) != 3:
        yield
        return
    try:
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation
    except ImportError as e:  # added in DeepSpeed 0.16
        raise ConfigError(
            "ZeRO-3 rollouts need deepspeed>=0.16 (deepspeed.runtime.zero.stage3.unwrap_model_for_generation); upgrade "
            "deepspeed or use dist.zero_stage=2"
        ) from e
    global _LOCAL_FORWARDS
    with unwrap_model_for_generation(policy):
        _LOCAL_FORWARDS += 1
        try:
            yield
        finally:
            _LOCAL_FORWARDS -= 1


def agreed_chunk_count(needed: int, head: torch.nn.Module) -> int:
    """How many logit chunks this process makes: ``needed``, or under ZeRO-3 (``head``'s weight
    partitioned) the most any process needs.

    A partitioned ``lm_head`` all-gathers its weight at every call, in the forward and again in the
    checkpointed backward, so processes whose responses need different numbers of chunks would issue
    different numbers of collectives and hang. With the agreed count the others make empty chunks.
    One all-reduce of one integer per training forward; none without partitioning, and none inside
    :func:`gathered_for_rollout`, where the weights are whole on every rank and ranks run different
    numbers of forwards (act's recompute, validation's episodes): agreeing there would wait for a
    rank that never comes.
    """
    weight = getattr(head, "weight", None)
    if (
        weight is None
        or not hasattr(weight, "ds_id")
        or _LOCAL_FORWARDS > 0
        or not torch.distributed.is_initialized()
        or torch.distributed.get_world_size() == 1
    ):
        return needed
    on_gpu = torch.distributed.get_backend() == "nccl"
    count = torch.tensor(
        [needed], dtype=torch.long, device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu"
    )
    torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
    return int(count.item())


@contextlib.contextmanager
def full_trainable(module: torch.nn.Module) -> Iterator[list[tuple[str, torch.nn.Parameter]]]:
    """The trainable parameters by name, whole on every rank while the block runs (gathered from
    their ZeRO-3 partitions, a collective every rank must enter; a no-op without partitioning)."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    partitioned = [p for _, p in params if hasattr(p, "ds_id")]
    if not partitioned:
        yield params
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        yield params


def reduce_mean(accelerator, metrics: Mapping[str, float]) -> dict[str, float]:
    """Mean of each scalar metric over processes (identity in a single-process run).

    Raises:
        RuntimeError: processes logged different metric keys (the reduction would mix them up).
    """
    if accelerator.num_processes == 1:
        return dict(metrics)
    from accelerate.utils import gather_object

    keys = sorted(metrics)
    all_keys = gather_object([keys])
    if any(k != keys for k in all_keys):
        raise RuntimeError(f"processes logged different metric keys: {all_keys}; every rank must log the same keys")
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    values = accelerator.reduce(values, reduction="mean")
    return {k: float(v) for k, v in zip(keys, values.tolist())}


def gather_lists(accelerator, items: Sequence[Any]) -> list[Any]:
    """Concatenate per-process lists of picklable items (e.g. finished episodes) on every process."""
    if accelerator.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return list(gather_object(list(items)))


def shutdown(accelerator=None) -> None:
    """Finish a run cleanly: wait for all processes, then destroy the process group.

    Destroying the group before interpreter exit avoids the "terminate called without an active
    exception" abort seen in processes that imported DeepSpeed.
    """
    if accelerator is not None:
        accelerator.wait_for_everyone()
        accelerator.end_training()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if accelerator is None:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()

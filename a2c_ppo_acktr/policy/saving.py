"""A policy's files: the LoRA adapter (peft format) or the trainable weights, and the heads.

A policy directory holds what :func:`save_policy` writes and :func:`load_policy_files` reads back:
with LoRA, peft's ``adapter_config.json`` + ``adapter_model.safetensors`` (an SFT adapter's format,
so an SFT adapter and a PPO checkpoint load the same way); without it, ``trainable.safetensors``;
and always ``heads.safetensors`` (value head and temperature head, float32, with the family and
whether the temperature head exists in its metadata).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from torch import Tensor

from a2c_ppo_acktr.policy.loading import ModelLoadError, adapter_settings, record_base_model

Policy = Any  # a2c_ppo_acktr.policy.model.VLMPolicy, which imports this module

HEADS_FILE = "heads.safetensors"
FULL_WEIGHTS_FILE = "trainable.safetensors"  # trainable weights when training without LoRA


def heads_state(policy: Policy) -> dict[str, Tensor]:
    """The heads' weights by name (``value_head.*``, ``temp_predictor.*``), float32 CPU copies."""
    state = {f"value_head.{k}": v for k, v in policy.value_head.state_dict().items()}
    if policy.temp_predictor is not None:
        state.update({f"temp_predictor.{k}": v for k, v in policy.temp_predictor.state_dict().items()})
    return {k: v.detach().float().cpu().contiguous() for k, v in state.items()}


def save_policy(policy: Policy, out_dir: str | os.PathLike) -> Path:
    """Write the adapter (peft format) or the trainable weights, and ``heads.safetensors``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if policy.cfg.use_lora:
        # LoRA on embed_tokens leaves the base embedding as it was: peft's "auto" would still copy the
        # whole matrix into every checkpoint (1 GB for a 7B model's vocabulary).
        policy.model.save_pretrained(str(out), save_embedding_layers=False)
        record_base_model(out)
    else:
        state = {n: p.detach().cpu().contiguous() for n, p in policy.model.named_parameters() if p.requires_grad}
        save_file(state, str(out / FULL_WEIGHTS_FILE))
    meta = {"use_temp_predictor": str(policy.temp_predictor is not None), "family": policy.family}
    save_file(heads_state(policy), str(out / HEADS_FILE), metadata=meta)
    return out


def load_policy_files(policy: Policy, in_dir: str | os.PathLike) -> None:
    """Load what :func:`save_policy` wrote (adapter or trainable weights, then the heads)."""
    if policy.cfg.use_lora:
        load_adapter(policy, in_dir)
    else:
        from safetensors.torch import load_file

        state = load_file(str(Path(in_dir) / FULL_WEIGHTS_FILE), device=str(policy.device))
        missing = set(state) - {n for n, _ in policy.model.named_parameters()}
        if missing:
            raise ValueError(f"{in_dir} holds weights this model does not have: {sorted(missing)[:5]}")
        policy.model.load_state_dict(state, strict=False)
    load_heads(policy, in_dir)


def load_heads(policy: Policy, in_dir: str | os.PathLike) -> None:
    """Load ``heads.safetensors`` written by :func:`save_policy`.

    Raises:
        FileNotFoundError: no heads file there.
        ModelLoadError: the file is truncated or damaged.
        ValueError: it was saved with the temperature head on and the policy has it off, or back.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(in_dir) / HEADS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; point at a directory written by VLMPolicy.save_pretrained")
    try:
        with safe_open(str(path), "pt") as f:
            saved_temp = (f.metadata() or {}).get("use_temp_predictor")
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(
            f"{path} cannot be read ({type(e).__name__}: {e}); the file is truncated or damaged"
        ) from e
    if saved_temp is not None and saved_temp != str(policy.temp_predictor is not None):
        raise ValueError(
            f"{path} was saved with use_temp_predictor={saved_temp} but model.use_temp_predictor="
            f"{policy.cfg.use_temp_predictor}; set model.use_temp_predictor to match the checkpoint"
        )
    policy.value_head.load_state_dict(
        {k[len("value_head.") :]: v for k, v in state.items() if k.startswith("value_head.")}
    )
    if policy.temp_predictor is not None:
        policy.temp_predictor.load_state_dict(
            {k[len("temp_predictor.") :]: v for k, v in state.items() if k.startswith("temp_predictor.")}
        )


def load_adapter(policy: Policy, path: str | os.PathLike) -> None:
    """Load LoRA weights saved by peft ``save_pretrained`` (an SFT warm start) into the policy's adapter.

    Raises:
        ValueError: no LoRA here, or the saved adapter's rank/alpha/targets do not fit.
        ModelLoadError: the adapter's files are truncated or damaged.
    """
    cfg = policy.cfg
    if not cfg.use_lora:
        raise ValueError("load_adapter needs model.use_lora=true")
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    path = Path(path)
    saved = adapter_settings(path)
    if saved["lora_r"] != cfg.lora_r or saved["lora_alpha"] != cfg.lora_alpha:
        raise ValueError(
            f"adapter at {path} has r={saved['lora_r']}, lora_alpha={saved['lora_alpha']} but the policy uses "
            f"model.lora_r={cfg.lora_r}, model.lora_alpha={cfg.lora_alpha}; build the policy from a config "
            "that loading.adopt_adapter_settings adapted to the adapter (as eval and --sft-adapter do)"
        )
    try:
        weights = load_peft_weights(str(path), device=str(policy.device))
    except (SafetensorError, OSError, EOFError, ValueError, RuntimeError) as e:
        raise ModelLoadError(
            f"adapter at {path} cannot be read ({type(e).__name__}: {e}); the file is truncated or damaged"
        ) from e
    result = set_peft_model_state_dict(policy.model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(
            f"adapter at {path} holds weights this policy has no place for (targets differ?): {unexpected[:5]}"
        )
    own = {k for k in policy.model.state_dict() if "lora_" in k}
    if not weights or len(weights) < len(own):
        raise ValueError(
            f"adapter at {path} holds {len(weights)} tensors but the policy's adapter has {len(own)}; "
            "model.lora_target_modules must match the SFT run's"
        )

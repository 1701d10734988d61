"""Real-size Qwen-VL architectures with random weights, built offline: memory, speed and numerics
of a real model on a machine that cannot download one.

``python -m a2c_ppo_acktr.real_size --preset qwen2.5-vl-3b --out DIR`` builds the architecture of the
checkpoint a GPU preset trains (its ``model.model_path``) from the values of its public
``config.json`` (:data:`a2c_ppo_acktr.memory.KNOWN_CONFIGS`), with random weights, and writes a
directory that ``--model.model_path DIR`` (:func:`~a2c_ppo_acktr.policy.loading.load_vlm`) loads:

- the language model and vision tower at the checkpoint's sizes, the embedding and ``lm_head`` at the
  checkpoint's vocabulary rows (tied where the checkpoint ties them), initialised by the model class
  under ``--seed``, in ``--dtype`` on ``--device`` (on a GPU the weights are created there directly:
  Qwen2.5-VL-3B's 3.75e9 parameters build in seconds);
- the tokenizer and chat template of the tiny build of the same family (:mod:`a2c_ppo_acktr.tiny`), whose
  special-token ids the config names. Its ~1.2k tokens are far fewer than the embedding's rows; the
  policy forbids the rows past the tokenizer (:func:`~a2c_ppo_acktr.policy.loading.forbidden_token_ids`),
  so sampled ids always decode;
- the family's processor with the checkpoint's own pixel budget and normalisation (its
  ``preprocessor_config.json`` values): a preset's ``model.min_pixels``/``max_pixels`` then apply on
  top exactly as they would to the real checkpoint.

Random weights give flat output distributions, so a log-prob ratio measured on such a model is an
upper bound on a trained model's; memory, time per token and shapes are the real ones.

Reductions make CPU proxies of the same architecture: ``--text-layers`` (decoder layers),
``--vision-blocks`` (tower blocks; Qwen2.5-VL keeps its windowed blocks with the full-attention
indexes that still exist, at least the last block; Qwen3-VL keeps the deepstack indexes that exist,
at least the last block), ``--hidden`` and ``--vision-hidden`` (widths at the checkpoint's head
dimension, MLPs scaled in proportion). Every value not reduced is the checkpoint's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from a2c_ppo_acktr.common.errors import UserError

DTYPES = ("float32", "bfloat16", "float16")
BUILD_RECORD = "real_size_build.json"


class RealSizeError(ValueError, UserError):
    """A real-size build cannot be made as asked; the message says what to change."""


@dataclass(frozen=True)
class Reductions:
    """Sizes to shrink for a CPU proxy; ``None`` keeps the checkpoint's value.

    Attributes:
        text_layers: decoder layers of the language model.
        vision_blocks: blocks of the vision tower.
        hidden: the language model's width (a multiple of its head dimension).
        vision_hidden: the vision tower's width (a multiple of its head dimension).
    """

    text_layers: Optional[int] = None
    vision_blocks: Optional[int] = None
    hidden: Optional[int] = None
    vision_hidden: Optional[int] = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value < 1:
                raise RealSizeError(
                    f"--{name.replace('_', '-')}={value} must be >= 1 (or left out to keep the checkpoint's value)"
                )


# ---------------------------------------------------------------------------------------------
# Which checkpoint a preset trains
# ---------------------------------------------------------------------------------------------
def real_size_presets() -> dict[str, str]:
    """``preset -> hub id`` for every preset under ``configs/`` whose ``model.model_path`` has its
    config values in :data:`~a2c_ppo_acktr.memory.KNOWN_CONFIGS`."""
    from a2c_ppo_acktr.config.arguments import list_presets, load_yaml, preset_path
    from a2c_ppo_acktr.memory import KNOWN_CONFIGS

    out = {}
    for name in list_presets():
        model_path = (load_yaml(preset_path(name)).get("model") or {}).get("model_path")
        if model_path in KNOWN_CONFIGS:
            out[name] = model_path
    return out


def hub_id_of(preset: str) -> str:
    """The checkpoint ``preset`` trains, when its config values are known.

    Raises:
        RealSizeError: ``preset`` is not one of :func:`real_size_presets`; the message lists them.
    """
    presets = real_size_presets()
    if preset not in presets:
        raise RealSizeError(f"no real-size architecture for preset {preset!r}; known: {', '.join(sorted(presets))}")
    return presets[preset]


# ---------------------------------------------------------------------------------------------
# The config
# ---------------------------------------------------------------------------------------------
def _scaled(value: int, ratio: float, multiple: int) -> int:
    """``value * ratio`` rounded up to ``multiple`` (kernels like widths with many factors of 2)."""
    return max(multiple, -(-int(round(value * ratio)) // multiple) * multiple)


def _reduce_text(text: dict[str, Any], r: Reductions) -> None:
    """Apply ``r.text_layers`` and ``r.hidden`` to a text config's fields, in place."""
    if r.text_layers is not None:
        text["num_hidden_layers"] = r.text_layers
    if r.hidden is None:
        return
    heads, hidden = text["num_attention_heads"], text["hidden_size"]
    head_dim = text.get("head_dim") or hidden // heads
    if r.hidden % head_dim:
        raise RealSizeError(
            f"--hidden={r.hidden} must be a multiple of the checkpoint's head dimension {head_dim} (RoPE sections fit "
            "it)"
        )
    new_heads = r.hidden // head_dim
    # Keep grouped-query attention: as many query heads per key/value head as the checkpoint, or fewer.
    group = heads // text["num_key_value_heads"]
    kv = max(1, new_heads // group)
    while new_heads % kv:
        kv -= 1
    text.update(
        hidden_size=r.hidden,
        num_attention_heads=new_heads,
        num_key_value_heads=kv,
        intermediate_size=_scaled(text["intermediate_size"], r.hidden / hidden, 64),
    )


def _kept_indexes(indexes: Sequence[int], depth: int) -> list[int]:
    """The block indexes below ``depth``, or the last block when none is."""
    kept = [i for i in indexes if i < depth]
    return kept or [depth - 1]


def _reduce_vision(vision: dict[str, Any], r: Reductions) -> None:
    """Apply ``r.vision_blocks`` and ``r.vision_hidden`` to a vision config's fields, in place."""
    if r.vision_blocks is not None:
        vision["depth"] = r.vision_blocks
        # Qwen2.5-VL: windowed blocks with full attention at these indexes; Qwen3-VL: blocks whose
        # outputs feed the first decoder layers (deepstack). Both must name existing blocks.
        for key in ("fullatt_block_indexes", "deepstack_visual_indexes"):
            if key in vision:
                vision[key] = _kept_indexes(vision[key], r.vision_blocks)
    if r.vision_hidden is None:
        return
    width = _tower_width_key(vision)
    heads, hidden = vision["num_heads"], vision[width]
    head_dim = hidden // heads
    if r.vision_hidden % head_dim:
        raise RealSizeError(
            f"--vision-hidden={r.vision_hidden} must be a multiple of the tower's head dimension {head_dim}"
        )
    vision.update({width: r.vision_hidden, "num_heads": r.vision_hidden // head_dim})
    if "intermediate_size" in vision:  # Qwen2-VL's MLP follows its width by mlp_ratio
        vision["intermediate_size"] = _scaled(vision["intermediate_size"], r.vision_hidden / hidden, 16)


def _tower_width_key(vision: dict[str, Any]) -> str:
    """The vision config's field for the tower's width: Qwen2-VL's ``embed_dim`` (its ``hidden_size`` is
    the merger's output), else ``hidden_size``."""
    return "embed_dim" if "embed_dim" in vision else "hidden_size"


def config_fields(hub_id: str, reductions: Reductions = Reductions()) -> dict[str, Any]:
    """The ``config.json`` fields of ``hub_id`` from :data:`~a2c_ppo_acktr.memory.KNOWN_CONFIGS`, reduced."""
    from a2c_ppo_acktr.memory import KNOWN_CONFIGS

    fields = copy.deepcopy({k: v for k, v in KNOWN_CONFIGS[hub_id].items() if k not in ("min_pixels", "max_pixels")})
    _reduce_text(fields["text_config"], reductions)
    _reduce_vision(fields["vision_config"], reductions)
    # The merger projects the tower's output to the language model's width.
    vision = fields["vision_config"]
    vision["hidden_size" if _tower_width_key(vision) == "embed_dim" else "out_hidden_size"] = fields["text_config"][
        "hidden_size"
    ]
    return fields


def build_config(hub_id: str, tokenizer: Any, reductions: Reductions = Reductions()) -> Any:
    """The ``PretrainedConfig`` of ``hub_id`` (reduced) with ``tokenizer``'s special-token ids."""
    from transformers import AutoConfig

    from a2c_ppo_acktr.tiny import build as tiny

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS}
    fields = config_fields(hub_id, reductions)
    fields["text_config"].update(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    return AutoConfig.for_model(
        **fields,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def build_processor(hub_id: str, tokenizer: Any) -> Any:
    """The family's processor around ``tokenizer`` with the checkpoint's pixel budget, patch sizes and
    normalisation (Qwen2.5-VL: CLIP's mean and std, the processor's default; Qwen3-VL: 0.5 / 0.5)."""
    import dataclasses

    from a2c_ppo_acktr.tiny import build as tiny
    from a2c_ppo_acktr.memory import KNOWN_CONFIGS

    known = KNOWN_CONFIGS[hub_id]
    vision = known["vision_config"]
    spec = dataclasses.replace(
        tiny.tiny_spec(known["model_type"]),
        min_pixels=known["min_pixels"],
        max_pixels=known["max_pixels"],
        patch_size=vision["patch_size"],
        merge_size=vision["spatial_merge_size"],
        temporal_patch_size=vision["temporal_patch_size"],
        image_mean=None,
        image_std=None,
    )
    return tiny.build_processor(spec, tokenizer)


# ---------------------------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------------------------
def _progress(message: str) -> None:
    print(f"real_size: {message}", file=sys.stderr, flush=True)


def _check_out(out: Path) -> None:
    """Refuse to write where user files are (or could be) replaced."""
    if out.is_file() or out.is_symlink():
        raise RealSizeError(f"--out {out} is a file or a link; name a new directory")
    if out.is_dir() and any(out.iterdir()):
        raise RealSizeError(f"--out {out} exists and is not empty; name a new directory (nothing is overwritten)")


def _check_device(device: str) -> None:
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise RealSizeError(f"--device {device!r} is not a device ({e}); use cpu, cuda or cuda:N") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise RealSizeError(
            f"--device {device} but CUDA is not available here; use --device cpu (with reductions for a CPU proxy)"
        )


def _instantiate(config: Any, dtype: str, device: str, seed: int) -> Any:
    """The model of ``config`` with the class's random initialisation, created on ``device``."""
    import torch
    from transformers import AutoModelForImageTextToText

    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with torch.device(device):
            return AutoModelForImageTextToText.from_config(config, dtype=getattr(torch, dtype))


def build_real_size(
    preset: str,
    out: str | os.PathLike,
    reductions: Reductions = Reductions(),
    dtype: str = "bfloat16",
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Build ``preset``'s architecture with random weights into the new directory ``out``.

    The files are written into a temporary sibling directory renamed into place, so ``out`` is
    either complete or absent.

    Args:
        preset: a preset of :func:`real_size_presets`.
        out: a directory that does not exist or is empty.
        reductions: sizes to shrink (CPU proxies); the default keeps the checkpoint's.
        dtype: the weights' dtype (``float32``, ``bfloat16``, ``float16``).
        device: where the weights are created (``cpu``, ``cuda``, ``cuda:1``).
        seed: seeds the initialisation.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        RealSizeError: an unknown preset or dtype, an ``out`` that holds files, or a reduction that
            does not fit the architecture.
    """
    from transformers import GenerationConfig

    from a2c_ppo_acktr.tiny import build as tiny

    hub_id = hub_id_of(preset)
    if dtype not in DTYPES:
        raise RealSizeError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    _check_device(device)
    out = Path(out)
    _check_out(out)
    family = _family(hub_id)
    t0 = time.perf_counter()
    tokenizer = tiny.build_tokenizer(tiny.tiny_spec(family), tiny.training_corpus())
    config = build_config(hub_id, tokenizer, reductions)
    text, vision = config.get_text_config(), config.vision_config
    _progress(
        f"building {preset} ({hub_id}'s architecture: {text.num_hidden_layers} text layers of width "
        f"{text.hidden_size}, "
        f"{vision.depth} vision blocks of width {vision.hidden_size}, {text.vocab_size} vocabulary rows) "
        f"with random weights in {dtype} on {device}"
    )
    model = _instantiate(config, dtype, device, seed)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    params = sum(p.numel() for p in model.parameters())
    t_built = time.perf_counter()
    _progress(f"{params / 1e6:,.1f}M parameters in {t_built - t0:.1f} s; writing {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        build_processor(hub_id, tokenizer).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "preset": preset,
            "architecture_of": hub_id,
            "reductions": asdict(reductions),
            "dtype": dtype,
            "device": device,
            "seed": seed,
            "num_parameters": int(params),
            "tokenizer_size": len(tokenizer),
            "vocab_rows": int(text.vocab_size),
            "build_seconds": round(t_built - t0, 2),
            "write_seconds": round(time.perf_counter() - t_built, 2),
        }
        (tmp / BUILD_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
        _check_out(out)  # nothing appeared there while building
        if out.is_dir():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _progress(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return out


def _family(hub_id: str) -> str:
    from a2c_ppo_acktr.memory import KNOWN_CONFIGS

    return KNOWN_CONFIGS[hub_id]["model_type"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.real_size",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", required=True, help="a GPU preset whose checkpoint's config is known (qwen2.5-vl-3b, ...)"
    )
    p.add_argument("--out", required=True, help="a new (or empty) directory for the model, tokenizer and processor")
    p.add_argument("--text-layers", type=int, default=None, help="decoder layers (default: the checkpoint's)")
    p.add_argument("--vision-blocks", type=int, default=None, help="vision tower blocks (default: the checkpoint's)")
    p.add_argument(
        "--hidden",
        type=int,
        default=None,
        help="language model width, a multiple of its head dimension (default: the checkpoint's)",
    )
    p.add_argument(
        "--vision-hidden",
        type=int,
        default=None,
        help="vision tower width, a multiple of its head dimension (default: the checkpoint's)",
    )
    p.add_argument("--dtype", default="bfloat16", help=f"weights' dtype: {', '.join(DTYPES)} (default bfloat16)")
    p.add_argument("--device", default="cpu", help="where the weights are created: cpu (default), cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed")
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    """CLI: build a preset's architecture into ``--out`` and print the directory."""
    args = _parser().parse_args(argv)
    reductions = Reductions(
        text_layers=args.text_layers,
        vision_blocks=args.vision_blocks,
        hidden=args.hidden,
        vision_hidden=args.vision_hidden,
    )
    print(build_real_size(args.preset, args.out, reductions, dtype=args.dtype, device=args.device, seed=args.seed))


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(run_main(main, "python -m a2c_ppo_acktr.real_size"))

"""The one place that loads vision-language models and their processors.

``load_vlm(cfg)`` resolves ``cfg.model_path`` (``tiny:<family>``, a local directory, or a hub id
available in the local HF cache), detects the family from ``config.model_type`` (never from the
path), and loads ``AutoModelForImageTextToText`` + ``AutoProcessor`` with the dtype, attention
implementation, device and pixel budget from :class:`~a2c_ppo_acktr.config.arguments.ModelConfig`. On CUDA
the weights load straight onto the rank's GPU (:func:`placement_kwargs`), never as a full host copy.

The processor's tokenizer is set to LEFT padding: the policy batches prompts of unequal length
into one ``generate`` call, and new tokens must follow each prompt's last real token.

The checkpoint's ``generation_config.json`` is set aside at load (``LoadedVLM.shipped_generation_config``)
and the model keeps only its token ids. ``generate`` fills every knob a call leaves unset from the
model's config (Qwen2.5-VL ships temperature 0.1, top_p 0.001, top_k 1, repetition_penalty 1.05;
transformers 4.x also replaced knobs left at their default values), so the rollout would sample from
a distribution other than the one whose log-probs are trained on. Sampling is what the run's config
says, whatever the checkpoint ships; the benchmark's video protocol and ``export`` use the shipped one.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from safetensors import SafetensorError  # a truncated or garbage .safetensors file

from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.common import atomic
from a2c_ppo_acktr.common.errors import UserError

log = logging.getLogger(__name__)

TINY_PREFIX = "tiny:"

# model_type -> family name used across the package. Qwen2/2.5/3-VL and LLaVA (``llava``) are tested
# on tiny models on CPU (``tiny:<family>``). No real checkpoint of any family is tested here (no GPU,
# no downloads).
SUPPORTED_FAMILIES: dict[str, str] = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "llava": "llava",
    "llava_next": "llava_next",
}
# Families that load through the same Auto classes but would run wrong: why, in one line each.
REFUSED_FAMILIES: dict[str, str] = {
    "llava_onevision": (
        "LLaVA-OneVision is refused until its encoding is built: the policy hands the processor a flat image "
        "list, so every frame takes the single-image anyres path (~3,700 tokens for a 448 px frame instead of "
        "~730; 10 frames make a 37k-token prompt) and each minibatch re-processes its images"
    ),
}

# Special tokens the processors insert for images/videos (Qwen's, then LLaVA's); generating one is
# never valid. Tokens a tokenizer does not know are skipped.
_VISION_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
)


class ModelLoadError(RuntimeError, UserError):
    """A model or processor could not be found or loaded; the message says how to fix it."""


class ContextLengthError(ValueError, UserError):
    """A prompt plus the response budget does not fit the model's positions; the message names the
    settings to lower."""


@dataclass
class LoadedVLM:
    """A loaded model with its processor.

    Attributes:
        model: the ``PreTrainedModel`` (``AutoModelForImageTextToText``), in eval mode, on its device.
        processor: the family's processor; ``processor.tokenizer.padding_side == "left"``.
        family: a value of :data:`SUPPORTED_FAMILIES` (from ``config.model_type``).
        path: the resolved local directory or hub id it was loaded from.
        shipped_generation_config: the checkpoint's own ``GenerationConfig``; ``model.generation_config``
            holds only its token ids (:func:`neutral_generation_config`). None when built by hand.
    """

    model: Any
    processor: Any
    family: str
    path: str
    shipped_generation_config: Any = None


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    return any(
        os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def resolve_model_path(path: str) -> str:
    """Turn a user's ``model_path`` into something ``from_pretrained`` can load.

    Args:
        path: ``tiny:<family>`` (the cached offline tiny model, built on first use), a local
            directory, or a hub id (``Qwen/Qwen2.5-VL-3B-Instruct``).

    Returns:
        A local directory, or the hub id unchanged.

    Raises:
        ModelLoadError: a local path that does not exist, an unknown tiny family, or a hub id that
            is not in the local cache while offline mode is on.
    """
    if path.startswith(TINY_PREFIX):
        from a2c_ppo_acktr.tiny import build as tiny

        family = path[len(TINY_PREFIX) :]
        if family not in tiny.BUILDS:
            raise ModelLoadError(
                f"model_path={path!r}: unknown tiny family {family!r}; use one of "
                f"{[TINY_PREFIX + f for f in tiny.BUILDS]}"
            )
        return str(tiny.tiny_model_dir(family))
    expanded = Path(path).expanduser()
    if expanded.is_dir():
        if not (expanded / "config.json").is_file():
            raise ModelLoadError(
                f"model_path={path!r} is a directory without config.json; point it at a saved model "
                "(the folder holding config.json and the weights), or use model.model_path=tiny:qwen2_5_vl for CPU"
            )
        return str(expanded)
    if expanded.exists():
        raise ModelLoadError(
            f"model_path={path!r} is a file; point it at the directory holding config.json and the weights"
        )
    # A hub id is "name" or "org/name"; anything else that names a path must exist locally.
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or os.sep != "/" and os.sep in path:
        raise ModelLoadError(
            f"model path {path!r} does not exist (resolved to {str(expanded.resolve())!r}); check the path, or "
            "for a CPU run without downloads set model.model_path=tiny:qwen2_5_vl"
        )
    if is_offline() and not _in_hf_cache(path):
        raise ModelLoadError(
            f"model {path!r} is not a local directory and not in the local Hugging Face cache, and offline mode is on "
            "(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it first with `huggingface-cli download "
            f"{path}` on a machine with network, pass a local directory, or use model.model_path=tiny:qwen2_5_vl for "
            "CPU"
        )
    return path


def record_base_model(adapter_dir: str | os.PathLike) -> None:
    """Make a saved peft adapter name its base model by an absolute path when that is a local directory.

    peft records ``base_model_name_or_path`` as given at load time; a relative path
    (``outputs/quickstart/model``) breaks ``AutoPeftModel*.from_pretrained`` and vLLM from any other
    working directory. Hub ids are kept as they are. Rewritten atomically; no-op without the file.
    """
    import json

    config = Path(adapter_dir) / "adapter_config.json"
    if not config.is_file():
        return
    data = json.loads(config.read_text(encoding="utf-8"))
    base = data.get("base_model_name_or_path")
    if not base or os.path.isabs(base) or not Path(base).is_dir():
        return
    data["base_model_name_or_path"] = str(Path(base).resolve())
    atomic.write_json(data, config)


def detect_family(model_type: str) -> str:
    """Map a config's ``model_type`` to a supported family.

    Raises:
        ModelLoadError: ``model_type`` is not supported; the message lists what is.
    """
    if model_type in REFUSED_FAMILIES:
        raise ModelLoadError(
            f"model_type {model_type!r}: {REFUSED_FAMILIES[model_type]}; supported: {sorted(SUPPORTED_FAMILIES)}"
        )
    if model_type not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"model_type {model_type!r} is not supported; supported model types: {sorted(SUPPORTED_FAMILIES)} "
            "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL and LLaVA, each tested on a tiny CPU model)"
        )
    return SUPPORTED_FAMILIES[model_type]


def resolve_device(device: str) -> str:
    """``auto`` -> this process's CUDA device when CUDA is available (``LOCAL_RANK`` under a
    launcher), else ``cpu``. ``cuda`` without CUDA raises."""
    import torch

    if device == "cpu":
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("model.device=cuda but CUDA is not available; use model.device=cpu or auto")
    if device in ("auto", "cuda") and torch.cuda.is_available():
        # Modulo: under SLURM each process may see only its own GPU (CUDA_VISIBLE_DEVICES).
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
    return "cpu"


def placement_kwargs(device: str) -> dict[str, Any]:
    """``from_pretrained`` arguments that load the weights straight onto ``device``.

    On CUDA, ``device_map={"": device}`` makes transformers copy each checkpoint tensor onto this
    rank's GPU as it is read, instead of building the whole model in host memory and moving it
    after: with 8 ranks on a node, 8 full host copies at once (8 x 16 GB for a 7B model in bf16)
    are what fills a node's RAM during start-up. ``low_cpu_mem_usage`` asks transformers 4.x for the
    same meta-device loading (5.x always loads that way and ignores the flag). Under DeepSpeed
    ZeRO-3 (accelerate has registered the ZeRO-3 config with transformers) ``zero.Init`` partitions
    the weights while loading and a device map is refused, so nothing is added; nor on CPU, whose
    loading stays as it was.

    Args:
        device: a :func:`resolve_device` result (``cpu`` or ``cuda:<index>``).

    Returns:
        Keyword arguments for ``from_pretrained`` (empty on CPU and under ZeRO-3).
    """
    if not device.startswith("cuda"):
        return {}
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return {}
    return {"device_map": {"": device}, "low_cpu_mem_usage": True}


def load_processor(
    path: str,
    min_pixels: Optional[int] = None,
    max_pixels: Optional[int] = None,
    padding_side: str = "left",
):
    """Load the processor of ``path`` (resolved with :func:`resolve_model_path`).

    Args:
        path: anything :func:`resolve_model_path` accepts.
        min_pixels, max_pixels: image budget overrides; None keeps the saved values.
        padding_side: tokenizer padding side; ``left`` for batched generation.
    """
    from transformers import AutoProcessor

    if padding_side not in ("left", "right"):
        raise ModelLoadError(f"padding_side={padding_side!r} must be 'left' (generation) or 'right'")
    resolved = resolve_model_path(path)
    try:
        processor = AutoProcessor.from_pretrained(resolved, local_files_only=is_offline())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load a processor from {resolved!r}: {e}") from e
    set_pixel_budget(processor, min_pixels, max_pixels)
    processor.tokenizer.padding_side = padding_side
    return processor


def set_pixel_budget(processor, min_pixels: Optional[int], max_pixels: Optional[int]) -> None:
    """Override the image (and video) processors' pixel budget in place; None keeps a bound."""
    if min_pixels is None and max_pixels is None:
        return
    for name in ("image_processor", "video_processor"):
        sub = getattr(processor, name, None)
        if sub is None:
            continue
        size = {k: v for k, v in dict(getattr(sub, "size", None) or {}).items() if v is not None}
        # A pixel budget is Qwen-VL's {shortest_edge: min pixels, longest_edge: max pixels}; CLIP's
        # (LLaVA's) lone shortest_edge is an edge length in pixels, not a pixel count.
        if "shortest_edge" not in size or "longest_edge" not in size:
            raise ModelLoadError(
                f"{type(sub).__name__} has no min/max pixel budget (size={size}, not Qwen-VL's "
                "shortest_edge/longest_edge "
                "pixel counts); unset model.min_pixels/max_pixels for this model"
            )
        if min_pixels is not None:
            size["shortest_edge"] = int(min_pixels)
        if max_pixels is not None:
            size["longest_edge"] = int(max_pixels)
        if size["shortest_edge"] > size["longest_edge"]:
            raise ModelLoadError(
                f"model.min_pixels={size['shortest_edge']} exceeds model.max_pixels={size['longest_edge']}; make min "
                "<= max"
            )
        sub.size = type(sub.size)(**size) if not isinstance(sub.size, dict) else size


# [lowest, first untested) (major, minor) of the libraries whose behaviour the suite pins, as setup.py
# pins them. Outside, load_vlm stops (VSI_PPO_ALLOW_UNTESTED_VERSIONS=1 makes it a warning).
# deepspeed is checked only where it is installed.
TESTED_VERSIONS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "transformers": ((5, 24), (6, 0)),
    "peft": ((0, 21), (0, 22)),
    "accelerate": ((1, 15), (1, 16)),
    "deepspeed": ((0, 19), (0, 20)),
}
ALLOW_UNTESTED_ENV = "VSI_PPO_ALLOW_UNTESTED_VERSIONS"


def _major_minor(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        parts.append(int(digits) if digits else 0)
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def untested_versions(installed: Optional[dict[str, str]] = None) -> list[str]:
    """One phrase per installed library outside :data:`TESTED_VERSIONS` (``installed``: name -> version,
    default: what is installed)."""
    from importlib import metadata

    if installed is None:
        installed = {}
        for name in TESTED_VERSIONS:
            try:
                installed[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
    bad = []
    for name, version in installed.items():
        low, high = TESTED_VERSIONS[name]
        if not low <= _major_minor(version) < high:
            bad.append(f"{name} {version} (tested: >={low[0]}.{low[1]},<{high[0]}.{high[1]})")
    return bad


def check_versions(installed: Optional[dict[str, str]] = None) -> None:
    """Stop with one line when a pinned library is outside its tested range; a warning instead under
    ``VSI_PPO_ALLOW_UNTESTED_VERSIONS=1``."""
    bad = untested_versions(installed)
    if not bad:
        return
    message = (
        f"untested library versions: {'; '.join(bad)}. Reinstall with 'bash scripts/setup.sh' "
        f"(or pip install -e .), or set {ALLOW_UNTESTED_ENV}=1 to run anyway"
    )
    if os.environ.get(ALLOW_UNTESTED_ENV, "") == "1":
        log.warning(message)
        return
    raise ModelLoadError(message)


def flash_attn_importable() -> bool:
    """Whether the ``flash_attn`` package imports (built for this torch and CUDA)."""
    try:
        import flash_attn  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or an OSError/RuntimeError from a build for another torch
        return False
    return True


def resolve_attn_implementation(choice: str, device: str, dtype: str) -> str:
    """``model.attn_implementation`` as loaded: ``auto`` is ``flash_attention_2`` on CUDA in bf16/fp16
    when ``flash_attn`` imports, else ``sdpa``; any other choice is kept."""
    if choice != "auto":
        return choice
    if device.startswith("cuda") and dtype in ("bfloat16", "float16") and flash_attn_importable():
        return "flash_attention_2"
    return "sdpa"


def load_vlm(cfg: ModelConfig) -> LoadedVLM:
    """Load the policy VLM and its processor as ``cfg`` says.

    Returns:
        :class:`LoadedVLM` with the model in eval mode on ``cfg.device`` (``auto``: CUDA if
        available) and the processor padding on the left.

    Raises:
        ModelLoadError: the path cannot be resolved, the model type is unsupported, loading fails, or a
            library is outside its tested versions (:func:`check_versions`).
    """
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    check_versions()
    path = resolve_model_path(cfg.model_path)
    offline = is_offline()
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=offline)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not read the model config of {path!r}: {e}") from e
    family = detect_family(config.model_type)
    dtype = getattr(torch, cfg.dtype)  # ModelConfig admits only float32 | bfloat16 | float16
    device = resolve_device(cfg.device)
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            attn_implementation=resolve_attn_implementation(cfg.attn_implementation, device, cfg.dtype),
            local_files_only=offline,
            **placement_kwargs(device),
        )
    except (OSError, ValueError, ImportError, SafetensorError, EOFError, RuntimeError) as e:
        raise ModelLoadError(
            f"could not load model {path!r} (dtype={cfg.dtype}, attn_implementation={cfg.attn_implementation}): "
            f"{type(e).__name__}: {e}; a truncated or damaged weights file needs a fresh copy"
        ) from e
    model.to(device)  # a no-op when placement_kwargs already put it there
    model.eval()
    shipped = getattr(model, "generation_config", None)
    if shipped is not None:
        model.generation_config = neutral_generation_config(shipped)
    dropped = (
        sorted(set(shipped.to_diff_dict()) - set(model.generation_config.to_diff_dict()) - {"transformers_version"})
        if shipped is not None
        else []
    )
    if dropped:
        log.info(
            "set aside the decoding defaults of %s's generation_config (%s); sampling follows the run's config",
            path,
            ", ".join(f"{k}={getattr(shipped, k)!r}" for k in dropped),
        )
    processor = load_processor(path, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    return LoadedVLM(model=model, processor=processor, family=family, path=path, shipped_generation_config=shipped)


# What a neutral generation config keeps from the checkpoint's: which ids start, end and pad a reply.
GENERATION_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def neutral_generation_config(shipped: Any) -> Any:
    """A ``GenerationConfig`` with ``shipped``'s token ids and nothing else.

    ``generate`` fills each knob a call leaves unset (``None``) from the model's config, so a
    checkpoint's ``min_p``, ``suppress_tokens``, ``sequence_bias``, ``top_k``... would silently reshape
    the sampled distribution. With this as the model's config, the unset knobs fall to transformers'
    neutral defaults (temperature 1, no truncation, no penalty).
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        **{k: getattr(shipped, k, None) for k in GENERATION_TOKEN_FIELDS if getattr(shipped, k, None) is not None}
    )


def forbidden_token_ids(processor, vocab_size: Optional[int] = None, allowed: Iterable[int] = ()) -> list[int]:
    """Token ids a policy must never generate.

    These are the vision placeholders (Qwen's ``<|image_pad|>``..., LLaVA's ``<image>``) and every
    other special token except the end-of-turn token (``eos``, ``<|im_end|>`` for Qwen) plus, when
    ``vocab_size`` (the model's embedding rows) is larger than the tokenizer, the unused padding rows. A random tiny
    model samples
    ``<|image_pad|>`` readily, and a sampled placeholder breaks the next forward (image-token
    count mismatch); the same list must mask the training forward so log-probs agree.

    Args:
        processor: a loaded processor (or a bare tokenizer).
        vocab_size: the model's vocabulary size (``model.config.get_text_config().vocab_size``).
        allowed: extra ids to keep generatable.

    Returns:
        Sorted unique ids.
    """
    tok = getattr(processor, "tokenizer", processor)
    keep = {
        i
        for i in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"))
        if i is not None and i != tok.unk_token_id
    }
    keep |= set(allowed)
    ids: set[int] = set()
    for t in _VISION_TOKENS:
        i = tok.convert_tokens_to_ids(t)
        if i is not None and i != tok.unk_token_id:
            ids.add(int(i))
    for i, added in tok.added_tokens_decoder.items():
        if added.special:
            ids.add(int(i))
    if vocab_size is not None and vocab_size > len(tok):
        ids.update(range(len(tok), vocab_size))
    return sorted(ids - keep)


def adapter_settings(adapter_dir: str | os.PathLike) -> dict[str, Any]:
    """What a saved LoRA adapter says about itself (its ``adapter_config.json``): ``lora_r``,
    ``lora_alpha``, ``lora_target_modules`` (peft's regex string as saved, or a list of module-name
    suffixes turned into the equivalent regex) and ``base_model`` (None when not recorded).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``adapter_dir``.
        ModelLoadError: the file is not a JSON object with an integer ``r``.
    """
    import json
    import re

    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; pass a directory written by peft save_pretrained (an SFT adapter or a "
            "checkpoint's policy/)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); the adapter is damaged") from e
    if not isinstance(data, dict) or not isinstance(data.get("r"), int):
        raise ModelLoadError(f"{path} has no integer 'r'; is it a LoRA adapter's config?")
    targets = data.get("target_modules")
    if isinstance(targets, (list, tuple)) and targets:
        targets = r"(?:.*\.)?(?:" + "|".join(re.escape(str(t)) for t in sorted(targets)) + ")"
    return {
        "lora_r": data["r"],
        "lora_alpha": data.get("lora_alpha", data["r"]),
        "lora_target_modules": targets if isinstance(targets, str) and targets else None,
        "base_model": data.get("base_model_name_or_path") or None,
    }


def adopt_adapter_settings(
    model_cfg: ModelConfig, adapter_dir: str | os.PathLike, take_base: bool = False
) -> list[str]:
    """Set ``model_cfg``'s LoRA rank, alpha and targets (and with ``take_base`` its ``model_path``) to
    what the adapter at ``adapter_dir`` was saved with, in place. Returns one line per setting the
    config held otherwise, naming both values (the caller logs them as warnings): an adapter is loaded
    as it is, never refused for a config that did not describe it.
    """
    saved = adapter_settings(adapter_dir)
    notes = []
    for field_name in ("lora_r", "lora_alpha", "lora_target_modules"):
        value = saved[field_name]
        if value is not None and getattr(model_cfg, field_name) != value:
            notes.append(
                f"adapter {adapter_dir} was saved with {field_name.replace('lora_', 'LoRA ')}={value!r}; using it "
                "instead of "
                f"model.{field_name}={getattr(model_cfg, field_name)!r}"
            )
            setattr(model_cfg, field_name, value)
    base = saved["base_model"]
    if base and base != model_cfg.model_path:
        if take_base and (not _looks_like_path(base) or Path(base).exists()):
            notes.append(
                f"adapter {adapter_dir} names its base model {base!r}; using it instead of "
                f"model.model_path={model_cfg.model_path!r}"
            )
            model_cfg.model_path = base
        else:
            notes.append(
                f"adapter {adapter_dir} was trained on {base!r} but model.model_path is {model_cfg.model_path!r}; "
                "loading it on the configured model"
            )
    return notes


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` is a filesystem path rather than a hub id (``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") != 1

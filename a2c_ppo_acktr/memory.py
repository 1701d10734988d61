"""Per-GPU memory of PPO training, from the model's config, the preset's shapes and the dtype.

``python -m a2c_ppo_acktr.memory --preset qwen2.5-vl-7b [--gpus 8] [--section.key value ...]`` prints
one line per term with its formula and its size; ``docs/TRAINING.md`` shows the output for the GPU
presets. Every number comes from a config: the model's own (a local directory, ``tiny:<family>``, or
for the two hub models that cannot be read offline the values of their public ``config.json`` in
:data:`KNOWN_CONFIGS`), and the run config's shapes (``ppo.mini_batch_size``, ``env.image_size``,
frames and history, ``model.max_new_tokens``, ``model.lora_r``, ``model.dtype``, ``dist.zero_stage``,
``model.gradient_checkpointing``).

The activation formula counts what autograd keeps for backward in one decoder layer of a
Qwen2-style block (RMSNorm, GQA attention through sdpa, SwiGLU MLP) with LoRA on its seven
projections and frozen base weights. It was derived by listing every tensor saved for backward
(``torch.autograd.graph.saved_tensors_hooks``); ``tests/test_memory.py`` checks it against that
list byte for byte, and the whole update's total against a measured peak. Per token, with ``b``
the activation dtype's bytes and ``a`` the LoRA weights' bytes:

- each RMSNorm keeps its input upcast to float32 and its float32 ``rsqrt``: ``2 * (4H + 4)``;
- LoRA ``A`` matrices keep their input: the two norm outputs (``2bH``) when ``a == b``, or one cast
  copy per adapter (``a(5H + q + I)``) when the adapters are float32 and the model is not (peft
  keeps adapters in float32 unless DeepSpeed casts the module), plus ``7ar`` for the ``B`` inputs;
- sdpa keeps q, k, v and its output, ``b(2q + 2kv)``, and a float32 log-sum-exp per head; with a
  padding mask transformers repeats k and v to all heads (``kv -> q``) and sdpa keeps its own copy
  of the mask converted to the dtype, per layer: ``B * T^2 * b`` (seen on CPU; counted everywhere);
- the MLP keeps the gate and up outputs and the activation (``3bI``) and ``down``'s LoRA input.

Nothing is kept for the frozen embeddings nor for the first layer's input norm (no gradient flows
there); the final norm keeps ``4H + 4``, which makes up for it. Gradient checkpointing keeps each
layer's input (``bH``) and recomputes one layer at a time in backward.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

GIB = 1024**3

# Values of the public config.json of each checkpoint on the Hugging Face hub: the numbers this
# estimate needs, and those where the config class's defaults differ from the checkpoint (positions,
# norm epsilon, RoPE), so that :mod:`a2c_ppo_acktr.real_size` builds the same architecture; the rest
# takes the class's defaults. The estimate uses them only when the model is neither a local directory
# nor in the local HF cache, so that the table prints offline.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen2-VL names its tower's width embed_dim (MLP mlp_ratio x wider) and its merger's output hidden_size.
    "Qwen/Qwen2-VL-2B-Instruct": {
        "model_type": "qwen2_vl",
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        },
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "hidden_size": 1536,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "min_pixels": 3136,
        "max_pixels": 12845056,
    },
    "Qwen/Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        },
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "min_pixels": 3136,
        "max_pixels": 12845056,
    },
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
        },
        # preprocessor_config.json
        "min_pixels": 3136,
        "max_pixels": 12845056,
    },
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
        },
        "min_pixels": 3136,
        "max_pixels": 12845056,
    },
    "Qwen/Qwen3-VL-4B-Instruct": {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-06,
            "rope_theta": 5000000,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        },
        "vision_config": {
            "depth": 24,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "out_hidden_size": 2560,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [5, 11, 17],
        },
        "min_pixels": 65536,
        "max_pixels": 16777216,
    },
    "Qwen/Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-06,
            "rope_theta": 5000000,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "out_hidden_size": 4096,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24],
        },
        "min_pixels": 65536,
        "max_pixels": 16777216,
    },
}

# A representative long turn for the text-token count: a VSI-Bench route-planning question (the
# longest question type) with four options, the feedback of a blocked move.
SAMPLE_QUESTION = (
    "You are a robot beginning at the sofa facing the tv. You want to navigate to the refrigerator. You will "
    "perform the following actions (Note: for each [please fill in], choose either 'turn back,' 'turn left,' "
    "or 'turn right.'): 1. Go forward until the tv 2. [please fill in] 3. Go forward until the table "
    "4. [please fill in] 5. Go forward until the refrigerator. You have reached the final destination."
)
SAMPLE_OPTIONS = (
    "A. Turn Left, Turn Right",
    "B. Turn Right, Turn Left",
    "C. Turn Back, Turn Left",
    "D. Turn Left, Turn Back",
)
# Characters per text token for models whose tokenizer is not at hand: byte-level BPE vocabularies
# of ~150k entries (Qwen) average about 4 characters of English per token.
CHARS_PER_TOKEN = 4.0
CHAT_TEMPLATE_TOKENS = 16  # <|im_start|>/<|im_end|> pairs, role names and newlines of a 2-message prompt
# Float32 (chunk, V) tensors alive at once in the backward of one chunk of chunked_token_stats:
# the logits kept for the temperature's gradient, log-softmax, probabilities, the zeroed
# log-probs, the reference's, a product and their gradients. Measured peak (CPU, RSS, V = 65536):
# 9.5 copies with the KL, 6.3 without.
CHUNK_FP32_COPIES = 10
# Assumed GPU overheads beside the tensors (typical values; the GPU smoke test's real-checkpoint stage
# checks the total against torch.cuda.max_memory_reserved): the CUDA context with the kernel images of
# torch and its libraries, NCCL's communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers), and
# the caching allocator's fragmentation under prompts of varying length.
CUDA_CONTEXT_BYTES = 0.75 * 1024**3
NCCL_BUFFER_BYTES = 0.5 * 1024**3
FRAGMENTATION_SHARE = 0.15


@dataclass(frozen=True)
class ModelDims:
    """The numbers of a model the estimate needs (from its config; parameters counted on ``meta``).

    Attributes:
        hidden, intermediate, layers, heads, kv_heads, head_dim, vocab: the language model's sizes.
        total_params: every parameter of the model (tied weights once).
        lora_params: parameters LoRA adds with the run's rank and target regex.
        trainable_extra: parameters of the vision modules ``model.train_vision`` trains (0 for none).
        vision_patches_per_token: vision-tower patches per visual token (spatial_merge_size ** 2).
        vision_hidden, vision_intermediate: the vision tower's widths (0 without one).
        patch_factor: pixels per visual token side (patch_size * spatial_merge_size), 0 if unknown.
        min_pixels, max_pixels: the image processor's default pixel budget (0 if unknown).
        source: where the config came from (a path, or "KNOWN_CONFIGS[...]").
    """

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    total_params: int
    lora_params: int
    trainable_extra: int
    vision_patches_per_token: int
    vision_hidden: int
    vision_intermediate: int
    patch_factor: int
    min_pixels: int
    max_pixels: int
    source: str
    # Feature maps the tower hands the language model per visual token: the merged tokens, plus
    # Qwen3-VL's deepstack layers.
    vision_outputs_per_token: int = 1

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Shapes:
    """One update minibatch and one rollout batch.

    Attributes:
        batch: turns per minibatch (``ppo.mini_batch_size``), rows padded to the longest.
        prompt_tokens: prompt length of a turn (images expanded), the longest turn.
        response_tokens: generated tokens (``model.max_new_tokens``).
        padded: rows differ in length, so a padding mask reaches attention.
        num_envs: rows of the rollout's batched ``generate``.
        images: images per turn; image_tokens: visual tokens per image.
        pixel_values: float32 pixel values the processor makes per image (elements).
        text_tokens: non-image prompt tokens; exact when the processor was at hand.
        text_exact: whether text_tokens were counted by the model's own processor.
    """

    batch: int
    prompt_tokens: int
    response_tokens: int
    padded: bool
    num_envs: int
    images: int
    image_tokens: int
    pixel_values: int
    text_tokens: int
    text_exact: bool

    @property
    def seq(self) -> int:
        """``T``: tokens of a ``[prompt | response]`` row."""
        return self.prompt_tokens + self.response_tokens

    @property
    def tokens(self) -> int:
        """``N = B * T``: tokens through the model per minibatch."""
        return self.batch * self.seq


@dataclass(frozen=True)
class Setup:
    """How the run trains: dtypes, sharding, checkpointing (from the run config)."""

    dtype_bytes: int  # b: weights and activations
    lora_bytes: int  # a: LoRA weights (float32 unless DeepSpeed casts the module to the dtype)
    zero_stage: int
    gpus: int
    gradient_checkpointing: bool
    reduce_bucket_elements: int  # DeepSpeed's gradient bucket (reduce_bucket_size)
    lora_r: int
    vision_cache_images: int = 0  # model.vision_cache_images where the tower's outputs are reused, else 0


@dataclass(frozen=True)
class Term:
    """One line of the table."""

    name: str
    bytes: float
    formula: str
    # "static": the whole run; "update": kept through a minibatch's forward+backward; "transient":
    # the update's short-lived peaks, one at a time (the largest counts); "rollout": act()'s own
    # peak; "info": not in the peak (the other checkpointing setting, or not concurrent); "overhead":
    # what the GPU holds besides tensors (CUDA context, NCCL buffers, fragmentation), added on top.
    group: str
    # "computed": from the model's dimensions and the run's shapes; "measured": a constant measured
    # here (CPU peak RSS); "assumed": a typical value, not measured on this package.
    basis: str = "computed"


# ---------------------------------------------------------------------------------------------
# Model numbers
# ---------------------------------------------------------------------------------------------
def _on_disk(model_path: str) -> bool:
    """True for ``tiny:<family>``, a local directory, or a hub id in the local HF cache."""
    from a2c_ppo_acktr.policy.loading import TINY_PREFIX, _in_hf_cache

    return model_path.startswith(TINY_PREFIX) or Path(model_path).expanduser().is_dir() or _in_hf_cache(model_path)


def _config_for(model_path: str) -> tuple[Any, str, dict[str, Any]]:
    """``(config, source, known)`` of ``model_path``: its own config when it is on disk, else the
    :data:`KNOWN_CONFIGS` entry (no network: the table prints on a machine without the model),
    else whatever ``from_pretrained`` can fetch."""
    from transformers import AutoConfig

    from a2c_ppo_acktr.policy.loading import ModelLoadError, is_offline, resolve_model_path

    if model_path in KNOWN_CONFIGS and not _on_disk(model_path):
        known = KNOWN_CONFIGS[model_path]
        fields = {k: v for k, v in known.items() if k not in ("min_pixels", "max_pixels")}
        return AutoConfig.for_model(**fields), f"KNOWN_CONFIGS[{model_path!r}] (public config.json)", known
    path = resolve_model_path(model_path)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=is_offline())
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"cannot read the config of {model_path!r} ({e}); download it, or add its numbers to "
            f"a2c_ppo_acktr.memory.KNOWN_CONFIGS (now {sorted(KNOWN_CONFIGS)})"
        ) from e
    # the name the user gave (tiny:..., a hub id), not the machine's cache path
    return config, f"{model_path} (its config.json)", {}


def model_dims(model_cfg: Any) -> ModelDims:
    """:class:`ModelDims` of ``model_cfg.model_path`` with ``model_cfg``'s LoRA rank and targets and
    the vision modules ``model_cfg.train_vision`` trains.

    Parameters are counted on an instance built on the ``meta`` device (no memory, no weights), so
    tied embeddings, biases and the vision tower count exactly as they load.
    """
    import torch
    from torch import nn
    from transformers import AutoModelForImageTextToText

    from a2c_ppo_acktr.policy.model import VISION_MODULES

    config, source, known = _config_for(model_cfg.model_path)
    text = config.get_text_config()
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    lora = 0
    if model_cfg.use_lora:
        for name, module in model.named_modules():
            # peft matches a string target_modules with re.fullmatch on the module's full name
            if isinstance(module, nn.Linear) and re.fullmatch(model_cfg.lora_target_modules, name):
                lora += model_cfg.lora_r * (module.in_features + module.out_features)
    extra = 0
    train_vision = model_cfg.train_vision
    suffixes = VISION_MODULES.get(config.model_type, {}).get(train_vision, []) if train_vision != "none" else []
    for name, module in model.named_modules():
        if any(name == s or name.endswith("." + s) for s in suffixes):
            extra += sum(p.numel() for p in module.parameters())
    vision = getattr(config, "vision_config", None)
    merge = int(getattr(vision, "spatial_merge_size", 1) or 1)
    patch = int(getattr(vision, "patch_size", 0) or 0)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    # Qwen2-VL's tower is embed_dim wide with an MLP of mlp_ratio x that; its hidden_size is the merger's output.
    vision_width = int(getattr(vision, "embed_dim", None) or getattr(vision, "hidden_size", 0) or 0)
    vision_mlp = int(
        getattr(vision, "intermediate_size", None) or vision_width * float(getattr(vision, "mlp_ratio", 0) or 0)
    )
    return ModelDims(
        hidden=int(text.hidden_size),
        intermediate=int(text.intermediate_size),
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        vocab=int(text.vocab_size),
        total_params=int(total),
        lora_params=int(lora),
        trainable_extra=int(extra),
        vision_patches_per_token=merge * merge,
        patch_factor=patch * merge,
        vision_hidden=vision_width,
        vision_intermediate=vision_mlp,
        min_pixels=int(known.get("min_pixels", 0)),
        max_pixels=int(known.get("max_pixels", 0)),
        source=source,
        vision_outputs_per_token=1 + len(getattr(vision, "deepstack_visual_indexes", None) or []),
    )


def head_params(hidden: int, value_head_hidden: int, temp_head_hidden: int, use_temp_predictor: bool) -> int:
    """Parameters of the value head and the temperature head (two-layer MLPs on the hidden state)."""
    mlp = lambda width: hidden * width + width + width + 1  # noqa: E731 - Linear(h, w) + Linear(w, 1)
    return mlp(value_head_hidden) + (mlp(temp_head_hidden) if use_temp_predictor else 0)


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------
def sample_observation(env_cfg: Any, blank_images: bool = True) -> dict:
    """A long turn of ``env_cfg``: the most images a turn carries (sweep + history) and
    :data:`SAMPLE_QUESTION` with a blocked move's feedback."""
    import numpy as np

    from a2c_ppo_acktr.common import prompts

    n_views = env_cfg.image_history
    text = prompts.observation_text(
        SAMPLE_QUESTION,
        list(SAMPLE_OPTIONS),
        prompts.feedback_text(prompts.Move(-90.0, 2.5), collided=True, walked_m=1.25),
        turns_left=env_cfg.max_turns,
        num_sweep_frames=env_cfg.num_sweep_frames,
        num_views=n_views,
        max_forward=env_cfg.max_forward,
        object_labels=env_cfg.object_labels,
    )
    size = env_cfg.image_size
    images = (
        [np.full((size, size, 3), 128, dtype=np.uint8) for _ in range(env_cfg.num_sweep_frames + n_views)]
        if blank_images
        else []
    )
    return {"images": images, "text": text}


def _qwen_image_tokens(size: int, dims: ModelDims, min_pixels: Optional[int], max_pixels: Optional[int]) -> int:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    factor = dims.patch_factor
    h, w = smart_resize(
        size, size, factor=factor, min_pixels=min_pixels or dims.min_pixels, max_pixels=max_pixels or dims.max_pixels
    )
    return (h // factor) * (w // factor)


def preset_shapes(run: Any, dims: ModelDims) -> Shapes:
    """:class:`Shapes` of a run config: counted with the model's processor when it can be loaded
    (exact), else from the Qwen-VL resize rule and :data:`CHARS_PER_TOKEN` (estimate)."""
    from a2c_ppo_acktr.common import prompts
    from a2c_ppo_acktr.policy.loading import ModelLoadError, load_processor

    obs = sample_observation(run.env)
    n_img = len(obs["images"])
    processor = None
    if _on_disk(run.model.model_path):
        try:
            processor = load_processor(
                run.model.model_path, min_pixels=run.model.min_pixels, max_pixels=run.model.max_pixels
            )
        except (ModelLoadError, OSError, ValueError):
            processor = None  # a model directory without processor files: estimate as for a hub id
    if processor is not None:
        text = prompts.render_prompt(processor, prompts.build_messages(obs))
        enc = processor(text=[text], images=obs["images"] or None, return_tensors="pt")
        ids = enc["input_ids"][0]
        tok = processor.tokenizer
        image_ids = {tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<image>")} - {None, tok.unk_token_id}
        n_image_tokens = int(sum(int((ids == i).sum()) for i in image_ids))
        prompt = int(ids.numel())
        per_image = n_image_tokens // max(n_img, 1)
        pixels = int(enc["pixel_values"].numel()) // max(n_img, 1) if "pixel_values" in enc else 0
        text_tokens, exact = prompt - n_image_tokens, True
    else:
        per_image = _qwen_image_tokens(run.env.image_size, dims, run.model.min_pixels, run.model.max_pixels)
        chars = len(prompts.system_prompt(obs)) + len(obs["text"])
        text_tokens = (
            math.ceil(chars / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS + 2 * n_img
        )  # + vision start/end per image
        prompt, exact = text_tokens + per_image * n_img, False
        # Qwen-VL: 3 channels x 2 frames (an image is repeated to the temporal patch) per resized pixel
        pixels = per_image * dims.patch_factor**2 * 3 * 2
    return Shapes(
        batch=run.ppo.mini_batch_size,
        prompt_tokens=prompt,
        response_tokens=run.model.max_new_tokens,
        padded=run.ppo.mini_batch_size > 1,
        num_envs=run.rollout.num_envs,
        images=n_img,
        image_tokens=per_image,
        pixel_values=pixels,
        text_tokens=text_tokens,
        text_exact=exact,
    )


# ---------------------------------------------------------------------------------------------
# The formula
# ---------------------------------------------------------------------------------------------
def layer_bytes_per_token(d: ModelDims, s: Setup, padded: bool) -> float:
    """Bytes one decoder layer keeps for backward per token (see the module docstring)."""
    H, q, inter, b, a, r = d.hidden, d.q_dim, d.intermediate, s.dtype_bytes, s.lora_bytes, s.lora_r
    kv = q if padded else d.kv_dim  # transformers repeats k, v to every head when a mask is passed to sdpa
    norms = 2 * (4 * H + 4)
    lora_inputs = 2 * b * H if a == b else a * (5 * H + q)
    attention = b * (2 * q + 2 * kv) + 4 * d.heads
    mlp = 3 * b * inter + a * inter
    return norms + lora_inputs + attention + mlp + 7 * a * r


def layer_formula(d: ModelDims, s: Setup, padded: bool) -> str:
    kv = "q" if padded else "kv"
    lora = "2bH" if s.lora_bytes == s.dtype_bytes else "a(5H+q)"
    return f"8H+8 + {lora} + b(2q+2{kv}) + 4heads + 3bI + aI + 7ar"


def chunk_tokens(d: ModelDims, shapes: Shapes) -> int:
    from a2c_ppo_acktr.policy.distributions import logits_chunk_tokens

    return min(logits_chunk_tokens(d.vocab), shapes.batch * shapes.response_tokens)


def _n(x: float) -> str:
    """A count in engineering notation: ``8.29e9``, ``242e6``, ``97.5e3``."""
    for exp in (9, 6, 3):
        if abs(x) >= 10**exp:
            v = x / 10**exp
            return f"{v:.3g}e{exp}"
    return f"{x:g}"


def estimate(d: ModelDims, shapes: Shapes, s: Setup, heads: int = 0) -> list[Term]:
    """The table's terms, in bytes per GPU.

    Args:
        d: model numbers; shapes: minibatch and rollout shapes; s: dtypes, ZeRO, checkpointing.
        heads: parameters of the value/temperature heads (trained, float32 unless DeepSpeed casts them).

    Returns:
        :class:`Term` s; :func:`totals` adds them up by group.
    """
    b, a, n, z = s.dtype_bytes, s.lora_bytes, s.gpus, s.zero_stage
    B, T, N, R = shapes.batch, shapes.seq, shapes.tokens, shapes.response_tokens
    H, L, V = d.hidden, d.layers, d.vocab
    P, Pt = d.total_params, d.lora_params + d.trainable_extra + heads
    shard, per_gpu = (n, f" / {n}") if z == 3 else (1, "")
    terms = [
        Term("weights", P * b / shard, f"params x b{per_gpu} = {_n(P)} x {b}{per_gpu}", "static"),
        Term(
            "trainable params (LoRA + heads)",
            Pt * a / shard,
            f"P_train x a{per_gpu} = {_n(Pt)} x {a}{per_gpu}",
            "static",
        ),
    ]
    if z > 0:
        terms.append(
            Term(
                "fp32 master + Adam m, v (ZeRO-sharded)",
                12 * Pt / n,
                f"12 x P_train / gpus = 12 x {_n(Pt)} / {n}",
                "static",
            )
        )
    else:
        terms.append(Term("Adam m, v", 8 * Pt, f"8 x P_train = 8 x {_n(Pt)}", "static"))
    if z >= 2:
        bucket = min(s.reduce_bucket_elements, Pt)
        terms.append(
            Term(
                "gradients (partition + reduce bucket)",
                Pt * a / n + bucket * a,
                f"P_train x a / gpus + bucket x a = {_n(Pt)} x {a} / {n} + {_n(bucket)} x {a}",
                "update",
            )
        )
    else:
        terms.append(Term("gradients", Pt * a, f"P_train x a = {_n(Pt)} x {a}", "update"))
    n_img = B * shapes.images
    terms.append(
        Term(
            "inputs: pixel values (float32)",
            n_img * shapes.pixel_values * 4,
            f"B x images x pixel values per image x 4 = {B} x {shapes.images} x {_n(shapes.pixel_values)} x 4",
            "update",
        )
    )
    per_layer = layer_bytes_per_token(d, s, shapes.padded)
    kv = d.q_dim if shapes.padded else d.kv_dim
    mask = B * T * T * b if shapes.padded else 0
    rope = 2 * b * d.head_dim * N
    mask_txt = " + B*T^2*b" if shapes.padded else ""
    full = L * (N * per_layer + mask) + rope
    ckpt = L * N * b * H + N * (4 * H + 4) + rope
    gc_on = s.gradient_checkpointing
    terms.append(
        Term(
            "activations kept for backward, no checkpointing",
            full,
            f"L x (N x [{layer_formula(d, s, shapes.padded)}]{mask_txt}) + 2b*hd*N; "
            f"N = B x T = {B} x {T}, {per_layer / 1e3:.1f} kB/token/layer",
            "info" if gc_on else "update",
        )
    )
    terms.append(
        Term(
            "activations kept for backward, gradient checkpointing",
            ckpt,
            "L x N x bH (each layer's input) + N(4H+4) (final norm) + 2b*hd*N",
            "update" if gc_on else "info",
        )
    )
    # On top of what is kept, the largest transient: a layer's backward (the gradients of its MLP
    # intermediates and of its input) and, under checkpointing, that layer's kept tensors
    # recomputed first; or, under checkpointing, a layer run forward without keeping anything,
    # whose intermediates all exist at once. (The KL reference's no-grad forward runs before the
    # policy's, on top of nothing kept.)
    backward_ws = N * b * (3 * d.intermediate + 2 * H)
    if gc_on:
        forward_ws = N * b * (2 * H + 2 * d.q_dim + 2 * kv + 3 * d.intermediate) + mask
        recompute = N * per_layer + mask + backward_ws
        fwd_txt = f"N x b(2H + 2q + 2{'q' if shapes.padded else 'kv'} + 3I){mask_txt}"
        terms.append(
            Term(
                "one layer: forward, or recomputed + backward",
                max(forward_ws, recompute),
                f"max(forward: {fwd_txt} = {_gib(forward_ws)}, backward: one layer recomputed + "
                f"N x b(3I + 2H) = {_gib(recompute)})",
                "transient",
            )
        )
    else:
        terms.append(Term("one layer's backward", backward_ws, "N x b(3I + 2H)", "transient"))
    terms.append(Term("final hidden states (policy, reference)", 2 * B * (R + 1) * H * b, "2 x B(R+1)H x b", "update"))
    # The chunks' backward runs before the layers' (lm_head is last in the forward): its peak and
    # a layer's never coincide.
    c = chunk_tokens(d, shapes)
    # Below float32, lm_head casts its weight to float32 for every call (model.float32_logits): a
    # V x H float32 temporary beside the chunk's tensors (generate holds one such cast for its whole call).
    head_copy = V * H * 4 if b < 4 else 0
    terms.append(
        Term(
            "logits chunk (chunked log-prob/entropy/KL)",
            c * V * (CHUNK_FP32_COPIES * 4 + b) + head_copy,
            f"c x V x ({CHUNK_FP32_COPIES} x 4 + b){' + V x H x 4 (float32 lm_head weight)' if head_copy else ''}; c = "
            f"{c} tokens, V = {V}",
            "transient",
        )
    )
    E, P_len = shapes.num_envs, shapes.prompt_tokens
    kv_cache = E * (P_len + R) * L * 2 * d.kv_dim * b
    terms.append(
        Term(
            "rollout: KV cache of generate",
            kv_cache,
            f"envs x T x L x 2 x kv x b = {E} x {P_len + R} x {L} x 2 x {d.kv_dim} x {b}",
            "rollout",
        )
    )
    prefill = E * P_len * b * (2 * H + d.q_dim + 2 * d.kv_dim + 3 * d.intermediate)
    terms.append(
        Term("rollout: prefill working set (one layer, no grad)", prefill, "envs x P x b(2H + q + 2kv + 3I)", "rollout")
    )
    if s.vision_cache_images:
        per_image = shapes.image_tokens * H * b * d.vision_outputs_per_token
        terms.append(
            Term(
                "rollout: tower outputs kept (model.vision_cache_images)",
                s.vision_cache_images * per_image,
                f"images x tokens/image x H x b{' x maps' if d.vision_outputs_per_token > 1 else ''} = "
                f"{s.vision_cache_images} x {shapes.image_tokens} x {H} x {b}"
                f"{f' x {d.vision_outputs_per_token}' if d.vision_outputs_per_token > 1 else ''} (at most)",
                "rollout",
            )
        )
    patches = n_img * shapes.image_tokens * d.vision_patches_per_token
    vision = patches * b * (4 * d.vision_hidden + 3 * d.vision_intermediate)
    terms.append(
        Term(
            "vision tower forward, no grad (before the language model)",
            vision,
            f"patches x b(4Hv + 3Iv); {_n(patches)} patches, Hv={d.vision_hidden}, Iv={d.vision_intermediate}",
            "info",
        )
    )
    # What a GPU holds besides the tensors: assumed values, not measured here (no GPU in CI); the GPU
    # smoke test's real-checkpoint stage compares the total with torch.cuda.max_memory_reserved.
    base = totals(terms)
    terms.append(
        Term(
            "CUDA context and kernel images",
            CUDA_CONTEXT_BYTES,
            f"assumed {_gib(CUDA_CONTEXT_BYTES)} per process",
            "overhead",
            "assumed",
        )
    )
    if n > 1:
        terms.append(
            Term(
                "NCCL communicator buffers",
                NCCL_BUFFER_BYTES,
                f"assumed {_gib(NCCL_BUFFER_BYTES)} per process with 2+ GPUs",
                "overhead",
                "assumed",
            )
        )
    frag = FRAGMENTATION_SHARE * max(base["update"], base["rollout"])
    terms.append(
        Term(
            "caching allocator fragmentation",
            frag,
            f"assumed {FRAGMENTATION_SHARE:.0%} of max(update, rollout)",
            "overhead",
            "assumed",
        )
    )
    return terms


def _gib(x: float) -> str:
    """Bytes as GiB, or MiB below 0.1 GiB (the tiny model's numbers)."""
    return f"{x / GIB:.2f} GiB" if x >= 0.1 * GIB else f"{x / 2**20:.1f} MiB"


def totals(terms: Sequence[Term]) -> dict[str, float]:
    """Bytes per group and the per-GPU peak.

    ``update`` is what a minibatch keeps plus its largest transient; ``peak`` is
    ``static + max(update, rollout)`` (tensors); ``peak_with_overhead`` adds the assumed
    ``overhead`` terms (CUDA context, NCCL buffers, fragmentation).
    """
    group = {g: sum(t.bytes for t in terms if t.group == g) for g in ("static", "update", "rollout", "overhead")}
    group["update"] += max((t.bytes for t in terms if t.group == "transient"), default=0.0)
    group["peak"] = group["static"] + max(group["update"], group["rollout"])
    group["peak_with_overhead"] = group["peak"] + group["overhead"]
    return group


def setup_from_run(run: Any, gpus: int) -> Setup:
    """:class:`Setup` of a run config; DeepSpeed casts LoRA weights to the dtype, plain peft keeps them float32."""
    import json

    b = {"float32": 4, "bfloat16": 2, "float16": 2}[run.model.dtype]
    bucket = 0
    if run.dist.zero_stage > 0 and run.dist.deepspeed_config:
        path = Path(run.dist.deepspeed_config)
        if not path.is_absolute():
            path = Path(__file__).resolve().parent.parent / path
        if path.is_file():
            bucket = int(float(json.loads(path.read_text())["zero_optimization"].get("reduce_bucket_size", 5e8)))
    return Setup(
        dtype_bytes=b,
        lora_bytes=b if run.dist.zero_stage > 0 else 4,
        zero_stage=run.dist.zero_stage,
        gpus=gpus if run.dist.zero_stage > 0 else 1,
        gradient_checkpointing=run.model.gradient_checkpointing,
        reduce_bucket_elements=bucket,
        lora_r=run.model.lora_r,
        vision_cache_images=run.model.vision_cache_images
        if run.model.reuse_vision_outputs and run.model.train_vision == "none"
        else 0,
    )


def format_table(title: str, d: ModelDims, shapes: Shapes, s: Setup, terms: Sequence[Term]) -> str:
    """Markdown: the inputs, one row per term (formula and GiB), the totals."""
    tot = totals(terms)
    text_note = (
        "counted by the model's processor"
        if shapes.text_exact
        else f"estimate: characters / {CHARS_PER_TOKEN:g} + template"
    )
    lines = [
        f"### {title}",
        "",
        f"Model: {d.source}: H={d.hidden}, L={d.layers}, I={d.intermediate}, heads={d.heads}, kv heads={d.kv_heads} "
        f"(q={d.q_dim}, kv={d.kv_dim}), V={d.vocab}, {_n(d.total_params)} params, LoRA r={s.lora_r}: "
        f"{_n(d.lora_params)}.",
        f"Shapes: B={shapes.batch} turns x T={shapes.seq} tokens (prompt {shapes.prompt_tokens} = {shapes.images} "
        "images x "
        f"{shapes.image_tokens} + {shapes.text_tokens} text [{text_note}]; R={shapes.response_tokens} generated); "
        f"b={s.dtype_bytes} B (dtype), a={s.lora_bytes} B (LoRA), ZeRO-{s.zero_stage} over {s.gpus} GPU(s), "
        f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}.",
        "",
        "| term | formula | size | in peak | basis |",
        "|---|---|---|---|---|",
    ]
    where = {
        "static": "yes",
        "update": "update",
        "transient": "update (largest transient)",
        "rollout": "rollout",
        "info": "no",
        "overhead": "on top",
    }
    for t in terms:
        basis = "measured (CPU peak RSS)" if t.name.startswith("logits chunk") else t.basis
        lines.append(f"| {t.name} | `{t.formula}` | {_gib(t.bytes)} | {where[t.group]} | {basis} |")
    lines += [
        "",
        f"Per GPU: static {_gib(tot['static'])} + max(update {_gib(tot['update'])}, rollout {_gib(tot['rollout'])}) "
        f"= **{_gib(tot['peak'])}** of tensors; with the assumed overheads (CUDA context, NCCL buffers, allocator "
        f"fragmentation) **{_gib(tot['peak_with_overhead'])}**. Computed terms follow from the model's dimensions and "
        "the run's shapes; the logit chunk's copy count was measured on CPU; the overheads are typical values, "
        "checked against a real GPU only by scripts/gpu_smoke.sh's real-checkpoint stage.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Measuring (CPU): peak resident memory of a call
# ---------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}; peak-RSS measurement needs Linux")


def peak_rss_delta(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), bytes)``: how far this process's resident memory peaked above where it stood.

    Resets the kernel's high-water mark first (``/proc/self/clear_refs`` = 5, Linux >= 4.0) so
    the peak is this call's, not the process's. Memory the allocator keeps from earlier calls is
    reused without showing up: run it in a fresh process started with a low
    ``MALLOC_MMAP_THRESHOLD_`` (:data:`HONEST_MALLOC_ENV`) so freed tensors go back to the kernel.
    """
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    out = fn()
    return out, (_status_kib("VmHWM") - before) * 1024


# glibc: blocks from 64 KiB up are mmap-ed and unmapped when freed, so resident memory follows what
# is allocated (the default threshold grows up to 32 MiB and freed heap memory stays resident).
HONEST_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "1"}


def measure_update_peak(policy: Any, minibatch: Any, with_kl: bool = True) -> int:
    """Bytes the process's resident memory peaks above its level during one PPO minibatch on CPU.

    One step is what :meth:`~a2c_ppo_acktr.algo.ppo.PPO.update` does per minibatch: the policy's
    forward (with the reference forward for the KL, as on an update's first minibatch), the PPO
    loss and ``backward``; gradients are dropped after it, as ``optimizer.zero_grad`` does. A first
    step warms up (thread pools, lazily built buffers); the second is measured.
    """
    import gc

    from a2c_ppo_acktr.algo.ppo import ppo_loss
    from a2c_ppo_acktr.config.arguments import PPOConfig

    ppo_cfg = PPOConfig()

    def step() -> None:
        out = policy(minibatch, with_kl=with_kl)
        loss, _ = ppo_loss(out, minibatch, ppo_cfg, 0.0)
        loss.backward()
        for p in policy.parameters():
            p.grad = None

    step()
    gc.collect()
    return peak_rss_delta(step)[1]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def report(run: Any, gpus: int, title: Optional[str] = None) -> str:
    """The Markdown table of a run config on ``gpus`` GPUs."""
    dims = model_dims(run.model)
    shapes = preset_shapes(run, dims)
    setup = setup_from_run(run, gpus)
    heads = head_params(
        dims.hidden, run.model.value_head_hidden, run.model.temp_head_hidden, run.model.use_temp_predictor
    )
    terms = estimate(dims, shapes, setup, heads=heads)
    return format_table(title or f"{run.preset or run.model.model_path}", dims, shapes, setup, terms)


def main(argv: Optional[Sequence[str]] = None) -> None:
    from a2c_ppo_acktr.config.cli import config_parser, parse_run_config

    parser = config_parser(__doc__.split("\n")[0])
    parser.add_argument(
        "--gpus", type=int, default=8, help="GPUs the ZeRO states are sharded over (default 8: one node)"
    )
    run, args = parse_run_config(argv, None, parser)
    print(report(run, args.gpus))


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(run_main(main, "python -m a2c_ppo_acktr.memory"))

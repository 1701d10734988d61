"""VLMPolicy: a Hugging Face VLM + PEFT LoRA + value head + temperature predictor.

Acting (:meth:`VLMPolicy.act`) runs ONE batched ``generate`` for all envs. Prompts are left-padded,
so the last prompt token of every row sits at the same index; its final hidden state (the input of
``lm_head`` at generate's first step, caught by a forward hook) gives the value and the temperature.
Each row is sampled at its own temperature by a ``LogitsProcessor`` that calls
:func:`~a2c_ppo_acktr.policy.distributions.process_logits` (divide by T_i, forbid placeholder tokens);
generate's own temperature/top-k/top-p stay neutral.

The training forward stops the model at ``lm_head``'s input and computes log-probs, entropy and KL
with :func:`~a2c_ppo_acktr.policy.distributions.chunked_token_stats`: ``lm_head`` and the float32
vocabulary-wide work run a chunk of positions at a time, recomputed in backward, so no ``(B, R, V)``
tensor is ever alive (the formulas are those of ``process_logits``/``token_log_probs``).

The rollout's log-probs (per token, and their weighted sums) come from the same functions the update
uses, on the same numbers: with ``model.rollout_log_probs = "generate"`` (no extra forward) the
processor keeps each step's processed logits and reads the sampled token's log-prob with
:func:`~a2c_ppo_acktr.policy.distributions.token_log_probs`, and the value head reads the hidden state
caught at generate's first step; with ``"recompute"`` a no-grad training forward
(:meth:`VLMPolicy.evaluate_actions`'s code) re-scores the batch. They are the update's old log-probs
only with ``ppo.old_log_probs=rollout`` (then within 1e-4 of the update's in fp32; in bf16 the
rounding depends on the batch layout); by default the update re-scores the rollout in its own layout
and its first ratio is exactly 1 (docs/TRAINING.md, "The first ratio"). Dropout is off while acting;
keep ``model.lora_dropout = 0`` for PPO, or the update's dropout masks make the first ratio differ
from 1.

Batch layout of the training forward: ``[left-padded prompt | generated ids right-padded]``; the
attention mask covers both paddings, and ``logits_to_keep = R + 1`` makes ``lm_head`` see exactly the
last prompt token and the generated positions: position 0 of its input is the last prompt token
(value, temperature), positions ``0..R-1`` predict the R generated tokens. Each observation's images
are processed once: ``act`` returns each row's processor output (:mod:`a2c_ppo_acktr.policy.encoding`), the
storage keeps it, and the update collates those very tensors instead of running the processor again
(so no re-tokenisation can drift from the rollout's; a minibatch without them is re-processed and its
prompt ids checked against the rollout's). Qwen-VL models derive
their M-RoPE positions from the attention mask; other families (LLaVA) are given generate's
positions explicitly (:data:`MASK_POSITION_FAMILIES`).

The reference policy for the KL penalty is the same network with the adapter disabled
(``peft``'s ``disable_adapter``): no second copy. ``train_vision`` modules are trained through
``modules_to_save``, so the reference keeps the original vision weights too.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from safetensors import SafetensorError
from torch import Tensor, nn
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.common.sameness import image_key, unique_rows
from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.run.distributed import agreed_chunk_count
from a2c_ppo_acktr.policy.distributions import (
    chunked_token_stats,
    logits_chunk_tokens,
    masked_mean,
    masked_sum,
    process_logits,
    response_token_weights,
    sample_kl,
    sequence_log_prob,
    token_log_probs,
)
from a2c_ppo_acktr.policy.encoding import IMAGE_KEYS, TurnEncoding, collate, split_rows
from a2c_ppo_acktr.policy.loading import ContextLengthError, LoadedVLM, ModelLoadError, adapter_settings, forbidden_token_ids, load_vlm, record_base_model
from a2c_ppo_acktr.policy.references import PERCEPTION_PROBES, EMAWeights, reference_named
from a2c_ppo_acktr.policy.references import REFERENCES as KL_REFERENCES
from a2c_ppo_acktr.policy.temp_predictor import TempPredictor, compute_in_float32, float32_weight_cache
from a2c_ppo_acktr.policy.vision_cache import VisionOutputCache, output_entries, vision_outputs

logger = logging.getLogger(__name__)

HEADS_FILE = "heads.safetensors"
FULL_WEIGHTS_FILE = "trainable.safetensors"  # trainable weights when training without LoRA

# Vision modules trained for ModelConfig.train_vision, per family (peft modules_to_save suffixes).
VISION_MODULES: dict[str, dict[str, list[str]]] = {
    "qwen2_vl": {"projector": ["visual.merger"], "tower": ["visual"]},
    "qwen2_5_vl": {"projector": ["visual.merger"], "tower": ["visual"]},
    "qwen3_vl": {"projector": ["visual.merger", "visual.deepstack_merger_list"], "tower": ["visual"]},
    "llava": {"projector": ["multi_modal_projector"], "tower": ["vision_tower", "multi_modal_projector"]},
    "llava_next": {"projector": ["multi_modal_projector"], "tower": ["vision_tower", "multi_modal_projector"]},
    "llava_onevision": {"projector": ["multi_modal_projector"], "tower": ["vision_tower", "multi_modal_projector"]},
}

# Families whose forward derives its (M-RoPE) positions from the attention mask itself. The others
# (LLaVA: plain RoPE in a Llama/Qwen2 text model) number positions from column 0 unless told, while
# generate numbers them from each row's first real token. Plain RoPE attention depends only on
# position differences, so the shift changes a left-padded row only by rounding (measured ~1e-6 on
# the tiny model), but not for RoPE scalings that depend on the largest position (``dynamic``):
# the training forward is given generate's positions and computes exactly what the rollout did.
MASK_POSITION_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})


def _distinct_rows(rows: Sequence[Any], where: Sequence[int]) -> list[Any]:
    """The distinct prompts' entries of ``rows``, in the distinct prompts' order, where row ``i`` is
    distinct prompt ``where[i]`` (its first row stands for it)."""
    first = {k: i for i, k in reversed(list(enumerate(where)))}
    return [rows[first[k]] for k in range(len(first))]


@dataclass
class ActOutput:
    """What :meth:`VLMPolicy.act` returns for N envs (lists have N entries, tensors are ``(N,)``)."""

    generated_ids: list[Tensor]  # (R_i,) generated ids, cut after the first EOS, no padding
    texts: list[str]  # decoded responses (special tokens skipped)
    log_probs: Tensor  # weighted action log-probs (thought_prob_coef on thought tokens)
    values: Tensor
    temperatures: Tensor
    prompts: list[str]  # rendered prompts (what the processor tokenized)
    images: list[list[np.ndarray]]  # raw images given with each prompt ([] when blind)
    prompt_ids: list[Tensor]  # (P_i,) prompt token ids without padding (image tokens expanded)
    token_weights: list[Tensor]  # (R_i,) float32
    # Each row's processor output (CPU, pixels in the model's dtype): the update forwards these.
    encodings: Optional[list[TurnEncoding]] = None
    # (N,) the rollout engine's own log-probs of the replies, weighted like log_probs (rollout.engine
    # other than hf; NaN where it returned none); None when the policy sampled itself.
    engine_log_probs: Optional[Tensor] = None
    # (R_i,) each reply's per-token log-probs (unweighted; log_probs are their weighted sums).
    token_log_probs: Optional[list[Tensor]] = None
    # (N,) bool: the reply was cut by model.max_new_tokens before an end-of-sequence token.
    reply_cut: Optional[Tensor] = None


@dataclass
class EvalOutput:
    """What :meth:`VLMPolicy.evaluate_actions` returns; all ``(B,)`` float32."""

    log_probs: Tensor
    values: Tensor
    entropy: Tensor  # mean per-token entropy over the generated tokens
    kl: Optional[Tensor]  # mean per-token KL(pi || pi_ref) over generated tokens (the chosen estimator); None if not asked
    temperatures: Tensor
    # The response's entropy: per-token entropies summed with the log-prob's token weights.
    seq_entropy: Optional[Tensor] = None
    kl_sum: Optional[Tensor] = None  # per-token KL summed over the response (the reward penalty); None if not asked
    # Per-token tensors behind the sums above, ``(B, R)`` (0 where ``token_mask`` is false): the
    # perception pass reads the KL to the masked-image reference and the log-probs per token.
    token_log_probs: Optional[Tensor] = None
    token_kl: Optional[Tensor] = None
    token_mask: Optional[Tensor] = None
    token_entropy: Optional[Tensor] = None


# The names the forward's ``reference`` option takes: the KL references, then the perception probes.
REFERENCES = tuple(KL_REFERENCES) + tuple(PERCEPTION_PROBES)


class _RowTemperatureProcessor(LogitsProcessor):
    """Divides row i's logits by T_i and forbids ids; optionally records the sampled tokens' log-probs.

    ``temperature_fn`` is called once, at the first step, after generate's first forward has run
    (the hook has then caught the last prompt token's hidden state). The token sampled at step k is
    only known at step k+1 (as the last column of ``input_ids``), so its log-prob is read from the
    processed logits kept from step k; :meth:`finish` reads the last one after generate returns.
    """

    def __init__(self, temperature_fn, forbidden_ids: Tensor, record_log_probs: bool, top_k: int = 0, top_p: float = 1.0) -> None:
        self.temperature_fn = temperature_fn
        self.forbidden_ids = forbidden_ids
        self.top_k, self.top_p = top_k, top_p
        self.record = record_log_probs
        self.temperatures: Optional[Tensor] = None
        self._previous: Optional[Tensor] = None  # (B, V) processed logits of the previous step
        self.step_log_probs: list[Tensor] = []  # (B,) per generated position

    def _read(self, tokens: Tensor) -> None:
        if self._previous is not None:
            lp = token_log_probs(self._previous[:, None, :], tokens.to(self._previous.device)[:, None])
            self.step_log_probs.append(lp[:, 0])
            self._previous = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.temperatures is None:
            self.temperatures = self.temperature_fn()
        processed = process_logits(scores, self.temperatures.to(scores.device), self.forbidden_ids, self.top_k, self.top_p)
        if self.record:
            self._read(input_ids[:, -1])
            self._previous = processed
        return processed

    def finish(self, last_tokens: Tensor) -> Tensor:
        """``(B, R)`` log-probs of the R generated positions (after generate returned)."""
        self._read(last_tokens)
        return torch.stack(self.step_log_probs, dim=1)


def build_lora_config(cfg: ModelConfig, modules_to_save: Optional[Sequence[str]] = None) -> Any:
    """The PEFT LoRA config shared by the PPO policy and SFT (rank, alpha, dropout, target regex).

    No ``task_type``: the adapter wraps the VLM as a plain ``PeftModel`` whose forward passes every
    multimodal argument through unchanged, so SFT adapters load into the policy key for key.
    """
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules,
        modules_to_save=list(modules_to_save) if modules_to_save else None,
        bias="none",
    )


def enable_gradient_checkpointing(base: nn.Module) -> None:
    """Recompute each decoder (and vision) block in backward instead of storing its activations.

    Non-reentrant checkpointing gives the LoRA weights inside a checkpointed block their gradients
    whether or not the block's input requires grad, so the frozen embeddings need no
    ``enable_input_require_grads``. transformers installs those hooks anyway, on every input
    embedding it finds, the vision tower's patch embedding included: that would pull the frozen
    tower into autograd (its blocks recomputed and back-propagated through for nothing), so they
    are removed. PPO's policy and SFT both enable it here. Tested: LoRA weights of every layer get
    gradients, the first ratio stays 1, and a frozen tower runs no backward.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5 (the old name warns)
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    base.disable_input_require_grads()


def float32_logits(head: nn.Module) -> None:
    """Make ``lm_head`` return float32 logits from low-precision weights and hidden states.

    A bf16 ``lm_head`` rounds each logit to bf16: one step is 0.06-0.25 at real logit sizes (16-64),
    the rounding differs between the rollout's and the update's batch layouts, and temperatures as
    low as ``min_temperature`` divide it, so the first PPO ratio strays from 1. Here the Linear that
    holds the weight computes ``x.float() @ W.float().T``: the exact product of the bf16 values in
    float32 (:func:`~a2c_ppo_acktr.policy.temp_predictor.compute_in_float32`: its ``forward`` is replaced, not
    its call, so ZeRO-3's gather and LoRA's wrapper, which adds its own term, still run around it).
    The cast weight is a per-call temporary of ``V x H`` floats (2.2 GB for a 7B Qwen, one chunk at a
    time). Applied whatever the dtype at construction (for float32 weights the casts are no-ops), so a
    later cast of the module, DeepSpeed's bf16 engine's, keeps float32 logits.
    """
    linear = getattr(head, "base_layer", head)  # peft's LoRA wrapper keeps the Linear as base_layer
    if isinstance(linear, nn.Linear):
        compute_in_float32(linear)


class VLMPolicy(nn.Module):
    """Actor-critic VLM policy.

    Args:
        cfg: :class:`ModelConfig`.
        loaded: an already loaded :class:`LoadedVLM` (tests share one); default loads ``cfg``.
    """

    def __init__(self, cfg: ModelConfig, loaded: Optional[LoadedVLM] = None) -> None:
        super().__init__()
        self.cfg = cfg
        loaded = loaded if loaded is not None else load_vlm(cfg)
        self.family = loaded.family
        self.processor = loaded.processor
        # The checkpoint's own decoding defaults; generate never sees them (loading.neutral_generation_config).
        self.shipped_generation_config = loaded.shipped_generation_config
        self.tokenizer = loaded.processor.tokenizer
        if self.tokenizer.padding_side != "left":
            raise ValueError(
                f"the processor pads on the {self.tokenizer.padding_side!r}; batched generation needs left padding "
                "(load it with a2c_ppo_acktr.policy.loading.load_processor, which sets it)"
            )
        base = loaded.model
        text_cfg = base.config.get_text_config()
        hidden = int(text_cfg.hidden_size)
        for p in base.parameters():
            p.requires_grad_(False)
        self.model = self._wrap(base, cfg, loaded.family)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(base)
        float32_logits(self.model.get_output_embeddings())
        device = next(base.parameters()).device
        # Heads stay float32 whatever the base dtype: values and temperatures need the precision.
        self.value_head = compute_in_float32(nn.Sequential(
            nn.Linear(hidden, cfg.value_head_hidden), nn.Tanh(), nn.Linear(cfg.value_head_hidden, 1)
        )).to(device=device, dtype=torch.float32)
        self.temp_predictor: Optional[TempPredictor] = None
        if cfg.use_temp_predictor:
            self.temp_predictor = TempPredictor(
                hidden, cfg.temp_head_hidden, cfg.temperature, cfg.min_temperature, cfg.max_temperature
            ).to(device=device, dtype=torch.float32)
        ids = forbidden_token_ids(self.processor, vocab_size=int(text_cfg.vocab_size))
        self.register_buffer("forbidden_ids", torch.tensor(ids, dtype=torch.long, device=device), persistent=False)
        gen = base.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.pad_token_id
        if pad is None:
            raise ValueError("the model has no pad token id (generation_config.pad_token_id / tokenizer.pad_token_id); set one")
        self.pad_id = int(pad)
        self._warned_split = False  # the processor output could not be kept with the rollout (warned once)
        self._engine: Any = None  # a rollout engine while a rollout uses one (with_engine), else None: generate here
        self._ema: Optional[EMAWeights] = None  # ppo.reference=ema: float32 averages (init_ema_reference)
        limit = getattr(text_cfg, "max_position_embeddings", None)
        self.context_limit: Optional[int] = int(limit) if limit else None  # prompt + response positions (_check_context)
        # The inner model whose vision encoder outputs the rollout keeps (model.reuse_vision_outputs), or None.
        self._vision_owner: Optional[nn.Module] = self._reusable_vision(base)
        self._vision_cache: Optional[VisionOutputCache] = None  # open inside vision_cache()

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _wrap(base: nn.Module, cfg: ModelConfig, family: str) -> nn.Module:
        vision = [] if cfg.train_vision == "none" else VISION_MODULES.get(family, {}).get(cfg.train_vision)
        if vision is None:
            raise ValueError(f"model.train_vision={cfg.train_vision!r} is not defined for family {family!r}; use train_vision=none")
        if not cfg.use_lora:
            # Full fine-tuning of the language model (+ the chosen vision modules); no reference model.
            names = [n for n, _ in base.named_parameters()]
            for n, p in base.named_parameters():
                in_vision = any(f".{v}." in f".{n}" for v in VISION_MODULES.get(family, {}).get("tower", []))
                chosen = any(f".{v}." in f".{n}" for v in vision)
                if not in_vision or chosen:
                    p.requires_grad_(True)
            if not any(p.requires_grad for p in base.parameters()):
                raise ValueError(f"no trainable parameters found among {len(names)}")
            return base
        from peft import get_peft_model

        lora = build_lora_config(cfg, modules_to_save=VLMPolicy._vision_module_names(base, vision))
        try:
            return get_peft_model(base, lora)
        except ValueError as e:
            from a2c_ppo_acktr.config.arguments import ConfigError

            raise ConfigError(f"LoRA could not be applied with model.lora_target_modules={cfg.lora_target_modules!r}: {e}") from e

    @staticmethod
    def _vision_module_names(base: nn.Module, suffixes: Sequence[str]) -> list[str]:
        """Full names of the modules ending in ``suffixes``; containers expand to their children
        (peft's modules_to_save cannot wrap a ModuleList, e.g. Qwen3-VL's deepstack mergers)."""
        names: list[str] = []
        for name, module in base.named_modules():
            if any(name == s or name.endswith("." + s) for s in suffixes):
                if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                    names += [f"{name}.{child}" for child, _ in module.named_children()]
                else:
                    names.append(name)
        if suffixes and not names:
            raise ValueError(f"no module of this model ends with any of {list(suffixes)}; check model.train_vision for this family")
        return names

    def _reusable_vision(self, base: nn.Module) -> Optional[nn.Module]:
        """The module whose ``get_image_features`` encodes images and whose forward takes them back as
        ``mm_encoder_outputs``, when ``model.reuse_vision_outputs`` is on and nothing in the vision
        tower or projector trains (``train_vision=none`` and no adapter there); else None."""
        inner = getattr(base, "model", None)
        tower = VISION_MODULES.get(self.family, {}).get("tower")
        if not (self.cfg.reuse_vision_outputs and self.cfg.train_vision == "none" and tower and inner is not None
                and callable(getattr(inner, "get_image_features", None))
                and "mm_encoder_outputs" in inspect.signature(inner.forward).parameters):
            return None
        trains = any(p.requires_grad and any(f".{v}." in f".{n}" for v in tower) for n, p in self.model.named_parameters())
        return None if trains else inner

    @contextlib.contextmanager
    def vision_cache(self) -> Iterator[Optional[VisionOutputCache]]:
        """Inside this block, :meth:`act` and :meth:`get_values` run the frozen vision tower only on
        images they have not encoded in the block (an episode's sweep frames are encoded once, not at
        every turn): :class:`~a2c_ppo_acktr.policy.vision_cache.VisionOutputCache`, at most
        ``model.vision_cache_images`` images. Yields the cache, or None where the tower's outputs are
        not reused (it trains, ``model.reuse_vision_outputs`` is off) or the size is 0. A rollout opens
        one (:func:`~a2c_ppo_acktr.rl.train.collect_rollout`), so nothing is kept between rollouts:
        a step's numbers depend on its own rollout only, and a resumed run computes what an
        uninterrupted one did."""
        size = int(self.cfg.vision_cache_images)
        previous = self._vision_cache
        self._vision_cache = VisionOutputCache(size) if self._vision_owner is not None and size > 0 else None
        try:
            yield self._vision_cache
        finally:
            self._vision_cache = previous

    def _image_keys(self, images: Sequence[Sequence[np.ndarray]], where: Optional[list[int]] = None) -> Optional[list[tuple]]:
        """The content keys of the images the next tower call encodes (rows in order; after a shared
        prefill, the distinct prompts' rows: row ``i`` is distinct prompt ``where[i]``), or None
        outside :meth:`vision_cache`."""
        if self._vision_cache is None:
            return None
        rows = images if where is None else _distinct_rows(images, where)
        return [image_key(im) for row in rows for im in row]

    @contextlib.contextmanager
    def _capture_vision(self, keys: Optional[Sequence[tuple]] = None) -> Iterator[list[Any]]:
        """The vision encoder's outputs (``get_image_features``) of the forwards in the block, in call
        order; nothing is captured when the outputs are not reused. With ``keys`` (:meth:`_image_keys`)
        the block's first encoder call is served from the open :meth:`vision_cache`: the tower runs
        on its images not yet encoded only."""
        caught: list[Any] = []
        owner = self._vision_owner
        if owner is None:
            yield caught
            return
        original = owner.get_image_features
        pending = [keys]

        @functools.wraps(original)  # generate reads the encoder's signature to pick its inputs
        def spy(*args: Any, **kwargs: Any) -> Any:
            out = None
            cache, want = self._vision_cache, pending.pop() if pending else None
            if cache is not None and want is not None:
                out = cache.encode(original, args, kwargs, want)
            if out is None:
                out = original(*args, **kwargs)
            caught.append(out)
            return out

        owner.get_image_features = spy
        try:
            yield caught
        finally:
            del owner.get_image_features  # the instance attribute: the method is back

    def _vision_entries(self, caught: list[Any], images_per_row: Sequence[int]) -> Optional[list[list[dict[str, Tensor]]]]:
        """Each row's per-image vision encodings (:attr:`TurnEncoding.vision`, on the model's device)
        from the outputs :meth:`_capture_vision` caught, or None (not reused, or an output this
        cannot split per image)."""
        if self._vision_owner is None:
            return None
        flat: list[dict[str, Tensor]] = []
        for out in caught:
            entries = output_entries(out)
            if entries is None:
                return None
            flat += entries
        if len(flat) != int(sum(images_per_row)):
            return None
        rows, start = [], 0
        for n in images_per_row:
            rows.append(flat[start:start + n])
            start += n
        return rows

    @staticmethod
    def _fresh(inputs: dict[str, Any]) -> dict[str, Any]:
        """``inputs`` with a new ``mm_encoder_outputs`` dict per forward (a forward may fill it in)."""
        if "mm_encoder_outputs" not in inputs:
            return inputs
        return {**inputs, "mm_encoder_outputs": dict(inputs["mm_encoder_outputs"])}

    def _vision_inputs(self, inputs: dict[str, Any], entries: Sequence[dict[str, Tensor]]) -> dict[str, Any]:
        """``inputs`` with the pixels replaced by the kept vision encodings of its images (in order):
        the forward then skips the tower."""
        out = {k: v for k, v in inputs.items() if not k.startswith("pixel_values")}
        if entries:
            out["mm_encoder_outputs"] = {"image": vision_outputs(entries, self.device)}
        return out

    @property
    def has_reference(self) -> bool:
        """True when the reference policy (adapter disabled) exists, i.e. with LoRA."""
        return self.cfg.use_lora

    @property
    def device(self) -> torch.device:
        return self.forbidden_ids.device

    @property
    def vocab_size(self) -> int:
        """Rows of ``lm_head`` (the model's vocabulary, padding rows included)."""
        return int(self.base_model.config.get_text_config().vocab_size)

    @property
    def base_model(self) -> nn.Module:
        """The transformers model (inside the PEFT wrapper when LoRA is on)."""
        return self.model.get_base_model() if self.cfg.use_lora else self.model

    # ------------------------------------------------------------------ heads
    def _temperatures(self, hidden: Tensor, fixed: Optional[float] = None, detach_input: bool = False) -> Tensor:
        """``(B,)`` per-row temperatures: the head's, or ``fixed`` (else ``model.temperature``) for
        every row when ``fixed`` is given or the head is off. ``detach_input``: the head's gradient
        stays in the head (its own objective must not move the language model)."""
        if fixed is None and self.temp_predictor is not None:
            return self.temp_predictor(hidden.detach() if detach_input else hidden)
        value = float(self.cfg.temperature if fixed is None else fixed)
        return torch.full((hidden.shape[0],), value, device=hidden.device)

    def _values(self, hidden: Tensor) -> Tensor:
        return self.value_head(hidden.float()).squeeze(-1)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Dropout off while acting (rollout numbers must not depend on dropout masks)."""
        was_training = self.training
        if not was_training:  # already in eval mode: walking every module twice costs ~1 ms a call
            yield
            return
        self.eval()
        try:
            yield
        finally:
            self.train(was_training)

    @contextlib.contextmanager
    def _catch_lm_head_input(self, skip_logits: bool = False) -> Iterator[list[Tensor]]:
        """Collect the inputs of ``lm_head`` (final hidden states) of every forward in the block.

        With ``skip_logits`` the hook also hands ``lm_head`` an empty slice (``(B, 0, H)``), so the
        model's forward returns ``(B, 0, V)`` logits at no cost while its graph up to the final
        hidden states is intact; :func:`chunked_token_stats` then applies ``lm_head`` chunk by
        chunk. Any family whose forward ends in ``lm_head(hidden[:, slice])`` works, with no
        family-specific entry point.
        """
        caught: list[Tensor] = []
        head = self.base_model.get_output_embeddings()

        def take(_module: nn.Module, args: tuple) -> Optional[tuple]:
            caught.append(args[0])
            return (args[0].narrow(-2, 0, 0),) + tuple(args[1:]) if skip_logits else None

        handle = head.register_forward_pre_hook(take)
        try:
            yield caught
        finally:
            handle.remove()

    # ------------------------------------------------------------------ batching
    def _prompts_and_images(self, observations: Sequence[dict], blind: bool) -> tuple[list[str], list[list[np.ndarray]]]:
        texts = [prompts.render_prompt(self.processor, prompts.build_messages(o, blind=blind)) for o in observations]
        images = [[] if blind else list(o["images"]) for o in observations]
        return texts, images

    def _process(self, texts: Sequence[str], images: Sequence[Sequence[np.ndarray]]) -> dict[str, Tensor]:
        """The processor's left-padded batch, on the CPU."""
        flat = [img for row in images for img in row]
        return dict(self.processor(text=list(texts), images=flat or None, padding=True, return_tensors="pt"))

    def _to_device(self, enc: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(self.device) for k, v in enc.items()}

    def _encode(self, texts: Sequence[str], images: Sequence[Sequence[np.ndarray]]) -> dict[str, Tensor]:
        return self._to_device(self._process(texts, images))

    def _with_positions(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """``inputs`` plus generate's ``position_ids`` (real tokens before each one, from 0; 0 on
        padding) for families outside :data:`MASK_POSITION_FAMILIES`; Qwen-VL inputs are unchanged."""
        if self.family in MASK_POSITION_FAMILIES:
            return inputs
        mask = inputs["attention_mask"]
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        return {**inputs, "position_ids": positions}

    def _forward_turns(
        self,
        enc: dict[str, Tensor],
        generated_ids: Sequence[Tensor],
        token_weights: Sequence[Tensor],
        with_kl: bool,
        temperature: Optional[float] = None,
        kl_estimator: str = "full",
        detach_temperature: bool = False,
        reference: str = "start",
        noise_seed: int = 0,
        vision: Optional[Sequence[dict[str, Tensor]]] = None,
    ) -> EvalOutput:
        """The training forward on ``[left-padded prompt | right-padded response]``.

        ``reference``: what the KL (``with_kl``) compares with, one of :data:`REFERENCES`;
        ``noise_seed`` seeds the ``noised_images`` pixels. ``vision``: the kept vision encodings of
        the batch's images in order (:attr:`TurnEncoding.vision`), forwarded instead of the pixels
        (the tower does not run; a reference that changes the pixels still gets them).

        ``kl_estimator``: ``full`` (exact per-token KL over the vocabulary) or ``k1``/``k2``/``k3``
        (:func:`~a2c_ppo_acktr.policy.distributions.sample_kl` on the sampled tokens). ``detach_temperature``:
        the log-probs, entropy and KL see the temperatures without gradient (the temperature head is
        then off the policy-gradient path; ``EvalOutput.temperatures`` keeps the head's gradient, for
        its own loss, but not the language model's)."""
        B, P = enc["input_ids"].shape
        R = max((len(g) for g in generated_ids), default=0)
        # Built on the CPU and moved once each: a copy per row would be a host sync per row.
        resp = torch.full((B, R), self.pad_id, dtype=torch.long)
        resp_mask = torch.zeros(B, R, dtype=torch.bool)
        weights = torch.zeros(B, R, dtype=torch.float32)
        for i, (g, w) in enumerate(zip(generated_ids, token_weights)):
            if len(w) != len(g):
                raise ValueError(f"row {i}: {len(w)} token weights for {len(g)} generated tokens")
            resp[i, : len(g)] = g.cpu()
            resp_mask[i, : len(g)] = True
            weights[i, : len(g)] = w.cpu()
        num_positions = int(resp_mask.sum())
        resp, resp_mask, weights = resp.to(self.device), resp_mask.to(self.device), weights.to(self.device)
        inputs = dict(enc)
        inputs["input_ids"] = torch.cat([enc["input_ids"], resp], dim=1)
        inputs["attention_mask"] = torch.cat([enc["attention_mask"], resp_mask.to(enc["attention_mask"].dtype)], dim=1)
        if "mm_token_type_ids" in enc:  # generated tokens are text
            inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(resp, dtype=enc["mm_token_type_ids"].dtype)], dim=1)
        inputs = self._with_positions(inputs)
        encoded = inputs if vision is None else self._vision_inputs(inputs, vision)
        head = self.base_model.get_output_embeddings()
        ref_final = ref_head = None
        if with_kl:
            # Before the policy's forward: this no-grad pass's working set then never sits on top
            # of the activations the policy's forward keeps for backward.
            strategy = reference_named(reference)
            ref_final = strategy.hidden(self, inputs if strategy.reads_pixels else self._fresh(encoded), R, noise_seed)
            ref_head = strategy.head(self, head)
        # The model runs up to lm_head's input only; the logits are made chunk by chunk below, so no
        # full (B, R+1, V) tensor (model dtype) nor its float32 derivatives exist at once.
        with self._catch_lm_head_input(skip_logits=True) as caught:
            self.model(**self._fresh(encoded), use_cache=False, logits_to_keep=R + 1)
        # (B, R+1, H) final hidden states: the last prompt token, then the generated ones; a copy,
        # so that the chunks' references do not keep the whole (B, T, H) tensor alive.
        final = caught[0].clone()
        hidden = final[:, 0]  # the last prompt token (left padding: index P-1 in every row)
        temps = self._temperatures(hidden, temperature, detach_input=detach_temperature)
        values = self._values(hidden)
        chunk = self.cfg.logits_chunk_tokens or logits_chunk_tokens(self.vocab_size)
        stats = chunked_token_stats(
            final[:, :R], resp, temps.detach() if detach_temperature else temps, self.forbidden_ids, resp_mask,
            head=head, ref_inputs=ref_final, ref_head=ref_head, chunk_tokens=chunk, top_k=self.cfg.top_k, top_p=self.cfg.top_p,
            num_chunks=agreed_chunk_count(-(-num_positions // chunk), head),  # equal lm_head calls on every ZeRO-3 rank
        )
        log_probs = sequence_log_prob(stats.log_probs, weights, resp_mask)
        entropy = masked_mean(stats.entropy, resp_mask)
        seq_entropy = masked_sum(stats.entropy * weights, resp_mask)
        kl = kl_sum = per_token = None
        if stats.kl is not None:
            per_token = stats.kl if kl_estimator == "full" else sample_kl(stats.log_probs, stats.ref_log_probs, kl_estimator)
            kl, kl_sum = masked_mean(per_token, resp_mask), masked_sum(per_token, resp_mask)
        return EvalOutput(
            log_probs=log_probs, values=values, entropy=entropy, kl=kl, temperatures=temps, seq_entropy=seq_entropy, kl_sum=kl_sum,
            token_log_probs=stats.log_probs, token_kl=per_token, token_mask=resp_mask, token_entropy=stats.entropy,
        )

    # ------------------------------------------------------------------ EMA reference (references.MovingAverage)
    def averaged_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The weights the EMA reference averages: the trainable ones of the VLM (the adapter and
        any ``train_vision`` copies), not the heads (the reference has no value or temperature)."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def init_ema_reference(self) -> None:
        """Start the EMA reference at the current weights (float32 copies on the model's device).

        Raises:
            ValueError: without LoRA (the average would copy the whole model).
        """
        if not self.cfg.use_lora:
            raise ValueError("ppo.reference=ema averages the LoRA adapter: set model.use_lora=true")
        self._ema = EMAWeights(self.averaged_parameters())

    @property
    def has_ema_reference(self) -> bool:
        return self._ema is not None

    def update_ema_reference(self, decay: float) -> None:
        """``ema <- decay * ema + (1 - decay) * weights`` (after a PPO update)."""
        if self._ema is None:
            raise RuntimeError("update_ema_reference before init_ema_reference")
        self._ema.update(self.averaged_parameters(), decay)

    def ema_reference_state(self) -> dict[str, Tensor]:
        """CPU copies of the EMA weights by name (checkpointed with the run)."""
        if self._ema is None:
            raise RuntimeError("no EMA reference: call init_ema_reference first")
        return self._ema.state()

    def load_ema_reference_state(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`ema_reference_state`; the names must be this policy's trainable weights."""
        ema = self._ema if self._ema is not None else EMAWeights([])
        ema.load(state, self.averaged_parameters())
        self._ema = ema

    @staticmethod
    def _unpadded(enc: dict[str, Tensor]) -> list[Tensor]:
        return [row[mask.bool()].cpu() for row, mask in zip(enc["input_ids"], enc["attention_mask"])]

    # ------------------------------------------------------------------ public API
    def forward(self, minibatch: Any, with_kl: bool = False, **options: Any) -> EvalOutput:
        """Same as :meth:`evaluate_actions`: PPO calls the (possibly wrapped) module itself."""
        return self.evaluate_actions(minibatch, with_kl=with_kl, **options)

    def evaluate_actions(
        self, minibatch: Any, with_kl: bool = False, kl_estimator: str = "full", detach_temperature: bool = False,
        reference: str = "start", noise_seed: int = 0,
    ) -> EvalOutput:
        """Re-forward prompt + action of stored turns.

        Args:
            minibatch: a :class:`~a2c_ppo_acktr.rl.storage.Minibatch` (``prompts``, ``images``,
                ``prompt_ids``, ``generated_ids``, ``token_weights`` are read).
            with_kl: also compute the KL to the reference (``reference``: the starting policy by default); one more forward.
            kl_estimator, detach_temperature, reference, noise_seed: see :meth:`_forward_turns`
                (``ppo.kl_estimator``, ``ppo.temperature_loss=entropy_target``, ``ppo.reference``,
                the perception pass).

        Returns:
            :class:`EvalOutput` with gradients.

        Raises:
            ValueError: the prompt ids the minibatch forwards are not the rollout's (a turn's kept
                encoding paired with another turn's ids, or, re-processed, a processor that now
                tokenizes differently).
        """
        encodings = getattr(minibatch, "encodings", None)
        vision = None
        if encodings is not None:
            # The rollout's own tensors (no processor run); the comparison is on CPU tensors, no device sync.
            now_ids = [e.input_ids for e in encodings]
            enc = self._to_device(collate(encodings, self._pad_token_id))
            fix = "the storage paired a turn's encoding with another turn's prompt ids"
            if self._vision_owner is not None and all(e.vision is not None for e in encodings):
                vision = [entry for e in encodings for entry in e.vision]  # the rollout's: no tower pass
        else:
            enc = self._encode(minibatch.prompts, minibatch.images)
            now_ids = self._unpadded(enc)
            fix = "the processor or its pixel budget changed between rollout and update"
        for i, (now, then) in enumerate(zip(now_ids, minibatch.prompt_ids)):
            if not torch.equal(now, then.cpu()):
                raise ValueError(f"turn {i}: the prompt has {len(now)} ids now but had {len(then)} in the rollout; {fix}")
        return self._forward_turns(
            enc, minibatch.generated_ids, minibatch.token_weights, with_kl,
            kl_estimator=kl_estimator, detach_temperature=detach_temperature, reference=reference, noise_seed=noise_seed,
            vision=vision,
        )

    def _split_encodings(self, cpu_enc: dict[str, Tensor], images: Sequence[Sequence[np.ndarray]]) -> Optional[list[TurnEncoding]]:
        """Each row's processor output, kept with the rollout: the update forwards these tensors and
        the processor never runs on these images again. None (the update re-processes the raw
        images) for a processor output :mod:`a2c_ppo_acktr.policy.encoding` cannot
        split, with a warning once."""
        try:
            return split_rows(cpu_enc, [len(row) for row in images], dtype=self.base_model.dtype)
        except ValueError as e:
            if not self._warned_split:
                logger.warning("processor outputs are not kept with the rollout, the update will re-process the images: %s", e)
                self._warned_split = True
            return None

    @property
    def _pad_token_id(self) -> int:
        """The id the processor left-pads prompts with (the generation pad id when it has none)."""
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self.pad_id

    @torch.no_grad()
    def get_values(self, observations: Sequence[dict], blind: bool = False, max_rows: Optional[int] = None) -> Tensor:
        """``(N,)`` values of observations (e.g. the final observation of a truncated episode).

        Args:
            observations: N observations, valued in one batched forward (processor run once).
            blind: withhold the images.
            max_rows: forward at most this many rows at a time (e.g. ``rollout.num_envs``: a
                batch no larger than the one ``act`` prefills, so it fits wherever acting fits);
                None forwards all N at once.
        """
        if not observations:
            return torch.zeros(0)
        step = len(observations) if max_rows is None else max(1, int(max_rows))
        if len(observations) > step:
            return torch.cat([self.get_values(observations[i:i + step], blind) for i in range(0, len(observations), step)])
        texts, images = self._prompts_and_images(observations, blind)
        enc = self._encode(texts, images)
        # Only the value head reads this forward: lm_head computes no vocabulary logits.
        with self._eval_mode(), self._catch_lm_head_input(skip_logits=True) as caught, self._capture_vision(self._image_keys(images)):
            self.model(**self._with_positions(enc), use_cache=False, logits_to_keep=1)
        return self._values(caught[0][:, -1]).float().cpu()

    def _trim(self, row: Tensor) -> Tensor:
        is_eos = torch.isin(row, torch.tensor(self.eos_ids, device=row.device))
        if bool(is_eos.any()):
            row = row[: int(is_eos.nonzero()[0]) + 1]  # keep the EOS: stopping is part of the action
        return row

    @contextlib.contextmanager
    def with_engine(self, engine: Any) -> Iterator[None]:
        """:meth:`act` samples through ``engine`` (:mod:`a2c_ppo_acktr.policy.rollout_engine`) inside this
        block; None keeps in-process ``generate``. Validation and evaluation outside it sample here."""
        previous, self._engine = self._engine, engine
        try:
            yield
        finally:
            self._engine = previous

    @torch.no_grad()
    def act(
        self,
        observations: Sequence[dict],
        greedy: bool = False,
        blind: bool = False,
        temperature: Optional[float] = None,
    ) -> ActOutput:
        """Choose one response per observation with ONE batched ``generate`` (or through the rollout
        engine inside :meth:`with_engine`: :meth:`_act_with_engine`). Rows that repeat a prompt are
        processed and prefilled once (``model.shared_prefill``: :meth:`_shared_prefill`).

        Args:
            observations: N env observations ``{"images": [uint8 HxWx3, ...], "text": str}``.
            greedy: argmax decoding (evaluation) instead of sampling.
            blind: withhold the images (prompts say so).
            temperature: sample every row at this temperature instead of the temperature head's
                per-row value (sampled evaluation); the returned log-probs and temperatures are
                then under it. ``None`` (training) uses the head, or ``model.temperature`` when off.

        Returns:
            :class:`ActOutput`. With ``model.rollout_log_probs=generate`` the log-probs come from
            generate's processed logits and the value/temperature from its first step (the
            training forward's functions on the same hidden states); with ``recompute`` from a
            no-grad training forward on the same batch.
        """
        if self._engine is not None:
            return self._act_with_engine(observations, greedy, blind, temperature)
        with self._eval_mode():
            texts, images = self._prompts_and_images(observations, blind)
            cpu_enc, unique = self._process_distinct(texts, images)
            self._check_context(cpu_enc["input_ids"].shape[1])
            enc = self._to_device(cpu_enc)
            P = enc["input_ids"].shape[1]
            recompute = self.cfg.recompute_rollout_log_probs
            with self._capture_vision(self._image_keys(images, None if unique is None else unique[1])) as encoded:
                # With repeated prompts, generate continues every row from the distinct prompts' cache.
                gen_inputs = enc if unique is None else self._shared_prefill(enc, *unique)
                seqs, proc, caught = self._generate(gen_inputs, greedy, temperature, recompute)
            vision = self._row_vision(encoded, images, None if unique is None else unique[1])
            # Trimmed on the CPU: one device-to-host copy instead of a sync per row.
            generated = [self._trim(row) for row in seqs[:, P:].cpu()]
            decoded = self.tokenizer.batch_decode([g.tolist() for g in generated], skip_special_tokens=True)
            weights = [response_token_weights(self.tokenizer, g.tolist(), self.cfg.thought_prob_coef) for g in generated]
            if recompute:
                ev = self._forward_turns(enc, generated, weights, with_kl=False, temperature=temperature,
                                         vision=None if vision is None else [e for row in vision for e in row])
                log_probs, values, temps, tok_lp = ev.log_probs, ev.values, ev.temperatures, ev.token_log_probs
            else:
                # Same functions as the training forward: process_logits -> token_log_probs ->
                # sequence_log_prob; the value head on the same (last prompt token) hidden state.
                tok_lp = proc.finish(seqs[:, -1])
                mask = torch.zeros(tok_lp.shape, dtype=torch.bool)
                w = torch.zeros(tok_lp.shape, dtype=tok_lp.dtype)
                for i, (g, wi) in enumerate(zip(generated, weights)):
                    mask[i, : len(g)] = True
                    w[i, : len(g)] = wi
                log_probs = sequence_log_prob(tok_lp, w.to(tok_lp.device), mask.to(tok_lp.device))
                values = self._values(caught[0][:, -1])
                temps = proc.temperatures
        encodings = self._with_vision(self._split_encodings(cpu_enc, images), vision)
        return ActOutput(
            generated_ids=generated,
            texts=decoded,
            log_probs=log_probs.float().cpu(),
            values=values.float().cpu(),
            temperatures=temps.float().cpu(),
            prompts=texts,
            images=images,
            prompt_ids=[e.input_ids for e in encodings] if encodings is not None else self._unpadded(cpu_enc),
            token_weights=weights,
            encodings=encodings,
            token_log_probs=self._rows(tok_lp, generated),
            reply_cut=self._reply_cut(generated),
        )

    @staticmethod
    def _rows(per_token: Tensor, generated: Sequence[Tensor]) -> list[Tensor]:
        """Each reply's entries of a ``(N, R)`` per-token tensor, on the CPU (one copy)."""
        cpu = per_token.detach().float().cpu()
        return [cpu[i, : len(g)].clone() for i, g in enumerate(generated)]

    def _reply_cut(self, generated: Sequence[Tensor]) -> Tensor:
        """``(N,)`` bool: replies that reached ``max_new_tokens`` without an end-of-sequence token."""
        return torch.tensor([len(g) >= self.cfg.max_new_tokens and (len(g) == 0 or int(g[-1]) not in self.eos_ids) for g in generated],
                            dtype=torch.bool)

    def _generate(self, inputs: dict[str, Any], greedy: bool, temperature: Optional[float], recompute: bool) -> tuple[Tensor, "_RowTemperatureProcessor", list[Tensor]]:
        """``generate`` under the per-row temperature processor: the sequences, the processor (its
        recorded log-probs and temperatures) and the caught ``lm_head`` inputs (the first: each row's
        last prompt token, which the heads read)."""
        # The float32 lm_head casts its weight once for the whole call, not once per decoded token.
        with self._catch_lm_head_input() as caught, float32_weight_cache(self.model):
            proc = _RowTemperatureProcessor(
                lambda: self._temperatures(caught[0][:, -1], temperature), self.forbidden_ids, record_log_probs=not recompute,
                top_k=self.cfg.top_k, top_p=self.cfg.top_p,
            )
            # synced_gpus=False: under ZeRO-3 act runs inside gathered_for_rollout (local forwards), and
            # transformers' default there (all-reduce every decoded token until every rank is done)
            # would hang ranks that call generate different numbers of times (validation's episodes).
            seqs = self.model.generate(
                **inputs, generation_config=self._generation_config(greedy), logits_processor=LogitsProcessorList([proc]),
                synced_gpus=False,
            )
        return seqs, proc, caught

    def _row_vision(self, encoded: list[Any], images: Sequence[Sequence[np.ndarray]], where: Optional[list[int]]) -> Optional[list[list[dict[str, Tensor]]]]:
        """Each row's vision encodings from the outputs caught while acting, or None: the rows'
        images in order, or, after a shared prefill, the distinct prompts' images (row ``i`` is
        distinct prompt ``where[i]``)."""
        if where is None:
            return self._vision_entries(encoded, [len(row) for row in images])
        distinct = self._vision_entries(encoded, [len(row) for row in _distinct_rows(images, where)])
        return None if distinct is None else [distinct[k] for k in where]

    @staticmethod
    def _with_vision(encodings: Optional[list[TurnEncoding]], vision: Optional[list[list[dict[str, Tensor]]]]) -> Optional[list[TurnEncoding]]:
        """``encodings`` with each row's vision encodings attached, on the CPU (kept with the rollout)."""
        if encodings is None or vision is None:
            return encodings
        for e, row in zip(encodings, vision):
            e.vision = [{k: v.cpu() for k, v in entry.items()} for entry in row]
        return encodings

    def _process_distinct(
        self, texts: Sequence[str], images: Sequence[Sequence[np.ndarray]]
    ) -> tuple[dict[str, Tensor], Optional[tuple[dict[str, Tensor], list[int]]]]:
        """The processor's batch of all rows, and, when some rows repeat a prompt (equal text and
        images; the batch shows images) and ``model.shared_prefill`` is on, the batch of the
        distinct prompts with each row's index in it (else None). The processor then runs on the
        distinct prompts only, and the full batch is laid out from them exactly as the processor
        lays it out (:func:`collate`)."""
        # Text-only batches are not shared: without images Qwen-VL's forward derives no positions from
        # the padding mask (generate does), so a prefill outside generate would place them otherwise.
        if self.cfg.shared_prefill and len(texts) > 1 and any(len(row) for row in images):
            distinct, where = unique_rows([{"text": t, "images": im} for t, im in zip(texts, images)])
            if len(distinct) < len(texts):
                few = self._process([d["text"] for d in distinct], [d["images"] for d in distinct])
                try:
                    rows = split_rows(few, [len(d["images"]) for d in distinct])
                except ValueError:  # a processor output encoding cannot lay out: every row on its own
                    return self._process(texts, images), None
                return collate([rows[k] for k in where], self._pad_token_id), (few, where)
        return self._process(texts, images), None

    def _shared_prefill(self, enc: dict[str, Tensor], few: dict[str, Tensor], where: list[int]) -> dict[str, Any]:
        """generate's inputs for ``enc``, whose rows repeat the prompts of ``few`` (row ``i`` is
        ``few``'s row ``where[i]``): the distinct prompts are forwarded once, all but their last
        token, and the KV cache is copied to every row; generate then forwards only each row's last
        prompt token (the temperature and value heads read its hidden state, as without sharing)
        and decodes on. The images lie in the cached part, so generate gets token tensors only;
        Qwen-VL's multimodal rope offsets, computed by the prefill, are copied per row like the cache."""
        few = self._to_device(few)
        B_few = few["input_ids"].shape[0]
        tokens = {k for k, v in few.items() if k not in IMAGE_KEYS and isinstance(v, Tensor) and v.shape == few["input_ids"].shape}
        head = {k: (v[:, :-1] if k in tokens else v) for k, v in few.items()}
        cache = DynamicCache(config=self.base_model.config)
        self.model(**self._with_positions(head), cache=cache, use_cache=True, logits_to_keep=1)
        index = torch.tensor(where, dtype=torch.long, device=self.device)
        cache.batch_select_indices(index)
        for module in self.base_model.modules():
            deltas = getattr(module, "rope_deltas", None)
            if isinstance(deltas, Tensor) and deltas.shape[0] == B_few:
                module.rope_deltas = deltas[index]
        return {**{k: enc[k] for k in tokens}, "cache": cache}

    def _act_with_engine(self, observations: Sequence[dict], greedy: bool, blind: bool, temperature: Optional[float]) -> ActOutput:
        """:meth:`act` through a rollout engine, in three steps: a prompt-only forward gives each
        row's temperature and value (the head predicts before sampling); the engine samples one reply
        per row at its temperature (0 when greedy) with a seed drawn from torch's generator; the
        training forward recomputes the replies' log-probs (so the first PPO ratio is the policy's
        against itself, whatever the engine's numerics)."""
        from a2c_ppo_acktr.policy.rollout_engine import EngineRow, sequence_log_probs

        with self._eval_mode():
            texts, images = self._prompts_and_images(observations, blind)
            cpu_enc = self._process(texts, images)
            self._check_context(cpu_enc["input_ids"].shape[1])
            enc = self._to_device(cpu_enc)
            with self._capture_vision(self._image_keys(images)) as encoded, self._catch_lm_head_input(skip_logits=True) as caught:
                self.model(**self._with_positions(enc), use_cache=False, logits_to_keep=1)
            vision = self._row_vision(encoded, images, None)
            temps = self._temperatures(caught[0][:, -1], temperature).float().cpu()
            seeds = torch.randint(0, 2**31 - 1, (len(observations),)).tolist()
            prompt_ids = self._unpadded(cpu_enc)
            rows = [
                EngineRow(messages=prompts.openai_messages(o, blind), prompt_ids=p.tolist(),
                          temperature=0.0 if greedy else float(t), seed=int(seed))
                for o, p, t, seed in zip(observations, prompt_ids, temps.tolist(), seeds)
            ]
            replies = self._engine.generate(rows)
            generated = [self._trim(torch.tensor(r.token_ids, dtype=torch.long)) for r in replies]
            decoded = self.tokenizer.batch_decode([g.tolist() for g in generated], skip_special_tokens=True)
            weights = [response_token_weights(self.tokenizer, g.tolist(), self.cfg.thought_prob_coef) for g in generated]
            ev = self._forward_turns(enc, generated, weights, with_kl=False, temperature=temperature,
                                     vision=None if vision is None else [e for row in vision for e in row])
        encodings = self._with_vision(self._split_encodings(cpu_enc, images), vision)
        return ActOutput(
            generated_ids=generated,
            texts=decoded,
            log_probs=ev.log_probs.float().cpu(),
            values=ev.values.float().cpu(),
            temperatures=ev.temperatures.float().cpu(),
            prompts=texts,
            images=images,
            prompt_ids=[e.input_ids for e in encodings] if encodings is not None else prompt_ids,
            token_weights=weights,
            encodings=encodings,
            engine_log_probs=torch.tensor(sequence_log_probs(replies, weights), dtype=torch.float32),
            token_log_probs=self._rows(ev.token_log_probs, generated),
            reply_cut=self._reply_cut(generated),
        )

    def _check_context(self, prompt_tokens: int) -> None:
        """Stop with one line when the longest prompt plus ``model.max_new_tokens`` does not fit the
        model's positions (``max_position_embeddings``): past them a model degrades without an error
        (LLaVA-1.5 has 4,096; a 10-frame VSI prompt at 448 px is ~6k tokens)."""
        limit = self.context_limit
        if limit is None or prompt_tokens + self.cfg.max_new_tokens <= limit:
            return
        raise ContextLengthError(
            f"a prompt of {prompt_tokens} tokens + model.max_new_tokens {self.cfg.max_new_tokens} exceeds the model's "
            f"{limit} positions (max_position_embeddings); lower env.num_sweep_frames, env.image_history, "
            f"model.max_pixels (visual tokens per frame) or model.max_new_tokens"
        )

    def _generation_config(self, greedy: bool) -> GenerationConfig:
        # Every knob that changes the distribution is set explicitly: unset fields fall back to the
        # checkpoint's generation_config.json (Qwen ships top_k=1, top_p=0.001,
        # repetition_penalty=1.05), and the sampled distribution would no longer be the one whose
        # log-probs we train on. Sampling-only knobs are left out of greedy configs (they warn there).
        kwargs: dict[str, Any] = dict(
            max_new_tokens=self.cfg.max_new_tokens,
            do_sample=not greedy,
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        if not greedy:
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
        return GenerationConfig(**kwargs)

    # ------------------------------------------------------------------ parameters and files
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def head_parameters(self) -> list[nn.Parameter]:
        """Value and temperature head parameters (for a separate learning rate, ppo.head_lr)."""
        heads = list(self.value_head.parameters())
        if self.temp_predictor is not None:
            heads += list(self.temp_predictor.parameters())
        return heads

    def _heads_state(self) -> dict[str, Tensor]:
        state = {f"value_head.{k}": v for k, v in self.value_head.state_dict().items()}
        if self.temp_predictor is not None:
            state.update({f"temp_predictor.{k}": v for k, v in self.temp_predictor.state_dict().items()})
        return {k: v.detach().float().cpu().contiguous() for k, v in state.items()}

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Write the adapter (peft format) or the trainable weights, and ``heads.safetensors``."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.cfg.use_lora:
            # LoRA on embed_tokens leaves the base embedding as it was: peft's "auto" would still copy the
            # whole matrix into every checkpoint (1 GB for a 7B model's vocabulary).
            self.model.save_pretrained(str(out), save_embedding_layers=False)
            record_base_model(out)
        else:
            state = {n: p.detach().cpu().contiguous() for n, p in self.model.named_parameters() if p.requires_grad}
            save_file(state, str(out / FULL_WEIGHTS_FILE))
        meta = {"use_temp_predictor": str(self.temp_predictor is not None), "family": self.family}
        save_file(self._heads_state(), str(out / HEADS_FILE), metadata=meta)
        return out

    def load_heads(self, in_dir: str | os.PathLike) -> None:
        """Load ``heads.safetensors`` written by :meth:`save_pretrained`."""
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
            raise ModelLoadError(f"{path} cannot be read ({type(e).__name__}: {e}); the file is truncated or damaged") from e
        if saved_temp is not None and saved_temp != str(self.temp_predictor is not None):
            raise ValueError(
                f"{path} was saved with use_temp_predictor={saved_temp} but model.use_temp_predictor="
                f"{self.cfg.use_temp_predictor}; set model.use_temp_predictor to match the checkpoint"
            )
        self.value_head.load_state_dict({k[len("value_head."):]: v for k, v in state.items() if k.startswith("value_head.")})
        if self.temp_predictor is not None:
            self.temp_predictor.load_state_dict({k[len("temp_predictor."):]: v for k, v in state.items() if k.startswith("temp_predictor.")})

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load LoRA weights saved by peft ``save_pretrained`` (SFT warm start) into this adapter.

        Raises:
            ValueError: no LoRA here, or the saved adapter's rank/alpha/targets do not fit.
        """
        if not self.cfg.use_lora:
            raise ValueError("load_adapter needs model.use_lora=true")
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        path = Path(path)
        saved = adapter_settings(path)
        if saved["lora_r"] != self.cfg.lora_r or saved["lora_alpha"] != self.cfg.lora_alpha:
            raise ValueError(
                f"adapter at {path} has r={saved['lora_r']}, lora_alpha={saved['lora_alpha']} but the policy uses "
                f"model.lora_r={self.cfg.lora_r}, model.lora_alpha={self.cfg.lora_alpha}; build the policy from a config "
                "that loading.adopt_adapter_settings adapted to the adapter (as eval and --sft-adapter do)"
            )
        try:
            weights = load_peft_weights(str(path), device=str(self.device))
        except (SafetensorError, OSError, EOFError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"adapter at {path} cannot be read ({type(e).__name__}: {e}); the file is truncated or damaged") from e
        result = set_peft_model_state_dict(self.model, weights)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"adapter at {path} holds weights this policy has no place for (targets differ?): {unexpected[:5]}")
        own = {k for k in self.model.state_dict() if "lora_" in k}
        if not weights or len(weights) < len(own):
            raise ValueError(
                f"adapter at {path} holds {len(weights)} tensors but the policy's adapter has {len(own)}; "
                "model.lora_target_modules must match the SFT run's"
            )

    def load_pretrained(self, in_dir: str | os.PathLike) -> None:
        """Load what :meth:`save_pretrained` wrote (adapter or trainable weights, and the heads)."""
        if self.cfg.use_lora:
            self.load_adapter(in_dir)
        else:
            from safetensors.torch import load_file

            state = load_file(str(Path(in_dir) / FULL_WEIGHTS_FILE), device=str(self.device))
            missing = set(state) - {n for n, _ in self.model.named_parameters()}
            if missing:
                raise ValueError(f"{in_dir} holds weights this model does not have: {sorted(missing)[:5]}")
            self.model.load_state_dict(state, strict=False)
        self.load_heads(in_dir)

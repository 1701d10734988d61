"""VLMPolicy: a Hugging Face VLM + PEFT LoRA + value head + temperature predictor.

The policy holds the network and its heads and composes the jobs around them:

- acting (:meth:`VLMPolicy.act`): :class:`~a2c_ppo_acktr.policy.sampling.Sampler`, one batched
  ``generate`` (or a rollout engine) with per-row temperatures, the rollout's log-probs and values;
- the training forward (:meth:`VLMPolicy.evaluate_actions`):
  :mod:`a2c_ppo_acktr.policy.training_forward`, log-probs, entropy and KL chunk by chunk;
- the frozen tower's outputs kept and forwarded again: :class:`~a2c_ppo_acktr.policy.vision_reuse.VisionReuse`;
- the KL's references (:mod:`a2c_ppo_acktr.policy.references`) and its files
  (:mod:`a2c_ppo_acktr.policy.saving`).

What they share lives here: the processor batch (:meth:`VLMPolicy._encode`), generate's positions for
families that need them (:data:`MASK_POSITION_FAMILIES`), the hook that catches ``lm_head``'s input
(the heads read the last prompt token's final hidden state) and the heads themselves.

The reference policy for the KL penalty is the same network with the adapter disabled
(``peft``'s ``disable_adapter``): no second copy. ``train_vision`` modules are trained through
``modules_to_save``, so the reference keeps the original vision weights too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.policy import saving, training_forward
from a2c_ppo_acktr.policy.loading import LoadedVLM, forbidden_token_ids, load_vlm
from a2c_ppo_acktr.policy.references import PERCEPTION_PROBES, EMAWeights
from a2c_ppo_acktr.policy.references import REFERENCES as KL_REFERENCES
from a2c_ppo_acktr.policy.sampling import ActOutput, Sampler
from a2c_ppo_acktr.policy.temp_predictor import TempPredictor, compute_in_float32
from a2c_ppo_acktr.policy.training_forward import EvalOutput
from a2c_ppo_acktr.policy.vision_cache import VisionOutputCache
from a2c_ppo_acktr.policy.vision_reuse import VisionReuse, reusable_vision

__all__ = [
    "ActOutput",
    "EvalOutput",
    "MASK_POSITION_FAMILIES",
    "REFERENCES",
    "VISION_MODULES",
    "VLMPolicy",
    "build_lora_config",
    "enable_gradient_checkpointing",
    "float32_logits",
]


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


# The names the forward's ``reference`` option takes: the KL references, then the perception probes.
REFERENCES = tuple(KL_REFERENCES) + tuple(PERCEPTION_PROBES)


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
        self.value_head = compute_in_float32(
            nn.Sequential(nn.Linear(hidden, cfg.value_head_hidden), nn.Tanh(), nn.Linear(cfg.value_head_hidden, 1))
        ).to(device=device, dtype=torch.float32)
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
            raise ValueError(
                "the model has no pad token id (generation_config.pad_token_id / tokenizer.pad_token_id); set one"
            )
        self.pad_id = int(pad)
        self._engine: Any = None  # a rollout engine while a rollout uses one (with_engine), else None: generate here
        self._ema: Optional[EMAWeights] = None  # ppo.reference=ema: float32 averages (init_ema_reference)
        limit = getattr(text_cfg, "max_position_embeddings", None)
        self.context_limit: Optional[int] = (
            int(limit) if limit else None
        )  # prompt + response positions (Sampler.check_context)
        # The frozen tower's outputs kept with the rollout (model.reuse_vision_outputs); acting's machinery.
        owner = reusable_vision(
            base,
            self.model,
            VISION_MODULES.get(self.family, {}).get("tower"),
            cfg.reuse_vision_outputs,
            cfg.train_vision,
        )
        self.vision = VisionReuse(owner, cfg.vision_cache_images)
        self.sampler = Sampler(self)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _wrap(base: nn.Module, cfg: ModelConfig, family: str) -> nn.Module:
        vision = [] if cfg.train_vision == "none" else VISION_MODULES.get(family, {}).get(cfg.train_vision)
        if vision is None:
            raise ValueError(
                f"model.train_vision={cfg.train_vision!r} is not defined for family {family!r}; use train_vision=none"
            )
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

            raise ConfigError(
                f"LoRA could not be applied with model.lora_target_modules={cfg.lora_target_modules!r}: {e}"
            ) from e

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
            raise ValueError(
                f"no module of this model ends with any of {list(suffixes)}; check model.train_vision for this family"
            )
        return names

    def vision_cache(self) -> contextlib.AbstractContextManager[Optional[VisionOutputCache]]:
        """Inside this block, :meth:`act` and :meth:`get_values` run the frozen vision tower only on
        images they have not encoded in the block (an episode's sweep frames are encoded once, not at
        every turn): :class:`~a2c_ppo_acktr.policy.vision_cache.VisionOutputCache`, at most
        ``model.vision_cache_images`` images. Yields the cache, or None where the tower's outputs are
        not reused (it trains, ``model.reuse_vision_outputs`` is off) or the size is 0. A rollout opens
        one (:func:`~a2c_ppo_acktr.rl.train.collect_rollout`), so nothing is kept between rollouts:
        a step's numbers depend on its own rollout only, and a resumed run computes what an
        uninterrupted one did."""
        return self.vision.cache_block()

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
    def _prompts_and_images(
        self, observations: Sequence[dict], blind: bool
    ) -> tuple[list[str], list[list[np.ndarray]]]:
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

    @property
    def _pad_token_id(self) -> int:
        """The id the processor left-pads prompts with (the generation pad id when it has none)."""
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self.pad_id

    @staticmethod
    def _unpadded(enc: dict[str, Tensor]) -> list[Tensor]:
        return [row[mask.bool()].cpu() for row, mask in zip(enc["input_ids"], enc["attention_mask"])]

    def _forward_turns(
        self,
        enc: dict[str, Tensor],
        generated_ids: Sequence[Tensor],
        token_weights: Sequence[Tensor],
        with_kl: bool,
        **options: Any,
    ) -> EvalOutput:
        """The training forward on ``[left-padded prompt | right-padded response]``: every re-scoring
        (the update, ``model.rollout_log_probs=recompute``, the engine's replies) goes through here
        (:func:`~a2c_ppo_acktr.policy.training_forward.forward_turns`, whose options it takes)."""
        return training_forward.forward_turns(self, enc, generated_ids, token_weights, with_kl, **options)

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

    # ------------------------------------------------------------------ public API
    def forward(self, minibatch: Any, with_kl: bool = False, **options: Any) -> EvalOutput:
        """Same as :meth:`evaluate_actions`: PPO calls the (possibly wrapped) module itself."""
        return self.evaluate_actions(minibatch, with_kl=with_kl, **options)

    def evaluate_actions(
        self,
        minibatch: Any,
        with_kl: bool = False,
        kl_estimator: str = "full",
        detach_temperature: bool = False,
        reference: str = "start",
        noise_seed: int = 0,
    ) -> EvalOutput:
        """Re-forward prompt + action of stored turns.

        Args:
            minibatch: a :class:`~a2c_ppo_acktr.algo.storage.Minibatch` (``prompts``, ``images``,
                ``prompt_ids``, ``generated_ids``, ``token_weights`` and, when kept, ``encodings``
                are read).
            with_kl: also compute the KL to the reference (``reference``: the starting policy by default); one more
            forward.
            kl_estimator, detach_temperature, reference, noise_seed: see
                :func:`~a2c_ppo_acktr.policy.training_forward.forward_turns` (``ppo.kl_estimator``,
                ``ppo.temperature_loss=entropy_target``, ``ppo.reference``, the perception pass).

        Returns:
            :class:`EvalOutput` with gradients.

        Raises:
            ValueError: the prompt ids the minibatch forwards are not the rollout's
                (:func:`~a2c_ppo_acktr.policy.training_forward.minibatch_inputs`).
        """
        enc, vision = training_forward.minibatch_inputs(self, minibatch)
        return self._forward_turns(
            enc,
            minibatch.generated_ids,
            minibatch.token_weights,
            with_kl,
            kl_estimator=kl_estimator,
            detach_temperature=detach_temperature,
            reference=reference,
            noise_seed=noise_seed,
            vision=vision,
        )

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
            return torch.cat(
                [self.get_values(observations[i : i + step], blind) for i in range(0, len(observations), step)]
            )
        texts, images = self._prompts_and_images(observations, blind)
        enc = self._encode(texts, images)
        # Only the value head reads this forward: lm_head computes no vocabulary logits.
        with (
            self._eval_mode(),
            self._catch_lm_head_input(skip_logits=True) as caught,
            self.vision.capture(self.vision.image_keys(images)),
        ):
            self.model(**self._with_positions(enc), use_cache=False, logits_to_keep=1)
        return self._values(caught[0][:, -1]).float().cpu()

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
        engine inside :meth:`with_engine`). Rows that repeat a prompt are processed and prefilled once
        (``model.shared_prefill``). The machinery is :class:`~a2c_ppo_acktr.policy.sampling.Sampler`'s.

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
        return self.sampler.act(observations, greedy, blind, temperature, engine=self._engine)

    # ------------------------------------------------------------------ parameters and files
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def head_parameters(self) -> list[nn.Parameter]:
        """Value and temperature head parameters (for a separate learning rate, ppo.head_lr)."""
        heads = list(self.value_head.parameters())
        if self.temp_predictor is not None:
            heads += list(self.temp_predictor.parameters())
        return heads

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Write the policy's files: the adapter (peft format) or the trainable weights, and the
        heads (:func:`~a2c_ppo_acktr.policy.saving.save_policy`)."""
        return saving.save_policy(self, out_dir)

    def load_pretrained(self, in_dir: str | os.PathLike) -> None:
        """Load what :meth:`save_pretrained` wrote (:func:`~a2c_ppo_acktr.policy.saving.load_policy_files`)."""
        saving.load_policy_files(self, in_dir)

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load an SFT adapter (peft format, no heads) into this policy's adapter: a warm start
        (:func:`~a2c_ppo_acktr.policy.saving.load_adapter`)."""
        saving.load_adapter(self, path)

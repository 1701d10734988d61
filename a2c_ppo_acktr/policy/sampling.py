"""Acting: one reply per observation, sampled (or greedy) with its log-probs, value and temperature.

:class:`Sampler` runs ONE batched ``generate`` for all envs. Prompts are left-padded, so the last
prompt token of every row sits at the same index; its final hidden state (the input of ``lm_head``
at generate's first step, caught by a forward hook) gives the value and the temperature. Each row is
sampled at its own temperature by a ``LogitsProcessor`` that calls
:func:`~a2c_ppo_acktr.policy.distributions.process_logits` (divide by T_i, forbid placeholder tokens);
generate's own temperature/top-k/top-p stay neutral.

The rollout's log-probs (per token, and their weighted sums) come from the same functions the update
uses, on the same numbers: with ``model.rollout_log_probs = "generate"`` (no extra forward) the
processor keeps each step's processed logits and reads the sampled token's log-prob with
:func:`~a2c_ppo_acktr.policy.distributions.token_log_probs`, and the value head reads the hidden state
caught at generate's first step; with ``"recompute"`` a no-grad training forward re-scores the batch.
They are the update's old log-probs only with ``ppo.old_log_probs=rollout`` (then within 1e-4 of the
update's in fp32; in bf16 the rounding depends on the batch layout); by default the update re-scores
the rollout in its own layout and its first ratio is exactly 1 (docs/TRAINING.md, "The first
ratio"). Dropout is off while acting; keep ``model.lora_dropout = 0`` for PPO, or the update's dropout
masks make the first ratio differ from 1.

Rows that repeat a prompt (grouped envs) are processed and prefilled once (``model.shared_prefill``).
Inside ``VLMPolicy.with_engine`` replies are sampled by a rollout engine
(:mod:`a2c_ppo_acktr.policy.rollout_engine`) and re-scored here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.common.sameness import unique_rows
from a2c_ppo_acktr.policy.distributions import (
    process_logits,
    response_token_weights,
    sequence_log_prob,
    token_log_probs,
)
from a2c_ppo_acktr.policy.encoding import IMAGE_KEYS, TurnEncoding, collate, split_rows
from a2c_ppo_acktr.policy.loading import ContextLengthError
from a2c_ppo_acktr.policy.temp_predictor import float32_weight_cache

Policy = Any  # a2c_ppo_acktr.policy.model.VLMPolicy, which imports this module

logger = logging.getLogger(__name__)


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


class RowTemperatureProcessor(LogitsProcessor):
    """Divides row i's logits by T_i and forbids ids; optionally records the sampled tokens' log-probs.

    ``temperature_fn`` is called once, at the first step, after generate's first forward has run
    (the hook has then caught the last prompt token's hidden state). The token sampled at step k is
    only known at step k+1 (as the last column of ``input_ids``), so its log-prob is read from the
    processed logits kept from step k; :meth:`finish` reads the last one after generate returns.
    """

    def __init__(
        self, temperature_fn, forbidden_ids: Tensor, record_log_probs: bool, top_k: int = 0, top_p: float = 1.0
    ) -> None:
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
        processed = process_logits(
            scores, self.temperatures.to(scores.device), self.forbidden_ids, self.top_k, self.top_p
        )
        if self.record:
            self._read(input_ids[:, -1])
            self._previous = processed
        return processed

    def finish(self, last_tokens: Tensor) -> Tensor:
        """``(B, R)`` log-probs of the R generated positions (after generate returned)."""
        self._read(last_tokens)
        return torch.stack(self.step_log_probs, dim=1)


def per_row(per_token: Tensor, generated: Sequence[Tensor]) -> list[Tensor]:
    """Each reply's entries of a ``(N, R)`` per-token tensor, on the CPU (one copy)."""
    cpu = per_token.detach().float().cpu()
    return [cpu[i, : len(g)].clone() for i, g in enumerate(generated)]


class Sampler:
    """``VLMPolicy.act``'s machinery: the policy's own ``generate`` or a rollout engine's replies."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._warned_split = False  # the processor output could not be kept with the rollout (warned once)

    # ------------------------------------------------------------------ acting
    def act(
        self, observations: Sequence[dict], greedy: bool, blind: bool, temperature: Optional[float], engine: Any = None
    ) -> ActOutput:
        """See :meth:`VLMPolicy.act`; ``engine``: sample through it (:meth:`act_with_engine`)."""
        if engine is not None:
            return self.act_with_engine(engine, observations, greedy, blind, temperature)
        pol = self.policy
        with pol._eval_mode():
            texts, images = pol._prompts_and_images(observations, blind)
            cpu_enc, unique = self.process_distinct(texts, images)
            self.check_context(cpu_enc["input_ids"].shape[1])
            enc = pol._to_device(cpu_enc)
            P = enc["input_ids"].shape[1]
            recompute = pol.cfg.recompute_rollout_log_probs
            where = None if unique is None else unique[1]
            with pol.vision.capture(pol.vision.image_keys(images, where)) as encoded:
                # With repeated prompts, generate continues every row from the distinct prompts' cache.
                gen_inputs = enc if unique is None else self.shared_prefill(enc, *unique)
                seqs, proc, caught = self.generate(gen_inputs, greedy, temperature, recompute)
            vision = pol.vision.row_entries(encoded, images, where)
            # Trimmed on the CPU: one device-to-host copy instead of a sync per row.
            generated = [self.trim(row) for row in seqs[:, P:].cpu()]
            decoded, weights = self._decode(generated)
            if recompute:
                ev = pol._forward_turns(
                    enc,
                    generated,
                    weights,
                    with_kl=False,
                    temperature=temperature,
                    vision=None if vision is None else [e for row in vision for e in row],
                )
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
                values = pol._values(caught[0][:, -1])
                temps = proc.temperatures
        encodings = pol.vision.attach(self.split_encodings(cpu_enc, images), vision)
        return ActOutput(
            generated_ids=generated,
            texts=decoded,
            log_probs=log_probs.float().cpu(),
            values=values.float().cpu(),
            temperatures=temps.float().cpu(),
            prompts=texts,
            images=images,
            prompt_ids=[e.input_ids for e in encodings] if encodings is not None else pol._unpadded(cpu_enc),
            token_weights=weights,
            encodings=encodings,
            token_log_probs=per_row(tok_lp, generated),
            reply_cut=self.reply_cut(generated),
        )

    def act_with_engine(
        self, engine: Any, observations: Sequence[dict], greedy: bool, blind: bool, temperature: Optional[float]
    ) -> ActOutput:
        """:meth:`act` through a rollout engine, in three steps: a prompt-only forward gives each
        row's temperature and value (the head predicts before sampling); the engine samples one reply
        per row at its temperature (0 when greedy) with a seed drawn from torch's generator; the
        training forward recomputes the replies' log-probs (so the first PPO ratio is the policy's
        against itself, whatever the engine's numerics)."""
        from a2c_ppo_acktr.policy.rollout_engine import EngineRow, sequence_log_probs

        pol = self.policy
        with pol._eval_mode():
            texts, images = pol._prompts_and_images(observations, blind)
            cpu_enc = pol._process(texts, images)
            self.check_context(cpu_enc["input_ids"].shape[1])
            enc = pol._to_device(cpu_enc)
            with (
                pol.vision.capture(pol.vision.image_keys(images)) as encoded,
                pol._catch_lm_head_input(skip_logits=True) as caught,
            ):
                pol.model(**pol._with_positions(enc), use_cache=False, logits_to_keep=1)
            vision = pol.vision.row_entries(encoded, images, None)
            temps = pol._temperatures(caught[0][:, -1], temperature).float().cpu()
            seeds = torch.randint(0, 2**31 - 1, (len(observations),)).tolist()
            prompt_ids = pol._unpadded(cpu_enc)
            rows = [
                EngineRow(
                    messages=prompts.openai_messages(o, blind),
                    prompt_ids=p.tolist(),
                    temperature=0.0 if greedy else float(t),
                    seed=int(seed),
                )
                for o, p, t, seed in zip(observations, prompt_ids, temps.tolist(), seeds)
            ]
            replies = engine.generate(rows)
            generated = [self.trim(torch.tensor(r.token_ids, dtype=torch.long)) for r in replies]
            decoded, weights = self._decode(generated)
            ev = pol._forward_turns(
                enc,
                generated,
                weights,
                with_kl=False,
                temperature=temperature,
                vision=None if vision is None else [e for row in vision for e in row],
            )
        encodings = pol.vision.attach(self.split_encodings(cpu_enc, images), vision)
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
            token_log_probs=per_row(ev.token_log_probs, generated),
            reply_cut=self.reply_cut(generated),
        )

    # ------------------------------------------------------------------ pieces
    def _decode(self, generated: Sequence[Tensor]) -> tuple[list[str], list[Tensor]]:
        """The replies' texts (special tokens skipped) and their token weights (``thought_prob_coef``)."""
        tokenizer, coef = self.policy.tokenizer, self.policy.cfg.thought_prob_coef
        decoded = tokenizer.batch_decode([g.tolist() for g in generated], skip_special_tokens=True)
        return decoded, [response_token_weights(tokenizer, g.tolist(), coef) for g in generated]

    def trim(self, row: Tensor) -> Tensor:
        """``row`` cut after its first end-of-sequence token (kept: stopping is part of the action)."""
        is_eos = torch.isin(row, torch.tensor(self.policy.eos_ids, device=row.device))
        if bool(is_eos.any()):
            row = row[: int(is_eos.nonzero()[0]) + 1]
        return row

    def reply_cut(self, generated: Sequence[Tensor]) -> Tensor:
        """``(N,)`` bool: replies that reached ``max_new_tokens`` without an end-of-sequence token."""
        limit, eos = self.policy.cfg.max_new_tokens, self.policy.eos_ids
        return torch.tensor(
            [len(g) >= limit and (len(g) == 0 or int(g[-1]) not in eos) for g in generated], dtype=torch.bool
        )

    def split_encodings(
        self, cpu_enc: dict[str, Tensor], images: Sequence[Sequence[np.ndarray]]
    ) -> Optional[list[TurnEncoding]]:
        """Each row's processor output, kept with the rollout: the update forwards these tensors and
        the processor never runs on these images again. None (the update re-processes the raw
        images) for a processor output :mod:`a2c_ppo_acktr.policy.encoding` cannot split, with a
        warning once."""
        pol = self.policy
        try:
            return split_rows(cpu_enc, [len(row) for row in images], dtype=pol.base_model.dtype)
        except ValueError as e:
            if not self._warned_split:
                logger.warning(
                    "processor outputs are not kept with the rollout, the update will re-process the images: %s", e
                )
                self._warned_split = True
            return None

    def generate(
        self, inputs: dict[str, Any], greedy: bool, temperature: Optional[float], recompute: bool
    ) -> tuple[Tensor, RowTemperatureProcessor, list[Tensor]]:
        """``generate`` under the per-row temperature processor: the sequences, the processor (its
        recorded log-probs and temperatures) and the caught ``lm_head`` inputs (the first: each row's
        last prompt token, which the heads read)."""
        pol = self.policy
        # The float32 lm_head casts its weight once for the whole call, not once per decoded token.
        with pol._catch_lm_head_input() as caught, float32_weight_cache(pol.model):
            proc = RowTemperatureProcessor(
                lambda: pol._temperatures(caught[0][:, -1], temperature),
                pol.forbidden_ids,
                record_log_probs=not recompute,
                top_k=pol.cfg.top_k,
                top_p=pol.cfg.top_p,
            )
            # synced_gpus=False: under ZeRO-3 act runs inside gathered_for_rollout (local forwards), and
            # transformers' default there (all-reduce every decoded token until every rank is done)
            # would hang ranks that call generate different numbers of times (validation's episodes).
            seqs = pol.model.generate(
                **inputs,
                generation_config=self.generation_config(greedy),
                logits_processor=LogitsProcessorList([proc]),
                synced_gpus=False,
            )
        return seqs, proc, caught

    def process_distinct(
        self, texts: Sequence[str], images: Sequence[Sequence[np.ndarray]]
    ) -> tuple[dict[str, Tensor], Optional[tuple[dict[str, Tensor], list[int]]]]:
        """The processor's batch of all rows, and, when some rows repeat a prompt (equal text and
        images; the batch shows images) and ``model.shared_prefill`` is on, the batch of the
        distinct prompts with each row's index in it (else None). The processor then runs on the
        distinct prompts only, and the full batch is laid out from them exactly as the processor
        lays it out (:func:`collate`)."""
        pol = self.policy
        # Text-only batches are not shared: without images Qwen-VL's forward derives no positions from
        # the padding mask (generate does), so a prefill outside generate would place them otherwise.
        if pol.cfg.shared_prefill and len(texts) > 1 and any(len(row) for row in images):
            distinct, where = unique_rows([{"text": t, "images": im} for t, im in zip(texts, images)])
            if len(distinct) < len(texts):
                few = pol._process([d["text"] for d in distinct], [d["images"] for d in distinct])
                try:
                    rows = split_rows(few, [len(d["images"]) for d in distinct])
                except ValueError:  # a processor output encoding cannot lay out: every row on its own
                    return pol._process(texts, images), None
                return collate([rows[k] for k in where], pol._pad_token_id), (few, where)
        return pol._process(texts, images), None

    def shared_prefill(self, enc: dict[str, Tensor], few: dict[str, Tensor], where: list[int]) -> dict[str, Any]:
        """generate's inputs for ``enc``, whose rows repeat the prompts of ``few`` (row ``i`` is
        ``few``'s row ``where[i]``): the distinct prompts are forwarded once, all but their last
        token, and the KV cache is copied to every row; generate then forwards only each row's last
        prompt token (the temperature and value heads read its hidden state, as without sharing)
        and decodes on. The images lie in the cached part, so generate gets token tensors only;
        Qwen-VL's multimodal rope offsets, computed by the prefill, are copied per row like the cache."""
        pol = self.policy
        few = pol._to_device(few)
        B_few = few["input_ids"].shape[0]
        tokens = {
            k
            for k, v in few.items()
            if k not in IMAGE_KEYS and isinstance(v, Tensor) and v.shape == few["input_ids"].shape
        }
        head = {k: (v[:, :-1] if k in tokens else v) for k, v in few.items()}
        cache = DynamicCache(config=pol.base_model.config)
        pol.model(**pol._with_positions(head), cache=cache, use_cache=True, logits_to_keep=1)
        index = torch.tensor(where, dtype=torch.long, device=pol.device)
        cache.batch_select_indices(index)
        for module in pol.base_model.modules():
            deltas = getattr(module, "rope_deltas", None)
            if isinstance(deltas, Tensor) and deltas.shape[0] == B_few:
                module.rope_deltas = deltas[index]
        return {**{k: enc[k] for k in tokens}, "cache": cache}

    def check_context(self, prompt_tokens: int) -> None:
        """Stop with one line when the longest prompt plus ``model.max_new_tokens`` does not fit the
        model's positions (``max_position_embeddings``): past them a model degrades without an error
        (LLaVA-1.5 has 4,096; a 10-frame VSI prompt at 448 px is ~6k tokens)."""
        limit, new = self.policy.context_limit, self.policy.cfg.max_new_tokens
        if limit is None or prompt_tokens + new <= limit:
            return
        raise ContextLengthError(
            f"a prompt of {prompt_tokens} tokens + model.max_new_tokens {new} exceeds the model's "
            f"{limit} positions (max_position_embeddings); lower env.num_sweep_frames, env.image_history, "
            f"model.max_pixels (visual tokens per frame) or model.max_new_tokens"
        )

    def generation_config(self, greedy: bool) -> GenerationConfig:
        """generate's config: every knob that changes the distribution set explicitly."""
        # Unset fields fall back to the checkpoint's generation_config.json (Qwen ships top_k=1,
        # top_p=0.001, repetition_penalty=1.05), and the sampled distribution would no longer be the
        # one whose log-probs we train on. Sampling-only knobs are left out of greedy configs (they warn there).
        pol = self.policy
        kwargs: dict[str, Any] = dict(
            max_new_tokens=pol.cfg.max_new_tokens,
            do_sample=not greedy,
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            eos_token_id=pol.eos_ids,
            pad_token_id=pol.pad_id,
            use_cache=True,
        )
        if not greedy:
            kwargs.update(
                temperature=1.0, top_k=0, top_p=1.0, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0
            )
        return GenerationConfig(**kwargs)

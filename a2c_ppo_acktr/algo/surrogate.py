"""The clipped policy-gradient objective in the forms the field uses, as pure tensor functions.

One reply ``i`` of ``T_i`` generated tokens has new log-probs ``log p_{i,t}``, old ones
``log q_{i,t}`` (the policy that sampled it, or its recompute before the update), token weights
``w_{i,t}`` (``model.thought_prob_coef`` on thought tokens, 1 elsewhere; the perception weighting may
rescale them) and one advantage ``A_i``. With ``d_{i,t} = log p_{i,t} - log q_{i,t}``:

* **ratio level** (``ppo.ratio_level``, :data:`RATIO_LEVELS`):

  - ``token``: ``r_{i,t} = exp(d_{i,t})``, one clipped term per token (PPO as verl, TRL and OpenRLHF
    apply it to language models); the token's term is multiplied by ``w_{i,t}``;
  - ``sequence``: ``r_i = exp(sum_t w_{i,t} d_{i,t})``, RL4VLM's ratio of the whole reply (Zhai et al.
    2024), one term per reply. Its log is a sum over up to ``max_new_tokens`` tokens, so any
    per-token noise (bf16 rounding) adds up over the reply;
  - ``sequence_mean``: ``r_i = exp(sum_t w_{i,t} d_{i,t} / sum_t w_{i,t})``, GSPO's length-normalised
    sequence ratio (Zheng et al. 2025), one term per reply.

* **clip**: the term of ratio ``r`` and advantage ``A`` is ``max(-A r, -A clip(r, 1 - low, 1 + high))``
  (Schulman et al. 2017; ``low != high`` is DAPO's clip-higher, Yu et al. 2025); with the dual clip
  (Ye et al. 2020, ``ppo.clip_ratio_c = c``) a negative advantage's term is further capped at
  ``-A c``.

* **aggregation** of the token level (``ppo.loss_agg``, :data:`LOSS_AGGREGATIONS`), with ``l_{i,t}`` the
  weighted token terms and ``B`` replies in the minibatch:

  - ``token-mean``: ``sum_{i,t} l_{i,t} / sum_i T_i`` (every token counts once; long replies weigh more);
  - ``seq-mean-token-sum``: ``(1/B) sum_i sum_t l_{i,t}``;
  - ``seq-mean-token-mean``: ``(1/B) sum_i (1/T_i) sum_t l_{i,t}`` (GRPO's original; every reply counts once);
  - ``seq-mean-token-sum-norm``: ``(1/B) sum_i sum_t l_{i,t} / L`` with the constant ``L =
    model.max_new_tokens`` (Dr. GRPO, Liu et al. 2025: no per-reply length normalisation, whose bias
    favours long wrong replies).

  The sequence levels average their per-reply terms over the replies. A reply with no token in the
  mask (left out: ``ppo.mask_truncated_replies``) counts in no sum and no denominator.

Each turn may also carry a detached sample weight (truncated importance sampling for a rollout
engine's sampler, :func:`tis_weights`) that multiplies all of its terms.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from a2c_ppo_acktr.common import choices
from a2c_ppo_acktr.common.choices import check_registry


def masked_token_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``(B,)`` sum of ``(B, R)`` ``x`` over the true entries of ``mask`` (others never read)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(-1)


# ---------------------------------------------------------------------------------------------
# Aggregation of per-token terms: fn(terms (B, R), mask (B, R), max_tokens) -> scalar
# ---------------------------------------------------------------------------------------------
def _token_mean(terms: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return masked_token_sum(terms, mask).sum() / mask.sum().clamp(min=1)


def _replies_mean(per_reply: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``(B,)`` over the replies with at least one token in ``mask`` (the others take no part)."""
    present = mask.any(-1)
    return torch.where(present, per_reply, torch.zeros_like(per_reply)).sum() / present.sum().clamp(min=1)


def _seq_mean_token_sum(terms: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return _replies_mean(masked_token_sum(terms, mask), mask)


def _seq_mean_token_mean(terms: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return _replies_mean(masked_token_sum(terms, mask) / mask.sum(-1).clamp(min=1), mask)


def _seq_mean_token_sum_norm(terms: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return _replies_mean(masked_token_sum(terms, mask), mask) / float(max_tokens)


LOSS_AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
check_registry("ppo.loss_agg", LOSS_AGGREGATIONS, choices.LOSS_AGGREGATIONS)


def aggregate(terms: Tensor, mask: Tensor, mode: str, max_tokens: int = 1) -> Tensor:
    """One number from ``(B, R)`` per-token ``terms`` (``mask`` true on generated tokens) as
    ``ppo.loss_agg=mode`` defines it (module docstring); ``max_tokens`` is Dr. GRPO's constant."""
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; known: {sorted(LOSS_AGGREGATIONS)}")
    return LOSS_AGGREGATIONS[mode](terms, mask, max_tokens)


# ---------------------------------------------------------------------------------------------
# Ratio levels: fn(log_ratio (B, R), weights (B, R), mask (B, R)) -> per-token (B, R) or per-reply (B,)
# ---------------------------------------------------------------------------------------------
def _token_log_ratio(log_ratio: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device))


def _sequence_log_ratio(log_ratio: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    return masked_token_sum(log_ratio * weights, mask)


def _sequence_mean_log_ratio(log_ratio: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    total = masked_token_sum(weights, mask)
    return masked_token_sum(log_ratio * weights, mask) / torch.where(total > 0, total, torch.ones_like(total))


RATIO_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
    "sequence_mean": _sequence_mean_log_ratio,
}
check_registry("ppo.ratio_level", RATIO_LEVELS, choices.RATIO_LEVELS)


def log_ratios(log_probs: Tensor, old_log_probs: Tensor, weights: Tensor, mask: Tensor, level: str) -> Tensor:
    """The log importance ratios of ``ppo.ratio_level=level``: ``(B, R)`` per token (0 off ``mask``)
    for ``token``, ``(B,)`` per reply for the sequence levels. Inputs ``(B, R)``; ``old_log_probs``
    and ``weights`` are taken as constants."""
    if level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {level!r}; known: {sorted(RATIO_LEVELS)}")
    return RATIO_LEVELS[level](log_probs - old_log_probs.detach(), weights.detach(), mask)


def clipped_terms(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, clip_ratio_c: Optional[float] = None
) -> Tensor:
    """``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` elementwise, and with the dual clip
    ``min(that, -A clip_ratio_c)`` where ``A < 0``. ``ratio`` and ``advantages`` broadcast together."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    terms = torch.max(unclipped, clipped)
    if clip_ratio_c is not None:
        terms = torch.where(advantages < 0, torch.min(terms, -advantages * clip_ratio_c), terms)
    return terms


def tis_weights(old_log_probs: Tensor, engine_log_probs: Optional[Tensor], cap: float) -> Tensor:
    """Truncated importance sampling weights (verl's TIS): ``min(exp(old - engine), cap)`` per turn,
    where ``old`` is the policy's log-prob of the reply and ``engine`` the sampler's own. They correct
    the policy gradient for replies drawn from the engine's distribution, not the policy's; the cap
    bounds the variance. A turn the engine did not score (NaN) weighs 1."""
    if engine_log_probs is None:
        return torch.ones_like(old_log_probs)
    w = (old_log_probs - engine_log_probs.to(old_log_probs.device)).exp().clamp(max=cap)
    return torch.where(torch.isnan(w), torch.ones_like(w), w)


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    level: str = "token",
    loss_agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: Optional[float] = None,
    max_tokens: int = 1,
    sample_weights: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate (to minimise) of the module docstring.

    Args:
        log_probs: ``(B, R)`` new per-token log-probs (with grad).
        old_log_probs: ``(B, R)`` old per-token log-probs.
        advantages: ``(B,)``.
        mask: ``(B, R)`` bool, true on generated tokens that take part (false on padding, and on every
            token of a reply left out of the loss); a sequence level leaves out a reply with no true entry.
        weights: ``(B, R)`` token weights.
        level: ``ppo.ratio_level``.
        loss_agg: ``ppo.loss_agg`` (token level only).
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``.
        clip_ratio_c: the dual clip's cap (> 1), or None.
        max_tokens: Dr. GRPO's constant length (``model.max_new_tokens``).
        sample_weights: ``(B,)`` detached per-turn weights (:func:`tis_weights`), or None.

    Returns:
        ``(loss, metrics)``; metrics (detached scalars, over the tokens at the token level and over
        the replies otherwise): ``approx_kl`` (k3, CleanRL's ``(r - 1) - log r``), ``clipfrac`` (the
        share of ratios outside the clip range), ``ratio_max_dev`` (largest ``|r - 1|``) and, with the
        dual clip, ``dual_clipfrac`` (the share held at ``-A c``).
    """
    log_ratio = log_ratios(log_probs, old_log_probs, weights, mask, level)
    ratio = log_ratio.exp()
    adv = advantages.to(ratio.dtype)
    scale = sample_weights.detach().to(ratio.dtype) if sample_weights is not None else None
    if level == "token":
        adv_t = adv[:, None].expand_as(ratio)
        terms = clipped_terms(ratio, adv_t, clip_low, clip_high, clip_ratio_c) * weights.detach().to(ratio.dtype)
        if scale is not None:
            terms = terms * scale[:, None]
        loss = aggregate(terms, mask, loss_agg, max_tokens)
        taking_part = mask
    else:
        adv_t = adv
        terms = clipped_terms(ratio, adv_t, clip_low, clip_high, clip_ratio_c)
        if scale is not None:
            terms = terms * scale
        taking_part = mask.any(-1)  # a reply whose every token is masked (mask_truncated_replies) takes no part
        loss = _replies_mean(terms, mask)
    with torch.no_grad():
        count = taking_part.sum().clamp(min=1)
        outside = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)) & taking_part
        dev = torch.where(taking_part, (ratio - 1.0).abs(), torch.zeros_like(ratio))
        metrics = {
            "approx_kl": torch.where(taking_part, (ratio - 1.0) - log_ratio, torch.zeros_like(ratio)).sum() / count,
            "clipfrac": outside.sum() / count,
            "ratio_max_dev": dev.max() if dev.numel() else torch.zeros((), device=ratio.device),
        }
        if clip_ratio_c is not None:
            held = (adv_t < 0) & (ratio > clip_ratio_c) & taking_part
            metrics["dual_clipfrac"] = held.sum() / count
    return loss, metrics

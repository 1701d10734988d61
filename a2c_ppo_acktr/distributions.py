"""Token-level distributions of generated text: log-probs under a temperature, weights, entropy, KL.

One function, :func:`process_logits`, turns raw next-token logits into the distribution the policy
samples from (divide by the row's temperature, then forbid placeholder tokens). The rollout's
``LogitsProcessor`` and the training forward both call it, so a token's log-prob is the same number in
``act`` and in ``evaluate_actions``; a second, slightly different implementation is how rollout and
update silently disagree (DESIGN.md, "Invariant that must hold").

Action log-prob (RL4VLM, Zhai et al. 2024)::

    log pi(a|s) = thought_prob_coef * sum(log p(thought tokens)) + sum(log p(other tokens))

Thought tokens are the tokens whose characters overlap the value of ``"thoughts"`` in the decoded
text (:func:`a2c_ppo_acktr.prompts.response_spans`). Every other generated token (JSON keys and
punctuation, the action value, the end-of-sequence token) counts at weight 1, as in RL4VLM, which
weights everything outside the thoughts fully. Text whose spans cannot be found weights all tokens 1.
The split comes from character offsets, never from hard-coded token ids.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from a2c_ppo_acktr import prompts

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level tokenizer decodes a partial UTF-8 character to


def process_logits(logits: Tensor, temperatures: Tensor, forbidden_ids: Tensor | None) -> Tensor:
    """Logits of the sampling distribution: ``logits / T`` with forbidden ids set to ``-inf``.

    Args:
        logits: ``(B, V)`` or ``(B, L, V)`` raw logits (any float dtype; computed in float32).
        temperatures: ``(B,)`` per-row temperatures (> 0). Gradients flow into them.
        forbidden_ids: ``(K,)`` long tensor of token ids that may never be generated, or None.

    Returns:
        Float32 tensor of the same shape as ``logits``.
    """
    if temperatures.dim() != 1 or temperatures.shape[0] != logits.shape[0]:
        raise ValueError(
            f"temperatures must have shape (B,) = ({logits.shape[0]},), got {tuple(temperatures.shape)}"
        )
    shape = (-1,) + (1,) * (logits.dim() - 1)
    out = logits.float() / temperatures.float().view(shape)
    if forbidden_ids is not None and forbidden_ids.numel() > 0:
        # index_fill keeps autograd happy (the filled entries get zero gradient).
        out = out.index_fill(-1, forbidden_ids.to(out.device), float("-inf"))
    return out


def token_log_probs(processed_logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probability of ``tokens`` under ``processed_logits``.

    Args:
        processed_logits: ``(B, L, V)`` output of :func:`process_logits`.
        tokens: ``(B, L)`` long token ids (padding positions may hold any valid id; mask them later).

    Returns:
        ``(B, L)`` float32 log-probs.
    """
    logp = torch.log_softmax(processed_logits, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _safe_log_softmax(processed_logits: Tensor) -> tuple[Tensor, Tensor]:
    """``(probs, log_probs)`` with ``log_probs`` zeroed where the probability is exactly 0.

    Forbidden ids have logit ``-inf``; ``0 * -inf`` would be NaN in entropy and KL, and so would its
    gradient, so those entries are zeroed before the product instead of after it.
    """
    logp = torch.log_softmax(processed_logits, dim=-1)
    impossible = torch.isneginf(processed_logits)
    return logp.exp(), logp.masked_fill(impossible, 0.0)


def token_entropy(processed_logits: Tensor) -> Tensor:
    """Entropy of each position's distribution. ``(B, L, V) -> (B, L)``."""
    p, logp = _safe_log_softmax(processed_logits)
    return -(p * logp).sum(-1)


def token_kl(processed_logits: Tensor, ref_processed_logits: Tensor) -> Tensor:
    """Exact ``KL(pi || pi_ref)`` over the vocabulary at each position. ``(B, L, V) x2 -> (B, L)``.

    Exact rather than a sampled estimator (k1/k3): both logits are at hand, and the exact value is
    non-negative and has no sampling noise. Both arguments must forbid the same ids.
    """
    p, logp = _safe_log_softmax(processed_logits)
    _, logq = _safe_log_softmax(ref_processed_logits)
    return (p * (logp - logq)).sum(-1)


def masked_sum(x: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Sum of ``x`` where ``mask`` is true (masked entries may hold NaN/inf; they are never read)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Mean of ``x`` over ``mask``; rows with an empty mask give 0."""
    count = mask.sum(dim).clamp(min=1).to(x.dtype)
    return masked_sum(x, mask, dim) / count


def sequence_log_prob(token_log_probs: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """Weighted action log-prob ``sum_t w_t * log p_t`` over generated tokens.

    Args:
        token_log_probs: ``(B, L)`` per-token log-probs.
        weights: ``(B, L)`` token weights (``thought_prob_coef`` on thought tokens, 1 elsewhere).
        mask: ``(B, L)`` bool, true on generated tokens (false on padding).

    Returns:
        ``(B,)`` action log-probs.
    """
    return masked_sum(token_log_probs * weights.to(token_log_probs.dtype), mask)


# ---------------------------------------------------------------------------------------------
# Thought / action split from character offsets
# ---------------------------------------------------------------------------------------------
def token_char_ends(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """End character offset of each token in ``tokenizer.decode(ids, skip_special_tokens=True)``.

    Built by decoding growing prefixes (``decode``/``batch_decode`` are all it uses), so it needs
    nothing tokenizer-specific. Token ``k`` covers
    characters ``[ends[k-1], ends[k])``; special tokens cover nothing. A token that ends inside a
    multi-byte character (the prefix decodes to a trailing replacement character that the full text
    does not have there) covers nothing, and the character goes to the token that completes it.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    # One batched call (Rust-side for fast tokenizers) instead of len(ids) Python-level decodes.
    prefixes = tokenizer.batch_decode([ids[: k + 1] for k in range(len(ids))], skip_special_tokens=True)
    ends: list[int] = []
    prev = 0
    for prefix in prefixes:
        end = len(prefix)
        while end > prev and prefix[end - 1] == REPLACEMENT_CHAR and text[end - 1 : end] != REPLACEMENT_CHAR:
            end -= 1
        end = min(max(end, prev), len(text))
        ends.append(end)
        prev = end
    return ends


def thought_token_mask(char_ends: Sequence[int], thought_span: tuple[int, int] | None) -> Tensor:
    """Bool ``(L,)``: true for tokens whose characters overlap ``thought_span = (start, end)``.

    A token straddling the span's edge (e.g. the last thought word fused with the closing quote)
    counts as a thought token: it carries thought characters, and the quote is format, not action.
    """
    mask = torch.zeros(len(char_ends), dtype=torch.bool)
    if thought_span is None:
        return mask
    t0, t1 = thought_span
    start = 0
    for k, end in enumerate(char_ends):
        mask[k] = end > start and start < t1 and end > t0
        start = end
    return mask


def token_weights(char_ends: Sequence[int], thought_span: tuple[int, int] | None, thought_prob_coef: float) -> Tensor:
    """Float32 ``(L,)`` weights: ``thought_prob_coef`` on thought tokens, 1 on every other token."""
    w = torch.ones(len(char_ends), dtype=torch.float32)
    w[thought_token_mask(char_ends, thought_span)] = float(thought_prob_coef)
    return w


def response_token_weights(tokenizer: Any, ids: Sequence[int], thought_prob_coef: float) -> Tensor:
    """Token weights of one generated response, spans read by :func:`prompts.response_spans`.

    Args:
        tokenizer: the processor's tokenizer (``decode`` is all that is used).
        ids: generated token ids of one row, padding removed (EOS kept if generated).
        thought_prob_coef: weight of thought tokens (``ModelConfig.thought_prob_coef``).

    Returns:
        ``(len(ids),)`` float32 weights; all ones when the text has no thoughts value.
    """
    text = tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
    thought_span, _ = prompts.response_spans(text)
    return token_weights(token_char_ends(tokenizer, ids), thought_span, thought_prob_coef)

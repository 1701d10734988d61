"""Token-level distributions of generated text: log-probs under a temperature, weights, entropy, KL.

One function, :func:`process_logits`, turns raw next-token logits into the distribution the policy
samples from (divide by the row's temperature, then forbid placeholder tokens). The rollout's
``LogitsProcessor`` and the training forward both call it, so a token's log-prob is the same number in
``act`` and in ``evaluate_actions``; a second, slightly different implementation is how rollout and
update silently disagree (the ratio-1 invariant: docs/CONTRACTS.md, "Policy and PPO").

Action log-prob (RL4VLM, Zhai et al. 2024)::

    log pi(a|s) = thought_prob_coef * sum(log p(thought tokens)) + sum(log p(other tokens))

Thought tokens are the tokens whose characters overlap the value of ``"thoughts"`` in the decoded
text (:func:`a2c_ppo_acktr.common.prompts.response_spans`). Every other generated token (JSON keys and
punctuation, the action value, the end-of-sequence token) counts at weight 1, as in RL4VLM, which
weights everything outside the thoughts fully. Text whose spans cannot be found weights all tokens 1.
The split comes from character offsets, never from hard-coded token ids.

Memory: a full-vocabulary float32 ``(B, R, V)`` tensor is 0.6 GB for a real Qwen (V = 151,936) at
B = 4, R = 256, and the naive composition of :func:`process_logits`, :func:`token_log_probs`,
:func:`token_entropy` and :func:`token_kl` keeps several of them alive for backward.
:func:`chunked_token_stats` computes the same three numbers per token a chunk of positions at a
time, from the final hidden states (applying ``lm_head`` itself) or from logits, under activation
checkpointing: the forward keeps only the chunk's inputs, and the backward recomputes one chunk's
float32 intermediates at a time, so the extra memory is ``O(chunk_tokens * V)`` in both passes.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from a2c_ppo_acktr.common import prompts

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level tokenizer decodes a partial UTF-8 character to


def process_logits(
    logits: Tensor, temperatures: Tensor, forbidden_ids: Tensor | None, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Logits of the sampling distribution: ``logits / T`` with forbidden ids set to ``-inf``, then
    (optionally) only the ``top_k`` largest and the nucleus of mass ``top_p`` kept.

    Args:
        logits: ``(B, V)`` or ``(B, L, V)`` raw logits (any float dtype; computed in float32).
        temperatures: ``(B,)`` per-row temperatures (> 0). Gradients flow into them.
        forbidden_ids: ``(K,)`` long tensor of token ids that may never be generated, or None.
        top_k: keep the k most likely tokens of each position (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``
            (1.0: all; the most likely token is always kept). Which tokens are kept is decided
            without gradient; the kept logits keep theirs.

    Returns:
        Float32 tensor of the same shape as ``logits``.
    """
    if temperatures.dim() != 1 or temperatures.shape[0] != logits.shape[0]:
        raise ValueError(f"temperatures must have shape (B,) = ({logits.shape[0]},), got {tuple(temperatures.shape)}")
    shape = (-1,) + (1,) * (logits.dim() - 1)
    out = logits.float() / temperatures.float().view(shape)
    if forbidden_ids is not None and forbidden_ids.numel() > 0:
        # index_fill keeps autograd happy (the filled entries get zero gradient).
        out = out.index_fill(-1, forbidden_ids.to(out.device), float("-inf"))
    if top_k > 0 or top_p < 1.0:
        out = out.masked_fill(_filtered_out(out.detach(), top_k, top_p), float("-inf"))
    return out


def _filtered_out(z: Tensor, top_k: int, top_p: float) -> Tensor:
    """Bool mask of the entries top-k / top-p sampling removes from logits ``z`` (..., V)."""
    drop = torch.zeros_like(z, dtype=torch.bool)
    if 0 < top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        drop |= z < kth
    if top_p < 1.0:
        sorted_z, order = z.masked_fill(drop, float("-inf")).sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        # Drop a token when the mass of the tokens strictly before it already reaches top_p.
        before = probs.cumsum(-1) - probs
        drop |= torch.zeros_like(drop).scatter(-1, order, before >= top_p)
    return drop


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


# Positions per chunk in chunked_token_stats are chosen so that one float32 (chunk, V) tensor holds
# this many elements (32 MB). A chunk's backward holds about ten such tensors (logits, log-softmax,
# probabilities, the reference's log-probs, products, their gradients; measured 9.5 with the KL):
# ~320 MB at V = 151,936 (55 tokens a chunk), small next to a 3B/7B model's activations, while a
# 55-row lm_head matmul still keeps a GPU busy. Larger chunks buy little speed; smaller ones pay
# more Python and kernel-launch overhead.
LOGITS_CHUNK_ELEMENTS = 2**23


def logits_chunk_tokens(vocab_size: int) -> int:
    """Positions per chunk for a vocabulary of ``vocab_size``: ``LOGITS_CHUNK_ELEMENTS // V`` (>= 1)."""
    return max(1, LOGITS_CHUNK_ELEMENTS // int(vocab_size))


class TokenStats(NamedTuple):
    """Per-token statistics of generated positions; each ``(B, R)`` float32, 0 where not computed."""

    log_probs: Tensor  # log p(token) under the processed (temperature, forbidden ids, top-k/p) distribution
    entropy: Tensor  # entropy of that distribution
    kl: Optional[Tensor]  # exact KL(pi || pi_ref); None without a reference
    ref_log_probs: Optional[Tensor] = None  # log pi_ref(token) (no grad); None without a reference


def _chunk_stats(
    inputs: Tensor,
    ref_inputs: Optional[Tensor],
    temperatures: Tensor,
    rows: Tensor,
    cols: Tensor,
    tokens: Tensor,
    head: Optional[Callable[[Tensor], Tensor]],
    ref_head: Optional[Callable[[Tensor], Tensor]],
    forbidden_ids: Optional[Tensor],
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """``(N, 2 or 4)`` [log-prob, entropy(, KL, reference log-prob)] of the N positions ``(rows, cols)``
    of ``inputs``. The reference is not filtered by top-k/top-p (its distribution is the model's own).

    The same formulas as :func:`token_log_probs`, :func:`token_entropy` and :func:`token_kl`, with one
    log-softmax shared by the three. The positions are selected inside (not by the caller) so that a
    checkpointed call keeps only references to the full inputs, never a chunk-sized copy.
    """
    x = inputs[rows, cols]
    logits = process_logits(
        head(x) if head is not None else x, temperatures[rows], forbidden_ids, top_k, top_p
    )  # (N, V) fp32
    raw = torch.log_softmax(logits, dim=-1)
    # The token's log-prob is read before zeroing impossible entries: a forbidden token keeps its
    # -inf, as in token_log_probs; entropy and KL use the zeroed copy, as _safe_log_softmax does.
    log_prob = raw.gather(-1, tokens[:, None]).squeeze(-1)
    p, logp = raw.exp(), raw.masked_fill(torch.isneginf(logits), 0.0)
    out = [log_prob, -(p * logp).sum(-1)]
    if ref_inputs is not None:
        with torch.no_grad():  # the reference is a fixed target: no gradient into it (nor into lm_head through it)
            y = ref_inputs[rows, cols]
            ref_logits = process_logits(
                ref_head(y) if ref_head is not None else y, temperatures[rows].detach(), forbidden_ids
            )
            _, logq = _safe_log_softmax(ref_logits)
            ref_log_prob = torch.log_softmax(ref_logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        out.append((p * (logp - logq)).sum(-1))
        out.append(ref_log_prob)
    return torch.stack(out, dim=-1)


def chunked_token_stats(
    inputs: Tensor,
    tokens: Tensor,
    temperatures: Tensor,
    forbidden_ids: Optional[Tensor],
    mask: Tensor,
    head: Optional[Callable[[Tensor], Tensor]] = None,
    ref_inputs: Optional[Tensor] = None,
    ref_head: Optional[Callable[[Tensor], Tensor]] = None,
    chunk_tokens: Optional[int] = None,
    top_k: int = 0,
    top_p: float = 1.0,
    num_chunks: Optional[int] = None,
) -> TokenStats:
    """Token log-probs, entropies and KLs of the masked positions, never holding a full ``(B, R, V)``.

    Equal (to float32 rounding) to ``token_log_probs(z, tokens)``, ``token_entropy(z)`` and
    ``token_kl(z, z_ref)`` with ``z = process_logits(head(inputs), temperatures, forbidden_ids)``,
    values and gradients (into ``inputs``, ``temperatures`` and ``head``'s weights) alike.

    Args:
        inputs: ``(B, R, H)`` inputs of ``head`` (final hidden states), or ``(B, R, V)`` raw logits
            when ``head`` is None.
        tokens: ``(B, R)`` long ids whose log-probs are read.
        temperatures: ``(B,)`` per-row temperatures (gradients flow into them; not into the KL's
            reference side, which uses them detached).
        forbidden_ids: ``(K,)`` ids masked to ``-inf`` (as :func:`process_logits`), or None.
        mask: ``(B, R)`` bool; only these positions are computed (padding costs nothing).
        head: maps ``(N, H) -> (N, V)`` logits (``lm_head``); None when ``inputs`` are logits.
        ref_inputs: ``(B, R, H)`` (or ``(B, R, V)``) inputs of the reference policy, without grad;
            None skips the KL.
        ref_head: the reference's head (default ``head``).
        chunk_tokens: positions per chunk; default :func:`logits_chunk_tokens` of the vocabulary
            (read from ``head.out_features`` or ``inputs.shape[-1]``).
        top_k, top_p: the sampling filters of :func:`process_logits` (the policy side only).
        num_chunks: make exactly this many chunks (at least the number ``chunk_tokens`` needs); the
            extra ones are empty but still call ``head`` and ``ref_head``, in the forward and in the
            backward's recompute. Under ZeRO-3 each ``head`` call is a collective, so every process
            must make the same number (:func:`a2c_ppo_acktr.run.distributed.agreed_chunk_count`).

    Returns:
        :class:`TokenStats` of ``(B, R)`` float32 tensors, 0 where ``mask`` is false.
    """
    if mask.shape != tokens.shape or inputs.shape[:2] != tokens.shape:
        raise ValueError(
            f"inputs {tuple(inputs.shape)}, tokens {tuple(tokens.shape)} and mask {tuple(mask.shape)} must agree on "
            "(B, R)"
        )
    if chunk_tokens is None:
        vocab = getattr(head, "out_features", None) if head is not None else inputs.shape[-1]
        if vocab is None:
            raise ValueError(
                f"cannot tell the vocabulary size of head {type(head).__name__}; pass "
                "chunk_tokens=logits_chunk_tokens(V)"
            )
        chunk_tokens = logits_chunk_tokens(vocab)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    ref_head = head if ref_head is None else ref_head
    rows, cols = mask.nonzero(as_tuple=True)
    tokens_sel = tokens[rows, cols]
    n_stats = 4 if ref_inputs is not None else 2
    needed = -(-rows.numel() // chunk_tokens)
    if num_chunks is not None and num_chunks < needed:
        raise ValueError(
            f"num_chunks={num_chunks} is fewer than the {needed} chunks of {chunk_tokens} positions that "
            f"{rows.numel()} positions need"
        )
    parts = []
    for k in range(needed if num_chunks is None else num_chunks):
        start = k * chunk_tokens  # past the end: an empty chunk
        args = (
            inputs,
            ref_inputs,
            temperatures,
            rows[start : start + chunk_tokens],
            cols[start : start + chunk_tokens],
            tokens_sel[start : start + chunk_tokens],
            head,
            ref_head,
            forbidden_ids,
            top_k,
            top_p,
        )
        if torch.is_grad_enabled():
            # Non-reentrant checkpoint: the forward stores only the arguments (references, no copies);
            # backward re-runs this chunk and frees its (N, V) intermediates before the next chunk.
            # No randomness inside, so the RNG state need not be saved and restored. The recompute's
            # metadata check is off: under DeepSpeed ZeRO-3 lm_head's weight is partitioned (shape
            # [0]) again by the time the check reads it, although the recompute used it gathered.
            parts.append(
                checkpoint(_chunk_stats, *args, use_reentrant=False, preserve_rng_state=False, determinism_check="none")
            )
        else:
            parts.append(_chunk_stats(*args))
    flat = torch.cat(parts) if parts else inputs.new_zeros((0, n_stats), dtype=torch.float32)
    out = flat.new_zeros(tokens.shape + (n_stats,)).index_put((rows, cols), flat)
    if ref_inputs is None:
        return TokenStats(log_probs=out[..., 0], entropy=out[..., 1], kl=None)
    return TokenStats(log_probs=out[..., 0], entropy=out[..., 1], kl=out[..., 2], ref_log_probs=out[..., 3])


def sample_kl(log_probs: Tensor, ref_log_probs: Tensor, estimator: str) -> Tensor:
    """Per-token sample estimates of ``KL(pi || pi_ref)`` on tokens drawn from pi (Schulman 2020).

    With ``d = log pi_ref(x) - log pi(x)``: ``k1 = -d`` (unbiased, can be negative), ``k2 = d^2 / 2``
    (biased, low variance), ``k3 = exp(d) - 1 - d`` (unbiased, >= 0, low variance). Gradients flow
    through ``log_probs`` only. Positions where both are ``-inf`` should be masked by the caller.
    """
    d = ref_log_probs.detach() - log_probs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.expm1(d) - d
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3 (or 'full' for the exact KL)")


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
    if thought_span is None:
        return torch.zeros(len(char_ends), dtype=torch.bool)
    t0, t1 = thought_span
    starts = [0, *char_ends[:-1]]
    # One tensor from a list: element-wise tensor writes cost microseconds each, per token per turn.
    return torch.tensor(
        [end > start and start < t1 and end > t0 for start, end in zip(starts, char_ends)], dtype=torch.bool
    )


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
    if thought_span is None or thought_prob_coef == 1.0:
        return torch.ones(len(ids), dtype=torch.float32)  # every token at weight 1: no offsets needed
    return token_weights(token_char_ends(tokenizer, ids), thought_span, thought_prob_coef)

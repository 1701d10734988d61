"""The training forward: stored turns re-scored with gradients (log-probs, values, entropy, KL).

The forward stops the model at ``lm_head``'s input and computes log-probs, entropy and KL with
:func:`~a2c_ppo_acktr.policy.distributions.chunked_token_stats`: ``lm_head`` and the float32
vocabulary-wide work run a chunk of positions at a time, recomputed in backward, so no ``(B, R, V)``
tensor is ever alive (the formulas are those of ``process_logits``/``token_log_probs``, the ones
sampling uses).

Batch layout: ``[left-padded prompt | generated ids right-padded]``; the attention mask covers both
paddings, and ``logits_to_keep = R + 1`` makes ``lm_head`` see exactly the last prompt token and the
generated positions: position 0 of its input is the last prompt token (value, temperature),
positions ``0..R-1`` predict the R generated tokens. A minibatch's turns carry the processor output
the rollout made (:mod:`a2c_ppo_acktr.policy.encoding`), collated here instead of running the
processor again, so no re-tokenisation can drift from the rollout's; a minibatch without them is
re-processed and its prompt ids checked against the rollout's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from a2c_ppo_acktr.policy.distributions import (
    chunked_token_stats,
    logits_chunk_tokens,
    masked_mean,
    masked_sum,
    sample_kl,
    sequence_log_prob,
)
from a2c_ppo_acktr.policy.encoding import collate
from a2c_ppo_acktr.policy.references import reference_named
from a2c_ppo_acktr.run.distributed import agreed_chunk_count

Policy = Any  # a2c_ppo_acktr.policy.model.VLMPolicy, which imports this module


@dataclass
class EvalOutput:
    """What :meth:`VLMPolicy.evaluate_actions` returns; all ``(B,)`` float32."""

    log_probs: Tensor
    values: Tensor
    entropy: Tensor  # mean per-token entropy over the generated tokens
    kl: Optional[
        Tensor
    ]  # mean per-token KL(pi || pi_ref) over generated tokens (the chosen estimator); None if not asked
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


def _responses(
    policy: Policy, generated_ids: Sequence[Tensor], token_weights: Sequence[Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """``(B, R)`` right-padded response ids, their mask and token weights, on the model's device."""
    B, R = len(generated_ids), max((len(g) for g in generated_ids), default=0)
    # Built on the CPU and moved once each: a copy per row would be a host sync per row.
    resp = torch.full((B, R), policy.pad_id, dtype=torch.long)
    resp_mask = torch.zeros(B, R, dtype=torch.bool)
    weights = torch.zeros(B, R, dtype=torch.float32)
    for i, (g, w) in enumerate(zip(generated_ids, token_weights)):
        if len(w) != len(g):
            raise ValueError(f"row {i}: {len(w)} token weights for {len(g)} generated tokens")
        resp[i, : len(g)] = g.cpu()
        resp_mask[i, : len(g)] = True
        weights[i, : len(g)] = w.cpu()
    return resp.to(policy.device), resp_mask.to(policy.device), weights.to(policy.device)


def forward_turns(
    policy: Policy,
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

    ``reference``: what the KL (``with_kl``) compares with, one of ``model.REFERENCES``;
    ``noise_seed`` seeds the ``noised_images`` pixels. ``vision``: the kept vision encodings of
    the batch's images in order (:attr:`TurnEncoding.vision`), forwarded instead of the pixels
    (the tower does not run; a reference that changes the pixels still gets them).

    ``kl_estimator``: ``full`` (exact per-token KL over the vocabulary) or ``k1``/``k2``/``k3``
    (:func:`~a2c_ppo_acktr.policy.distributions.sample_kl` on the sampled tokens). ``detach_temperature``:
    the log-probs, entropy and KL see the temperatures without gradient (the temperature head is
    then off the policy-gradient path; ``EvalOutput.temperatures`` keeps the head's gradient, for
    its own loss, but not the language model's)."""
    resp, resp_mask, weights = _responses(policy, generated_ids, token_weights)
    R = resp.shape[1]
    num_positions = int(resp_mask.sum())
    inputs = dict(enc)
    inputs["input_ids"] = torch.cat([enc["input_ids"], resp], dim=1)
    inputs["attention_mask"] = torch.cat([enc["attention_mask"], resp_mask.to(enc["attention_mask"].dtype)], dim=1)
    if "mm_token_type_ids" in enc:  # generated tokens are text
        inputs["mm_token_type_ids"] = torch.cat(
            [enc["mm_token_type_ids"], torch.zeros_like(resp, dtype=enc["mm_token_type_ids"].dtype)], dim=1
        )
    inputs = policy._with_positions(inputs)
    reuse = policy.vision
    encoded = inputs if vision is None else reuse.forward_inputs(inputs, vision, policy.device)
    head = policy.base_model.get_output_embeddings()
    ref_final = ref_head = None
    if with_kl:
        # Before the policy's forward: this no-grad pass's working set then never sits on top
        # of the activations the policy's forward keeps for backward.
        strategy = reference_named(reference)
        ref_final = strategy.hidden(policy, inputs if strategy.reads_pixels else reuse.fresh(encoded), R, noise_seed)
        ref_head = strategy.head(policy, head)
    # The model runs up to lm_head's input only; the logits are made chunk by chunk below, so no
    # full (B, R+1, V) tensor (model dtype) nor its float32 derivatives exist at once.
    with policy._catch_lm_head_input(skip_logits=True) as caught:
        policy.model(**reuse.fresh(encoded), use_cache=False, logits_to_keep=R + 1)
    # (B, R+1, H) final hidden states: the last prompt token, then the generated ones; a copy,
    # so that the chunks' references do not keep the whole (B, T, H) tensor alive.
    final = caught[0].clone()
    hidden = final[:, 0]  # the last prompt token (left padding: index P-1 in every row)
    temps = policy._temperatures(hidden, temperature, detach_input=detach_temperature)
    values = policy._values(hidden)
    chunk = policy.cfg.logits_chunk_tokens or logits_chunk_tokens(policy.vocab_size)
    stats = chunked_token_stats(
        final[:, :R],
        resp,
        temps.detach() if detach_temperature else temps,
        policy.forbidden_ids,
        resp_mask,
        head=head,
        ref_inputs=ref_final,
        ref_head=ref_head,
        chunk_tokens=chunk,
        top_k=policy.cfg.top_k,
        top_p=policy.cfg.top_p,
        num_chunks=agreed_chunk_count(-(-num_positions // chunk), head),  # equal lm_head calls on every ZeRO-3 rank
    )
    log_probs = sequence_log_prob(stats.log_probs, weights, resp_mask)
    entropy = masked_mean(stats.entropy, resp_mask)
    seq_entropy = masked_sum(stats.entropy * weights, resp_mask)
    kl = kl_sum = per_token = None
    if stats.kl is not None:
        per_token = (
            stats.kl if kl_estimator == "full" else sample_kl(stats.log_probs, stats.ref_log_probs, kl_estimator)
        )
        kl, kl_sum = masked_mean(per_token, resp_mask), masked_sum(per_token, resp_mask)
    return EvalOutput(
        log_probs=log_probs,
        values=values,
        entropy=entropy,
        kl=kl,
        temperatures=temps,
        seq_entropy=seq_entropy,
        kl_sum=kl_sum,
        token_log_probs=stats.log_probs,
        token_kl=per_token,
        token_mask=resp_mask,
        token_entropy=stats.entropy,
    )


def minibatch_inputs(policy: Policy, minibatch: Any) -> tuple[dict[str, Tensor], Optional[list[dict[str, Tensor]]]]:
    """The forward's prompt batch for a minibatch's turns and their kept vision encodings (or None):
    the rollout's own processor output when the turns carry it, else the processor run again; either
    way the prompt ids are checked against the rollout's.

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
        enc = policy._to_device(collate(encodings, policy._pad_token_id))
        fix = "the storage paired a turn's encoding with another turn's prompt ids"
        if policy.vision.owner is not None and all(e.vision is not None for e in encodings):
            vision = [entry for e in encodings for entry in e.vision]  # the rollout's: no tower pass
    else:
        enc = policy._encode(minibatch.prompts, minibatch.images)
        now_ids = policy._unpadded(enc)
        fix = "the processor or its pixel budget changed between rollout and update"
    for i, (now, then) in enumerate(zip(now_ids, minibatch.prompt_ids)):
        if not torch.equal(now, then.cpu()):
            raise ValueError(f"turn {i}: the prompt has {len(now)} ids now but had {len(then)} in the rollout; {fix}")
    return enc, vision

"""Float32 comparison bounds derived from the arithmetic, not tuned to one CPU.

Two float32 computations of the same value that add ``terms`` rounded terms in different orders
(another kernel's blocking, chunked against whole, batched against one row) differ by at most about
``terms * eps * magnitude``, where ``magnitude`` bounds the terms and partial sums: each addition
rounds to within eps of its result. The bound does not depend on which CPU, SIMD width or thread
count computed either side; a tolerance written as a bare 1e-6 does.

A model forward chains thousands of such additions (every layer's projections, attention over the
sequence, the vocabulary's log-sum-exp), and the worst case, every rounding error of the same sign
and full size, would allow about what a padding leak changes (0.35 against 0.4 on a ten-token
response of the tiny Qwen2.5-VL). Rounding errors of
different summation orders are independent, each within +-eps/2 of its magnitude, with mean zero:
by Hoeffding's inequality the ``2 * terms`` of two such computations differ by more than
``CHAIN_SIGMAS * sqrt(terms) * eps * magnitude`` with probability at most
``2 * exp(-CHAIN_SIGMAS**2)`` (3e-11), whichever CPU ran them (:func:`f32_chain_tolerance`). The
magnitude of a forward's outputs is measured (max |logit| / T; the heads' outputs plus the O(1)
normalised hidden states they sum), and each stage is taken to pass relative errors on unamplified,
as layer norms and residual streams of O(1) gain do.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

EPS32 = torch.finfo(torch.float32).eps
CHAIN_SIGMAS = 5.0


def f32_tolerance(terms: int, magnitude: float) -> float:
    """``terms * eps32 * magnitude`` (see the module docstring)."""
    return terms * EPS32 * float(magnitude)


def f32_chain_tolerance(terms: int, magnitude: float) -> float:
    """``CHAIN_SIGMAS * sqrt(terms) * eps32 * magnitude``, never more than :func:`f32_tolerance`: two
    computations that round ``terms`` additions each in another order (see the module docstring)."""
    return min(terms, CHAIN_SIGMAS * math.sqrt(terms)) * EPS32 * float(magnitude)


def logit_terms(hidden: int, vocab: int) -> int:
    """Rounded additions behind one token statistic: ``hidden`` products per logit, then a
    log-sum-exp (and an entropy or KL sum) over ``vocab`` logits."""
    return hidden + 2 * vocab


def block_terms(hidden: int, intermediate: int, seq: int) -> int:
    """Rounded additions one transformer block puts on the path to its output at one position: two
    norms, the q, k, v and output projections, the scores (a head's width, counted as ``hidden``) and
    the MLP's gate and up projections (``hidden`` each), the softmax normaliser and the value sum
    over ``seq`` positions, and the down projection (``intermediate``)."""
    return 9 * hidden + 2 * seq + intermediate


def vlm_forward_terms(config: Any, seq: int) -> int:
    """Rounded additions on the path from a VLM's inputs to one final hidden state over ``seq``
    positions: the vision tower (patch embedding, its blocks over one image's patches, the
    projector), the language model's blocks and the final norm. One image's patches: CLIP's fixed
    grid, or at most ``spatial_merge_size**2`` per position of the sequence (Qwen-VL's merger)."""
    text = config.get_text_config()
    terms = text.num_hidden_layers * block_terms(text.hidden_size, text.intermediate_size, seq) + text.hidden_size
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        width = getattr(vision, "embed_dim", None) or vision.hidden_size
        intermediate = getattr(vision, "intermediate_size", None) or width * vision.mlp_ratio
        depth = getattr(vision, "depth", None) or vision.num_hidden_layers
        channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", None) or 3
        patch_inputs = channels * vision.patch_size**2 * (getattr(vision, "temporal_patch_size", None) or 1)
        merge = getattr(vision, "spatial_merge_size", None) or 1
        image_size = getattr(vision, "image_size", None)
        patches = (image_size // vision.patch_size) ** 2 + 1 if image_size else merge**2 * seq
        projector = 2 * max(merge**2 * width, text.hidden_size)
        terms += patch_inputs + depth * block_terms(width, intermediate, patches) + projector
    return terms


def vlm_token_terms(config: Any, seq: int) -> int:
    """Rounded additions behind one token log-prob, entropy or KL, ``z_t - logsumexp(z)``: two logits'
    forwards (the token's and the largest's, ``lm_head`` adding ``hidden`` products to each), then
    the log-sum-exp and the entropy or KL sum over the vocabulary."""
    text = config.get_text_config()
    return logit_terms(2 * (vlm_forward_terms(config, seq) + text.hidden_size), text.vocab_size)


def head_terms(head: torch.nn.Module) -> int:
    """Rounded additions through a small MLP head: each Linear's input width."""
    return sum(m.in_features for m in head.modules() if isinstance(m, torch.nn.Linear))


@dataclass(frozen=True)
class ForwardBounds:
    """Bounds for two float32 computations of the same turns through a VLM policy that differ in
    batch layout, padding, KV caching, chunking or kernels (:func:`f32_chain_tolerance`)."""

    token: float  # one token's log-prob, entropy or KL (and their per-response means)
    log_prob: float  # a response's weighted log-prob: its tokens' bounds times their weights, then their sum
    value: float
    temperature: float

    @property
    def ratio(self) -> float:
        """``|exp(new - old) - 1|`` when the log-probs differ by at most ``log_prob``."""
        return math.expm1(self.log_prob)


def forward_bounds(
    policy: Any,
    seq: int,
    length: int,
    logit: float,
    log_prob: float,
    value: float,
    temperature: float,
    weight: float = 1.0,
) -> ForwardBounds:
    """:class:`ForwardBounds` of ``policy`` on ``seq`` positions (padded prompt plus ``length``
    response tokens, the longest), with measured max |logit / T| ``logit``, max |log-prob|, |value|,
    T and token weight. Token statistics have magnitude ``logit + 1`` (the log-sum-exp's terms are at
    most 1); a response adds ``length`` of them, each scaled by its weight; the heads sum O(1)
    normalised hidden states."""
    config = policy.base_model.config
    token = f32_chain_tolerance(vlm_token_terms(config, seq), logit + 1.0)
    response = f32_chain_tolerance(
        length * vlm_token_terms(config, seq), (logit + 1.0) * max(weight, 1.0)
    ) + f32_tolerance(length, log_prob)
    forward = vlm_forward_terms(config, seq)
    value_bound = f32_chain_tolerance(forward + head_terms(policy.value_head), value + 1.0)
    head = policy.temp_predictor
    temp_bound = f32_chain_tolerance(forward + head_terms(head), temperature + 1.0) if head is not None else 0.0
    return ForwardBounds(token=token, log_prob=response, value=value_bound, temperature=temp_bound)


@contextlib.contextmanager
def recorded_forwards(policy_class: Any) -> Iterator[list[ForwardBounds]]:
    """Record the :class:`ForwardBounds` of every training forward (``_forward_turns``) of any
    ``policy_class`` instance inside the block, measured on that forward itself: its padded length,
    longest response, max |logit| (``lm_head``'s outputs, the reference's included) over the
    smallest temperature, its largest token weight, and its log-probs, values and temperatures."""
    original = policy_class._forward_turns
    records: list[ForwardBounds] = []

    def spy(self: Any, enc: dict, generated_ids: Any, token_weights: Any, *args: Any, **kwargs: Any) -> Any:
        logits = [0.0]

        def hook(_module: Any, _args: Any, out: torch.Tensor) -> None:
            if out.numel():
                logits[0] = max(logits[0], float(out.detach().abs().max()))

        handle = self.base_model.get_output_embeddings().register_forward_hook(hook)
        try:
            out = original(self, enc, generated_ids, token_weights, *args, **kwargs)
        finally:
            handle.remove()
        length = max((len(g) for g in generated_ids), default=0)
        temps = out.temperatures.detach()
        records.append(
            forward_bounds(
                self,
                seq=enc["input_ids"].shape[1] + length,
                length=length,
                logit=logits[0] / float(temps.min()),
                log_prob=float(out.log_probs.detach().abs().max()),
                value=float(out.values.detach().abs().max()),
                temperature=float(temps.max()),
                weight=max((float(w.abs().max()) for w in token_weights if len(w)), default=1.0),
            )
        )
        return out

    policy_class._forward_turns = spy
    try:
        yield records
    finally:
        policy_class._forward_turns = original


def widest(bounds: list[ForwardBounds]) -> ForwardBounds:
    """Each field's largest value over ``bounds`` (several forwards compared against one bound)."""
    return ForwardBounds(*(max(getattr(b, f) for b in bounds) for f in ("token", "log_prob", "value", "temperature")))


def normalized_mean_tolerance(raw: torch.Tensor, normalized: torch.Tensor) -> float:
    """Bound on |mean(normalized)|, 0 in exact arithmetic, where ``normalized = (raw - mean) / std``
    in float32: the float32 mean of the n raw values is off by n roundings at max |raw| (in units of
    the std once divided), each value's subtraction and division round at its size, and the mean of
    the n results adds n more."""
    n = raw.numel()
    std = float(raw.double().std(unbiased=False))
    return f32_tolerance(n, float(raw.abs().max()) / std) + f32_tolerance(n + 2, float(normalized.abs().max()))


def normalized_std_tolerance(normalized: torch.Tensor) -> float:
    """Relative bound on the float32 std of ``normalized`` against its exact value (1 for the
    population std): the normaliser's variance and this one each sum n squares of up to
    max |normalized|^2 after subtracting a mean (a relative error halves in the square root)."""
    return f32_tolerance(normalized.numel() + 2, float(normalized.abs().max()) ** 2)

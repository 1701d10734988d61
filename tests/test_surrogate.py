"""The policy-loss menu (``ppo.ratio_level``, ``ppo.loss_agg``, decoupled and dual clipping, TIS weights,
left-out replies) against the papers' definitions, written here a second time as plain loops over
replies and tokens: values and gradients on random tensors, plus hand-computed cases."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from a2c_ppo_acktr.algo.surrogate import aggregate, clipped_terms, log_ratios, policy_loss
from a2c_ppo_acktr.common.choices import LOSS_AGGREGATIONS, RATIO_LEVELS
from numerics import f32_tolerance


def _case(seed: int = 0, B: int = 5, R: int = 6):
    """Random replies of 1..R tokens: new log-probs (leaf), old ones within +-0.5 (so ratios fall on both
    sides of every clip), token weights 1 or 0.5, advantages of both signs, TIS weights."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = torch.arange(R)[None, :] < lengths[:, None]
    old = -torch.rand(B, R, generator=g) * 3
    new = (old + (torch.rand(B, R, generator=g) - 0.5)).requires_grad_()
    weights = torch.where(torch.rand(B, R, generator=g) < 0.3, torch.full((B, R), 0.5), torch.ones(B, R))
    adv = torch.randn(B, generator=g) * 2
    tis = torch.rand(B, generator=g) + 0.5
    return new, old, adv, mask, weights, tis


def _term(r: float, a: float, low: float, high: float, c):
    """One clipped term, from the definition: max(-A r, -A clip(r)), and min(., -A c) for A < 0."""
    term = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
    if c is not None and a < 0:
        term = min(term, -a * c)
    return term


def _reference_loss(new, old, adv, mask, weights, level, agg, low, high, c, max_tokens, tis):
    """The loss as nested loops over replies and tokens, in torch scalars (so autograd gives its gradient)."""
    B, R = mask.shape
    rows = []
    for i in range(B):
        toks = [t for t in range(R) if mask[i, t]]
        s = tis[i] if tis is not None else 1.0
        if level == "token":
            terms = []
            for t in toks:
                r = torch.exp(new[i, t] - old[i, t])
                a = float(adv[i])
                clipped = torch.clamp(r, 1 - low, 1 + high)
                term = torch.maximum(-a * r, -a * clipped)
                if c is not None and a < 0:
                    term = torch.minimum(term, torch.tensor(-a * c))
                terms.append(term * weights[i, t] * s)
            rows.append(terms)
        else:
            log_r = sum(weights[i, t] * (new[i, t] - old[i, t]) for t in toks)
            if level == "sequence_mean":
                log_r = log_r / sum(weights[i, t] for t in toks)
            r = torch.exp(log_r)
            a = float(adv[i])
            term = torch.maximum(-a * r, -a * torch.clamp(r, 1 - low, 1 + high))
            if c is not None and a < 0:
                term = torch.minimum(term, torch.tensor(-a * c))
            rows.append(term * s)
    if level != "token":
        return sum(rows) / B
    n_tokens = sum(len(r) for r in rows)
    if agg == "token-mean":
        return sum(sum(r) for r in rows) / n_tokens
    if agg == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / B
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / B
    assert agg == "seq-mean-token-sum-norm"
    return sum(sum(r) / max_tokens for r in rows) / B


MODES = [("token", agg) for agg in LOSS_AGGREGATIONS] + [("sequence", None), ("sequence_mean", None)]


@pytest.mark.parametrize("level, agg", MODES)
@pytest.mark.parametrize(
    "clip", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 1.5)], ids=["symmetric", "clip-higher", "dual-clip"]
)
@pytest.mark.parametrize("with_tis", [False, True])
def test_every_mode_matches_its_definition_in_value_and_gradient(level, agg, clip, with_tis):
    low, high, c = clip
    for seed in range(3):
        new, old, adv, mask, weights, tis = _case(seed)
        sample = tis if with_tis else None
        ours, metrics = policy_loss(
            new,
            old,
            adv,
            mask,
            weights,
            level=level,
            loss_agg=agg or "token-mean",
            clip_low=low,
            clip_high=high,
            clip_ratio_c=c,
            max_tokens=7,
            sample_weights=sample,
        )
        (g_ours,) = torch.autograd.grad(ours, new)
        ref_new = new.detach().clone().requires_grad_()
        ref = _reference_loss(ref_new, old, adv, mask, weights, level, agg, low, high, c, 7, sample)
        (g_ref,) = torch.autograd.grad(ref, ref_new)
        # Sums of at most B * R terms of magnitude <= max|A| * e^(3) * 1.5 (tis), in float32.
        scale = float(adv.abs().max()) * math.exp(3.0) * 1.5
        tol = f32_tolerance(mask.numel() + 8, scale)
        assert abs(float(ours.detach()) - float(ref.detach())) <= tol, (seed, float(ours.detach()), float(ref.detach()))
        torch.testing.assert_close(g_ours, g_ref, atol=tol, rtol=0)
        assert float(g_ours[~mask].abs().sum()) == 0.0  # padding takes no gradient
        assert set(metrics) >= {"approx_kl", "clipfrac", "ratio_max_dev"} and (
            ("dual_clipfrac" in metrics) == (c is not None)
        )


def test_hand_computed_token_level_with_clip_higher_and_dual_clip():
    """Two replies of two tokens, ratios e^d with d chosen on both sides of [1 - 0.2, 1 + 0.28] and past c = 2."""
    ratios = torch.tensor([[1.5, 1.1], [2.5, 0.5]])
    new = ratios.log().requires_grad_()
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask, weights = torch.ones(2, 2, dtype=torch.bool), torch.tensor([[1.0, 0.5], [1.0, 1.0]])
    loss, m = policy_loss(
        new,
        old,
        adv,
        mask,
        weights,
        level="token",
        loss_agg="token-mean",
        clip_low=0.2,
        clip_high=0.28,
        clip_ratio_c=2.0,
    )
    # reply 0 (A = 1): token 0 max(-1.5, -1.28) = -1.28 (clipped); token 1 max(-1.1, -1.1) = -1.1, weight 0.5
    # reply 1 (A = -1): token 0 max(2.5, 1.28) = 2.5, dual clip -> min(2.5, 2.0) = 2.0; token 1 max(0.5, 0.8) = 0.8
    expected = (-1.28 - 0.55 + 2.0 + 0.8) / 4
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # d/d log p of -A r w / N where the unclipped branch is taken, 0 where a clip holds the term
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -1.1 * 0.5 / 4], [0.0, 0.0]]))
    assert float(m["clipfrac"]) == pytest.approx(3 / 4)  # 1.5 and 2.5 above 1.28, 0.5 below 0.8
    assert float(m["dual_clipfrac"]) == pytest.approx(1 / 4)
    assert float(m["ratio_max_dev"]) == pytest.approx(1.5)


def test_hand_computed_sequence_levels():
    """RL4VLM's summed ratio against GSPO's mean: one reply of 3 tokens with log-ratios 0.1, 0.1, 0.1 and
    weights 1, 1, 0.5: sum 0.25 (ratio 1.284, clipped at 1.2 with A > 0), mean 0.25 / 2.5 = 0.1 (1.105, inside)."""
    new = torch.full((1, 3), 0.1, requires_grad=True)
    old = torch.zeros(1, 3)
    weights = torch.tensor([[1.0, 1.0, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([2.0])
    seq, _ = policy_loss(new, old, adv, mask, weights, level="sequence", clip_low=0.2, clip_high=0.2)
    assert float(seq) == pytest.approx(-2.0 * 1.2)
    (g,) = torch.autograd.grad(seq, new)
    assert float(g.abs().sum()) == 0.0  # clipped with a positive advantage: no gradient
    mean, _ = policy_loss(new, old, adv, mask, weights, level="sequence_mean", clip_low=0.2, clip_high=0.2)
    assert float(mean) == pytest.approx(-2.0 * math.exp(0.1), rel=1e-6)
    (g,) = torch.autograd.grad(mean, new)
    # d/d log p_t of -A exp(sum w d / sum w) = -A r w_t / sum w
    torch.testing.assert_close(g, -2.0 * math.exp(0.1) * weights / 2.5)


def test_aggregations_weigh_replies_as_their_papers_say():
    """Reply A has 1 token of loss 1, reply B 3 tokens of loss 3 each."""
    terms = torch.tensor([[1.0, 0.0, 0.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    assert float(aggregate(terms, mask, "token-mean")) == pytest.approx(10 / 4)  # every token once
    assert float(aggregate(terms, mask, "seq-mean-token-sum")) == pytest.approx((1 + 9) / 2)
    assert float(aggregate(terms, mask, "seq-mean-token-mean")) == pytest.approx((1 + 3) / 2)  # every reply once
    assert float(aggregate(terms, mask, "seq-mean-token-sum-norm", max_tokens=5)) == pytest.approx((1 + 9) / 2 / 5)
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'mean'; known: \["):
        aggregate(terms, mask, "mean")
    with pytest.raises(ValueError, match=r"unknown ratio level 'tokens'; known: \["):
        log_ratios(terms, terms, terms, mask, "tokens")
    assert set(RATIO_LEVELS) == {"token", "sequence", "sequence_mean"}


def test_left_out_replies_take_no_part_at_any_level():
    """A reply whose tokens are all masked (ppo.mask_truncated_replies) adds nothing to the loss, to its
    denominator or to the gradient; the rest are scored as if it were not there."""
    new, old, adv, mask, weights, _ = _case(4, B=4)
    dropped = mask.clone()
    dropped[1] = False
    for level, agg in MODES:
        kwargs = dict(level=level, loss_agg=agg or "token-mean", clip_low=0.2, clip_high=0.2, max_tokens=6)
        loss, _ = policy_loss(new, old, adv, dropped, weights, **kwargs)
        keep = torch.tensor([0, 2, 3])
        alone, _ = policy_loss(new[keep], old[keep], adv[keep], mask[keep], weights[keep], **kwargs)
        assert float(loss) == pytest.approx(float(alone), rel=1e-6, abs=1e-7), level
        (g,) = torch.autograd.grad(loss, new)
        assert float(g[1].abs().sum()) == 0.0


def test_clipped_terms_is_the_pessimistic_bound_elementwise():
    for r, a in itertools.product([0.5, 0.85, 1.0, 1.25, 1.4, 3.0], [-2.0, -0.5, 0.5, 2.0]):
        got = float(clipped_terms(torch.tensor(r), torch.tensor(a), 0.2, 0.3, 2.5))
        assert got == pytest.approx(_term(r, a, 0.2, 0.3, 2.5)), (r, a)

"""PPO losses against closed forms, and the update loop's guards on a toy tensor policy.

The update is pinned to independent answers: the total loss to a hand computation with every
coefficient non-zero, accumulated gradients to the full-batch gradient (plain and accelerate),
clipped steps to ``max_grad_norm`` along the unclipped direction, and target-KL early stopping to
the epoch a recomputation of the per-epoch KL says it must stop at.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from a2c_ppo_acktr.algo.kl import adapt_kl_coef
from a2c_ppo_acktr.algo.ppo import PPO, explained_variance, ppo_loss, value_loss
from a2c_ppo_acktr.algo.surrogate import policy_loss
from a2c_ppo_acktr.config.arguments import PPOConfig
from helpers import ToyPolicy, one_token_output, toy_minibatch, toy_ppo, toy_storage
from numerics import f32_tolerance


class LinearToyPolicy(nn.Module):
    """Logit ``x_i . w`` and value ``x_i . u`` over fixed random features ``x_i`` of each stored turn.

    Unlike :class:`ToyPolicy` every turn shares the weights, so the gradients of different
    minibatches add up on the same parameters (what accumulation and clipping act on). Entropy is
    the Bernoulli entropy of ``sigmoid(logit)`` and the KL is ``logit^2``, so every loss term has a
    gradient.
    """

    has_reference = True

    def __init__(self, n: int, dim: int = 3, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("features", torch.randn(n, dim, generator=g))
        # small weights: every ratio starts within the clip range of the stored log(0.5)
        self.w = nn.Parameter(0.05 * torch.randn(dim, generator=g))
        self.u = nn.Parameter(0.05 * torch.randn(dim, generator=g))

    def forward(self, mb, with_kl=False):
        x = self.features[mb.indices]
        logit = x @ self.w
        p = torch.sigmoid(logit)
        return one_token_output(
            nn.functional.logsigmoid(logit),
            x @ self.u,
            -(p * p.log() + (1 - p) * (1 - p).log()),
            logit**2 if with_kl else None,
        )


def _full_batch_gradient(policy, st, cfg, kl_coef):
    """The gradient of ``ppo_loss`` over the whole rollout in one batch (no accumulation, no clipping)."""
    mb = next(st.minibatches(st.num_steps * st.num_envs, torch.Generator(), adv_norm="none"))
    out = policy(mb, with_kl=True)
    loss, _ = ppo_loss(out, mb, cfg, kl_coef)
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(policy.parameters()))])


def _flat_weights(policy):
    return torch.cat([p.detach().flatten() for p in policy.parameters()]).clone()


def _step_tolerance(policy, st, cfg, kl_coef, windows):
    """Bound for an SGD step (lr 1) against minus the full-batch gradient: both add the same per-turn
    terms (a mean over turns; elementwise, so equal on both sides) in other groupings, n in one batch
    or n / k in each of k windows and the k window sums, at the largest per-entry sum of |terms| (they
    cancel: it exceeds the gradient); the step's w - g - w rounds twice more at |w|."""
    n = st.num_steps * st.num_envs
    terms = 0
    for mb in st.minibatches(1, torch.Generator(), adv_norm="none"):
        out = policy(mb, with_kl=True)
        loss, _ = ppo_loss(out, mb, cfg, kl_coef)
        terms = terms + torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(policy.parameters()))]).abs() / n
    return f32_tolerance(n + windows, float(terms.max())) + f32_tolerance(2, float(_flat_weights(policy).abs().max()))


def _norm_tolerance(step_tolerance, grad):
    """|norm(a) - norm(b)| <= norm(a - b) <= sqrt(P) * step_tolerance, and each norm's P squares."""
    return grad.numel() ** 0.5 * step_tolerance + 2 * f32_tolerance(grad.numel() + 1, float(grad.norm()))


def _update(policy, st, cfg, backend):
    """One ``PPO.update`` with SGD at ``cfg.lr``, plain or through a single-process CPU Accelerator."""
    opt = torch.optim.SGD(policy.parameters(), lr=cfg.lr)
    if backend == "plain":
        return PPO(policy, opt, cfg, seed=0).update(st)
    from accelerate import Accelerator

    acc = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum_steps)
    model, opt = acc.prepare(policy, opt)
    return PPO(model, opt, cfg, accelerator=acc, seed=0).update(st)


def test_policy_loss_closed_form():
    adv = torch.tensor([1.0, -1.0, 2.0])
    old = torch.zeros(3, 1)
    new = torch.log(torch.tensor([1.5, 1.5, 0.9]))[:, None]
    ones = torch.ones(3, 1)
    mask = ones.bool()
    loss, m = policy_loss(new, old, adv, mask, ones, clip_low=0.2, clip_high=0.2)
    # max(-A r, -A clip(r)): row0 -1.2 (clipped), row1 +1.5 (unclipped, pessimistic), row2 -1.8
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 1.8) / 3, rel=1e-5)
    assert m["clipfrac"].item() == pytest.approx(2 / 3)
    assert m["ratio_max_dev"].item() == pytest.approx(0.5, rel=1e-5)
    r = torch.tensor([1.5, 1.5, 0.9])
    assert m["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item(), rel=1e-5)
    # a ratio exactly on the clip boundary counts as inside it (outside means strictly beyond 1 -+ clip)
    on_edge = float(1 - new.exp()[2, 0])
    assert policy_loss(new, old, adv, mask, ones, clip_low=on_edge, clip_high=0.2)[1][
        "clipfrac"
    ].item() == pytest.approx(2 / 3)


def test_value_loss_clipped_and_unclipped():
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, 1.0])
    unclipped, _ = value_loss(v, old, ret, 0.5, clip_vloss=False)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    clipped, m = value_loss(v, old, ret, 0.5, clip_vloss=True)
    # row0: max((1-2)^2, (0.5-2)^2) = 2.25
    assert clipped.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert m["value_clipfrac"].item() == pytest.approx(0.5)
    assert value_loss(v, old, ret, 0.5, clip_vloss=False)[1]["value_clipfrac"].item() == 0.0  # nothing clipped
    # Rollout values away from 0, clip 0.5: row0 moved -1 (clipped to -0.5 on the low side: (-0.5+2)^2 =
    # 2.25 beats (-1+2)^2 = 1); row1 moved 0.3 (inside: 1.3^2); row2 moved exactly 0.5 (inside, 0).
    v, old, ret = torch.tensor([-1.0, 1.3, 0.5]), torch.tensor([0.0, 1.0, 0.0]), torch.tensor([-2.0, 0.0, 0.5])
    clipped, m = value_loss(v, old, ret, 0.5, clip_vloss=True)
    assert clipped.item() == pytest.approx(0.5 * (2.25 + 1.69 + 0.0) / 3, rel=1e-5)
    assert m["value_clipfrac"].item() == pytest.approx(1 / 3)


def test_explained_variance_and_kl_controller():
    ret = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(ret, ret) == pytest.approx(1.0)
    assert explained_variance(0.5 * ret, ret) == pytest.approx(0.75)  # residual 0.5*ret: 1 - 0.25
    assert explained_variance(torch.full((3,), 2.0), ret) == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(explained_variance(ret, torch.ones(3)))
    assert adapt_kl_coef(0.1, 1.0, 0.05) == pytest.approx(0.12)  # far above target: +20% cap
    assert adapt_kl_coef(0.1, 0.0, 0.05) == pytest.approx(0.08)
    assert adapt_kl_coef(0.1, 0.055, 0.05) == pytest.approx(0.11)


def test_update_metrics_and_first_ratio():
    st = toy_storage()
    pol = ToyPolicy(8)
    ppo = toy_ppo(pol)
    out = ppo.update(st)
    expected = {
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "losses/grad_norm",
        "losses/skipped_minibatches",
        "losses/kl_ref",
        "losses/kl_coef",
        "debug/first_minibatch_ratio_max_dev",
    }
    assert expected <= set(out)
    assert out["debug/first_minibatch_ratio_max_dev"] < 1e-6
    assert out["losses/skipped_minibatches"] == 0
    assert out["losses/kl_ref"] == 0.0  # measured once (first minibatch) though kl_coef = 0
    assert pol.calls == [True] + [False] * 7
    # Each turn's logit moves along its own normalised advantage. Per turn (ToyPolicy's logits are
    # independent) SGD on -A * ratio / m with ratio = 2 sigmoid(theta) adds lr * A * 2p(1-p) / m per
    # epoch until the ratio leaves the clip range on the side A favours.
    a = st.advantages.flatten()
    a = (a - a.mean()) / a.std(unbiased=False)
    theta = torch.zeros(8)
    for _ in range(2):
        p = torch.sigmoid(theta)
        ratio = 2 * p
        active = ~(((a > 0) & (ratio > 1.2)) | ((a < 0) & (ratio < 0.8)))
        theta = theta + active * 0.1 * a * 2 * p * (1 - p) / 2
    assert (torch.sign(pol.theta.detach()) == torch.sign(a)).all()
    torch.testing.assert_close(pol.theta.detach(), theta, rtol=1e-5, atol=1e-7)
    # by default the KL monitor is measured on every update
    again = ppo.update(st)
    assert pol.calls[8:] == [True] + [False] * 7 and math.isfinite(again["losses/kl_ref"])


def test_non_finite_loss_skips_minibatch_and_keeps_weights():
    st = toy_storage()
    st.advantages[0, 0] = float("nan")
    pol = ToyPolicy(8)
    out = toy_ppo(pol, norm_adv=False, ppo_epochs=1).update(st)
    assert out["losses/skipped_minibatches"] == 1
    assert out["optim/steps"] == 3 and out["optim/skipped_windows"] == 1  # one window per minibatch
    assert math.isfinite(out["losses/policy_loss"])
    # the skipped minibatch's turns (the one holding index 0) were never stepped on
    assert pol.theta[0].item() == 0.0 and pol.v[0].item() == 0.0
    assert torch.isfinite(pol.theta).all()
    # every minibatch non-finite: nothing moves at all (no optimizer step, not even momentum)
    st.advantages.fill_(float("nan"))
    pol2 = ToyPolicy(8)
    opt = torch.optim.Adam(pol2.parameters(), lr=0.1)
    ppo = PPO(pol2, opt, PPOConfig(old_log_probs="rollout", ppo_epochs=1, mini_batch_size=2, norm_adv=False), seed=0)
    before = {k: v.clone() for k, v in pol2.state_dict().items()}
    out = ppo.update(st)
    assert out["losses/skipped_minibatches"] == 4
    for k, v in pol2.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in pol2.parameters())
    # no step, no norm, no loss to report
    assert out["optim/steps"] == 0 and out["optim/skipped_windows"] == 4
    for key in (
        "losses/grad_norm",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/value_clipfrac",
    ):
        assert math.isnan(out[key]), key


def test_grad_accumulation_steps_once_per_window():
    st = toy_storage()
    pol = ToyPolicy(8)
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    steps = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    PPO(
        pol, opt, PPOConfig(old_log_probs="rollout", ppo_epochs=2, mini_batch_size=2, grad_accum_steps=2), seed=0
    ).update(st)
    assert len(steps) == 2 * (4 // 2)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        PPO(
            pol, opt, PPOConfig(old_log_probs="rollout", ppo_epochs=1, mini_batch_size=4, grad_accum_steps=4), seed=0
        ).update(st)


def _epoch_mean_kls(seen, per_epoch):
    """Mean k3 KL ``(r - 1) - log r`` of each epoch, recounted from the policy's own forwards."""
    kls = [float(((lp - old).exp() - 1 - (lp - old)).mean()) for lp, old in seen]
    return [sum(kls[i : i + per_epoch]) / per_epoch for i in range(0, len(kls), per_epoch)]


def test_target_kl_stops_after_the_first_epoch_whose_mean_kl_exceeds_it():
    """Every epoch before the last one run has mean KL <= target_kl, the last one > target_kl. The
    per-epoch means here are 0, 0.0019, 0.0077, 0.0170, 0.0242, 0.0268; the target 0.015 lies below
    epoch 4's mean but above 4/5 of it and above epoch 3's mean, and below epoch 3's sum: the update
    must run exactly 4 epochs (a sum instead of a mean stops at 3, a mean over one minibatch too many
    at 5, a missing break runs all 6)."""
    st = toy_storage()
    pol = ToyPolicy(8)
    out = toy_ppo(pol, lr=0.5, ppo_epochs=6, target_kl=0.015).update(st)
    assert out["optim/steps"] == len(pol.seen)  # stopping early still reports the update
    assert len(pol.seen) % 4 == 0
    means = _epoch_mean_kls(pol.seen, 4)
    assert all(m <= 0.015 for m in means[:-1]) and means[-1] > 0.015
    assert len(means) == 4
    # A target no epoch reaches runs every epoch.
    pol = ToyPolicy(8)
    toy_ppo(pol, lr=0.5, ppo_epochs=6, target_kl=1.0).update(st)
    assert len(pol.seen) == 6 * 4


def test_kl_penalty_and_adaptive_coef():
    st = toy_storage()
    st.advantages.zero_()  # only the penalty moves theta
    pol = ToyPolicy(8)
    with torch.no_grad():
        pol.theta.fill_(1.0)
    ppo = toy_ppo(pol, kl_coef=0.1, kl_adaptive=True, kl_target=0.05, norm_adv=False, vf_coef=0.0)
    out = ppo.update(st)
    assert all(pol.calls)  # KL computed on every minibatch when penalised
    # each window's gradient is 2 kl_coef theta / m on its two turns: norm sqrt(2) * 0.1 * theta, with
    # theta 1 in epoch 1 and 0.99 in epoch 2; the logged norm is the mean over windows
    assert out["losses/grad_norm"] == pytest.approx(2**0.5 * 0.1 * (1 + 0.99) / 2, rel=1e-5)
    # The penalty pulls theta to the reference (KL = theta^2): d(kl_coef * mean theta^2)/d theta_i =
    # 2 kl_coef theta_i / m, so each epoch scales theta by 1 - 2 lr kl_coef / m (lr 0.1, m 2).
    torch.testing.assert_close(pol.theta.detach(), torch.full((8,), (1 - 2 * 0.1 * 0.1 / 2) ** 2))
    # kl_ref is the mean KL the minibatches saw: epoch 1 at theta 1, epoch 2 at theta 0.99
    assert out["losses/kl_ref"] == pytest.approx((1.0 + 0.99**2) / 2, rel=1e-5)
    assert out["losses/kl_coef"] == pytest.approx(0.12)  # far above kl_target: +20% cap
    state = ppo.state_dict()
    assert (state["num_updates"], state["optimizer_steps"]) == (1, 8)
    fresh = toy_ppo(ToyPolicy(8), kl_coef=0.1, kl_adaptive=True, kl_target=0.05)
    fresh.load_state_dict(state)
    assert fresh.kl_coef == pytest.approx(0.12)
    assert (fresh.num_updates, fresh.optimizer_steps) == (1, 8)
    assert torch.equal(fresh.generator.get_state(), ppo.generator.get_state())
    out = fresh.update(st)  # counters carry on from the checkpoint
    assert out["optim/steps"] == 16 and fresh.num_updates == 2
    # a checkpoint written before optim/steps existed loads with the count at 0
    old_state = {k: v for k, v in state.items() if k != "optimizer_steps"}
    fresh.load_state_dict(old_state)
    assert fresh.optimizer_steps == 0 and fresh.num_updates == 1


def test_update_through_accelerate_matches_plain():
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    st = toy_storage()
    plain, wrapped = ToyPolicy(8), ToyPolicy(8)
    toy_ppo(plain).update(st)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    model, opt = acc.prepare(wrapped, opt)
    cfg = PPOConfig(old_log_probs="rollout", ppo_epochs=2, mini_batch_size=2, lr=0.1, max_grad_norm=10.0)
    PPO(model, opt, cfg, accelerator=acc, seed=0).update(st)
    torch.testing.assert_close(acc.unwrap_model(model).theta, plain.theta)
    with pytest.raises(
        ValueError, match=r"create the Accelerator with gradient_accumulation_steps=cfg.ppo.grad_accum_steps$"
    ):
        PPO(model, opt, PPOConfig(grad_accum_steps=2), accelerator=acc)


# ------------------------------------------------------------------ the total loss and the step, pinned
def test_ppo_loss_hand_computed_with_every_term():
    """``pg + vf_coef * v - ent_coef * H + kl_coef * KL`` with every coefficient non-zero and distinct:
    a flipped sign or a lost scale in any term changes the total (flipping H gives 0.1475, v -0.9608,
    KL -0.1725, against -0.0525)."""
    mb = toy_minibatch(
        old_log_probs=[0.0, 0.0, 0.0], old_values=[0.0, 0.0, 0.0], advantages=[1.0, -2.0, 2.0], returns=[2.0, 1.0, -1.0]
    )
    log_probs = torch.log(torch.tensor([1.5, 0.5, 0.9])).requires_grad_()
    values = torch.tensor([1.0, 0.0, 0.1], requires_grad=True)
    entropy = torch.tensor([0.5, 1.5, 1.0], requires_grad=True)
    kl = torch.tensor([0.1, 0.3, 0.2], requires_grad=True)
    cfg = PPOConfig(clip_coef=0.2, clip_vloss=True, vf_coef=0.5, ent_coef=0.1)
    loss, m = ppo_loss(one_token_output(log_probs, values, entropy, kl), mb, cfg, kl_coef=0.3)
    # policy, max(-A r, -A clip(r, 0.8, 1.2)): row0 max(-1.5, -1.2); row1 max(1.0, 1.6); row2 (in range) -1.8
    pg = (-1.2 + 1.6 - 1.8) / 3
    # value, 0.5 * max((v - R)^2, (old + clip(v - old, +-0.2) - R)^2): row0 max(1, 3.24); row1 1; row2 1.21
    v = 0.5 * (3.24 + 1.0 + 1.21) / 3
    ent, kl_mean = 1.0, 0.2
    assert loss.item() == pytest.approx(pg + 0.5 * v - 0.1 * ent + 0.3 * kl_mean, rel=1e-5)  # -0.0525
    assert m["policy_loss"].item() == pytest.approx(pg, rel=1e-5)
    assert m["value_loss"].item() == pytest.approx(v, rel=1e-5)
    assert m["entropy"].item() == pytest.approx(ent) and m["kl_ref"].item() == pytest.approx(kl_mean)
    assert m["value_clipfrac"].item() == pytest.approx(1 / 3)  # row0 moved 1.0 > 0.2 from its old value
    loss.backward()
    # The bonus pushes entropy up and the penalty pushes KL down: gradients -ent_coef/B and +kl_coef/B.
    torch.testing.assert_close(entropy.grad, torch.full((3,), -0.1 / 3))
    torch.testing.assert_close(kl.grad, torch.full((3,), 0.3 / 3))
    # Clipped rows get no policy gradient; row2 gets d(-A r / B)/d log p = -A r / B.
    torch.testing.assert_close(log_probs.grad, torch.tensor([0.0, 0.0, -2.0 * 0.9 / 3]))
    # Row0's value is past the clip (the clipped branch is flat); rows 1 and 2: vf_coef * (v - R) / B.
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 0.5 * (0.0 - 1.0) / 3, 0.5 * (0.1 + 1.0) / 3]))
    # No penalty term without kl_coef, and a missing KL with a penalty is refused.
    no_kl, _ = ppo_loss(one_token_output(log_probs, values, entropy, kl), mb, cfg, kl_coef=0.0)
    assert no_kl.item() == pytest.approx(pg + 0.5 * v - 0.1 * ent, rel=1e-5)
    with pytest.raises(
        ValueError,
        match="^kl_coef > 0 but the policy returned no KL; evaluate_actions must be called with with_kl=True$",
    ):
        ppo_loss(one_token_output(log_probs, values, entropy, None), mb, cfg, kl_coef=0.3)


@pytest.mark.parametrize("backend", ["plain", "accelerate"])
@pytest.mark.parametrize("k", [2, 4])
def test_accumulated_gradient_equals_full_batch_gradient(backend, k):
    """One window of k minibatches of 8/k turns takes one SGD step (lr 1) equal to minus the gradient
    of the loss over all 8 turns at once: each minibatch's mean loss is scaled by 1/k before backward
    (by the window on the plain path, by ``accelerator.backward`` under accelerate)."""
    st = toy_storage()
    pol = LinearToyPolicy(8)
    cfg = PPOConfig(
        old_log_probs="rollout",
        ppo_epochs=1,
        mini_batch_size=8 // k,
        grad_accum_steps=k,
        lr=1.0,
        max_grad_norm=1e6,
        norm_adv=False,
        vf_coef=0.5,
        ent_coef=0.1,
        kl_coef=0.3,
    )
    expected = _full_batch_gradient(pol, st, cfg, kl_coef=0.3)
    atol = _step_tolerance(pol, st, cfg, 0.3, windows=k)
    before = _flat_weights(pol)
    out = _update(pol, st, cfg, backend)
    assert out["optim/steps"] == 1
    torch.testing.assert_close(_flat_weights(pol) - before, -expected, atol=atol, rtol=0)
    assert out["losses/grad_norm"] == pytest.approx(expected.norm().item(), abs=_norm_tolerance(atol, expected))


@pytest.mark.parametrize("backend", ["plain", "accelerate"])
def test_gradient_clipping_caps_the_step_and_keeps_its_direction(backend):
    """One SGD step (lr 1) on one minibatch: when the gradient's norm exceeds max_grad_norm the step
    is the gradient rescaled to norm max_grad_norm, same direction; below it the step is the gradient.
    The reported grad_norm is the norm before clipping."""
    st = toy_storage()
    for ratio in (0.25, 2.0):
        pol = LinearToyPolicy(8)
        base = dict(
            old_log_probs="rollout", ppo_epochs=1, mini_batch_size=8, lr=1.0, norm_adv=False, vf_coef=0.5, ent_coef=0.1
        )
        grad = _full_batch_gradient(pol, st, PPOConfig(**base), kl_coef=0.0)
        norm = grad.norm().item()
        cfg = PPOConfig(**base, max_grad_norm=ratio * norm)
        atol = _step_tolerance(pol, st, cfg, 0.0, windows=1)  # one minibatch, its turns shuffled
        before = _flat_weights(pol)
        out = _update(pol, st, cfg, backend)
        step = _flat_weights(pol) - before
        assert out["losses/grad_norm"] == pytest.approx(norm, abs=_norm_tolerance(atol, grad))
        if ratio < 1:
            assert step.norm().item() <= cfg.max_grad_norm * (1 + 1e-5)
            assert step.norm().item() == pytest.approx(cfg.max_grad_norm, rel=1e-4)
            # unit vectors of gradients <= atol apart, each divided by its norm (P squares, a root, a division)
            unit = 2 * atol / norm + 2 * f32_tolerance(grad.numel() + 2, 1.0)
            torch.testing.assert_close(step / step.norm(), -grad / norm, atol=unit, rtol=0)
        else:
            torch.testing.assert_close(step, -grad, atol=atol, rtol=0)


def test_update_rejects_minibatch_layouts_with_the_fix():
    st = toy_storage()  # 8 turns
    with pytest.raises(ValueError, match=r"^ppo.mini_batch_size=3 must divide num_steps\*num_envs=8$"):
        toy_ppo(ToyPolicy(8), mini_batch_size=3).update(st)
    fix = (
        r"^4 minibatches per epoch is not a multiple of ppo.grad_accum_steps=3; pick mini_batch_size and "
        r"grad_accum_steps so that \(num_envs\*num_steps/mini_batch_size\) % grad_accum_steps == 0$"
    )
    with pytest.raises(ValueError, match=fix):
        toy_ppo(ToyPolicy(8), grad_accum_steps=3).update(st)


class _RecordingPolicy(ToyPolicy):
    """ToyPolicy with Bernoulli entropies that keeps every minibatch and (detached) output it saw."""

    def __init__(self, n):
        super().__init__(n)
        self.record = []

    def forward(self, mb, with_kl=False):
        out = super().forward(mb, with_kl)
        p = out.log_probs.exp()
        out.entropy = -(p * p.log() + (1 - p) * (1 - p).log())
        out.token_entropy = out.entropy[:, None]
        self.record.append(
            (mb, SimpleNamespace(**{k: (v.detach().clone() if v is not None else None) for k, v in vars(out).items()}))
        )
        return out


def test_update_logs_each_metric_as_its_mean_over_minibatches():
    """Recompute every logged number from what the policy returned on each minibatch: policy and
    value losses, entropy, k3 KL, clip fractions (means over minibatches), the first minibatch's
    ratio deviation and KL to the reference, explained variance over the rollout, step counts."""
    g = torch.Generator().manual_seed(7)
    st = toy_storage()
    st.old_log_probs = math.log(0.5) + 0.3 * torch.randn(2, 4, generator=g)  # ratios on both sides of the clip
    st.old_token_log_probs = [x.reshape(1) for x in st.old_log_probs.flatten()]  # one token per turn
    st.values = 0.5 * torch.randn(2, 4, generator=g)  # rollout values the value clip is centred on
    st.old_values = st.values.clone()
    pol = _RecordingPolicy(8)
    with torch.no_grad():
        pol.theta.copy_(0.5 * torch.randn(8, generator=g))
        pol.v.copy_(st.values.flatten() + 0.25 * torch.randn(8, generator=g))  # some moved past the 0.2 clip
    out = toy_ppo(pol, ent_coef=0.01).update(st)
    assert len(pol.record) == 8
    per_mb = {k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "value_clipfrac")}
    for mb, o in pol.record:
        r = (o.log_probs - mb.old_log_probs).exp()
        a = mb.advantages
        per_mb["policy_loss"].append(float(torch.maximum(-a * r, -a * r.clamp(0.8, 1.2)).mean()))
        per_mb["approx_kl"].append(float(((r - 1) - r.log()).mean()))
        per_mb["clipfrac"].append(float(((r - 1).abs() > 0.2).float().mean()))
        moved = o.values - mb.old_values
        clipped = mb.old_values + moved.clamp(-0.2, 0.2)
        per_mb["value_loss"].append(
            float(0.5 * torch.maximum((o.values - mb.returns) ** 2, (clipped - mb.returns) ** 2).mean())
        )
        per_mb["value_clipfrac"].append(float((moved.abs() > 0.2).float().mean()))
        per_mb["entropy"].append(float(o.entropy.mean()))
    for name, values in per_mb.items():
        assert out[f"losses/{name}"] == pytest.approx(sum(values) / len(values), rel=1e-5, abs=1e-7), name
    assert 0 < out["losses/clipfrac"] < 1 and 0 < out["losses/value_clipfrac"] < 1  # both branches seen
    first_mb, first = pol.record[0]
    assert out["debug/first_minibatch_ratio_max_dev"] == pytest.approx(
        float(((first.log_probs - first_mb.old_log_probs).exp() - 1).abs().max()), rel=1e-6
    )
    assert out["losses/kl_ref"] == pytest.approx(
        float(first.kl.mean()), rel=1e-6
    )  # measured on the first minibatch only
    ret, val = st.returns.flatten().double().numpy(), st.values.flatten().double().numpy()
    assert out["losses/explained_variance"] == pytest.approx(1 - (ret - val).var() / ret.var(), rel=1e-5)
    assert (out["optim/steps"], out["optim/skipped_windows"], out["losses/skipped_minibatches"]) == (8, 0, 0)
    assert out["losses/kl_coef"] == 0.0


def test_minibatch_order_follows_the_seed_not_the_global_rng():
    """The update shuffles with its own generator, seeded by ``seed`` (default 0) and carried across
    epochs: the order is that of ``storage.minibatches`` with ``Generator().manual_seed(seed)``."""
    st = toy_storage()

    def expected(seed):
        gen = torch.Generator().manual_seed(seed)
        return [mb.indices.tolist() for _ in range(2) for mb in st.minibatches(2, gen)]

    for seed in (None, 5):
        pol = _RecordingPolicy(8)
        cfg = PPOConfig(old_log_probs="rollout", ppo_epochs=2, mini_batch_size=2)
        opt = torch.optim.SGD(pol.parameters(), lr=0.1)
        torch.manual_seed(123)  # the global RNG must not matter
        ppo = PPO(pol, opt, cfg) if seed is None else PPO(pol, opt, cfg, seed=seed)
        ppo.update(st)
        assert [mb.indices.tolist() for mb, _ in pol.record] == expected(0 if seed is None else seed)


class _TwoRankAccelerator:
    """A 2-process accelerate run seen from one rank, in one process: ``gather`` adds the other rank's
    finite-loss flag and ``reduce(mean)`` averages with the other rank's number. Backward and
    clipping are the single-process ones."""

    num_processes = 2
    device = torch.device("cpu")
    distributed_type = "MULTI_CPU"

    def __init__(self, other_finite: float, other_value: float) -> None:
        self.gradient_accumulation_steps = 1
        self.other_finite, self.other_value = other_finite, other_value
        self.backwards = self.clips = 0

    def backward(self, loss):
        self.backwards += 1
        loss.backward()

    def clip_grad_norm_(self, params, max_norm):
        self.clips += 1
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def unwrap_model(self, model):
        return model

    def gather(self, t):
        assert t.shape == (1,) and t.device == self.device
        return torch.cat([t, torch.tensor([self.other_finite])])

    def reduce(self, t, reduction):
        assert reduction == "mean" and t.shape == (1,) and t.dtype == torch.float32 and t.device == self.device
        return (t + self.other_value) / 2


def test_skips_and_early_stops_are_decided_across_processes():
    """A minibatch whose loss is non-finite on the other rank is skipped here too (collectives stay
    matched); target-KL stopping and the adaptive KL coefficient use the KL averaged over ranks."""
    st = toy_storage()
    pol = ToyPolicy(8)
    cfg = PPOConfig(old_log_probs="rollout", ppo_epochs=1, mini_batch_size=2, lr=0.1)
    out = PPO(pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg, accelerator=_TwoRankAccelerator(0.0, 0.0)).update(st)
    assert out["losses/skipped_minibatches"] == 4 and out["optim/steps"] == 0
    assert pol.theta.abs().sum() == 0 and pol.v.abs().sum() == 0
    # Here the first epoch's KL is 0 (ToyPolicy's turns are independent) and so is the KL to the
    # reference (theta 0); the other rank reports 1.0 for both: the means, 0.5, are above target.
    pol = ToyPolicy(8)
    cfg = PPOConfig(
        old_log_probs="rollout",
        ppo_epochs=3,
        mini_batch_size=2,
        lr=0.1,
        target_kl=0.1,
        kl_coef=0.1,
        kl_adaptive=True,
        kl_target=0.05,
    )
    acc = _TwoRankAccelerator(1.0, 1.0)
    ppo = PPO(pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg, accelerator=acc)
    out = ppo.update(st)
    assert len(pol.calls) == 4  # stopped after one epoch
    assert acc.backwards == 4 and acc.clips == 4  # through the accelerator (DDP sync, loss scaling)
    assert out["losses/kl_ref"] == 0.0  # this rank's own KL is logged
    assert ppo.kl_coef == pytest.approx(0.12)  # the controller saw the mean, 0.5 > 0.05


class _FakeEngine(ToyPolicy):
    """ToyPolicy behind the slice of a DeepSpeed engine's interface that the update drives: the
    engine owns the accumulation window (boundary flag, 1/k scaling, one step per window)."""

    def __init__(self, n: int, k: int, lr: float) -> None:
        super().__init__(n)
        self.k, self.boundaries, self.engine_steps = k, [], 0
        self.inner = torch.optim.SGD(self.parameters(), lr=lr)

    def gradient_accumulation_steps(self):
        return self.k

    def set_gradient_accumulation_boundary(self, flag):
        self.boundaries.append(bool(flag))

    def backward(self, loss):
        (loss / self.k).backward()

    def step(self):
        self.inner.step()
        self.inner.zero_grad()
        self.engine_steps += 1

    def was_step_applied(self):
        return True

    def get_global_grad_norm(self):
        return 0.5


def test_deepspeed_engine_steps_once_per_window():
    """Under DeepSpeed the update marks the last backward of each window as the boundary and calls
    ``engine.step()`` once per window (not once per backward), with the same result as plain SGD."""
    st = toy_storage()
    engine = _FakeEngine(8, k=2, lr=0.1)
    acc = SimpleNamespace(
        num_processes=1,
        device=torch.device("cpu"),
        distributed_type="DistributedType.DEEPSPEED",
        gradient_accumulation_steps=2,
        unwrap_model=lambda m: m,
    )
    cfg = PPOConfig(
        old_log_probs="rollout", ppo_epochs=2, mini_batch_size=2, grad_accum_steps=2, lr=0.1, max_grad_norm=10.0
    )
    out = PPO(engine, engine.inner, cfg, accelerator=acc, seed=0).update(st)
    # per window: first backward, boundary backward, then the flag reset after engine.step()
    assert engine.boundaries == [False, True, False] * 4 and engine.engine_steps == 4
    assert out["optim/steps"] == 4 and out["losses/grad_norm"] == 0.5
    plain = ToyPolicy(8)
    PPO(plain, torch.optim.SGD(plain.parameters(), lr=0.1), cfg, seed=0).update(st)
    torch.testing.assert_close(engine.theta.detach(), plain.theta.detach())


def test_truncated_replies_leave_the_policy_loss_only_when_asked():
    """``ppo.mask_truncated_replies`` (DAPO's overlong filtering): a reply cut by ``max_new_tokens`` takes
    no policy gradient and leaves the aggregation's denominator; value, entropy and KL keep it."""
    mb = toy_minibatch(old_log_probs=[0.0, 0.0], old_values=[0.0, 0.0], advantages=[1.0, -1.0], returns=[0.0, 0.0])
    mb.reply_cut = torch.tensor([False, True])
    log_probs = torch.log(torch.tensor([1.1, 0.9])).requires_grad_()
    out = one_token_output(log_probs, torch.zeros(2), torch.tensor([0.2, 0.4]), torch.tensor([0.1, 0.3]))
    _, m_kept = ppo_loss(out, mb, PPOConfig(vf_coef=0.0, mask_truncated_replies=False), 0.0)
    masked, m = ppo_loss(out, mb, PPOConfig(vf_coef=0.0, mask_truncated_replies=True), 0.0)
    assert float(m_kept["policy_loss"]) == pytest.approx((-1.1 + 0.9) / 2, rel=1e-6)
    assert float(m["policy_loss"]) == pytest.approx(-1.1, rel=1e-6)  # reply 1 gone, denominator 1
    assert float(m["entropy"]) == pytest.approx(0.3) and float(m["kl_ref"]) == pytest.approx(0.2)  # both replies
    (grad,) = torch.autograd.grad(masked, log_probs)
    assert float(grad[1]) == 0.0 and float(grad[0]) == pytest.approx(-1.1, rel=1e-6)

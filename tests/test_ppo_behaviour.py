"""What a PPO update must do to a policy whose answer is known (in the spirit of SB3's identity tests).

On :class:`helpers.ToyPolicy` each stored turn has its own logit ``theta_i`` (action probability
``sigmoid(theta_i)``, stored at 0.5) and its own value ``v_i``, so one SGD step on a minibatch of ``m``
turns moves each turn's parameters by a closed form: the direction of every term of the loss (and
its scale) is checked against it, not only that "weights moved".
"""

from types import SimpleNamespace

import pytest
import torch

from helpers import ToyPolicy, toy_ppo, toy_storage

LR, M = 0.1, 2  # toy_ppo's SGD learning rate and mini_batch_size


class BernoulliToyPolicy(ToyPolicy):
    """ToyPolicy whose entropy is the Bernoulli entropy of its action probability ``sigmoid(theta_i)``."""

    def forward(self, mb, with_kl=False):
        out = super().forward(mb, with_kl)
        p = out.log_probs.exp()
        entropy = -(p * p.log() + (1 - p) * (1 - p).log())
        return SimpleNamespace(**{**vars(out), "entropy": entropy, "token_entropy": entropy[:, None]})


def _bernoulli_entropy(theta):
    p = torch.sigmoid(theta)
    return -(p * p.log() + (1 - p) * (1 - p).log())


def _zero_advantage_storage():
    st = toy_storage()
    st.advantages.zero_()  # no policy gradient: only the term under test moves the policy
    return st


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_sets_the_direction_of_the_action_probability(sign):
    """A > 0 raises every action's probability, A < 0 lowers it, by the closed form of one epoch:
    d(-A ratio / m)/d theta = -A * 2p(1-p) / m with p = 1/2, so theta_i = lr * A / (2 m)."""
    st = toy_storage()
    st.advantages.fill_(sign)
    pol = ToyPolicy(8)
    toy_ppo(pol, ppo_epochs=1, norm_adv=False).update(st)
    torch.testing.assert_close(pol.theta.detach(), torch.full((8,), sign * LR / (2 * M)))
    prob = torch.sigmoid(pol.theta.detach())
    assert ((prob > 0.5) if sign > 0 else (prob < 0.5)).all()


def test_value_loss_falls_towards_the_returns_with_zero_advantages():
    """Each epoch SGD on vf_coef * 0.5 * mean (v - R)^2 shrinks every v_i - R_i by 1 - lr vf_coef / m;
    the logged value loss falls from update to update."""
    st = _zero_advantage_storage()
    pol = ToyPolicy(8)
    ppo = toy_ppo(pol, norm_adv=False, clip_vloss=False, vf_coef=0.5)
    returns = st.returns.flatten()
    losses = [ppo.update(st)["losses/value_loss"] for _ in range(3)]
    assert losses[0] > losses[1] > losses[2]
    # the first update's logged loss is measured at v = 0 (epoch 1) and after one epoch (epoch 2)
    shrink = 1 - LR * 0.5 / M
    assert losses[0] == pytest.approx(float((0.5 * returns**2).mean()) * (1 + shrink**2) / 2, rel=1e-5)
    torch.testing.assert_close(pol.v.detach(), returns * (1 - shrink**6), rtol=1e-5, atol=1e-6)


def test_entropy_bonus_raises_entropy_with_zero_advantages():
    """From a confident policy (theta 2), -ent_coef * H moves theta_i by -lr ent_coef theta p(1-p) / m
    per epoch (dH/dtheta = -theta p(1-p)): towards 1/2, so the entropy rises."""
    st = _zero_advantage_storage()
    pol = BernoulliToyPolicy(8)
    with torch.no_grad():
        pol.theta.fill_(2.0)
    ppo = toy_ppo(pol, norm_adv=False, ent_coef=0.5)
    entropies = [float(_bernoulli_entropy(pol.theta.detach()).mean())]
    for _ in range(2):
        ppo.update(st)
        entropies.append(float(_bernoulli_entropy(pol.theta.detach()).mean()))
    assert entropies[0] < entropies[1] < entropies[2]
    theta = torch.full((8,), 2.0)
    for _ in range(4):  # 2 updates x 2 epochs
        p = torch.sigmoid(theta)
        theta = theta - LR * 0.5 * theta * p * (1 - p) / M
    torch.testing.assert_close(pol.theta.detach(), theta)


def test_kl_penalty_lowers_the_kl_to_the_reference_with_zero_advantages():
    """ToyPolicy's KL to the reference is theta^2: the penalty shrinks it update after update, and the
    logged kl_ref (measured before each minibatch's step) falls with it."""
    st = _zero_advantage_storage()
    pol = ToyPolicy(8)
    with torch.no_grad():
        pol.theta.copy_(torch.linspace(-1.5, 1.5, 8))
    start = float((pol.theta.detach() ** 2).mean())
    ppo = toy_ppo(pol, norm_adv=False, kl_coef=0.5)
    logged = [ppo.update(st)["losses/kl_ref"] for _ in range(3)]
    assert logged[0] > logged[1] > logged[2]
    factor = (1 - 2 * LR * 0.5 / M) ** 2  # per epoch theta scales by 1 - 2 lr kl_coef / m; KL by its square
    assert float((pol.theta.detach() ** 2).mean()) == pytest.approx(start * factor**6, rel=1e-5)
    assert logged[0] == pytest.approx(start * (1 + factor) / 2, rel=1e-5)

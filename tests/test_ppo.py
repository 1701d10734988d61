"""PPO losses against closed forms, and the update loop's guards on a toy tensor policy."""
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from a2c_ppo_acktr.algo.ppo import PPO, adapt_kl_coef, explained_variance, policy_loss, value_loss
from a2c_ppo_acktr.arguments import PPOConfig
from a2c_ppo_acktr.storage import RolloutStorage


class ToyPolicy(nn.Module):
    """One logit and one value per stored turn; the KL to the reference is theta^2."""

    has_reference = True

    def __init__(self, n: int) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(n))
        self.v = nn.Parameter(torch.zeros(n))
        self.calls = []

    def forward(self, mb, with_kl=False):
        self.calls.append(with_kl)
        th = self.theta[mb.indices]
        return SimpleNamespace(
            log_probs=nn.functional.logsigmoid(th),
            values=self.v[mb.indices],
            entropy=torch.zeros_like(th),
            kl=th**2 if with_kl else None,
        )


def _storage(T=2, N=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    st = RolloutStorage(T, N)
    for t in range(T):
        act = SimpleNamespace(
            texts=[""] * N, prompts=[""] * N, images=[[] for _ in range(N)], prompt_ids=[torch.zeros(1)] * N,
            generated_ids=[torch.zeros(1)] * N, token_weights=[torch.ones(1)] * N,
            log_probs=torch.full((N,), math.log(0.5)), values=torch.zeros(N), temperatures=torch.ones(N),
        )
        st.insert(act, torch.randn(N, generator=g), torch.zeros(N), torch.zeros(N))
    st.compute_returns(torch.zeros(N))
    return st


def _ppo(policy, lr=0.1, **over):
    cfg = PPOConfig(**{"ppo_epochs": 2, "mini_batch_size": 2, "lr": lr, "max_grad_norm": 10.0, **over})
    return PPO(policy, torch.optim.SGD(policy.parameters(), lr=lr), cfg, seed=0)


def test_policy_loss_closed_form():
    adv = torch.tensor([1.0, -1.0, 2.0])
    old = torch.zeros(3)
    new = torch.log(torch.tensor([1.5, 1.5, 0.9]))
    loss, m = policy_loss(new, old, adv, 0.2)
    # max(-A r, -A clip(r)): row0 -1.2 (clipped), row1 +1.5 (unclipped, pessimistic), row2 -1.8
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 1.8) / 3, rel=1e-5)
    assert m["clipfrac"].item() == pytest.approx(2 / 3)
    assert m["ratio_max_dev"].item() == pytest.approx(0.5, rel=1e-5)
    r = torch.tensor([1.5, 1.5, 0.9])
    assert m["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item(), rel=1e-5)


def test_value_loss_clipped_and_unclipped():
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, 1.0])
    unclipped, _ = value_loss(v, old, ret, 0.5, clip_vloss=False)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    clipped, m = value_loss(v, old, ret, 0.5, clip_vloss=True)
    # row0: max((1-2)^2, (0.5-2)^2) = 2.25
    assert clipped.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert m["value_clipfrac"].item() == pytest.approx(0.5)


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
    st = _storage()
    pol = ToyPolicy(8)
    out = _ppo(pol).update(st)
    expected = {"losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
                "losses/explained_variance", "losses/grad_norm", "losses/skipped_minibatches", "losses/kl_ref",
                "losses/kl_coef", "debug/first_minibatch_ratio_max_dev"}
    assert expected <= set(out)
    assert out["debug/first_minibatch_ratio_max_dev"] < 1e-6
    assert out["losses/skipped_minibatches"] == 0
    assert out["losses/kl_ref"] == 0.0  # measured once (first minibatch) though kl_coef = 0
    assert pol.calls == [True] + [False] * 7
    assert pol.theta.abs().sum() > 0  # it learned


def test_non_finite_loss_skips_minibatch_and_keeps_weights():
    st = _storage()
    st.advantages[0, 0] = float("nan")
    pol = ToyPolicy(8)
    out = _ppo(pol, norm_adv=False, ppo_epochs=1).update(st)
    assert out["losses/skipped_minibatches"] == 1
    assert math.isfinite(out["losses/policy_loss"])
    # the skipped minibatch's turns (the one holding index 0) were never stepped on
    assert pol.theta[0].item() == 0.0 and pol.v[0].item() == 0.0
    assert torch.isfinite(pol.theta).all()
    # every minibatch non-finite: nothing moves at all (no optimizer step, not even momentum)
    st.advantages.fill_(float("nan"))
    pol2 = ToyPolicy(8)
    opt = torch.optim.Adam(pol2.parameters(), lr=0.1)
    ppo = PPO(pol2, opt, PPOConfig(ppo_epochs=1, mini_batch_size=2, norm_adv=False), seed=0)
    before = {k: v.clone() for k, v in pol2.state_dict().items()}
    out = ppo.update(st)
    assert out["losses/skipped_minibatches"] == 4
    for k, v in pol2.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in pol2.parameters())


def test_grad_accumulation_steps_once_per_window():
    st = _storage()
    pol = ToyPolicy(8)
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    steps = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    PPO(pol, opt, PPOConfig(ppo_epochs=2, mini_batch_size=2, grad_accum_steps=2), seed=0).update(st)
    assert len(steps) == 2 * (4 // 2)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        PPO(pol, opt, PPOConfig(ppo_epochs=1, mini_batch_size=4, grad_accum_steps=4), seed=0).update(st)


def test_target_kl_stops_epochs_early():
    st = _storage()
    pol = ToyPolicy(8)
    _ppo(pol, lr=50.0, ppo_epochs=5, target_kl=1e-3).update(st)
    assert len(pol.calls) < 5 * 4  # stopped after the first epoch's KL exceeded the target
    assert len(pol.calls) % 4 == 0


def test_kl_penalty_and_adaptive_coef():
    st = _storage()
    pol = ToyPolicy(8)
    with torch.no_grad():
        pol.theta.fill_(1.0)
    ppo = _ppo(pol, kl_coef=0.1, kl_adaptive=True, kl_target=0.05)
    out = ppo.update(st)
    assert all(pol.calls)  # KL computed on every minibatch when penalised
    assert out["losses/kl_ref"] > 0.05 and out["losses/kl_coef"] == pytest.approx(0.12)
    state = ppo.state_dict()
    fresh = _ppo(ToyPolicy(8), kl_coef=0.1, kl_adaptive=True, kl_target=0.05)
    fresh.load_state_dict(state)
    assert fresh.kl_coef == pytest.approx(0.12)


def test_update_through_accelerate_matches_plain():
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    st = _storage()
    plain, wrapped = ToyPolicy(8), ToyPolicy(8)
    _ppo(plain).update(st)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    model, opt = acc.prepare(wrapped, opt)
    cfg = PPOConfig(ppo_epochs=2, mini_batch_size=2, lr=0.1, max_grad_norm=10.0)
    PPO(model, opt, cfg, accelerator=acc, seed=0).update(st)
    torch.testing.assert_close(acc.unwrap_model(model).theta, plain.theta)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        PPO(model, opt, PPOConfig(grad_accum_steps=2), accelerator=acc)

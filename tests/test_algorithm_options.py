"""The seeds' algorithm options against closed forms: top-k/top-p, KL estimators k1/k2/k3 and the KL
reward penalty, the sequence entropy bonus, and the temperature head's own objective."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from a2c_ppo_acktr.algo.ppo import PPO, ppo_loss, temperature_loss
from a2c_ppo_acktr.config.arguments import PPOConfig
from a2c_ppo_acktr.policy.distributions import (
    chunked_token_stats,
    process_logits,
    sample_kl,
    token_entropy,
    token_kl,
    token_log_probs,
)
from helpers import one_token_output, toy_minibatch, toy_storage


# ------------------------------------------------------------------------ top-k / top-p
def test_top_k_and_top_p_keep_the_closed_form_sets():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]], requires_grad=True)
    one = torch.ones(1)
    kept = lambda z: (~torch.isneginf(z)).tolist()[0]  # noqa: E731
    assert kept(process_logits(logits, one, None, top_k=2)) == [True, True, False, False]
    # softmax([4,3,2,1]) = [.644, .237, .087, .032]; mass before each token: 0, .644, .881, .968
    assert kept(process_logits(logits, one, None, top_p=0.7)) == [True, True, False, False]
    assert kept(process_logits(logits, one, None, top_p=0.6)) == [True, False, False, False]
    assert kept(process_logits(logits, one, None, top_p=0.9)) == [True, True, True, False]
    # both: top-k first, then the nucleus of what is left (renormalised: .731, .269 -> .731 < .95)
    assert kept(process_logits(logits, one, None, top_k=2, top_p=0.95)) == [True, True, False, False]
    # a forbidden id stays out whatever the filters; the temperature acts before them
    assert kept(process_logits(logits, one, torch.tensor([0]), top_k=2)) == [False, True, True, False]
    assert kept(process_logits(logits, torch.tensor([100.0]), None, top_p=0.5)) == [True, True, False, False]
    lp = token_log_probs(process_logits(logits, one, None, top_k=2)[:, None], torch.tensor([[1]]))
    assert lp.item() == pytest.approx(3.0 - math.log(math.exp(4) + math.exp(3)), rel=1e-6)
    lp.sum().backward()
    assert logits.grad[0, 2:].abs().max() == 0 and logits.grad[0, :2].abs().min() > 0  # filtered logits get no gradient


def test_chunked_stats_with_filters_equal_the_naive_composition():
    g = torch.Generator().manual_seed(0)
    B, R, H, V = 2, 5, 4, 11
    hidden = torch.randn(B, R, H, generator=g)
    head = nn.Linear(H, V, bias=False)
    temps = torch.tensor([0.7, 1.3])
    z = process_logits(head(hidden), temps, None, top_k=4, top_p=0.8)
    tokens = z.argmax(-1)  # a token that survives the filters
    mask = torch.ones(B, R, dtype=torch.bool)
    stats = chunked_token_stats(
        hidden, tokens, temps, None, mask, head=head, ref_inputs=hidden * 0.9, chunk_tokens=3, top_k=4, top_p=0.8
    )
    torch.testing.assert_close(stats.log_probs, token_log_probs(z, tokens))
    torch.testing.assert_close(stats.entropy, token_entropy(z))
    zr = process_logits(head(hidden * 0.9), temps, None)  # the reference is not filtered
    torch.testing.assert_close(stats.kl, token_kl(z, zr))
    torch.testing.assert_close(stats.ref_log_probs, token_log_probs(zr, tokens))


# ------------------------------------------------------------------------ KL estimators
def test_sample_kl_closed_forms_and_unbiasedness():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = ref - lp  # [-0.5, 1.0]
    torch.testing.assert_close(sample_kl(lp, ref, "k1"), -d)
    torch.testing.assert_close(sample_kl(lp, ref, "k2"), 0.5 * d * d)
    torch.testing.assert_close(sample_kl(lp, ref, "k3"), d.exp() - 1 - d)
    with pytest.raises(ValueError, match="unknown KL estimator 'k9'"):
        sample_kl(lp, ref, "k9")
    # Monte Carlo on a categorical: k1 and k3 average to the exact KL, k3 is never negative
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    exact = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 400_000, replacement=True, generator=torch.Generator().manual_seed(0))
    lpx, lqx = p.log()[x], q.log()[x]
    # per-sample sd 0.60 (k1) and 0.50 (k3): 4e-3 is 4.2 and 5.1 standard errors of the 400,000-sample means
    assert float(sample_kl(lpx, lqx, "k1").mean()) == pytest.approx(exact, abs=4e-3)
    k3 = sample_kl(lpx, lqx, "k3")
    assert float(k3.mean()) == pytest.approx(exact, abs=4e-3) and float(k3.min()) >= 0
    assert float(k3.var()) < float(sample_kl(lpx, lqx, "k1").var())  # the low-variance one
    # gradients flow through the policy's log-probs only
    lp_g = torch.tensor([-1.0], requires_grad=True)
    ref_g = torch.tensor([-1.5], requires_grad=True)
    sample_kl(lp_g, ref_g, "k3").sum().backward()
    assert ref_g.grad is None and lp_g.grad.item() == pytest.approx(1 - math.exp(-0.5))


class KLToyPolicy(nn.Module):
    """Reports kl_sum = 10 * flat index of each turn, to check the reward penalty's layout."""

    has_reference = True

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.calls = []

    def forward(self, mb, with_kl=False, **options):
        self.calls.append((with_kl, options, self.training))
        n = len(mb.indices)
        zero = self.w.expand(n) * 0.0  # differentiable zeros: the update runs a backward
        return one_token_output(
            zero, zero, zero, zero, kl_sum=10.0 * mb.indices.float(), temperatures=torch.ones(n) + zero
        )


def test_reward_kl_is_per_turn_in_storage_layout_and_enters_the_rewards():
    from a2c_ppo_acktr.rl.train import apply_kl_reward

    st = toy_storage(T=2, N=3)
    policy = KLToyPolicy()
    cfg = PPOConfig(mini_batch_size=2, kl_coef=0.1, kl_penalty="reward", kl_estimator="k3")
    ppo = PPO(policy, torch.optim.SGD(policy.parameters(), lr=0.1), cfg)
    before = st.rewards.clone()
    run = SimpleNamespace(cfg=SimpleNamespace(ppo=cfg), ppo=ppo, storage=st)
    metrics = apply_kl_reward(run)
    kl = 10.0 * torch.arange(6.0).view(2, 3)
    torch.testing.assert_close(st.rewards, before - 0.1 * kl)
    assert metrics["rollout/kl_to_reference"] == pytest.approx(25.0)
    assert all(c == (True, {"kl_estimator": "k3"}, False) for c in policy.calls) and len(policy.calls) == 3
    # in the update the KL is then not in the loss: no reference forward beyond the monitor's
    assert not ppo.kl_in_loss
    # kl_penalty=loss leaves the rewards alone
    run.cfg = SimpleNamespace(ppo=PPOConfig(kl_coef=0.1))
    assert apply_kl_reward(run) == {} and torch.equal(st.rewards, before - 0.1 * kl)


def test_kl_penalty_reward_keeps_the_kl_out_of_the_loss():
    mb = toy_minibatch([math.log(0.5)] * 2, [0.0, 0.0], [1.0, -1.0], [0.0, 0.0])
    lp = torch.full((2,), math.log(0.5))
    kl = torch.tensor([0.3, 0.5])
    out = one_token_output(lp, torch.zeros(2), torch.zeros(2), kl)
    in_loss, _ = ppo_loss(out, mb, PPOConfig(kl_coef=0.2), 0.2)
    as_reward, m = ppo_loss(out, mb, PPOConfig(kl_coef=0.2, kl_penalty="reward"), 0.2)
    assert float(in_loss - as_reward) == pytest.approx(0.2 * 0.4)
    assert m["kl_ref"].item() == pytest.approx(0.4)  # still monitored


# ------------------------------------------------------------------------ entropy and temperature
def test_sequence_entropy_bonus_uses_the_response_entropy():
    mb = toy_minibatch([0.0] * 2, [0.0] * 2, [0.0] * 2, [0.0] * 2)
    out = one_token_output(
        torch.zeros(2),
        torch.zeros(2),
        torch.tensor([0.1, 0.2]),
        seq_entropy=torch.tensor([2.0, 4.0]),
        temperatures=torch.ones(2),
    )
    tok, _ = ppo_loss(out, mb, PPOConfig(ent_coef=0.5, vf_coef=0.0), 0.0)
    seq, m = ppo_loss(out, mb, PPOConfig(ent_coef=0.5, vf_coef=0.0, entropy_bonus="sequence"), 0.0)
    assert float(tok) == pytest.approx(-0.5 * 0.15) and float(seq) == pytest.approx(-0.5 * 3.0)
    assert m["seq_entropy"].item() == 3.0
    out.seq_entropy = None
    with pytest.raises(ValueError, match="needs the policy's seq_entropy"):
        ppo_loss(out, mb, PPOConfig(entropy_bonus="sequence"), 0.0)


def test_temperature_loss_moves_temperature_toward_the_target_entropy():
    t = torch.tensor([1.0, 1.0], requires_grad=True)
    loss = temperature_loss(t, torch.tensor([0.5, 0.1]), target_entropy=0.3)
    loss.backward()
    # d/dT mean(log T (H - target)) = (H - target) / (2 T): above target -> descent lowers T, below -> raises it
    torch.testing.assert_close(t.grad, torch.tensor([0.1, -0.1]))
    assert loss.item() == 0.0  # log 1 = 0
    # in ppo_loss it is added with temp_coef and reported
    mb = toy_minibatch([0.0] * 2, [0.0] * 2, [0.0] * 2, [0.0] * 2)
    temps = torch.tensor([2.0, 2.0], requires_grad=True)
    out = one_token_output(torch.zeros(2), torch.zeros(2), torch.tensor([0.5, 0.5]), temperatures=temps)
    cfg = PPOConfig(vf_coef=0.0, temperature_loss="entropy_target", target_entropy=0.3, temp_coef=2.0)
    total, m = ppo_loss(out, mb, cfg, 0.0)
    assert total.item() == pytest.approx(2.0 * math.log(2.0) * 0.2, rel=1e-6)
    assert m["temperature_loss"].item() == pytest.approx(math.log(2.0) * 0.2, rel=1e-6)


@pytest.mark.parametrize("estimator, value_in_loss", [("gae", True), ("rloo", False), ("grpo", False)])
def test_value_loss_only_for_an_estimator_that_reads_values(estimator, value_in_loss):
    """Zero advantages, returns of -10 against values of 0: under gae the loss is vf_coef * 50 and
    its gradient reaches the values (hence, through the value head, the shared trunk); under rloo and
    grpo nothing reads a value, the loss is 0 and the values get no gradient (value_loss still logged)."""
    mb = toy_minibatch([0.0] * 2, [0.0] * 2, [0.0] * 2, [-10.0] * 2)
    values = torch.zeros(2, requires_grad=True)
    cfg = PPOConfig(advantage_estimator=estimator, vf_coef=0.5, clip_vloss=False)
    total, m = ppo_loss(one_token_output(torch.zeros(2), values, torch.zeros(2)), mb, cfg, 0.0)
    total.backward()
    assert m["value_loss"].item() == pytest.approx(50.0)  # 0.5 * (0 - (-10))^2
    if value_in_loss:
        assert total.item() == pytest.approx(25.0) and values.grad.abs().sum().item() > 0
    else:
        assert total.item() == 0.0 and (values.grad is None or values.grad.abs().sum().item() == 0.0)


def test_forward_options_reach_the_policy_only_when_not_default():
    policy = KLToyPolicy()
    st = toy_storage(T=1, N=2)
    PPO(policy, torch.optim.SGD(policy.parameters(), lr=0.0), PPOConfig(mini_batch_size=2, ppo_epochs=1)).update(st)
    assert policy.calls[-1][1] == {}
    assert policy.calls[0] == (False, {}, True)  # the old-policy recompute: no KL, no option, in training mode
    PPO(
        policy,
        torch.optim.SGD(policy.parameters(), lr=0.0),
        PPOConfig(mini_batch_size=2, ppo_epochs=1, kl_estimator="k2", temperature_loss="entropy_target"),
    ).update(st)
    assert policy.calls[-1][1] == {"kl_estimator": "k2", "detach_temperature": True}


# ------------------------------------------------------------------------ on the tiny VLM
from a2c_ppo_acktr.policy.model import VLMPolicy  # noqa: E402
from tests.numerics import f32_tolerance, recorded_forwards, widest  # noqa: E402
from helpers import NUM_ENVS, NUM_STEPS, fresh_policy, policy_rollout  # noqa: E402


def test_top_k_rollout_log_probs_equal_the_update_and_stay_in_the_kept_set(loaded, tiny_model_path):
    """The ratio invariant holds with top-k/top-p sampling: generate and the training forward
    apply the same filters, and every sampled token is one the filters kept."""
    policy = fresh_policy(loaded, tiny_model_path, top_k=3, top_p=0.9)
    st = policy_rollout(policy, seed=1)
    assert torch.isfinite(st.old_log_probs).all()
    policy.train()
    mb = next(st.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    with recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb)
        unfiltered = fresh_policy(loaded, tiny_model_path).evaluate_actions(mb)
    bounds = widest(
        forwards
    )  # act's forward against this batch's, filtered or not: rounding only (numerics.forward_bounds)
    assert (out.log_probs - mb.old_log_probs).abs().max().item() < bounds.log_prob
    # renormalised over at most 3 tokens: every response is at least as likely as without the filters
    assert (out.log_probs >= unfiltered.log_probs - bounds.log_prob).all() and (
        out.log_probs > unfiltered.log_probs + 1e-3
    ).any()


def test_detached_temperature_splits_the_gradients(loaded, tiny_model_path):
    """temperature_loss=entropy_target: the policy-gradient terms do not reach the temperature head,
    and the head's own loss does not reach the language model; seq_entropy is the summed entropy."""
    policy = fresh_policy(loaded, tiny_model_path, thought_prob_coef=1.0)
    st = policy_rollout(policy, seed=2)
    policy.train()
    mb = next(st.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    head = [p for n, p in policy.named_parameters() if n.startswith("temp_predictor") and p.requires_grad]
    lora = [p for n, p in policy.named_parameters() if "lora_" in n]
    out = policy.evaluate_actions(mb, detach_temperature=True)
    pg = torch.autograd.grad((out.log_probs.sum() + out.entropy.sum()), head, allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in pg)
    own = torch.autograd.grad(out.temperatures.sum(), lora, allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in own)
    attached = policy.evaluate_actions(mb)
    pg_attached = torch.autograd.grad(attached.log_probs.sum(), head, allow_unused=True)
    assert any(g is not None and g.abs().max() > 0 for g in pg_attached)  # the default keeps it on the PG path
    lengths = torch.tensor([float(len(g)) for g in mb.generated_ids])
    # weights all 1: the same R entropies summed, against their mean times R (R + 2 roundings at the sum's size)
    atol = f32_tolerance(int(lengths.max()) + 2, float(out.seq_entropy.detach().abs().max()))
    torch.testing.assert_close(out.seq_entropy, out.entropy * lengths, atol=atol, rtol=0)


def test_sample_kl_estimators_of_the_policy(loaded, tiny_model_path):
    """k1/k2/k3 are 0 at the reference (LoRA B = 0) and, once the adapter moved, k3 > 0 per token; the
    response sums are the means times the lengths."""
    policy = fresh_policy(loaded, tiny_model_path)
    st = policy_rollout(policy, seed=3)
    mb = next(st.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    for est in ("k1", "k2", "k3"):
        assert policy.evaluate_actions(mb, with_kl=True, kl_estimator=est).kl.abs().max().item() < 1e-6
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    lengths = torch.tensor([float(len(g)) for g in mb.generated_ids])
    k3 = policy.evaluate_actions(mb, with_kl=True, kl_estimator="k3")
    full = policy.evaluate_actions(mb, with_kl=True)
    assert (k3.kl > 0).all() and (full.kl > 0).all()
    # the same R per-token KLs summed, against their mean times R (R + 2 roundings at the sum's size)
    torch.testing.assert_close(
        k3.kl_sum,
        k3.kl * lengths,
        atol=f32_tolerance(int(lengths.max()) + 2, float(k3.kl_sum.detach().abs().max())),
        rtol=0,
    )

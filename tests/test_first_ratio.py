"""The first ratio is exactly 1 (``ppo.old_log_probs=update``): the update re-scores the rollout in the
first epoch's own minibatches before any step, so every minibatch of the first accumulation window
repeats that forward bit for bit, in bf16 too, with the KL's reference forward beside it, at every
ratio level. Bitwise: no tolerance."""

from __future__ import annotations

import pytest
import torch

from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.config.arguments import PPOConfig
from helpers import NUM_ENVS, NUM_STEPS, policy_rollout, tiny_model_cfg
from numerics import f32_tolerance


def _recording(policy):
    """Keep a detached copy of every forward's per-token log-probs, in call order."""
    seen = []
    forward = policy.forward

    def record(mb, **kwargs):
        out = forward(mb, **kwargs)
        seen.append(
            (
                mb.indices.clone(),
                out.token_log_probs.detach().clone(),
                out.token_mask.clone(),
                out.values.detach().clone(),
            )
        )
        return out

    policy.forward = record
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("level, kl_coef", [("token", 0.0), ("token", 0.5), ("sequence", 0.0), ("sequence_mean", 0.0)])
def test_first_window_ratios_are_exactly_one_in_bf16(tiny_model_path, level, kl_coef):
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.policy.model import VLMPolicy

    cfg = tiny_model_cfg(
        tiny_model_path,
        dtype="bfloat16",
        max_new_tokens=24,
        gradient_checkpointing=True,
        temperature=0.3,
        min_temperature=0.1,
        max_temperature=1.0,
    )
    torch.manual_seed(0)
    policy = VLMPolicy(cfg, load_vlm(cfg))
    st = policy_rollout(policy)
    turns = NUM_STEPS * NUM_ENVS
    mb_size = 2
    windows = turns // mb_size  # one accumulation window: no step until every first-epoch minibatch ran
    ppo_cfg = PPOConfig(
        ppo_epochs=2,
        mini_batch_size=mb_size,
        grad_accum_steps=windows,
        lr=1e-2,
        max_grad_norm=1e6,
        ratio_level=level,
        kl_coef=kl_coef,
    )
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=ppo_cfg.lr)
    seen = _recording(policy)
    metrics = PPO(policy, opt, ppo_cfg, seed=3).update(st)
    recompute, first_epoch, second_epoch = seen[:windows], seen[windows : 2 * windows], seen[2 * windows :]
    assert len(second_epoch) == windows
    for (idx_a, lp_a, mask_a, v_a), (idx_b, lp_b, mask_b, v_b) in zip(recompute, first_epoch):
        assert torch.equal(idx_a, idx_b)  # the same minibatches, in the same order
        assert torch.equal(lp_a[mask_a], lp_b[mask_b]) and torch.equal(v_a, v_b)  # bit for bit
    assert metrics["debug/first_minibatch_ratio_max_dev"] == 0.0
    assert metrics["losses/clipfrac"] >= 0.0 and metrics["time/old_log_probs"] > 0.0
    # The stored old log-probs are the recompute's, so the loss saw exp(0) = 1 on every first-epoch token.
    for idx, lp, mask, _ in recompute:
        for row, i in enumerate(idx.tolist()):
            assert torch.equal(st.old_token_log_probs[i], lp[row][mask[row]].float())
    # The one step moved the policy: the second epoch no longer repeats the first.
    moved = [
        not torch.equal(a[1][a[2]], b[1][b[2]])
        for a, b in zip(
            sorted(first_epoch, key=lambda s: s[0].tolist()), sorted(second_epoch, key=lambda s: s[0].tolist())
        )
    ]
    assert any(moved)


def test_rollout_mode_keeps_acts_log_probs_and_runs_no_recompute(loaded, tiny_model_path):
    """``ppo.old_log_probs=rollout``: the update's first forward is the first epoch's, against act's own
    per-token log-probs (float32 here: equal to the float32 bounds of the policy tests)."""
    from helpers import fresh_policy

    policy = fresh_policy(loaded, tiny_model_path)
    st = policy_rollout(policy)
    stored = [t.clone() for t in st.old_token_log_probs]
    seen = _recording(policy)
    metrics = PPO(
        policy,
        torch.optim.SGD(policy.trainable_parameters(), lr=0.0),
        PPOConfig(ppo_epochs=1, mini_batch_size=2, old_log_probs="rollout"),
    ).update(st)
    assert len(seen) == NUM_STEPS * NUM_ENVS // 2 and metrics["time/old_log_probs"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(stored, st.old_token_log_probs))  # untouched
    assert metrics["debug/first_minibatch_ratio_max_dev"] < 1e-4


def test_act_flags_the_replies_max_new_tokens_cut_and_keeps_their_token_log_probs(loaded, tiny_model_path):
    import numpy as np

    from helpers import fresh_policy, policy_observations

    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=3)
    act = policy.act(policy_observations(np.random.default_rng(0), 0))
    expected = [len(g) == 3 and int(g[-1]) not in policy.eos_ids for g in act.generated_ids]
    assert act.reply_cut.tolist() == expected
    for lp, g, w, total in zip(act.token_log_probs, act.generated_ids, act.token_weights, act.log_probs):
        # the same float32 products summed (at most 3 additions of terms bounded by sum |lp|)
        assert lp.shape == g.shape and abs(float((lp * w).sum()) - float(total)) <= f32_tolerance(
            3, float(lp.abs().sum())
        )

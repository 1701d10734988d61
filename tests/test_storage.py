"""GAE and episode estimators against closed forms and a naive loop; storage bookkeeping."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.arguments import ADVANTAGE_ESTIMATORS as CONFIG_ESTIMATORS
from a2c_ppo_acktr.storage import (
    ADVANTAGE_ESTIMATORS,
    RolloutStorage,
    compute_gae,
    episode_ids,
    get_advantage_estimator,
    grpo_advantages,
    rloo_advantages,
)


def _naive_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Per-env, per-step loop written independently of the vectorised code."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                delta = rewards[t, n] - values[t, n]
                running = delta
            elif truncated[t, n]:
                delta = rewards[t, n] + gamma * next_values[t, n] - values[t, n]
                running = delta
            else:
                delta = rewards[t, n] + gamma * next_values[t, n] - values[t, n]
                running = delta + gamma * lam * running
            adv[t, n] = running
    return adv


def _zeros(T, N):
    return torch.zeros(T, N), torch.zeros(T, N, dtype=torch.bool)


def test_constant_values_closed_form():
    T, N, c, gamma, lam = 6, 2, 2.0, 0.9, 0.8
    values = torch.full((T, N), c)
    rewards, none = _zeros(T, N)
    adv, ret = compute_gae(rewards, values, values.clone(), none, none, gamma, lam)
    gl = gamma * lam
    expect = torch.tensor([(gamma - 1) * c * (1 - gl ** (T - t)) / (1 - gl) for t in range(T)])
    torch.testing.assert_close(adv, expect[:, None].expand(T, N), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ret, adv + values)


def test_geometric_reward_stream_monte_carlo():
    T, gamma = 7, 0.95
    rewards = torch.ones(T, 1)
    values, none = _zeros(T, 1)
    term = none.clone()
    term[-1] = True
    next_values = torch.zeros(T, 1)
    next_values[-1] = 123.0  # after the terminal step: must be ignored
    adv, ret = compute_gae(rewards, values, next_values, term, none, gamma, 1.0)
    expect = torch.tensor([(1 - gamma ** (T - t)) / (1 - gamma) for t in range(T)])[:, None]
    torch.testing.assert_close(ret, expect)


def test_infinite_horizon_fixed_point_only_when_truncation_bootstraps():
    T, N, gamma = 8, 3, 0.9
    v = 1.0 / (1.0 - gamma)
    rewards = torch.ones(T, N)
    values = torch.full((T, N), v)
    _, none = _zeros(T, N)
    ends = none.clone()
    ends[2, 0] = ends[5, 1] = ends[7, 2] = True
    adv, ret = compute_gae(rewards, values, values.clone(), none, ends, gamma, 0.95)
    torch.testing.assert_close(adv, torch.zeros(T, N), atol=1e-4, rtol=0)
    torch.testing.assert_close(ret, values)
    # The same ends treated as terminations must not be the fixed point.
    adv_term, _ = compute_gae(rewards, values, values.clone(), ends, none, gamma, 0.95)
    assert adv_term[2, 0] == pytest.approx(1.0 - v, rel=1e-5)


def test_matches_naive_loop_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    T, N, gamma, lam = 11, 5, 0.97, 0.9
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T, N, generator=g)
    next_values = torch.randn(T, N, generator=g)
    u = torch.rand(T, N, generator=g)
    term, trunc = u < 0.15, (u >= 0.15) & (u < 0.3)
    adv, ret = compute_gae(rewards, values, next_values, term, trunc, gamma, lam)
    naive = _naive_gae(rewards.numpy(), values.numpy(), next_values.numpy(), term.numpy(), trunc.numpy(), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv + values)


def test_value_after_terminated_step_never_leaks():
    g = torch.Generator().manual_seed(1)
    T, N = 6, 2
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    term, trunc = _zeros(T, N)[1], _zeros(T, N)[1]
    term[2, 0] = True
    nv = torch.cat([values[1:], torch.randn(1, N, generator=g)])
    a1, _ = compute_gae(rewards, values, nv, term, trunc, 0.99, 0.95)
    nv2, values2 = nv.clone(), values.clone()
    nv2[2, 0] = float("nan")  # the next episode's first value, as storage passes it
    values2[3, 0] = 1e6
    nv2[2, 0] = 1e6
    a2, _ = compute_gae(rewards, values2, nv2, term, trunc, 0.99, 0.95)
    torch.testing.assert_close(a1[:3, 0], a2[:3, 0])
    assert torch.isfinite(a2).all()


def _fake_act(N, t, log_probs=None, values=None):
    return SimpleNamespace(
        texts=[f"t{t}e{n}" for n in range(N)],
        prompts=[f"prompt {t} {n}" for n in range(N)],
        images=[[np.zeros((4, 4, 3), np.uint8)] for _ in range(N)],
        prompt_ids=[torch.arange(3 + n) for n in range(N)],
        generated_ids=[torch.arange(2 + t) for _ in range(N)],
        token_weights=[torch.ones(2 + t) for _ in range(N)],
        log_probs=torch.zeros(N) if log_probs is None else log_probs,
        values=torch.zeros(N) if values is None else values,
        temperatures=torch.ones(N),
    )


def test_storage_truncation_bootstraps_and_matches_compute_gae():
    T, N, gamma, lam = 4, 2, 0.9, 0.7
    g = torch.Generator().manual_seed(2)
    values = torch.randn(T, N, generator=g)
    rewards = torch.randn(T, N, generator=g)
    term = torch.zeros(T, N, dtype=torch.bool)
    trunc = torch.zeros(T, N, dtype=torch.bool)
    trunc[1, 0] = True
    term[2, 1] = True
    final_v = torch.tensor([5.0, -7.0])
    st = RolloutStorage(T, N)
    for t in range(T):
        st.insert(_fake_act(N, t, values=values[t]), rewards[t], term[t], trunc[t], final_values=final_v if trunc[t].any() else None)
    bootstrap = torch.tensor([0.3, -0.4])
    st.compute_returns(bootstrap, "gae", gamma, lam)
    nv = torch.cat([values[1:], bootstrap[None]])
    nv[1, 0] = 5.0
    adv, ret = compute_gae(rewards, values, nv, term, trunc, gamma, lam)
    torch.testing.assert_close(st.advantages, adv)
    # the truncated step's TD error uses the final observation's value, not the next episode's
    assert st.advantages[1, 0] == pytest.approx(float(rewards[1, 0] + gamma * 5.0 - values[1, 0]), rel=1e-5)


def test_storage_minibatches_cover_every_turn_once_and_are_seeded():
    T, N = 3, 4
    st = RolloutStorage(T, N)
    for t in range(T):
        st.insert(_fake_act(N, t, log_probs=torch.arange(N) + 10.0 * t), torch.ones(N), torch.zeros(N), torch.zeros(N))
    st.compute_returns(torch.zeros(N))
    mbs = list(st.minibatches(4, torch.Generator().manual_seed(3)))
    idx = torch.cat([mb.indices for mb in mbs])
    assert sorted(idx.tolist()) == list(range(T * N))
    for mb in mbs:
        for j, i in enumerate(mb.indices.tolist()):
            t, n = divmod(i, N)
            assert mb.prompts[j] == f"prompt {t} {n}"
            assert mb.old_log_probs[j] == n + 10.0 * t
            assert len(mb.generated_ids[j]) == 2 + t
    again = torch.cat([mb.indices for mb in st.minibatches(4, torch.Generator().manual_seed(3))])
    assert torch.equal(idx, again)
    with pytest.raises(ValueError, match="must divide"):
        next(st.minibatches(5, torch.Generator()))
    norm = torch.cat([mb.advantages for mb in st.minibatches(4, torch.Generator(), normalize_advantages=True)])
    assert abs(float(norm.mean())) < 1e-5


def test_storage_rejects_misuse():
    st = RolloutStorage(1, 2)
    with pytest.raises(ValueError, match="final_values"):
        st.insert(_fake_act(2, 0), torch.ones(2), torch.zeros(2), torch.tensor([True, False]))
    with pytest.raises(RuntimeError, match="insert every step"):
        st.compute_returns(torch.zeros(2))
    st.insert(_fake_act(2, 0), torch.ones(2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match="after_update"):
        st.insert(_fake_act(2, 0), torch.ones(2), torch.zeros(2), torch.zeros(2))


# ------------------------------------------------------------------ episode estimators
def _episode_case():
    """T=2, N=3; env2 finishes two one-turn episodes; env0/env1 one two-turn episode each."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.5]])
    term = torch.tensor([[False, False, True], [True, True, True]])
    groups = torch.tensor([[0, 0, 1], [0, 0, 0]])
    return rewards, term, groups


def test_rloo_and_grpo_hand_computed():
    rewards, term, groups = _episode_case()
    none = torch.zeros_like(term)
    kw = dict(rewards=rewards, values=torch.zeros(2, 3), next_values=torch.zeros(2, 3), terminated=term,
              truncated=none, group_ids=groups, gamma=1.0, gae_lambda=1.0)
    adv, ret = get_advantage_estimator("rloo")(**kw)
    # group 0 returns: env0 1.0, env1 0.0, env2 (2nd episode) 0.5; group 1: env2's first episode alone.
    expect = torch.tensor([[0.75, -0.75, 0.0], [0.75, -0.75, 0.0]])
    torch.testing.assert_close(adv, expect)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.5]]))
    adv, _ = get_advantage_estimator("grpo")(**kw)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]]), atol=1e-5, rtol=0)


def test_incomplete_episodes_get_zero_advantage():
    ended = torch.tensor([[False, True], [True, False]])
    ids, complete = episode_ids(ended, starts_episode=torch.tensor([False, True]))
    # env0: one episode that began before the rollout (incomplete); env1: complete, then an open one.
    assert ids[0, 0] == ids[1, 0] and ids[0, 1] != ids[1, 1]
    assert complete.tolist() == [False, True, False]
    r = torch.tensor([3.0, 1.0, 2.0])
    assert rloo_advantages(r, torch.zeros(3, dtype=torch.long), complete).tolist() == [0.0, 0.0, 0.0]
    assert grpo_advantages(r, torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)).abs().sum() > 0


def test_registry_names_and_unknown_name():
    assert set(ADVANTAGE_ESTIMATORS) == set(CONFIG_ESTIMATORS)
    with pytest.raises(KeyError, match=r"known estimators: \['gae', 'grpo', 'rloo'\]"):
        get_advantage_estimator("vtrace")
    with pytest.raises(ValueError, match="group_ids"):
        rewards, term, _ = _episode_case()
        get_advantage_estimator("grpo")(rewards=rewards, terminated=term, truncated=torch.zeros_like(term), group_ids=None)

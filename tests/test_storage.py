"""GAE and episode estimators against closed forms and a naive loop; storage bookkeeping."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.config.arguments import ADVANTAGE_ESTIMATORS as CONFIG_ESTIMATORS
from a2c_ppo_acktr.algo.storage import (
    ADVANTAGE_ESTIMATORS,
    RolloutStorage,
    advantage_mask,
    compute_gae,
    episode_ids,
    get_advantage_estimator,
    grpo_advantages,
    rloo_advantages,
)
from numerics import normalized_mean_tolerance, normalized_std_tolerance


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


@pytest.mark.parametrize("wrong", ["rewards", "values", "next_values", "terminated", "truncated"])
def test_compute_gae_rejects_an_input_of_another_shape(wrong):
    T, N = 3, 2
    args = dict(
        rewards=torch.zeros(T, N),
        values=torch.zeros(T, N),
        next_values=torch.zeros(T, N),
        terminated=torch.zeros(T, N, dtype=torch.bool),
        truncated=torch.zeros(T, N, dtype=torch.bool),
    )
    args[wrong] = args[wrong][:, :1]
    with pytest.raises(ValueError, match=r"^all inputs must share one \(T, N\) shape, got \{"):
        compute_gae(**args, gamma=0.9, gae_lambda=0.9)
    # one shape, but not (T, N)
    flat = {k: v[:, 0] for k, v in dict(args, **{wrong: args["rewards"]}).items()}
    with pytest.raises(ValueError, match=r"\(T, N\) shape"):
        compute_gae(**flat, gamma=0.9, gae_lambda=0.9)


def test_one_step_rollout_is_one_td_error():
    rewards, values, nv = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.25]]), torch.tensor([[3.0, 4.0]])
    term = torch.tensor([[False, True]])
    adv, ret = compute_gae(rewards, values, nv, term, torch.zeros_like(term), 0.9, 0.8)
    # r + gamma V' - V, no bootstrap where terminated
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.9 * 3.0 - 0.5, 2.0 - 0.25]]))
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
    # env0 truncated at t=1 and on the last step; env1 terminated at t=0 and truncated at t=1 and
    # t=2 (the step before the last, whose successor is bootstrapped from next_value)
    trunc[1, 0] = trunc[3, 0] = trunc[1, 1] = trunc[2, 1] = True
    term[0, 1] = True
    final_v = {1: torch.tensor([5.0, -3.0]), 2: torch.tensor([0.0, -7.0]), 3: torch.tensor([9.0, 0.0])}
    st = RolloutStorage(T, N)
    for t in range(T):
        st.insert(_fake_act(N, t, values=values[t]), rewards[t], term[t], trunc[t], final_values=final_v.get(t))
    bootstrap = torch.tensor([0.3, -0.4])
    st.compute_returns(bootstrap, "gae", gamma, lam)
    nv = torch.cat([values[1:], bootstrap[None]])
    nv[1, 0], nv[3, 0], nv[1, 1], nv[2, 1] = 5.0, 9.0, -3.0, -7.0
    adv, ret = compute_gae(rewards, values, nv, term, trunc, gamma, lam)
    torch.testing.assert_close(st.advantages, adv)
    torch.testing.assert_close(st.returns, ret)
    # the truncated step's TD error uses the final observation's value, not the next episode's
    assert st.advantages[1, 0] == pytest.approx(float(rewards[1, 0] + gamma * 5.0 - values[1, 0]), rel=1e-5)
    assert st.advantages[3, 0] == pytest.approx(float(rewards[3, 0] + gamma * 9.0 - values[3, 0]), rel=1e-5)
    assert st.advantages[3, 1] == pytest.approx(float(rewards[3, 1] + gamma * -0.4 - values[3, 1]), rel=1e-5)


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
            assert mb.generated_ids[j].tolist() == list(range(2 + t))
            assert mb.prompt_ids[j].tolist() == list(range(3 + n))
            assert mb.token_weights[j].tolist() == [1.0] * (2 + t)
            assert len(mb.images[j]) == 1 and mb.images[j][0].shape == (4, 4, 3)
        assert mb.encodings is None  # acts without processor output: the update re-processes the images
    again = torch.cat([mb.indices for mb in st.minibatches(4, torch.Generator().manual_seed(3))])
    assert torch.equal(idx, again)
    with pytest.raises(ValueError, match="must divide"):
        next(st.minibatches(5, torch.Generator()))
    norm = torch.cat([mb.advantages for mb in st.minibatches(4, torch.Generator(), adv_norm="batch")])
    assert abs(float(norm.mean())) < normalized_mean_tolerance(st.advantages, norm)
    assert float(norm.std(unbiased=False)) == pytest.approx(1.0, rel=normalized_std_tolerance(norm))


def test_normalised_advantages_have_mean_zero_and_population_std_one():
    """One mean and one population std (``unbiased=False``, numpy's default ddof=0) over the whole
    rollout, whatever minibatch a turn lands in; the advantages' std (about 4.6) is far from 1, so
    a lost division by it shows."""
    T, N = 3, 4
    g = torch.Generator().manual_seed(4)
    st = RolloutStorage(T, N)
    for t in range(T):
        st.insert(_fake_act(N, t), 5.0 * torch.randn(N, generator=g), torch.zeros(N), torch.zeros(N))
    st.compute_returns(torch.zeros(N))
    raw = st.advantages.flatten().numpy().astype(np.float64)
    assert raw.std() > 3.0
    expected = (raw - raw.mean()) / raw.std()  # independent: numpy, float64, ddof=0
    norm = torch.zeros(T * N)
    for mb in st.minibatches(4, torch.Generator().manual_seed(0), adv_norm="batch"):
        norm[mb.indices] = mb.advantages
    # each float32 value is shifted by the mean's rounding and scaled by the std's (numerics)
    np.testing.assert_allclose(
        norm.numpy(), expected, rtol=normalized_std_tolerance(norm), atol=normalized_mean_tolerance(st.advantages, norm)
    )
    assert float(norm.mean()) == pytest.approx(0.0, abs=normalized_mean_tolerance(st.advantages, norm))
    assert float(norm.std(unbiased=False)) == pytest.approx(1.0, rel=normalized_std_tolerance(norm))
    # the convention matters at this size: the unbiased std of the same numbers is sqrt(12/11)
    assert float(norm.std(unbiased=True)) == pytest.approx(
        math.sqrt(T * N / (T * N - 1)), rel=normalized_std_tolerance(norm)
    )
    # The epsilon guards a (near) zero std: equal advantages normalise to 0, and a spread far below
    # the epsilon keeps every sign (an epsilon subtracted instead would flip them).
    st.advantages = torch.zeros(T, N)
    flat = torch.cat([mb.advantages for mb in st.minibatches(T * N, torch.Generator(), adv_norm="batch")])
    assert torch.equal(flat, torch.zeros(T * N))
    st.advantages = torch.tensor([0.0, 1e-9] * (T * N // 2)).reshape(T, N)
    for mb in st.minibatches(T * N, torch.Generator(), adv_norm="batch"):
        raw_mb = st.advantages.flatten()[mb.indices]
        assert (torch.sign(mb.advantages) == torch.where(raw_mb > 0, 1.0, -1.0)).all()
        assert mb.advantages.abs().max() < 0.1  # 5e-10 / (5e-10 + 1e-8)
    # without normalisation the raw advantages come through untouched
    st.compute_returns(torch.zeros(N))
    plain = torch.zeros(T * N)
    for mb in st.minibatches(4, torch.Generator().manual_seed(0)):
        plain[mb.indices] = mb.advantages
    torch.testing.assert_close(plain, st.advantages.flatten())


def test_after_update_carries_starts_episode_across_rollouts():
    """An env whose last step ended (terminated or truncated) starts the next rollout with a new
    episode; one that ended earlier, or never, is mid-episode at the boundary. The carried flags decide
    which episodes of the next rollout are complete, hence their rloo advantages (hand-computed)."""
    T, N = 3, 4
    st = RolloutStorage(T, N)
    assert st.starts_episode.tolist() == [True] * N  # right after reset
    # rollout 1: env0 terminates on the last step, env1 truncates on it, env2 terminates at t=0 and
    # is mid-episode at the end, env3 never ends.
    term, trunc = torch.zeros(T, N, dtype=torch.bool), torch.zeros(T, N, dtype=torch.bool)
    term[2, 0], trunc[2, 1], term[0, 2] = True, True, True
    for t in range(T):
        st.insert(_fake_act(N, t), torch.zeros(N), term[t], trunc[t], final_values=torch.zeros(N), group_ids=[t] * N)
    st.compute_returns(torch.zeros(N))
    assert st.group_ids[:, 0].tolist() == [0, 1, 2]
    st.after_update()
    assert st.group_ids is None
    assert st.starts_episode.tolist() == [True, True, False, False]
    assert st.step == 0 and st.advantages is None and st.returns is None
    # rollout 2, one question (group 0): env0 ends at t=1 and starts an open episode; env1 ends at
    # t=2; env2 finishes its old episode at t=0, then a new one at t=2; env3 finishes its old one at t=2.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.25, 2.0]])
    term = torch.tensor([[False, False, True, False], [True, False, False, False], [False, True, True, True]])
    for t in range(T):
        st.insert(_fake_act(N, t), rewards[t], term[t], torch.zeros(N), group_ids=[0] * N)
    st.compute_returns(torch.zeros(N), "rloo")
    # complete episodes: env0's (R 1.0), env1's (0.5), env2's second (0.25): R - mean of the other two.
    # env2's first and env3's began in rollout 1 (incomplete), env0's last is open: advantage 0.
    a, b, c = 1.0 - (0.5 + 0.25) / 2, 0.5 - (1.0 + 0.25) / 2, 0.25 - (1.0 + 0.5) / 2
    expect = torch.tensor([[a, b, 0.0, 0.0], [a, b, c, 0.0], [0.0, b, c, 0.0]])
    torch.testing.assert_close(st.advantages, expect)
    st.after_update()
    assert st.starts_episode.tolist() == [False, True, True, True]


def test_deferred_final_values_and_a_missing_bootstrap_are_refused_with_the_fix():
    """GAE reads a truncated step's final value and V(s_T) of envs still mid-episode: deferred final
    values must all be given (to the steps deferred, no others) and next_value may be None only when
    every episode ended."""
    st = RolloutStorage(2, 2)
    st.insert(_fake_act(2, 0), torch.ones(2), torch.zeros(2), torch.tensor([True, False]), defer_final_values=True)
    st.insert(_fake_act(2, 1), torch.ones(2), torch.zeros(2), torch.zeros(2))
    fix = (
        r"^advantage estimator 'gae' reads the final values of truncated steps, but 1 were deferred and never "
        r"given; call set_final_values before compute_returns$"
    )
    with pytest.raises(ValueError, match=fix):
        st.compute_returns(torch.zeros(2))
    with pytest.raises(ValueError, match=r"^1 steps, 2 envs and 1 values must be as many$"):
        st.set_final_values([0], [0, 1], torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"^step 0 env 1 is not a truncated step whose final value was deferred$"):
        st.set_final_values([0], [1], torch.tensor([2.0]))
    st.set_final_values([0], [0], torch.tensor([2.0]))
    with pytest.raises(
        ValueError, match=r"^advantage estimator 'gae' needs next_value \(N,\): V\(s_T\) of the envs still mid-episode$"
    ):
        st.compute_returns(None)
    st.compute_returns(torch.tensor([0.5, -0.5]), gamma=0.9, gae_lambda=1.0)
    # env0: truncated at t=0 (r + gamma * 2.0), then a new episode bootstrapped from 0.5
    torch.testing.assert_close(st.advantages[:, 0], torch.tensor([1.0 + 0.9 * 2.0, 1.0 + 0.9 * 0.5]))


def test_storage_rejects_misuse():
    for steps, envs in ((0, 2), (2, 0)):
        with pytest.raises(ValueError, match=rf"^num_steps={steps} and num_envs={envs} must both be >= 1$"):
            RolloutStorage(steps, envs)
    assert RolloutStorage(1, 1).starts_episode.tolist() == [True]
    st = RolloutStorage(1, 2)
    assert st.starts_episode.dtype == torch.bool
    assert st.advantages is None and st.returns is None and st.group_ids is None  # nothing until computed
    with pytest.raises(RuntimeError, match="^call compute_returns before minibatches$"):
        next(st.minibatches(1, torch.Generator()))
    with pytest.raises(ValueError, match=r"^act holds 3 rows, storage has num_envs=2$"):
        st.insert(_fake_act(3, 0), torch.ones(3), torch.zeros(3), torch.zeros(3))
    with pytest.raises(
        ValueError, match="^a step cannot be both terminated and truncated; the env must report one of them$"
    ):
        st.insert(
            _fake_act(2, 0),
            torch.ones(2),
            torch.tensor([True, False]),
            torch.tensor([True, False]),
            final_values=torch.zeros(2),
        )
    with pytest.raises(
        ValueError, match=r"^some envs truncated: pass final_values \(value of their final observation\) to insert$"
    ):
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
    kw = dict(
        rewards=rewards,
        values=torch.zeros(2, 3),
        next_values=torch.zeros(2, 3),
        terminated=term,
        truncated=none,
        group_ids=groups,
        gamma=1.0,
        gae_lambda=1.0,
    )
    adv, ret = get_advantage_estimator("rloo")(**kw)
    # group 0 returns: env0 1.0, env1 0.0, env2 (2nd episode) 0.5; group 1: env2's first episode alone.
    expect = torch.tensor([[0.75, -0.75, 0.0], [0.75, -0.75, 0.0]])
    torch.testing.assert_close(adv, expect)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.5]]))
    adv, _ = get_advantage_estimator("grpo")(**kw)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]]), atol=1e-5, rtol=0)


def test_group_of_two_and_a_lone_group_before_it():
    """Group 0 holds one complete episode (no baseline: 0), group 1 two (each against the other);
    the lone group comes first, so later groups are still computed."""
    returns = torch.tensor([5.0, 1.0, 3.0])
    groups = torch.tensor([0, 1, 1])
    valid = torch.ones(3, dtype=torch.bool)
    torch.testing.assert_close(rloo_advantages(returns, groups, valid), torch.tensor([0.0, -2.0, 2.0]))
    # grpo: mean 2, unbiased std sqrt(2); a tiny spread shows the epsilon is added (std 1.41e-3)
    torch.testing.assert_close(
        grpo_advantages(returns, groups, valid), torch.tensor([0.0, -1.0, 1.0]) / (2**0.5 + 1e-6)
    )
    tiny = grpo_advantages(torch.tensor([5.0, 0.001, -0.001]), groups, valid)
    torch.testing.assert_close(tiny, torch.tensor([0.0, 0.001, -0.001]) / (0.002 / 2**0.5 + 1e-6), rtol=1e-5, atol=0)


def test_episode_estimator_factory_broadcasts_per_episode_advantages():
    """``_episode_estimator`` (how rloo and grpo enter the registry) turns a per-episode function of
    (returns, groups, complete) into a (T, N) estimator: it numbers the episodes (terminated or
    truncated ends, the rollout's starts_episode), sums each one's rewards, and broadcasts the
    function's answer and the episode return to every turn. Built here, at test time, with a
    function whose answer shows what it was given."""
    from a2c_ppo_acktr.algo.storage import _episode_estimator

    def tagged(returns, groups, valid):
        """10 * return + group for complete episodes, 0 for the others."""
        return torch.where(valid, 10 * returns + groups, torch.zeros_like(returns))

    estimator = _episode_estimator(tagged)
    assert estimator.__doc__ == tagged.__doc__
    rewards, term, groups = _episode_case()
    trunc = torch.zeros_like(term)
    term[1, 1], trunc[1, 1] = False, True  # env1's episode is cut, not finished: it still ends there
    # env0 began before the rollout: incomplete, advantage 0; env1 complete (R 0, group 0); env2 two
    # complete one-turn episodes (R 1 in group 1, then R 0.5 in group 0).
    adv, ret = estimator(
        rewards=rewards,
        terminated=term,
        truncated=trunc,
        group_ids=groups,
        starts_episode=torch.tensor([False, True, True]),
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, 11.0], [0.0, 0.0, 5.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.5]]))
    message = (
        r"^this advantage estimator compares episodes of the same question: pass group_ids \(T, N\) to "
        r"RolloutStorage.insert \(e.g. the question's index\), or use advantage_estimator='gae'$"
    )
    with pytest.raises(ValueError, match=message):
        estimator(rewards=rewards, terminated=term, truncated=trunc, group_ids=None)
    with pytest.raises(ValueError, match="^group_ids must be constant within an episode"):
        estimator(rewards=rewards, terminated=term, truncated=trunc, group_ids=torch.tensor([[0, 0, 1], [1, 0, 0]]))


def test_group_ids_must_be_constant_within_an_episode():
    rewards = torch.zeros(2, 1)
    term = torch.tensor([[False], [True]])
    with pytest.raises(
        ValueError, match=r"^group_ids must be constant within an episode \(one question per episode\)$"
    ):
        get_advantage_estimator("rloo")(
            rewards=rewards, terminated=term, truncated=torch.zeros_like(term), group_ids=torch.tensor([[0], [1]])
        )


def test_incomplete_episodes_get_zero_advantage():
    ended = torch.tensor([[False, True, False], [True, False, False]])
    ids, complete = episode_ids(ended, starts_episode=torch.tensor([False, True, True]))
    # env0: one episode that began before the rollout (incomplete); env1: complete, then an open one;
    # env2: begins with the rollout and never ends (open).
    assert ids[0, 0] == ids[1, 0] and ids[0, 1] != ids[1, 1] and ids[0, 2] == ids[1, 2]
    assert complete.dtype == torch.bool
    assert complete.tolist() == [False, True, False, False]
    assert episode_ids(ended)[1].tolist() == [True, True, False, False]  # default: every env starts an episode
    ended = ended[:, :2]
    ids, complete = episode_ids(ended, starts_episode=torch.tensor([False, True]))
    r = torch.tensor([3.0, 1.0, 2.0])
    assert rloo_advantages(r, torch.zeros(3, dtype=torch.long), complete).tolist() == [0.0, 0.0, 0.0]
    # grpo over all three: mean 2, unbiased std 2 (verl's convention; the population std is 1.63)
    r = torch.tensor([4.0, 0.0, 2.0])
    adv = grpo_advantages(r, torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0]) * 2 / (2 + 1e-6))


def test_registry_names_and_unknown_name():
    assert set(ADVANTAGE_ESTIMATORS) == set(CONFIG_ESTIMATORS)
    with pytest.raises(KeyError, match=r"known estimators: \['gae', 'grpo', 'rloo'\]"):
        get_advantage_estimator("vtrace")
    rewards, term, _ = _episode_case()
    message = (
        r"^this advantage estimator compares episodes of the same question: pass group_ids \(T, N\) to "
        r"RolloutStorage.insert \(e.g. the question's index\), or use advantage_estimator='gae'$"
    )
    with pytest.raises(ValueError, match=message):
        get_advantage_estimator("grpo")(
            rewards=rewards, terminated=term, truncated=torch.zeros_like(term), group_ids=None
        )
    # each registered episode estimator documents itself with its per-episode formula
    assert get_advantage_estimator("rloo").__doc__ == rloo_advantages.__doc__
    assert get_advantage_estimator("grpo").__doc__ == grpo_advantages.__doc__


def test_horizon_counts_only_episodes_bound_to_end_inside_the_rollout():
    """T=4, horizon 2: an episode counts only if its first turn is at step <= 2. env0: a 1-turn
    episode at 0 (counts), one at 1 (counts), one at 2 (counts), one at 3 (ends, but began too late).
    env1: a 2-turn episode at 0-1 (counts), a 1-turn one at 2 (counts), then one at 3 left open."""
    ended = torch.tensor([[True, False], [True, True], [True, True], [True, False]])
    ids, complete = episode_ids(ended)
    assert complete.tolist() == [True, True, True, True, True, True, False]
    ids_h, complete_h = episode_ids(ended, horizon=2)
    assert torch.equal(ids_h, ids)
    assert complete_h.tolist() == [True, True, True, False, True, True, False]
    # horizon = T: only the episodes that began at step 0; starts_episode false still excludes env0's first.
    _, first_only = episode_ids(ended, starts_episode=torch.tensor([False, True]), horizon=4)
    assert first_only.tolist() == [False, False, False, False, True, False, False]


def test_horizon_removes_the_short_episode_bias_of_rloo():
    """A policy whose episodes are a 1-turn win (return 1) or a 3-turn loss (return -1), each with
    probability 1/2, in 4-step rollouts, groups of 8 envs on the same deal. The expected advantage of
    the win under the true 50/50 mix is +1 (1 minus the mean of the others, which is 0 in
    expectation). Without a horizon, late-starting losses are cut and never compared, so the
    baseline is inflated toward the win and the win's advantage shrinks (the losses mostly vanish
    from the gradient); with horizon 3 only the episodes that began at step 0 or 1 count and the mean
    advantage of the compared wins is +1 as it should be (Monte Carlo, 1500 rollouts)."""
    rng = np.random.default_rng(0)
    T, N = 4, 8
    est = get_advantage_estimator("rloo")
    win_adv = {None: [], 3: []}
    losses_compared = {None: 0, 3: 0}
    for _ in range(1500):
        ended = torch.zeros(T, N, dtype=torch.bool)
        rewards = torch.zeros(T, N)
        episode_slot = torch.zeros(T, N, dtype=torch.long)
        for n in range(N):
            t, k = 0, 0
            while t < T:
                win = rng.random() < 0.5
                length = 1 if win else 3
                for s in range(t, min(t + length, T)):
                    episode_slot[s, n] = k
                end = t + length - 1
                if end < T:
                    ended[end, n] = True
                    rewards[end, n] = 1.0 if win else -1.0
                t, k = t + length, k + 1
        group_ids = episode_slot  # the k-th episodes of the group share a deal (one group)
        for horizon in (None, 3):
            none = torch.zeros_like(ended)
            adv, ret = est(rewards=rewards, terminated=ended, truncated=none, group_ids=group_ids, horizon=horizon)
            compared = ended & advantage_mask("rloo", ended, none, group_ids, horizon=horizon)  # one turn per episode
            win_adv[horizon] += adv[compared & (ret > 0)].tolist()
            losses_compared[horizon] += int((compared & (ret < 0)).sum())
    unbiased = float(np.mean(win_adv[3]))
    biased = float(np.mean(win_adv[None]))
    print(f"mean advantage of a compared win: horizon 3 {unbiased:.3f}, none {biased:.3f}")
    assert abs(unbiased - 1.0) < 0.05, unbiased
    assert biased < 0.85, biased  # the cut losses pull the baseline up: the win looks less good
    assert losses_compared[3] > 0

"""No forward whose result nothing reads, and no host read the update does not need.

Forwards are counted with a hook on the transformers model (every forward outside ``generate``):
GAE's values (truncated final observations, and V(s_T) of envs still mid-episode) are ONE batched
forward per rollout and land on the right (step, env); episode-level estimators (grpo) and rollouts
where every episode ended run none; the reference forward runs only when the KL is in the loss or
on the ``log.kl_ref_interval``-th update for the monitor. Host reads of values computed from the
policy's outputs are counted with a tensor subclass: one per minibatch (the finite-loss check) and
one at the end of the update.
"""

from __future__ import annotations

import contextlib
import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.config.arguments import ConfigError, LogConfig, PPOConfig
from a2c_ppo_acktr.policy.loading import LoadedVLM, load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage, compute_gae
from a2c_ppo_acktr.common.sameness import same_observation
from a2c_ppo_acktr.rl.train import collect_rollout, compute_advantages
from helpers import one_token_output, tiny_model_cfg, toy_storage
from numerics import f32_chain_tolerance, head_terms, vlm_forward_terms


def _value_tolerance(policy, observations, values) -> float:
    """Values of ``observations`` forwarded in other batches differ by rounding: the model's sums
    over the longest prompt, then the value head, at max |value| + 1 (numerics)."""
    seq = policy._encode(*policy._prompts_and_images(observations, blind=False))["input_ids"].shape[1]
    terms = vlm_forward_terms(policy.base_model.config, seq) + head_terms(policy.value_head)
    return f32_chain_tolerance(terms, float(values.abs().max()) + 1.0)


@pytest.fixture(scope="module")
def policy(tiny_model_path) -> VLMPolicy:
    cfg = tiny_model_cfg(tiny_model_path, max_new_tokens=6)
    loaded = load_vlm(cfg)
    torch.manual_seed(0)
    return VLMPolicy(
        cfg,
        LoadedVLM(
            model=copy.deepcopy(loaded.model), processor=loaded.processor, family=loaded.family, path=loaded.path
        ),
    )


def _obs(rng, tag: str) -> dict:
    return {
        "images": [rng.integers(0, 256, (28, 28 + 14 * (len(tag) % 2), 3), dtype=np.uint8)],
        "text": f"How many chairs? {tag}",
    }


class ScriptedEnv:
    """Envs whose episode ends follow a script: ``ends[t][n]`` is "term", "trunc" or None. Every
    observation is fresh (its text names step and env), so values of different observations differ."""

    def __init__(self, ends: list[list], group_ids: bool = False) -> None:
        self.ends, self.t, self.group_ids = ends, 0, group_ids
        self.rng = np.random.default_rng(0)
        self.finals: dict[tuple[int, int], dict] = {}

    def reset(self) -> list[dict]:
        return [_obs(self.rng, f"reset env {n}") for n in range(len(self.ends[0]))]

    def resync(self, observations):
        return observations, False

    def step(self, texts):
        ends = self.ends[self.t]
        N = len(ends)
        term = np.array([e == "term" for e in ends])
        trunc = np.array([e in ("trunc", "limit") for e in ends])
        obs, infos = [], []
        for n in range(N):
            o = _obs(self.rng, f"step {self.t} env {n}")
            info = {
                "valid": True,
                "time_limit_announced": ends[n] == "limit",
            }  # "limit": a turn limit the prompt showed
            if self.group_ids:
                info["group_id"] = n // 2
            if term[n] or trunc[n]:
                info["final_observation"] = o
                self.finals[(self.t, n)] = o
                o = _obs(self.rng, f"next episode after step {self.t} env {n}")
            obs.append(o)
            infos.append(info)
        self.t += 1
        return obs, np.linspace(-1, 1, N).astype(np.float32), term, trunc, infos


@contextlib.contextmanager
def counted_forwards(policy: VLMPolicy):
    """Rows of every forward of the transformers model outside ``generate`` and act's shared prefill."""
    rows: list[int] = []
    inside = [False]

    def entered(original):
        def wrapped(*args, **kwargs):
            inside[0] = True
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] = False

        return wrapped

    def hook(_module, _args, kwargs):
        if not inside[0]:
            rows.append(int(kwargs["input_ids"].shape[0]))

    handle = policy.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    policy.model.generate = entered(policy.model.generate)
    policy.sampler.shared_prefill = entered(policy.sampler.shared_prefill)
    try:
        yield rows
    finally:
        handle.remove()
        del policy.model.generate, policy.sampler.shared_prefill  # the instance attributes; the class methods are back


def test_gae_values_are_one_batched_forward_on_the_right_turns(policy):
    """Truncations at steps 0 and 2, a termination and two envs mid-episode at the end: 2 final
    observations + 2 bootstraps = ONE forward of 4 rows (num_envs), each value where GAE reads it."""
    ends = [[None, "trunc", None, None], [None, None, None, None], ["trunc", None, "term", None]]
    env = ScriptedEnv(ends)
    st = RolloutStorage(3, 4)
    with counted_forwards(policy) as rows:
        last_obs, stats = collect_rollout(policy, env, st, env.reset(), 3, bootstrap=True)
    assert rows == [4]
    assert stats.value_rows == 4 and stats.value_seconds > 0
    alone = {k: float(policy.get_values([o])[0]) for k, o in env.finals.items()}
    batched = [*env.finals.values(), last_obs[1], last_obs[3]]
    atol = _value_tolerance(policy, batched, torch.tensor([*alone.values(), *stats.next_value[[1, 3]].tolist()]))
    assert st.next_values[0, 1].item() == pytest.approx(alone[(0, 1)], abs=atol)
    assert st.next_values[2, 0].item() == pytest.approx(alone[(2, 0)], abs=atol)
    torch.testing.assert_close(
        stats.next_value[[1, 3]], policy.get_values([last_obs[1], last_obs[3]]), atol=atol, rtol=0
    )
    assert math.isnan(stats.next_value[0]) and math.isnan(stats.next_value[2])  # ended: nothing reads them
    compute_advantages(st, stats.next_value, PPOConfig(gamma=0.9, gae_lambda=0.8))
    nv = torch.cat([st.values[1:], torch.zeros(1, 4)])
    nv[0, 1], nv[2, 0], nv[2, 1], nv[2, 3] = alone[(0, 1)], alone[(2, 0)], stats.next_value[1], stats.next_value[3]
    adv, _ = compute_gae(st.rewards, st.values, nv, st.terminated, st.truncated, 0.9, 0.8)
    # the same arithmetic on next values that differ by <= atol (alone against batched): an
    # advantage weighs them by at most gamma * sum (gamma * lambda)^k
    torch.testing.assert_close(st.advantages, adv, atol=atol * 0.9 / (1 - 0.9 * 0.8), rtol=0)


def test_more_values_than_envs_are_forwarded_num_envs_rows_at_a_time(policy):
    ends = [["trunc", "trunc"], ["trunc", None]]
    env = ScriptedEnv(ends)
    st = RolloutStorage(2, 2)
    with counted_forwards(policy) as rows:
        _, stats = collect_rollout(policy, env, st, env.reset(), 2, bootstrap=True)
    assert rows == [2, 2]  # 3 finals + 1 bootstrap, never a batch larger than act's
    together = policy.get_values(list(env.finals.values()))
    atol = _value_tolerance(policy, list(env.finals.values()), together)
    torch.testing.assert_close(policy.get_values(list(env.finals.values()), max_rows=2), together, atol=atol, rtol=0)


class StandStillEnv:
    """One-turn episodes over a fixed prompt set, two envs per prompt (a group): each reply is cut
    (truncated) on the state it answered, whose final observation is a copy of the acted one (equal,
    not the same object), or, with ``moved``, that state with one pixel changed."""

    def __init__(self, num_envs: int, moved: bool = False) -> None:
        rng = np.random.default_rng(3)
        self.prompts = [_obs(rng, f"prompt {k}") for k in range(num_envs // 2)]
        self.num_envs, self.moved, self.t = num_envs, moved, 0
        self.finals: list[dict] = []

    def _show(self) -> list[dict]:
        k0 = self.t * (self.num_envs // 2)
        return [self.prompts[(k0 + n // 2) % len(self.prompts)] for n in range(self.num_envs)]

    def reset(self) -> list[dict]:
        return self._show()

    def resync(self, observations):
        return observations, False

    def step(self, texts):
        shown = self._show()
        finals = [{"images": [im.copy() for im in o["images"]], "text": str(o["text"])} for o in shown]
        if self.moved:
            for f in finals:
                f["images"][0][0, 0, 0] ^= 1
        self.finals = finals
        self.t += 1
        N = self.num_envs
        infos = [{"valid": False, "final_observation": f} for f in finals]
        return self._show(), np.zeros(N, np.float32), np.zeros(N, bool), np.ones(N, bool), infos


def test_a_step_cut_on_the_state_act_valued_takes_acts_value_without_a_forward(policy):
    """A one-turn episode cut at its reply ends on the state it acted on: V(final observation) is
    the value act computed (bit for bit), and no forward runs, while a state one pixel away is
    forwarded, each distinct state once (two envs of a group share one)."""
    env = StandStillEnv(4)
    st = RolloutStorage(2, 4)
    values = []
    original = policy.act

    def recording_act(observations, **kw):
        out = original(observations, **kw)
        values.append(out.values.clone())
        return out

    policy.act = recording_act
    try:
        with counted_forwards(policy) as rows:
            _, stats = collect_rollout(policy, env, st, env.reset(), 2, bootstrap=True)
    finally:
        del policy.act
    assert rows == [] and stats.value_rows == 0
    assert torch.equal(st.next_values, torch.stack(values))
    assert not bool(st.final_pending.any())

    env = StandStillEnv(4, moved=True)
    st = RolloutStorage(1, 4)
    with counted_forwards(policy) as rows:
        collect_rollout(policy, env, st, env.reset(), 1, bootstrap=True)
    assert rows == [2] and not bool(st.final_pending.any())  # 4 cut envs, 2 distinct states
    alone = policy.get_values([env.finals[0], env.finals[2]])
    atol = _value_tolerance(policy, env.finals, alone)
    torch.testing.assert_close(st.next_values[0], alone.repeat_interleave(2), atol=atol, rtol=0)
    assert st.next_values[0, 0] == st.next_values[0, 1] and st.next_values[0, 2] == st.next_values[0, 3]


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (
            {"text": "x", "images": [np.zeros((2, 2, 3), np.uint8)]},
            {"text": "x", "images": [np.zeros((2, 2, 3), np.uint8)]},
            True,
        ),
        (
            {"text": "x", "images": [np.zeros((2, 2, 3), np.uint8)]},
            {"text": "y", "images": [np.zeros((2, 2, 3), np.uint8)]},
            False,
        ),
        (
            {"text": "x", "images": [np.zeros((2, 2, 3), np.uint8)]},
            {"text": "x", "images": [np.zeros((2, 3, 3), np.uint8)]},
            False,
        ),
        (
            {"text": "x", "images": [np.zeros((2, 2, 3), np.uint8)]},
            {"text": "x", "images": [np.zeros((2, 2, 3), np.float32)]},
            False,
        ),
        ({"text": "x", "images": []}, {"text": "x", "images": [], "turn": 1}, False),
        ({"text": "x", "turn": torch.tensor([1, 2])}, {"text": "x", "turn": torch.tensor([1, 2])}, True),
        ({"text": "x", "turn": torch.tensor([1, 2])}, {"text": "x", "turn": torch.tensor([1, 3])}, False),
        ({"text": "x", "turn": 1}, {"text": "x", "turn": 1.0}, False),
    ],
)
def test_same_observation_compares_every_field(a, b, equal):
    assert same_observation(a, b) is equal
    assert same_observation(b, a) is equal


def test_no_forward_when_every_episode_ended_by_termination(policy):
    env = ScriptedEnv([["term", None], [None, "term"], ["term", "term"]])
    st = RolloutStorage(3, 2)
    with counted_forwards(policy) as rows:
        _, stats = collect_rollout(policy, env, st, env.reset(), 3, bootstrap=True)
    assert rows == [] and stats.value_rows == 0
    compute_advantages(st, stats.next_value, PPOConfig())  # the NaN placeholders are never read
    assert torch.isfinite(st.advantages).all()


def test_an_announced_turn_limit_is_terminal_and_bootstraps_nothing(policy):
    """A turn limit every observation showed ("Turns left", info["time_limit_announced"]) ends the MDP
    (Pardo et al. 2018): stored as terminated, no value forward for it; an unannounced cut of the same
    shape still bootstraps from its final observation."""
    env = ScriptedEnv([["limit", "trunc"], ["limit", "limit"]])
    st = RolloutStorage(2, 2)
    with counted_forwards(policy) as rows:
        _, stats = collect_rollout(policy, env, st, env.reset(), 2, bootstrap=True)
    assert rows == [1] and stats.value_rows == 1  # env 1's unannounced cut at step 0 only
    assert st.terminated.tolist() == [[True, False], [True, True]] and st.truncated.tolist() == [
        [False, True],
        [False, False],
    ]
    compute_advantages(st, stats.next_value, PPOConfig(gamma=0.9, gae_lambda=1.0))
    # terminal: the advantage of an announced end is its reward minus its value, no bootstrap term
    assert st.advantages[1, 0].item() == pytest.approx(float(st.rewards[1, 0] - st.values[1, 0]), abs=1e-6)


def test_the_envs_announce_their_turn_limits_only_where_their_prompts_show_them():
    from a2c_ppo_acktr.envs.registry import make_env
    from a2c_ppo_acktr.config.arguments import load_config

    vsi = make_env(load_config(preset="debug", overrides=["env.max_turns=1"]).env)
    vsi.reset(seed=0)
    assert "Turns left" in vsi._observation()["text"] or "last turn" in vsi._observation()["text"]
    *_, term, trunc, info = vsi.step("not a reply")
    assert (term, trunc, info["time_limit_announced"]) == (False, True, True)
    vsi.reset(seed=0)
    *_, term, trunc, info = vsi.step('{"thoughts": "x", "action": {"answer": "3"}}')
    assert term and not info["time_limit_announced"]
    numberline = make_env(
        load_config(
            preset="debug", config="configs/envs/numberline.yaml", overrides=["env.image_size=64", "env.max_turns=1"]
        ).env
    )
    obs, _ = numberline.reset(seed=0)
    assert "Turns left" not in obs["text"]
    *_, term, trunc, info = numberline.step("not a reply")
    assert trunc and not info["time_limit_announced"]  # its prompt never shows the turns left: a truncation
    grid = make_env(
        load_config(
            preset="debug",
            config="configs/envs/minigrid-empty.yaml",
            overrides=["env.image_size=64", "env.max_turns=1"],
        ).env
    )
    obs, _ = grid.reset(seed=0)
    assert "Turns left: 1" in obs["text"]
    *_, term, trunc, info = grid.step("not a reply")
    assert trunc and info["time_limit_announced"]


def test_grpo_rollout_computes_no_value(policy):
    """Episode-level estimators read no value of a later state: no forward, even with truncations
    and envs mid-episode, and the deferred final values are never asked for."""
    env = ScriptedEnv([["trunc", "trunc", None, "term"], [None, "term", "trunc", None]], group_ids=True)
    st = RolloutStorage(2, 4)
    with counted_forwards(policy) as rows:
        _, stats = collect_rollout(policy, env, st, env.reset(), 2, bootstrap=False)
    assert rows == [] and stats.next_value is None
    assert st.final_pending.sum() == 3
    compute_advantages(st, stats.next_value, PPOConfig(advantage_estimator="grpo"))
    assert torch.isfinite(st.advantages).all()
    with pytest.raises(ValueError, match="deferred and never given; call set_final_values"):
        st.compute_returns(None, "gae")


class _KLToy(nn.Module):
    """One logit per stored turn; records whether each forward ran the reference (``with_kl``)."""

    has_reference = True

    def __init__(self, n: int) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(n))
        self.calls: list[bool] = []

    def forward(self, mb, with_kl=False):
        self.calls.append(with_kl)
        th = self.theta[mb.indices]
        return one_token_output(nn.functional.logsigmoid(th), th * 0, th * 0, th**2 if with_kl else None)


def test_reference_forward_only_when_the_kl_is_read():
    """kl_coef = 0: the reference runs on the first minibatch of updates 0 and 3 (interval 3), never
    otherwise, and losses/kl_ref is NaN in between; kl_coef > 0: on every minibatch."""
    st = toy_storage()
    pol = _KLToy(8)
    cfg = PPOConfig(ppo_epochs=2, mini_batch_size=2, lr=0.1, old_log_probs="rollout")  # the update's own forwards only
    ppo = PPO(pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg, seed=0, kl_ref_interval=3)
    logged = []
    for _ in range(4):
        pol.calls.clear()
        logged.append(ppo.update(st)["losses/kl_ref"])
        assert len(pol.calls) == 8
        per_update = list(pol.calls)
        assert per_update[1:] == [False] * 7
        logged[-1] = (per_update[0], logged[-1])
    assert [with_kl for with_kl, _ in logged] == [True, False, False, True]
    assert [math.isnan(v) for _, v in logged] == [False, True, True, False]
    pol = _KLToy(8)
    ppo = PPO(
        pol,
        torch.optim.SGD(pol.parameters(), lr=0.1),
        PPOConfig(ppo_epochs=2, mini_batch_size=2, kl_coef=0.1),
        seed=0,
        kl_ref_interval=3,
    )
    for _ in range(2):
        assert math.isfinite(ppo.update(st)["losses/kl_ref"])
    # ppo.old_log_probs=update first re-scores the 4 minibatches without the reference, then the 8 read the KL
    assert pol.calls == ([False] * 4 + [True] * 8) * 2


def test_reference_forward_decision_is_the_same_on_every_rank():
    """Ranks see different minibatches (other seeds, other rollouts) but run the reference on the
    same updates: the decision reads only the update count and kl_coef, which all ranks share."""
    runs = []
    for rank in range(2):
        pol = _KLToy(8)
        ppo = PPO(
            pol,
            torch.optim.SGD(pol.parameters(), lr=0.1),
            PPOConfig(ppo_epochs=1, mini_batch_size=4, old_log_probs="rollout"),
            seed=rank,
            kl_ref_interval=2,
        )
        for _ in range(5):
            ppo.update(toy_storage(seed=rank + 10 * ppo.num_updates))
        runs.append(pol.calls)
    assert runs[0] == runs[1] == [True, False, False, False, True, False, False, False, True, False]


def test_kl_ref_interval_must_be_positive():
    assert LogConfig().kl_ref_interval == 10
    with pytest.raises(ConfigError, match=r"log.kl_ref_interval=0 must be >= 1"):
        LogConfig(kl_ref_interval=0)
    with pytest.raises(ValueError, match="kl_ref_interval=0 must be >= 1"):
        PPO(_KLToy(2), torch.optim.SGD(_KLToy(2).parameters(), lr=0.1), PPOConfig(), kl_ref_interval=0)


class _Counted(torch.Tensor):
    """A tensor that counts host reads (``item``, ``float``, ``tolist``, ``bool``, ``int``) of itself
    and of every tensor computed from it."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (
            torch.Tensor.item,
            torch.Tensor.__float__,
            torch.Tensor.tolist,
            torch.Tensor.__bool__,
            torch.Tensor.__int__,
        ):
            _Counted.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class _CountedToy(_KLToy):
    def forward(self, mb, with_kl=False):
        out = super().forward(mb, with_kl)
        return SimpleNamespace(
            **{k: (v.as_subclass(_Counted) if isinstance(v, torch.Tensor) else v) for k, v in vars(out).items()}
        )


@pytest.mark.parametrize("epochs, target_kl", [(1, None), (3, None), (2, 1e9)])
def test_update_reads_policy_outputs_once_per_minibatch(epochs, target_kl):
    """Values computed from the policy's outputs reach the host once per minibatch (is the loss
    finite on every rank: decided before backward), once per epoch with target_kl, and once at the
    end (all metrics in one copy): not once per metric per minibatch."""
    st = toy_storage()
    pol = _CountedToy(8)
    cfg = PPOConfig(ppo_epochs=epochs, mini_batch_size=2, kl_coef=0.1, target_kl=target_kl, grad_accum_steps=2)
    _Counted.reads = 0
    out = PPO(pol, torch.optim.SGD(pol.parameters(), lr=0.1), cfg, seed=0).update(st)
    minibatches = 4 * epochs
    assert _Counted.reads == minibatches + (epochs if target_kl is not None else 0) + 1
    assert math.isfinite(out["losses/policy_loss"]) and math.isfinite(out["losses/kl_ref"])
    assert out["losses/skipped_minibatches"] == 0 and out["optim/steps"] == minibatches // 2


def test_deferred_final_values_equal_the_immediate_ones():
    """Inserting with defer_final_values then set_final_values gives the storage that passing
    final_values at each step gives; only deferred truncated turns take a value."""
    g = torch.Generator().manual_seed(4)
    trunc = torch.tensor([[True, False, True], [False, True, False]])
    term = torch.tensor([[False, True, False], [False, False, False]])
    finals = torch.randn(2, 3, generator=g)
    values, rewards = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)

    def fill(defer: bool) -> RolloutStorage:
        st = RolloutStorage(2, 3)
        for t in range(2):
            act = SimpleNamespace(
                texts=[""] * 3,
                prompts=[""] * 3,
                images=[[] for _ in range(3)],
                prompt_ids=[torch.zeros(1)] * 3,
                generated_ids=[torch.zeros(1)] * 3,
                token_weights=[torch.ones(1)] * 3,
                log_probs=torch.zeros(3),
                values=values[t],
                temperatures=torch.ones(3),
            )
            st.insert(
                act, rewards[t], term[t], trunc[t], final_values=None if defer else finals[t], defer_final_values=defer
            )
        return st

    deferred, direct = fill(True), fill(False)
    assert deferred.needs_bootstrap.tolist() == [True, False, True]
    with pytest.raises(ValueError, match="step 0 env 1 is not a truncated step whose final value was deferred"):
        deferred.set_final_values([0], [1], torch.zeros(1))
    with pytest.raises(ValueError, match="2 steps, 2 envs and 1 values must be as many"):
        deferred.set_final_values([0, 0], [0, 2], torch.zeros(1))
    deferred.set_final_values([0, 0, 1], [0, 2, 1], finals[trunc])
    assert not deferred.final_pending.any()
    bootstrap = torch.tensor([0.5, float("nan"), -0.5])  # env 1 ended: its entry is never read
    for st in (deferred, direct):
        st.compute_returns(bootstrap, "gae", 0.9, 0.8)
    torch.testing.assert_close(deferred.advantages, direct.advantages)
    assert torch.isfinite(deferred.advantages).all()


def test_one_prefill_per_turn_and_the_heads_read_it(policy):
    """The HF engine (model.rollout_log_probs=generate): a turn is ONE prefill, generate's own (the
    temperature head and the value head read its last prompt position); no other forward of the
    prompt runs. Every later forward inside generate decodes one new token per row."""
    rng = np.random.default_rng(0)
    obs = [_obs(rng, f"env {n}") for n in range(3)]
    lengths: list[int] = []

    def hook(_module, _args, kwargs):
        lengths.append(int(kwargs["input_ids"].shape[1]))

    handle = policy.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with counted_forwards(policy) as outside:
            out = policy.act(obs)
    finally:
        handle.remove()
    assert outside == []  # nothing but generate forwarded
    assert len(lengths) >= 2 and lengths[0] > 1 and set(lengths[1:]) == {1}  # one prefill, then one token per step
    assert torch.isfinite(out.values).all() and torch.isfinite(out.temperatures).all()

"""DAPO's dynamic sampling (``ppo.dynamic_sampling``): groups whose episodes all score alike leave the
update's batch, more rollouts refill it, and a batch the rounds cannot fill is completed with turns that
take no advantage. On hand-made one-turn rollouts where every group's returns are known."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.algo.storage import RolloutStorage, informative_turns
from a2c_ppo_acktr.rl.train import RolloutStats, dynamic_batch


def _rollout(st: RolloutStorage, rewards: list[float], round_id: int) -> RolloutStats:
    """One step of 4 one-turn episodes in groups of 2 (envs 0-1 and 2-3), texts naming round and env."""
    N = len(rewards)
    act = SimpleNamespace(
        texts=[""] * N,
        prompts=[f"round {round_id} env {n}" for n in range(N)],
        images=[[] for _ in range(N)],
        prompt_ids=[torch.zeros(1)] * N,
        generated_ids=[torch.tensor([round_id * 10 + n]) for n in range(N)],
        token_weights=[torch.ones(1)] * N,
        log_probs=torch.full((N,), math.log(0.5)),
        values=torch.zeros(N),
        temperatures=torch.ones(N),
        token_log_probs=[torch.full((1,), math.log(0.5))] * N,
    )
    groups = [round_id * 100 + n // 2 for n in range(N)]
    st.insert(act, torch.tensor(rewards), torch.ones(N), torch.zeros(N), group_ids=groups)
    return RolloutStats(turns=N, reward_sum=float(sum(rewards)))


def _estimate(st: RolloutStorage):
    def estimate(_stats: RolloutStats) -> dict:
        st.compute_returns(None, "grpo", horizon=1)
        return {}

    return estimate


def _run(st: RolloutStorage, rounds: int):
    return SimpleNamespace(
        storage=st,
        accelerator=SimpleNamespace(num_processes=1, device=torch.device("cpu")),
        cfg=SimpleNamespace(ppo=SimpleNamespace(dynamic_sampling_max_rounds=rounds)),
    )


def test_informative_turns_keep_whole_groups_that_differ():
    adv = torch.tensor([[0.7, -0.7, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    groups = torch.tensor([[1, 1, 2, 2, 3, 3]])
    # group 1 differs; group 2's returns were equal (all 0); group 3 has a turn outside the comparison
    assert informative_turns(adv, mask, groups).tolist() == [[True, True, False, False, False, False]]
    # a differing group keeps a zero-advantage member (grpo's middle return)
    adv2 = torch.tensor([[1.0, 0.0, -1.0]])
    assert informative_turns(adv2, torch.ones(1, 3, dtype=torch.bool), torch.tensor([[5, 5, 5]])).tolist() == [
        [True] * 3
    ]


def test_rounds_refill_the_batch_with_differing_groups_only():
    st = RolloutStorage(1, 4)
    estimate = _estimate(st)
    stats = _rollout(st, [1.0, 1.0, 0.0, 1.0], round_id=0)  # group 0 all alike, group 1 differs
    estimate(stats)
    later = iter([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # round 1: nothing differs; round 2: group 0 does
    calls = []

    def collect() -> RolloutStats:
        calls.append(len(calls) + 1)
        return _rollout(st, next(later), round_id=len(calls))

    batch, merged, metrics = dynamic_batch(_run(st, rounds=4), stats, collect, estimate)
    assert calls == [1, 2]
    assert metrics == {
        "rollout/dynamic_rounds": 3.0,
        "rollout/informative_fraction": 4 / 12,
        "rollout/uninformative_fill": 0.0,
    }
    assert batch.prompts == ["round 0 env 2", "round 0 env 3", "round 2 env 0", "round 2 env 1"]
    assert [int(g[0]) for g in batch.generated_ids] == [2, 3, 20, 21]
    assert batch.adv_mask.all() and (batch.advantages.flatten() != 0).all()
    assert batch.group_ids.flatten().tolist() == [1, 1, 200, 200]
    assert merged.turns == 12 and merged.reward_sum == 4.0
    # the batch reads like a rollout: normalised advantages, minibatches by flat index
    mbs = list(batch.minibatches(2, torch.Generator().manual_seed(0), adv_norm="batch"))
    assert sorted(i for mb in mbs for i in mb.indices.tolist()) == [0, 1, 2, 3]


def test_rounds_that_run_out_fill_the_rest_without_an_advantage():
    st = RolloutStorage(1, 4)
    estimate = _estimate(st)
    stats = _rollout(st, [1.0, 0.0, 1.0, 1.0], round_id=0)
    estimate(stats)

    def collect() -> RolloutStats:
        return _rollout(st, [0.0, 0.0, 1.0, 1.0], round_id=1)

    batch, _, metrics = dynamic_batch(_run(st, rounds=2), stats, collect, estimate)
    assert metrics["rollout/dynamic_rounds"] == 2.0 and metrics["rollout/uninformative_fill"] == 0.5
    assert batch.prompts[:2] == ["round 0 env 0", "round 0 env 1"]
    assert batch.prompts[2:] == ["round 1 env 0", "round 1 env 1"]  # the last round's first turns fill in
    assert batch.adv_mask.flatten().tolist() == [True, True, False, False]
    assert batch.advantages.flatten()[2:].tolist() == [0.0, 0.0]


def test_dynamic_sampling_needs_a_grouped_estimator():
    with pytest.raises(ConfigError, match="ppo.dynamic_sampling drops groups.*use rloo or grpo"):
        load_config(preset="debug", overrides=["ppo.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="ppo.dynamic_sampling_max_rounds=0 must be >= 1"):
        load_config(preset="debug", overrides=["ppo.dynamic_sampling_max_rounds=0"])
    cfg = load_config(
        preset="debug",
        overrides=[
            "ppo.dynamic_sampling=true",
            "ppo.advantage_estimator=grpo",
            "rollout.group_size=2",
            "rollout.num_steps=3",
            "env.max_turns=3",
            "ppo.mini_batch_size=2",
        ],
    )
    assert cfg.ppo.dynamic_sampling

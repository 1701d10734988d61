"""Grouped rollouts (rollout.group_size): the envs of a group play the same episodes; rloo/grpo and
the advantage normalisation modes against closed forms on grouped, terminated and truncated episodes."""

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.config.arguments import EnvConfig
from a2c_ppo_acktr.envs.batch import GROUP_ID_STRIDE, VSIBatchEnv, episode_seed
from a2c_ppo_acktr.envs.vsi_env import VSIEnv
from a2c_ppo_acktr.algo.storage import advantage_mask, get_advantage_estimator, normalize_advantages
from numerics import normalized_mean_tolerance

CFG = EnvConfig(image_size=32, num_sweep_frames=2, image_history=1, max_turns=3, num_scenes=8)
ANSWER = '{"thoughts": "", "action": {"answer": "2"}}'
MOVE = '{"thoughts": "", "action": {"rotation_angle_degrees": 30, "forward_meters": 0.5}}'


def _spec(env: VSIEnv) -> tuple:
    """What a group must share at an episode's start: scene, question, answer, start pose."""
    q = env.question
    return (env.scene.scene_id, q.question, str(q.ground_truth), tuple(q.options or ()), env.path[0])


def test_envs_of_a_group_start_every_episode_alike_and_carry_its_group_id():
    batch = VSIBatchEnv(CFG, num_envs=4, seed=7, group_size=2)
    obs = batch.reset()
    specs = [_spec(e) for e in batch.envs]
    assert specs[0] == specs[1] and specs[2] == specs[3]
    assert specs[0] != specs[2]  # different groups draw different episodes
    assert obs[0]["text"] == obs[1]["text"] and all(
        np.array_equal(a, b) for a, b in zip(obs[0]["images"], obs[1]["images"])
    )
    assert [i["group_id"] for i in batch.reset_infos] == [0, 0, GROUP_ID_STRIDE, GROUP_ID_STRIDE]
    # Env 0 answers at once (its 2nd episode starts), env 1 walks until truncated (3 turns): they drift apart.
    second: dict[int, tuple] = {}
    for turn in range(3):
        _, _, term, trunc, infos = batch.step([ANSWER, MOVE, ANSWER, ANSWER])
        # every step's id is the episode the step belonged to
        assert infos[0]["group_id"] == turn and infos[1]["group_id"] == 0
        assert infos[2]["group_id"] == GROUP_ID_STRIDE + turn
        assert term[0] and not term[1]
        if turn == 0:
            second[0] = _spec(batch.envs[0])
    assert trunc[1] and infos[1]["reset_info"]["group_id"] == 1
    # env 1's 2nd episode, started 2 turns after env 0's, is the same episode
    assert _spec(batch.envs[1]) == second[0]
    assert batch.episode_counts == [4, 2, 4, 4]
    # resync (the start of every rollout): each group restarts on the next index none of its envs began
    obs, restarted = batch.resync(obs)
    assert restarted and batch.episode_counts == [5, 5, 5, 5]
    assert _spec(batch.envs[0]) == _spec(batch.envs[1]) and _spec(batch.envs[2]) == _spec(batch.envs[3])
    assert [i["group_id"] for i in batch.reset_infos] == [4, 4, GROUP_ID_STRIDE + 4, GROUP_ID_STRIDE + 4]
    assert batch.resync(obs) == (obs, False)  # nothing stepped since: no-op
    ungrouped = VSIBatchEnv(CFG, 2, seed=1)
    first = ungrouped.reset()
    ungrouped.step([ANSWER, MOVE])
    assert ungrouped.resync(first) == (first, False)


def test_group_episode_seeds_are_a_pure_function_of_seed_group_and_index():
    assert episode_seed(7, 1, 3) == episode_seed(7, 1, 3)
    assert len({episode_seed(7, g, k) for g in range(3) for k in range(3)} | {episode_seed(8, 0, 0)}) == 10
    a, b = VSIBatchEnv(CFG, 2, seed=3, group_size=2), VSIBatchEnv(CFG, 2, seed=3, group_size=2)
    a.reset(), b.reset()
    assert _spec(a.envs[0]) == _spec(b.envs[1])


def test_group_size_one_keeps_the_ungrouped_streams():
    """Env i seeded seed + i, then continuing its own generator: what runs without groups always did."""
    batch = VSIBatchEnv(CFG, num_envs=2, seed=5)
    batch.reset()
    alone = VSIEnv(CFG)
    alone.reset(seed=6)
    assert _spec(batch.envs[1]) == _spec(alone)
    batch.step([ANSWER, ANSWER])
    alone.reset()
    assert _spec(batch.envs[1]) == _spec(alone)
    with pytest.raises(ValueError, match="group_size=3 must be >= 1 and divide num_envs=4"):
        VSIBatchEnv(CFG, 4, group_size=3)


# ------------------------------------------------------------------------ estimators, closed forms
# 2 steps x 4 envs, groups {0,1} and {2,3} (ids as VSIBatchEnv makes them: g * 2**32 + k).
#   env 0: ep (k=0) answers at t=0 (R=1.0), then ep k=1 answers at t=1 (R=0.5)
#   env 1: ep k=0 truncated at t=1 after 2 turns (R=-0.1 + 0.0)
#   env 2: ep k=0 answers at t=1 (R = 0 + 0.8)
#   env 3: ep k=0 answers at t=0 (R=0.2), ep k=1 goes on past the rollout (incomplete)
G = GROUP_ID_STRIDE
REWARDS = torch.tensor([[1.0, -0.1, 0.0, 0.2], [0.5, 0.0, 0.8, 0.3]])
TERM = torch.tensor([[True, False, False, True], [True, False, True, False]])
TRUNC = torch.tensor([[False, False, False, False], [False, True, False, False]])
GIDS = torch.tensor([[0, 0, G, G], [1, 0, G, G + 1]])


def _run(name):
    return get_advantage_estimator(name)(
        rewards=REWARDS,
        values=torch.zeros(2, 4),
        next_values=torch.zeros(2, 4),
        terminated=TERM,
        truncated=TRUNC,
        group_ids=GIDS,
        starts_episode=None,
        gamma=1.0,
        gae_lambda=1.0,
    )


def test_rloo_on_grouped_terminated_and_truncated_episodes():
    adv, ret = _run("rloo")
    # group (0, k=0): env 0 R=1.0 and env 1 R=-0.1 (truncated, still complete) -> +-1.1
    # group (1, k=0): env 2 R=0.8 and env 3 R=0.2 -> +-0.6;  (0, k=1) and (1, k=1) alone -> 0
    want = torch.tensor([[1.1, -1.1, 0.6, -0.6], [0.0, -1.1, 0.6, 0.0]])
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, torch.tensor([[1.0, -0.1, 0.8, 0.2], [0.5, -0.1, 0.8, 0.3]]))
    mask = advantage_mask("rloo", TERM, TRUNC, GIDS)
    assert mask.tolist() == [[True, True, True, True], [False, True, True, False]]


def test_grpo_with_and_without_std_floor():
    adv, _ = _run("grpo")
    # a pair (a, b): (x - mean) / unbiased std = +-1/sqrt(2) ... divided by std + 1e-6
    s0, s1 = (1.1 / 2) * 2**0.5, (0.6 / 2) * 2**0.5
    torch.testing.assert_close(
        adv[0], torch.tensor([0.55 / (s0 + 1e-6), -0.55 / (s0 + 1e-6), 0.3 / (s1 + 1e-6), -0.3 / (s1 + 1e-6)])
    )
    floored, _ = get_advantage_estimator("grpo")(
        rewards=REWARDS,
        terminated=TERM,
        truncated=TRUNC,
        group_ids=GIDS,
        std_floor=1.0,
    )
    torch.testing.assert_close(
        floored[0], torch.tensor([0.55, -0.55, 0.3, -0.3])
    )  # both stds (0.78, 0.42) < 1: floored
    # equal returns in a group: exactly 0, with or without floor
    eq, _ = get_advantage_estimator("grpo")(
        rewards=torch.ones(1, 2),
        terminated=torch.ones(1, 2, dtype=torch.bool),
        truncated=torch.zeros(1, 2, dtype=torch.bool),
        group_ids=torch.zeros(1, 2, dtype=torch.long),
    )
    assert eq.abs().max().item() == 0.0


def test_gae_on_a_grouped_rollout_ignores_groups():
    adv, _ = _run("gae")
    # gamma = lambda = 1, values 0: advantage = rest of the episode's reward inside the rollout
    torch.testing.assert_close(adv, torch.tensor([[1.0, -0.1, 0.8, 0.2], [0.5, 0.0, 0.8, 0.3]]))
    assert advantage_mask("gae", TERM, TRUNC, GIDS).all()


# ------------------------------------------------------------------------ normalisation
def test_normalisation_modes_closed_form():
    a = torch.tensor([[1.0, 3.0, 10.0, 14.0]])
    groups = torch.tensor([[0, 0, 1, 1]])
    torch.testing.assert_close(normalize_advantages(a, "none"), a)
    # batch: mean 7, population std sqrt(((36+16+9+49)/4)) = sqrt(27.5)
    torch.testing.assert_close(normalize_advantages(a, "batch"), (a - 7) / (27.5**0.5 + 1e-8))
    # group: means 2 and 12, stds 1 and 2
    torch.testing.assert_close(
        normalize_advantages(a, "group", group_ids=groups), torch.tensor([[-1.0, 1.0, -1.0, 1.0]])
    )
    # the floor only acts where the std is below it
    torch.testing.assert_close(
        normalize_advantages(a, "group", std_floor=1.5, group_ids=groups),
        torch.tensor([[-1 / 1.5, 1 / 1.5, -1.0, 1.0]]),
    )
    # masked entries stay 0 and do not enter the statistics
    mask = torch.tensor([[True, True, True, False]])
    out = normalize_advantages(a, "batch", mask=mask)
    assert out[0, 3].item() == 0.0
    torch.testing.assert_close(
        out[0, :3].mean(), torch.tensor(0.0), atol=normalized_mean_tolerance(a[mask], out[0, :3]), rtol=0
    )
    with pytest.raises(ValueError, match="needs the rollout's group ids"):
        normalize_advantages(a, "group")


def test_equal_rewards_give_near_zero_advantages_with_the_floor():
    """Every reward 1.0: GAE advantages are value noise (std 0.002); without a floor they are blown up
    to unit std (the measured instability), with the default floor 0.1 they stay at 2% of it."""
    noise = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 0.002
    unfloored = normalize_advantages(noise, "batch")
    floored = normalize_advantages(noise, "batch", std_floor=0.1)
    assert unfloored.std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
    assert floored.abs().max().item() < 0.1


# ------------------------------------------------------------------------ end to end
def _grouped_overrides(out, estimator, **extra):
    base = {
        "log.output_dir": str(out),
        "log.progress_bar": "false",
        "log.tensorboard": "false",
        "log.save_interval": "1",
        "ppo.num_iterations": "3",
        "env.max_turns": "2",
        "model.max_new_tokens": "24",
        "rollout.num_envs": "4",
        "rollout.group_size": "2",
        "rollout.num_steps": "2",
        "ppo.advantage_estimator": estimator,
        "ppo.mini_batch_size": "4",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_grouped_estimators_train_end_to_end_and_resume_exactly(tmp_path, estimator, monkeypatch):
    """main_vsi.py's path with rloo/grpo: 3 iterations equal 2 + resume + 1, groups included; the
    advantages are computed with horizon env.max_turns (only episodes bound to end are compared)."""
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.algo.storage import RolloutStorage
    from a2c_ppo_acktr.rl.train import run_training

    horizons = []
    real = RolloutStorage.compute_returns

    def spy(self, *args, **kwargs):
        horizons.append(kwargs.get("horizon"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RolloutStorage, "compute_returns", spy)
    full = run_training(load_config(preset="debug", overrides=_grouped_overrides(tmp_path / "full", estimator)))
    assert horizons == [2, 2, 2]
    run_training(
        load_config(
            preset="debug",
            overrides=_grouped_overrides(tmp_path / "split", estimator, **{"log.stop_after_iterations": "2"}),
        )
    )
    resumed = run_training(
        load_config(
            preset="debug", overrides=_grouped_overrides(tmp_path / "split", estimator, **{"log.resume": "auto"})
        )
    )
    a, b = torch.load(full / "trainable.pt"), torch.load(resumed / "trainable.pt")
    assert all(torch.equal(a[n], b[n]) for n in a)
    rows = read_metrics(tmp_path / "full" / "metrics.jsonl")
    again = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows] == [
        {k: v for k, v in r.items() if not k.startswith("time/")} for r in again
    ]
    # groups of 2 that answered within the rollout were compared (some turns have a baseline)
    assert any(r["adv/compared_fraction"] > 0 for r in rows)
    assert all(np.isnan(r["time/collect_values"]) or r["time/collect_values"] == 0.0 for r in rows)  # no value pass

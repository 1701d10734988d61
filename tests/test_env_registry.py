"""Every env of the registry through the one pipeline: config, batched stepping, exact
resume, oracle labelling, SFT samples and evaluation, and end to end from the tiny model
(label -> SFT -> 2 PPO iterations -> eval) for every id."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.envs import registry

GAME_IDS = [i for i in registry.TESTED_IDS if i != registry.VSI_ID]
OVERLAYS = registry.OVERLAYS


def game_cfg(env_id: str, **over):
    """The debug preset on ``env_id`` with its overlay (64 px: the card drawings' minimum)."""
    overrides = {"env": {"image_size": 64}, "log": {"progress_bar": False}}
    for dotted, value in over.items():
        section, key = dotted.split("__")
        overrides.setdefault(section, {})[key] = value
    return load_config(preset="debug", config=str(registry.overlay_path(env_id)), overrides=overrides)


# ------------------------------------------------------------------------------------ the config
def test_every_overlay_names_its_env_and_every_tested_id_has_one():
    assert set(OVERLAYS) == set(GAME_IDS)
    for env_id in GAME_IDS:
        assert game_cfg(env_id).env.env_id == env_id


def test_unknown_env_id_and_unknown_game_setting_are_clear_errors():
    with pytest.raises(ConfigError, match="env.env_id='Pong-v0' is not a known env.*MiniGrid-DoorKey-6x6-v0"):
        load_config(preset="debug", overrides=["--env.env_id", "Pong-v0"])
    cfg = load_config(
        preset="debug",
        overrides=["--env.env_id", "NumberLine-v0", "--env.image_size", "64", "--env.game.max_postion", "7"],
    )
    with pytest.raises(ValueError, match=r"env.game has \['max_postion'\].*max_position"):
        registry.make_env(cfg.env)
    cfg = load_config(
        preset="debug",
        overrides=["--env.env_id", "NumberLine-v0", "--env.image_size", "64", "--env.game.max_position", "1"],
    )
    with pytest.raises(ValueError, match="NumberLine-v0: max_position=1 must be >= 2"):
        registry.make_env(cfg.env)
    with pytest.raises(ValueError, match="leave env.game empty"):
        registry.make_env(load_config(preset="debug", overrides=["--env.game.max_position", "7"]).env)


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_every_game_has_a_typed_frozen_config_of_its_own(env_id):
    import dataclasses

    from a2c_ppo_acktr.envs.cards.common import CardGameConfig

    cfg = registry.game_config(game_cfg(env_id).env)
    cls = registry.env_class(env_id).config_class
    assert type(cfg) is cls and dataclasses.is_dataclass(cls) and cls.__name__ != "CardGameConfig"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_turns = 3
    # a card game's settings are a card game's; MiniGrid and Sokoban are not card games
    assert isinstance(cfg, CardGameConfig) == (env_id in registry.CARD_IDS)


@pytest.mark.parametrize("entry", ["run_training", "resolve_config", "label_trajectories"])
def test_a_bad_game_setting_stops_each_entry_point_before_a_model_loads(entry, tmp_path, monkeypatch):
    from a2c_ppo_acktr.policy import model

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the game's settings were checked")

    monkeypatch.setattr(model, "VLMPolicy", no_model)
    flags = [
        "--env.env_id",
        "NumberLine-v0",
        "--env.image_size",
        "64",
        "--env.game.max_postion",
        "7",
        "--log.output_dir",
        str(tmp_path / "run"),
        "--label.out_dir",
        str(tmp_path / "labels"),
    ]
    with pytest.raises(registry.GameConfigError, match=r"env.game has \['max_postion'\].*max_position"):
        if entry == "run_training":
            from a2c_ppo_acktr.rl.train import run_training

            run_training(load_config(preset="debug", overrides=flags))
        elif entry == "resolve_config":
            import argparse

            from a2c_ppo_acktr.eval.evaluation import resolve_config

            args = argparse.Namespace(
                preset="debug",
                config=None,
                model_path=None,
                blind=False,
                zero_images=False,
                vsibench=None,
                data_root=None,
            )
            resolve_config(args, flags)
        else:
            from a2c_ppo_acktr.labels.labeling import label_trajectories

            label_trajectories(load_config(preset="debug", overrides=flags + ["--label.teacher", "oracle"]))
    assert not (tmp_path / "run").exists() and not (tmp_path / "labels").exists()


def test_shared_fields_and_game_settings_reach_the_game_config():
    cfg = load_config(
        preset="debug",
        overrides=[
            "--env.env_id",
            "gym_cards/NumberLine-v0",
            "--env.image_size",
            "96",
            "--env.max_turns",
            "7",
            "--env.invalid_penalty",
            "-0.5",
            "--env.game.max_position",
            "9",
        ],
    )
    env = registry.make_env(cfg.env)
    assert (env.cfg.image_size, env.cfg.max_turns, env.cfg.invalid_penalty, env.cfg.max_position) == (96, 7, -0.5, 9)
    obs, _ = env.reset(seed=0)
    assert obs["images"][0].shape == (96, 96, 3)
    sok = registry.make_env(game_cfg("Sokoban-v0", env__max_turns=11).env)
    assert (sok.cfg.dim_room, sok.cfg.tile_size, sok.cfg.max_turns) == ((6, 6), 16, 11)


# ------------------------------------------------------------------------------- batched stepping
@pytest.mark.parametrize("env_id", GAME_IDS)
def test_batch_env_is_seeded_auto_resets_and_penalises_malformed_replies(env_id):
    """Two batches with one seed play identically; finished episodes report score/turns/task and
    reset; a malformed reply costs env.invalid_penalty."""
    from a2c_ppo_acktr.envs.batch import BatchEnv

    cfg = game_cfg(env_id, env__max_turns=4)
    rng = np.random.default_rng(0)
    a, b = BatchEnv(cfg.env, 3, seed=5), BatchEnv(cfg.env, 3, seed=5)
    oa, ob = a.reset(), b.reset()
    assert all(np.array_equal(x["images"][0], y["images"][0]) and x["text"] == y["text"] for x, y in zip(oa, ob))
    episodes = []
    for _ in range(6):
        texts = ["not json"] + [e.random_reply(rng) for e in a.envs[1:]]
        ra, rb = a.step(texts), b.step(texts)
        assert np.array_equal(ra[1], rb[1]) and [o["text"] for o in ra[0]] == [o["text"] for o in rb[0]]
        assert ra[1][0] == pytest.approx(cfg.env.invalid_penalty) and not ra[4][0]["valid"]
        episodes += [i["episode"] for i in ra[4] if "episode" in i]
    task = registry.task_name(env_id)
    assert episodes and all(
        e["question_type"] == task and e["score"] in (0.0, 1.0) and 1 <= e["turns"] <= 4 for e in episodes
    )
    # Another seed deals other games.
    other = BatchEnv(cfg.env, 3, seed=6).reset()
    assert any(not np.array_equal(x["images"][0], y["images"][0]) for x, y in zip(oa, other))
    # Grouped rollouts (RLOO/GRPO): the envs of a group are dealt the same game.
    grouped = BatchEnv(cfg.env, 4, seed=5, group_size=2).reset()
    assert grouped[0]["text"] == grouped[1]["text"] and np.array_equal(grouped[0]["images"][0], grouped[1]["images"][0])
    assert np.array_equal(grouped[2]["images"][0], grouped[3]["images"][0])


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_restored_batch_matches_the_uninterrupted_one(env_id):
    """The state saved after step k (pickled, as a checkpoint does), restored into a fresh batch,
    gives exactly the steps k+1.. of the batch that was never interrupted."""
    from a2c_ppo_acktr.envs.batch import BatchEnv
    from a2c_ppo_acktr.rl.run_state import restore_env_state

    cfg = game_cfg(env_id, env__max_turns=5)
    rng = np.random.default_rng(1)
    a = BatchEnv(cfg.env, 2, seed=9)
    a.reset()
    for _ in range(3):
        a.step([e.random_reply(rng) for e in a.envs])
    saved = pickle.loads(pickle.dumps(a.get_state()))
    texts = [[e.random_reply(rng) for e in a.envs] for _ in range(6)]
    straight = [a.step(t) for t in texts]
    b = BatchEnv(cfg.env, 2, seed=0)
    b.reset()
    restore_env_state(b, saved)
    resumed = [b.step(t) for t in texts]
    for x, y in zip(straight, resumed):
        assert np.array_equal(x[1], y[1]) and np.array_equal(x[2], y[2])
        assert [o["text"] for o in x[0]] == [o["text"] for o in y[0]]
        assert all(np.array_equal(p["images"][0], q["images"][0]) for p, q in zip(x[0], y[0]))


def test_games_bring_their_own_system_prompt_and_vsi_keeps_its_own():
    from a2c_ppo_acktr.envs.cards.common import GAME_SYSTEM_PROMPT
    from a2c_ppo_acktr.common.prompts import SYSTEM_PROMPT, build_messages

    obs, _ = registry.make_env(game_cfg("Blackjack-v0").env).reset(seed=0)
    assert build_messages(obs)[0]["content"][0]["text"] == GAME_SYSTEM_PROMPT
    assert "blackjack" in build_messages(obs)[1]["content"][-1]["text"]
    vsi, _ = registry.make_env(load_config(preset="debug").env).reset(seed=0)
    assert "system" not in vsi and build_messages(vsi)[0]["content"][0]["text"] == SYSTEM_PROMPT


# ------------------------------------------------------------------- oracle labels, SFT, evaluation
@pytest.mark.parametrize("env_id", ["NumberLine-v0", "MiniGrid-Empty-Random-6x6-v0", "Sokoban-v0"])
def test_oracle_labels_become_sft_samples_with_the_games_prompt(tmp_path, env_id):
    from a2c_ppo_acktr.envs.cards.common import GAME_SYSTEM_PROMPT
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, read_episodes
    from a2c_ppo_acktr.envs.cards.common import BRIEF_GAME_THOUGHTS
    from SFT.data import build_sft_dataset

    cfg = game_cfg(
        env_id,
        label__out_dir=str(tmp_path / "lab"),
        label__num_episodes=6,
        label__val_fraction=0.0,
        label__oracle_thoughts="brief",
        label__epsilon=0.0,
    )
    summary = label_trajectories(cfg)
    assert summary["written"] == 6 and summary["mean_score"] == 1.0 and summary["invalid_turns"] == 0
    episodes = read_episodes(tmp_path / "lab" / TRAJECTORIES)
    assert {e["env_id"] for e in episodes} == {env_id} and {e["question_type"] for e in episodes} == {
        registry.task_name(env_id)
    }
    first = json.loads(episodes[0]["turns"][0]["teacher_output"])
    assert first["thoughts"] == BRIEF_GAME_THOUGHTS
    stats = build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, tmp_path / "data", cfg.label)
    assert stats["train_samples"] == sum(len(e["turns"]) for e in episodes)
    sample = json.loads((tmp_path / "data" / "train.jsonl").read_text().splitlines()[0])
    assert sample["messages"][0]["content"][0]["text"] == GAME_SYSTEM_PROMPT


def test_labelling_exploration_executes_random_game_actions(tmp_path):
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, read_episodes

    cfg = game_cfg("NumberLine-v0", label__out_dir=str(tmp_path / "lab"), label__num_episodes=8, label__epsilon=0.5)
    assert label_trajectories(cfg)["explore_turns"] > 0
    turns = [t for e in read_episodes(tmp_path / "lab" / TRAJECTORIES) for t in e["turns"] if t["explore"]]
    assert turns and all(json.loads(t["executed"])["action"] in ("+", "-") for t in turns)


@pytest.mark.parametrize(
    "env_id, oracle_at_least",
    [
        ("NumberLine-v0", 1.0),
        ("EZPoints-v0", 1.0),
        ("Sokoban-v0", 1.0),
        ("MiniGrid-Empty-Random-6x6-v0", 1.0),
        ("MiniGrid-DoorKey-6x6-v0", 0.95),
    ],
)
def test_evaluation_of_oracle_and_chance_on_games(env_id, oracle_at_least):
    """The oracle's success through the evaluation loop (the issue's figures), the chance agent's
    below it, and game reports carry success, return, length and invalid rate."""
    from a2c_ppo_acktr.eval import evaluation
    from a2c_ppo_acktr import reports
    from a2c_ppo_acktr.labels.teachers import OracleTeacher

    cfg = game_cfg(env_id, eval__num_episodes=20, env__max_turns=60)
    specs = evaluation.eval_specs(cfg)
    assert [s.seed for s in specs] == [cfg.eval.seed + i for i in range(20)]
    oracle = evaluation.run_episodes(OracleTeacher(), specs, evaluation.eval_env_config(cfg), 5, progress=False)
    chance = evaluation.run_episodes(
        evaluation.DummyAgent(0), specs, evaluation.eval_env_config(cfg), 5, progress=False
    )
    success = np.mean([r.score for r in oracle.records])
    assert success >= oracle_at_least, success
    assert np.mean([r.score for r in chance.records]) < success
    report = reports.build_report(oracle.records, name="oracle")
    assert report["agent"]["success_rate"] == pytest.approx(success)
    assert report["agent"]["invalid_output_rate"] == 0.0
    assert report["agent"]["mean_reward"] == pytest.approx(np.mean([r.reward for r in oracle.records]))


# --------------------------------------------------------------------------- end to end, every env
@pytest.mark.parametrize("env_id", GAME_IDS)
def test_label_sft_ppo_eval_end_to_end_from_the_tiny_model(tmp_path, tiny_model_path, env_id):
    """Oracle labels -> SFT dataset -> SFT (2 steps) -> 2 PPO iterations from the adapter ->
    evaluation of the checkpoint: every stage runs on the env, and the report is the game's."""
    import eval_vsi
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories
    from a2c_ppo_acktr.rl.train import run_training
    from SFT.data import build_sft_dataset
    from SFT.trainer import run_sft

    cfg = game_cfg(
        env_id,
        env__max_turns=3,
        model__model_path=tiny_model_path,
        model__max_new_tokens=16,
        label__out_dir=str(tmp_path / "lab"),
        label__num_episodes=3,
        label__oracle_thoughts="brief",
        label__val_fraction=0.0,
        sft__data_path=str(tmp_path / "data"),
        sft__output_dir=str(tmp_path / "sft"),
        sft__max_steps=2,
        sft__per_device_batch_size=2,
        sft__save_steps=2,
        log__output_dir=str(tmp_path / "ppo"),
        log__tensorboard=False,
        ppo__num_iterations=2,
    )
    assert label_trajectories(cfg)["written"] == 3
    assert build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, tmp_path / "data", cfg.label)["train_samples"] >= 3
    adapter = run_sft(cfg)
    import dataclasses

    run_training(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, sft_adapter=str(adapter))))
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in metrics if "iteration" in m]) >= 2
    ckpt = sorted((tmp_path / "ppo" / "checkpoints").glob("checkpoint-*"))[-1]
    out = tmp_path / "eval"
    rc = eval_vsi.main(
        [
            "--preset",
            "debug",
            "--config",
            str(registry.overlay_path(env_id)),
            "--checkpoint",
            str(ckpt),
            "--out",
            str(out),
            "--env.image_size",
            "64",
            "--env.max_turns",
            "3",
            "--eval.num_episodes",
            "2",
            "--eval.batch_size",
            "2",
            "--log.progress_bar",
            "false",
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["env_id"] == env_id and report["meta"]["question_set"] == "game"
    assert {r["question_type"] for r in report["records"]} == {registry.task_name(env_id)}
    assert set(report["agent"]) >= {"success_rate", "mean_reward", "mean_turns", "invalid_output_rate"}
    assert (out / "report.md").is_file()


# ------------------------------------------------------------------- user code: env and reward
def test_an_env_and_a_reward_defined_outside_the_package_run_through_labelling_training_and_evaluation(
    tmp_path, tiny_model_path
):
    """``env.env_id=user_game:ParityEnv`` and ``env.reward_fn=user_game:plus_ten`` (tests/user_game.py,
    outside the package): oracle labels, 2 PPO iterations and the checkpoint's evaluation all run on
    the user's env, every step's reward is the user's function of the env's (the function is given
    the reply, the env's reward and the episode), and the reported score stays the env's."""
    import eval_vsi
    import user_game
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, read_episodes
    from a2c_ppo_acktr.rl.train import run_training

    overrides = [
        "--env.env_id",
        "user_game:ParityEnv",
        "--env.reward_fn",
        "user_game:plus_ten",
        "--env.image_size",
        "64",
        "--env.game.largest",
        "5",
    ]
    cfg = load_config(
        preset="debug",
        overrides=overrides
        + [
            "--model.model_path",
            tiny_model_path,
            "--model.max_new_tokens",
            "16",
            "--log.progress_bar",
            "false",
            "--log.tensorboard",
            "false",
            "--label.out_dir",
            str(tmp_path / "lab"),
            "--label.num_episodes",
            "4",
            "--label.oracle_thoughts",
            "brief",
            "--label.epsilon",
            "0",
            "--log.output_dir",
            str(tmp_path / "ppo"),
            "--ppo.num_iterations",
            "2",
        ],
    )
    assert registry.task_name(cfg.env.env_id) == "parity" and registry.make_env(cfg.env).cfg.largest == 5

    user_game.CALLS.clear()
    assert label_trajectories(cfg)["written"] == 4
    episodes = read_episodes(tmp_path / "lab" / TRAJECTORIES)
    assert {e["question_type"] for e in episodes} == {"parity"} and all(e["score"] == 1.0 for e in episodes)
    assert [t["reward"] for e in episodes for t in e["turns"]] == [11.0] * 4  # the oracle is right: 1 + 10
    assert len(user_game.CALLS) == 4 and all(
        c["question_type"] == "parity" and '"action"' in c["reply"] for c in user_game.CALLS
    )

    run_training(cfg)
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    rollouts = [m for m in metrics if "rollout/reward_mean" in m]
    assert len(rollouts) == 2 and all(m["rollout/reward_mean"] >= 9.0 for m in rollouts)  # a game reward is at most 1
    assert all(0.0 <= m["rollout/episode_score_mean"] <= 1.0 for m in rollouts if m["rollout/episodes"] > 0)

    ckpt = sorted((tmp_path / "ppo" / "checkpoints").glob("checkpoint-*"))[-1]
    rc = eval_vsi.main(
        [
            "--preset",
            "debug",
            "--checkpoint",
            str(ckpt),
            "--out",
            str(tmp_path / "eval"),
            *overrides,
            "--eval.num_episodes",
            "3",
            "--eval.batch_size",
            "3",
            "--log.progress_bar",
            "false",
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["meta"]["env_id"] == "user_game:ParityEnv" and {r["question_type"] for r in report["records"]} == {
        "parity"
    }
    assert all(r["reward"] >= 9.0 and r["score"] in (0.0, 1.0) for r in report["records"])


def test_user_code_that_cannot_be_loaded_or_breaks_the_contract_is_a_one_line_error():
    from a2c_ppo_acktr.common.entry_points import EntryPointError
    from a2c_ppo_acktr.envs.reward_fn import RewardFunctionError

    with pytest.raises(ConfigError, match="not a known env.*'module.path:ClassName'"):
        load_config(preset="debug", overrides=["--env.env_id", "user_game.ParityEnv"])
    with pytest.raises(ConfigError, match="env.reward_fn='plus_ten' must name a function as 'module.path:function'"):
        load_config(preset="debug", overrides=["--env.reward_fn", "plus_ten"])
    cases = {
        ("no_such_module:Env", None): "module 'no_such_module' cannot be imported .*PYTHONPATH",
        ("user_game:NoSuchEnv", None): "module 'user_game' has no 'NoSuchEnv'",
        ("user_game:plus_ten", None): "names a function, not an env class",
        ("user_game:ParityConfig", None): r"ParityConfig lacks \['reset', 'step'",
        ("user_game:ParityEnv", "user_game:nothing"): "has no 'nothing'",
    }
    for (env_id, reward_fn), message in cases.items():
        cfg = load_config(
            preset="debug",
            overrides=["--env.env_id", env_id, "--env.image_size", "64"]
            + (["--env.reward_fn", reward_fn] if reward_fn else []),
        )
        with pytest.raises(EntryPointError, match=message):
            registry.make_env(cfg.env)
    env = registry.make_env(
        load_config(
            preset="debug",
            overrides=[
                "--env.env_id",
                "user_game:ParityEnv",
                "--env.image_size",
                "64",
                "--env.reward_fn",
                "user_game:not_a_number",
            ],
        ).env
    )
    env.reset(seed=0)
    with pytest.raises(
        RewardFunctionError, match="user_game:not_a_number' returned 'ten'; it must return a finite number"
    ):
        env.step(env.oracle_reply())


def test_a_shaped_env_saves_and_restores_its_episode_reward_with_the_env():
    from a2c_ppo_acktr.envs.batch import BatchEnv

    cfg = load_config(
        preset="debug",
        overrides=[
            "--env.env_id",
            "user_game:ParityEnv",
            "--env.image_size",
            "64",
            "--env.reward_fn",
            "user_game:plus_ten",
            "--env.game.largest",
            "7",
        ],
    )
    batch = BatchEnv(cfg.env, 2, seed=3)
    batch.reset()
    state = pickle.loads(pickle.dumps(batch.get_state()))
    again = BatchEnv(cfg.env, 2, seed=99)
    again.reset()
    again.set_state(state)
    replies = [env.oracle_reply() for env in batch.envs]
    a, b = batch.step(replies), again.step(replies)
    assert a[1].tolist() == b[1].tolist() == [11.0, 11.0]
    assert [i["episode"]["reward"] for i in a[4]] == [i["episode"]["reward"] for i in b[4]] == [11.0, 11.0]

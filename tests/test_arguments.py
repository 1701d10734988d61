"""Configuration: YAML round trip, presets, CLI overrides and every validation message."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from a2c_ppo_acktr.config.arguments import (
    ConfigError,
    RunConfig,
    list_presets,
    load_config,
    parse_overrides,
)


@pytest.mark.parametrize(
    "preset", ["debug", "cpu-demo", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "rl4vlm", "vsgrpo"]
)
def test_required_presets_load(preset):
    assert preset in list_presets()
    cfg = load_config(preset=preset)
    assert cfg.preset == preset
    assert cfg.rollout.batch_size % cfg.ppo.mini_batch_size == 0


def test_gpu_presets_are_bf16_lora_zero2():
    for name in ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b"):
        cfg = load_config(preset=name)
        assert cfg.model.dtype == "bfloat16"
        assert (cfg.model.lora_r, cfg.model.lora_alpha) == (128, 256)
        assert cfg.dist.zero_stage == 2


def test_rl4vlm_preset_is_rl4vlms_setting():
    """RL4VLM's scripts: --num-steps 512 --ppo-epoch 4 --mini-batch-size 1 --grad-accum-steps 128
    --init-lr 1e-5 --end-lr 1e-9 --temperature 0.2 --thought-prob-coef 0.5 --max-new-tokens 256
    --train-vision all --use-lora, and its defaults gamma 0.9, lambda 0.95, clip 0.1, grad norm 0.01."""
    cfg = load_config(preset="rl4vlm")
    p, m, r = cfg.ppo, cfg.model, cfg.rollout
    assert (r.num_envs, r.num_steps, p.ppo_epochs, p.mini_batch_size, p.grad_accum_steps) == (1, 512, 4, 1, 128)
    assert p.lr == 1e-5 and p.lr * p.min_lr_ratio == pytest.approx(1e-9) and p.lr_schedule == "cosine"
    assert (m.use_temp_predictor, m.temperature, m.thought_prob_coef, m.max_new_tokens, m.train_vision) == (
        False,
        0.2,
        0.5,
        256,
        "tower",
    )
    assert (p.gamma, p.gae_lambda, p.clip_coef, p.max_grad_norm) == (0.9, 0.95, 0.1, 0.01)
    assert p.num_iterations * r.batch_size == pytest.approx(15000, rel=0.02)  # --num-env-steps 15000
    with_game = load_config(config="configs/envs/numberline.yaml", preset="rl4vlm")
    assert (with_game.rollout, with_game.ppo.lr, with_game.ppo.grad_accum_steps) == (
        cfg.rollout,
        cfg.ppo.lr,
        cfg.ppo.grad_accum_steps,
    )
    assert with_game.env.env_id != cfg.env.env_id


def test_room_size_overlay_is_a_vsi_run_of_one_question_type_on_the_room_reading_build():
    """configs/envs/vsi-room-size.yaml (the quickstart's VSI block) loads over cpu-demo and changes
    only what it says: VSI, one question type of one turn, the rooms build at a fixed temperature, its SFT
    stop, grouped PPO and eval sizes."""
    base = load_config(preset="cpu-demo")
    rooms = load_config(preset="cpu-demo", config="configs/envs/vsi-room-size.yaml")
    assert rooms.env.env_id == base.env.env_id and rooms.env.question_types == ["room_size_estimation"]
    assert (
        rooms.model.model_path == "tiny:qwen2_5_vl-rooms" and rooms.env.num_scenes == rooms.env.scene_cache_size == 512
    )
    assert (rooms.sft.max_steps, rooms.ppo.num_iterations, rooms.ppo.ppo_epochs, rooms.ppo.lr) == (50, 24, 1, 2e-4)
    assert (rooms.rollout.num_envs, rooms.eval.num_episodes) == (32, 400)
    # One answer turn, four answers per room compared with each other (RLOO), at a fixed temperature.
    assert (rooms.env.max_turns, rooms.rollout.group_size, rooms.ppo.advantage_estimator) == (1, 4, "rloo")
    assert rooms.rollout.num_steps >= rooms.env.max_turns and rooms.rollout.num_envs % rooms.rollout.group_size == 0
    assert (rooms.model.use_temp_predictor, rooms.model.temperature, rooms.ppo.temperature_loss) == (
        False,
        1.0,
        "policy_gradient",
    )
    assert (rooms.ppo.kl_coef, rooms.ppo.reference, rooms.env.image_size) == (
        base.ppo.kl_coef,
        base.ppo.reference,
        base.env.image_size,
    )


def test_yaml_round_trip(tmp_path):
    cfg = load_config(preset="debug", overrides=["--ppo.lr", "3e-4", "env.max_turns=5"])
    path = tmp_path / "config.yaml"
    cfg.save(path)
    again = RunConfig.from_yaml(path)
    assert again == cfg
    assert again.to_yaml() == cfg.to_yaml()
    assert yaml.safe_load(path.read_text())["ppo"]["lr"] == pytest.approx(3e-4)


def test_overrides_parse_types():
    cfg = load_config(
        preset="debug",
        overrides=[
            "--ppo.lr",
            "1e-5",
            "--model.use_lora=false",
            "env.question_types=object_counting,route_planning",
            "--model.max_pixels",
            "3136",
            "--model.min_pixels",
            "none",
            "--log.run_name",
            "123",
        ],
    )
    assert cfg.ppo.lr == pytest.approx(1e-5) and isinstance(cfg.ppo.lr, float)
    assert cfg.model.use_lora is False
    assert cfg.env.question_types == ["object_counting", "route_planning"]
    assert cfg.model.max_pixels == 3136 and cfg.model.min_pixels is None
    assert cfg.log.run_name == "123"


def test_override_precedence_over_preset_and_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("ppo:\n  lr: 0.5\nrollout:\n  num_envs: 4\n")
    cfg = load_config(config=str(f), preset="debug", overrides=["ppo.lr=0.25"])
    assert cfg.ppo.lr == 0.25  # CLI beats file
    assert cfg.rollout.num_envs == 4  # file beats preset
    assert cfg.model.lora_r == load_config(preset="debug").model.lora_r  # preset beats defaults


def test_derived_batch_size_is_not_a_flag():
    cfg = load_config(overrides=["rollout.num_envs=3", "rollout.num_steps=4", "ppo.mini_batch_size=6"])
    assert cfg.rollout.batch_size == 12
    with pytest.raises(ConfigError, match="unknown config key 'rollout.batch_size'"):
        load_config(overrides=["rollout.batch_size=12"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["rollout.num_envs=3", "rollout.num_steps=3", "ppo.mini_batch_size=2"],
            r"not divisible by ppo.mini_batch_size=2.*\[1, 3, 9\]",
        ),
        (["model.temperature=0"], r"model.temperature=0.0 must be > 0"),
        (["model.temperature=-1"], r"model.temperature=-1.0 must be > 0"),
        (["model.temperature=2.0"], r"min_temperature .* <= model.max_temperature"),
        (["model.thought_prob_coef=1.5"], r"thought_prob_coef=1.5 must be in \[0, 1\]"),
        (["model.thought_prob_coef=-0.1"], r"thought_prob_coef=-0.1 must be in \[0, 1\]"),
        (
            ["ppo.advantage_estimator=vtrace"],
            r"ppo.advantage_estimator='vtrace' is not allowed; choose one of \['gae', 'rloo', 'grpo'\]",
        ),
        (["model.dtype=fp8"], r"model.dtype='fp8' is not allowed"),
        (["env.question_types=object_counting,bogus"], r"unknown type 'bogus'"),
        (["env.scene_source=scannet"], r"needs env.data_root"),
        (["env.scene_source=vsibench"], r"needs env.vsibench_path"),
        (["ppo.gamma=1.5"], r"ppo.gamma=1.5 must be in \[0, 1\]"),
        (["ppo.kl_adaptive=true", "ppo.kl_coef=0"], r"kl_adaptive needs an initial ppo.kl_coef > 0"),
        (["model.attn_implementation=flash_attention_2"], r"flash_attention_2 needs model.dtype bfloat16"),
        (["dist.zero_stage=3", "model.use_lora=false"], r"zero_stage=3 is supported only with LoRA"),
        (["dist.zero_stage=3", "model.train_vision=tower"], r"zero_stage=3 is supported only with LoRA"),
        (
            ["ppo.advantage_estimator=grpo", "rollout.num_envs=1", "ppo.mini_batch_size=1"],
            r"set rollout.group_size >= 2",
        ),
        (["ppo.advantage_estimator=rloo"], r"compares episodes of the same question: set rollout.group_size >= 2"),
        (
            [
                "ppo.advantage_estimator=grpo",
                "rollout.group_size=2",
                "rollout.num_steps=4",
                "env.max_turns=5",
                "ppo.mini_batch_size=4",
            ],
            r"only those bound to end inside the rollout .*rollout.num_steps=4 must be >= env.max_turns=5",
        ),
        (
            ["rollout.group_size=3"],
            r"rollout.group_size=3 must be >= 1 and divide rollout.num_envs=4 \(e.g. one of \[1, 2, 4\]\)",
        ),
        (["ppo.adv_norm=group"], r"ppo.adv_norm=group normalises within groups"),
        (["ppo.adv_norm=std"], r"ppo.adv_norm='std' is not allowed"),
        (["ppo.adv_std_floor=-1"], r"ppo.adv_std_floor=-1.0 must be >= 0"),
        (["ppo.kl_estimator=k4"], r"ppo.kl_estimator='k4' is not allowed"),
        (
            ["ppo.kl_penalty=reward", "ppo.kl_adaptive=true", "ppo.kl_coef=0.1"],
            r"kl_adaptive works with ppo.kl_penalty=loss only",
        ),
        (
            ["ppo.temperature_loss=entropy_target", "model.use_temp_predictor=false"],
            r"entropy_target trains the temperature head",
        ),
        (["ppo.kl_coef=0.1", "model.use_lora=false"], r"needs LoRA"),
        (["model.top_p=0"], r"model.top_p=0.0 must be in \(0, 1\]"),
        (["model.top_k=-1"], r"model.top_k=-1 must be >= 0"),
        (["log.wandb_mode=cloud"], r"log.wandb_mode='cloud' is not allowed"),
        (["env.image_size=8"], r"env.image_size=8 must be in \[16, 2048\]"),
        (
            ["model.use_temp_predictor=true", "model.min_temperature=1.0", "model.max_temperature=1.0"],
            r"use_temp_predictor needs",
        ),
    ],
)
def test_validation_errors_fire_with_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ppo.lrr=1"], r"unknown config key 'ppo.lrr'. Did you mean 'ppo.lr'\?"),
        (["optim.lr=1"], r"unknown config key 'optim'"),
        (["ppo.num_iterations=two"], r"ppo.num_iterations must be an integer, got 'two'"),
        (["ppo.lr=fast"], r"ppo.lr must be a number, got 'fast'"),
        (["model.use_lora=maybe"], r"model.use_lora must be true or false, got 'maybe'"),
        (["ppo.num_iterations=2.5"], r"ppo.num_iterations must be an integer, got 2.5"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_bad_override_syntax_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="has no value"):
        parse_overrides(["--ppo.lr"])
    with pytest.raises(ConfigError, match="cannot read override"):
        parse_overrides(["ppo.lr"])
    with pytest.raises(ConfigError, match="unknown preset 'nope'; known presets"):
        load_config(preset="nope")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(config=str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(config=str(bad))
    worse = tmp_path / "worse.yaml"
    worse.write_text("ppo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(config=str(worse))


def test_every_field_has_a_default_and_round_trips_through_dict():
    cfg = RunConfig()
    d = cfg.to_dict()
    assert RunConfig.from_dict(d) == cfg
    for section in ("env", "model", "rollout", "ppo", "sft", "eval", "log", "dist"):
        assert dataclasses.is_dataclass(getattr(cfg, section))

"""SFT data path and trainer: token identity with RL prompts, loss masking, grouped batching,
image checks, and a short training run on the tiny model that must teach it the action format."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.common.prompts import (
    Answer,
    Invalid,
    Move,
    assistant_message,
    build_messages,
    format_response,
    parse_action,
    render_prompt,
)
from helpers import sft_observation, write_sft_rows
from numerics import f32_tolerance, logit_terms
from SFT.data import IGNORE_INDEX, ModalityGroupedBatchSampler, SFTCollator, SFTDataset


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_sft_prompt_tokens_equal_rl_prompt_tokens(family, tiny_family_path, tmp_path):
    """The collator's prompt part (read back from PNG files) is token-for-token and pixel-for-pixel
    what the policy's processor call makes of the live observation."""
    from a2c_ppo_acktr.policy.loading import load_processor

    processor = load_processor(tiny_family_path(family))
    rng = np.random.default_rng(0)
    observations = [sft_observation(rng, 1), sft_observation(rng, 3)]
    response = format_response("The chair is left.", Move(30.0, 0.5))
    ds = SFTDataset(write_sft_rows(tmp_path, [(o, response) for o in observations]))
    collator = SFTCollator(processor, max_length=4096)
    for i, obs in enumerate(observations):
        rl = processor(text=[render_prompt(processor, build_messages(obs))], images=obs["images"], return_tensors="pt")
        enc = collator.encode(ds[i]["messages"], ds[i]["images"])
        n = enc.prompt_length
        assert n == rl["input_ids"].shape[1]
        assert torch.equal(enc.input_ids[:n], rl["input_ids"][0])
        assert torch.equal(enc.vision["pixel_values"], rl["pixel_values"])
        assert torch.equal(enc.vision["image_grid_thw"], rl["image_grid_thw"])
        assert torch.equal(enc.token_extras["mm_token_type_ids"][:n], rl["mm_token_type_ids"][0])
        # The target is exactly what the policy would generate: the reply, then end-of-turn.
        assert processor.tokenizer.decode(enc.input_ids[n:]) == response + "<|im_end|>"


def test_loss_only_on_assistant_tokens(loaded):
    rng = np.random.default_rng(1)
    tok = loaded.processor.tokenizer
    responses = [
        format_response("I count 3 chairs.", Answer("3")),
        format_response("Turning to look.", Move(-45.0, 1.0)),
    ]
    rows = [
        {"messages": build_messages(o) + [assistant_message(r)], "images": o["images"]}
        for o, r in zip([sft_observation(rng, 1), sft_observation(rng, 2)], responses)
    ]
    batch = SFTCollator(loaded.processor, max_length=4096)(rows)
    image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    for i, (row, resp) in enumerate(zip(rows, responses)):
        prompt_len = loaded.processor(
            text=[render_prompt(loaded.processor, row["messages"][:-1])], images=row["images"], return_tensors="pt"
        )["input_ids"].shape[1]
        length = int(batch["attention_mask"][i].sum())
        labelled = torch.nonzero(batch["labels"][i] != IGNORE_INDEX).flatten().tolist()
        assert labelled == list(range(prompt_len, length))  # not the prompt, not the padding
        assert not (batch["labels"][i] == image_pad).any()
        assert (batch["input_ids"][i, :prompt_len] == image_pad).sum() > 0  # images are in the prompt...
        assert tok.decode(batch["labels"][i, labelled]) == resp + "<|im_end|>"  # ...and only the reply is learned
        assert torch.equal(batch["labels"][i, labelled], batch["input_ids"][i, labelled])
    # The model's loss is the mean next-token cross-entropy over exactly those tokens.
    with torch.no_grad():
        out = loaded.model(**batch)
    logits = out.logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    mask = targets != IGNORE_INDEX
    manual = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
    # the same logits, two cross-entropies: a log-sum-exp over V per label (at max |logit| + 1), then their mean
    atol = f32_tolerance(logit_terms(0, logits.shape[-1]), float(logits.abs().max()) + 1.0) + f32_tolerance(
        int(mask.sum()), float(manual)
    )
    torch.testing.assert_close(out.loss, manual, atol=atol, rtol=0)


def test_history_turns_keep_rl_prompt_as_suffix(loaded):
    """With one turn of history the sample still ends with the current turn's user text and the
    labels still cover only the final reply."""
    rng = np.random.default_rng(2)
    first, second = sft_observation(rng, 1), sft_observation(rng, 2)
    move = format_response("Look left.", Move(90.0, 0.0))
    answer = format_response("Three.", Answer("3"))
    messages = build_messages(first) + [assistant_message(move), build_messages(second)[1], assistant_message(answer)]
    batch = SFTCollator(loaded.processor, max_length=4096)(
        [{"messages": messages, "images": first["images"] + second["images"]}]
    )
    tok = loaded.processor.tokenizer
    labelled = batch["labels"][0][batch["labels"][0] != IGNORE_INDEX]
    assert tok.decode(labelled) == answer + "<|im_end|>"
    assert batch["image_grid_thw"].shape[0] == 3


def test_grouped_batches_share_image_count():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 4, size=103).tolist()
    lengths = rng.integers(10, 500, size=103).tolist()
    sampler = ModalityGroupedBatchSampler(counts, lengths, batch_size=4, seed=0, mega_batch_mult=2)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(103))  # every sample once per epoch
    for b in batches:
        assert 1 <= len(b) <= 4
        assert len({counts[i] for i in b}) == 1
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    # Only the last batch of each image-count group's mega-batches may be short.
    assert sum(len(b) < 4 for b in batches) <= 2 * len(set(counts)) * 2
    sampler.set_epoch(1)
    assert list(sampler) != batches  # reshuffled per epoch
    sampler.set_epoch(0)
    assert list(sampler) == batches  # and deterministic


def test_missing_and_corrupt_images_are_skipped_or_fail(tmp_path, caplog):
    rng = np.random.default_rng(4)
    resp = format_response("x", Answer("1"))
    path = write_sft_rows(
        tmp_path, [(sft_observation(rng, 1), resp), (sft_observation(rng, 1), resp), (sft_observation(rng, 2), resp)]
    )
    (tmp_path / "img/0_0.png").unlink()
    (tmp_path / "img/2_1.png").write_bytes(b"not a png")
    with caplog.at_level(logging.WARNING):
        ds = SFTDataset(path)
    assert len(ds) == 1 and ds.skipped == 2
    assert "0_0.png" in caplog.text and "2_1.png" in caplog.text
    assert ds[0]["images"][0].dtype == np.uint8 and ds[0]["images"][0].shape == (32, 32, 3)
    with pytest.raises(FileNotFoundError, match="0_0.png"):
        SFTDataset(path, strict_images=True)


def test_rows_whose_images_do_not_match_their_placeholders_fail_at_load_naming_the_line(tmp_path):
    """2 images for 5 placeholders used to crash inside the processor mid-training; now the dataset
    refuses the row when it loads, naming file:line (a JsonlError: one line from the entry scripts)."""
    from a2c_ppo_acktr.common.jsonl import JsonlError

    rng = np.random.default_rng(6)
    resp = format_response("x", Answer("1"))
    path = write_sft_rows(tmp_path, [(sft_observation(rng, 1), resp), (sft_observation(rng, 5), resp)])
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["images"] = row["images"][:2]
    path.write_text(lines[0] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(JsonlError, match=r"train.jsonl:2 has 2 image\(s\) for 5 image placeholder\(s\)"):
        SFTDataset(path)
    row["messages"][1]["content"] = "a string, not parts"
    path.write_text(lines[0] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(JsonlError, match="train.jsonl:2: every message needs"):
        SFTDataset(path)


def test_prompt_longer_than_max_length_raises(loaded):
    rng = np.random.default_rng(5)
    obs = sft_observation(rng, 1)
    with pytest.raises(ValueError, match="sft.max_length"):
        SFTCollator(loaded.processor, max_length=64).encode(
            build_messages(obs) + [assistant_message("{}")], obs["images"]
        )


def valid_rate(model, processor, observations, max_new_tokens: int = 48) -> float:
    """Fraction of greedy outputs that parse as a valid action."""
    from a2c_ppo_acktr.labels.teachers import greedy_generate

    texts = greedy_generate(model, processor, observations, max_new_tokens)
    return float(np.mean([not isinstance(parse_action(t), Invalid) for t in texts]))


@pytest.mark.slow
def test_label_preprocess_sft_teaches_the_action_format_and_warm_starts_the_policy(tmp_path, tiny_model_path):
    """Oracle labels -> SFT dataset -> LoRA SFT on the tiny model: the loss falls, greedy outputs
    parse as actions far more often, checkpoints hold the adapter only, and a VLMPolicy loaded with
    the adapter writes exactly the SFT model's greedy outputs."""
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.labels.labeling import TRAJECTORIES, label_trajectories, make_env
    from a2c_ppo_acktr.policy.loading import load_vlm
    from SFT.data import build_sft_dataset
    from SFT.trainer import TRAIN_LOG, run_sft

    steps = SFT_STEPS
    cfg = load_config(
        preset="debug",
        overrides={
            "model": {
                "model_path": tiny_model_path,
                "device": "cpu",
                "lora_r": SFT_LORA_R,
                "lora_alpha": SFT_LORA_ALPHA,
                "lora_target_modules": SFT_TARGETS,
            },
            # One question type keeps the replies templated, so a few dozen CPU steps teach the format.
            "env": {"question_types": ["room_size_estimation"]},
            "label": {
                "out_dir": str(tmp_path / "lab"),
                "dataset_dir": str(tmp_path / "data"),
                "num_episodes": 16,
                "val_fraction": 0.0,
            },
            "sft": {
                "data_path": str(tmp_path / "data"),
                "output_dir": str(tmp_path / "sft"),
                "max_steps": steps,
                "lr": SFT_LR,
                "per_device_batch_size": 2,
                "logging_steps": 5,
                "save_steps": steps // 2,
                "warmup_ratio": 0.0,
            },
            "log": {"progress_bar": False},
        },
    )
    assert label_trajectories(cfg)["mean_score"] >= 0.95
    stats = build_sft_dataset(tmp_path / "lab" / TRAJECTORIES, cfg.label.dataset_dir, cfg.label)
    assert stats["train_samples"] >= 16
    env = make_env(cfg)
    held_out = [env.reset(seed=10_000 + i)[0] for i in range(8)]  # states not in the training set

    loaded = load_vlm(cfg.model)
    before = valid_rate(loaded.model, loaded.processor, held_out)
    adapter = run_sft(cfg, loaded=loaded)
    after = valid_rate(loaded.model, loaded.processor, held_out)
    print(f"valid action rate before SFT {before:.2f}, after {after:.2f}")
    losses = [e["loss"] for e in json.loads((tmp_path / "sft" / TRAIN_LOG).read_text()) if "loss" in e]
    assert losses[-1] < losses[0] - 1.0, losses
    assert after >= before + 0.5, (before, after)

    # Checkpoints hold the adapter only, and resuming continues the step count.
    ckpt = tmp_path / "sft" / f"checkpoint-{steps}"
    assert (ckpt / "adapter_model.safetensors").is_file() and not list(ckpt.glob("model*.safetensors"))
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert os.path.isabs(base) and os.path.isdir(base)  # loads from any working directory

    # Warm start: the policy with the adapter decodes exactly as the SFT model does.
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.labels.teachers import greedy_generate

    sft_texts = greedy_generate(loaded.model, loaded.processor, held_out, cfg.model.max_new_tokens)
    policy = VLMPolicy(cfg.model, loaded=load_vlm(cfg.model))
    cold = policy.act(held_out, greedy=True).texts
    policy.load_adapter(adapter)
    warm = policy.act(held_out, greedy=True).texts
    assert warm == sft_texts
    assert cold != sft_texts


# The tiny model's random lm_head caps logits near +-1.3, so LoRA on the decoder alone learns the
# format very slowly; the test also adapts lm_head (the same regex goes to the policy, so the
# warm start still matches). Real checkpoints do not need this.
SFT_STEPS = 160
SFT_LR = 4e-3
SFT_LORA_R = 16
SFT_LORA_ALPHA = 32
SFT_TARGETS = r".*(language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)|lm_head)"


@pytest.mark.slow
def test_sft_resumes_from_an_adapter_checkpoint(tmp_path, tiny_model_path):
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.loading import load_vlm
    from SFT.trainer import TRAIN_LOG, run_sft

    rng = np.random.default_rng(6)
    rows = [(sft_observation(rng, 1 + i % 2), format_response("Three chairs.", Answer("3"))) for i in range(4)]
    (tmp_path / "data").mkdir()
    write_sft_rows(tmp_path / "data", rows)
    overrides = {
        "model": {"model_path": tiny_model_path, "device": "cpu"},
        "sft": {
            "data_path": str(tmp_path / "data" / "train.jsonl"),
            "output_dir": str(tmp_path / "sft"),
            "max_steps": 2,
            "per_device_batch_size": 2,
            "save_steps": 1,
            "logging_steps": 1,
            "resume": "auto",
        },
        "log": {"progress_bar": False},
    }
    cfg = load_config(preset="debug", overrides=overrides)
    run_sft(cfg, loaded=load_vlm(cfg.model))
    assert sorted(p.name for p in (tmp_path / "sft").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert (tmp_path / "sft" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    first = json.loads((tmp_path / "sft" / TRAIN_LOG).read_text())
    # Resume with another learning rate: a restarted run would log steps 1-2 at the new rate; a
    # resumed one restores them (and the optimizer and scheduler) from checkpoint-2 and runs step 3.
    overrides["sft"].update(max_steps=3, lr=0.5)
    cfg = load_config(preset="debug", overrides=overrides)
    run_sft(cfg, loaded=load_vlm(cfg.model))
    log = [e for e in json.loads((tmp_path / "sft" / TRAIN_LOG).read_text()) if "loss" in e]
    assert [e["step"] for e in log] == [1, 2, 3]
    assert log[:2] == [e for e in first if "loss" in e]
    assert "checkpoint-3" in {p.name for p in (tmp_path / "sft").glob("checkpoint-*")}
    # A fresh start into the used directory is refused before anything loads; sft.overwrite moves the
    # first run aside whole (nothing deleted) and trains afresh.
    from a2c_ppo_acktr.config.arguments import ConfigError

    overrides["sft"].update(resume=None, max_steps=1)
    with pytest.raises(ConfigError, match="already holds an SFT run.*--sft.overwrite true"):
        run_sft(load_config(preset="debug", overrides=overrides))
    overrides["sft"].update(overwrite=True)
    cfg = load_config(preset="debug", overrides=overrides)
    run_sft(cfg, loaded=load_vlm(cfg.model))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("sft.old-")]
    assert len(aside) == 1 and (aside[0] / "checkpoint-3" / "adapter_model.safetensors").is_file()
    assert [e["step"] for e in json.loads((tmp_path / "sft" / TRAIN_LOG).read_text()) if "loss" in e] == [1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero2_two_processes_through_the_launch_script(tmp_path, tiny_model_path):
    """scripts/run_vsi_sft.sh with 2 CPU processes and ZeRO-2: batches are sharded across ranks
    (one epoch of 8 rows = 2 steps of 2 rows x 2 ranks), optimizer states are partitioned, and
    checkpoints hold the adapter only."""
    import os
    import socket
    import subprocess

    rng = np.random.default_rng(7)
    (tmp_path / "data").mkdir()
    write_sft_rows(
        tmp_path / "data", [(sft_observation(rng, 2), format_response("Three.", Answer("3"))) for _ in range(8)]
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        NUM_GPUS="2",
        DS_ACCELERATOR="cpu",
        PRESET="debug",
        PORT=str(port),
        DATA_PATH=str(tmp_path / "data" / "train.jsonl"),
        MODEL_PATH=tiny_model_path,
        EXTRA_ARGS=(
            "--sft.max_steps 2 --sft.save_steps 2 --sft.per_device_batch_size 2 --sft.logging_steps 1 "
            "--log.progress_bar false"
        ),
    )
    out = tmp_path / "sft"
    proc = subprocess.run(
        ["bash", "scripts/run_vsi_sft.sh", str(out)], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [e for e in json.loads((out / "train_log.json").read_text()) if "loss" in e]
    assert [e["step"] for e in log] == [1, 2] and log[-1]["epoch"] == 1.0
    shards = sorted(p.name for p in (out / "checkpoint-2").rglob("*optim_states.pt"))
    assert len(shards) == 2  # ZeRO-2: one optimizer partition per rank
    states = list((out / "checkpoint-2").rglob("*model_states.pt"))
    module = torch.load(states[0], weights_only=False, map_location="cpu")["module"]
    assert module and all("lora_" in k for k in module)  # frozen base weights are not written
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_deepspeed_config_leaves_batch_sizes_to_the_trainer():
    from a2c_ppo_acktr.config.arguments import ConfigError, load_config
    from SFT.trainer import deepspeed_config

    repo = Path(__file__).resolve().parent.parent
    cfg = load_config(
        preset="debug", overrides={"dist": {"zero_stage": 2, "deepspeed_config": str(repo / "scripts/ds_config.json")}}
    )
    ds = deepspeed_config(cfg)
    pinned = json.loads((repo / "scripts/ds_config.json").read_text())
    assert pinned["train_micro_batch_size_per_gpu"] != "auto"  # the shared PPO file pins it...
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert ds[key] == "auto"  # ...SFT leaves it to the Trainer (filled from sft.*)
    assert "train_batch_size" not in ds  # DeepSpeed derives it with the real world size
    assert ds["zero_optimization"] == pinned["zero_optimization"]
    cfg.dist.zero_stage = 3
    with pytest.raises(ConfigError, match="ZeRO stage 2"):
        deepspeed_config(cfg)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_sft_clips_gradients_at_its_own_max_grad_norm(zero_stage, tmp_path):
    """``sft.max_grad_norm`` reaches the Trainer (and DeepSpeed's ``gradient_clipping``), never
    ``ppo.max_grad_norm``: the GPU presets' PPO value (0.01) would all but stop supervised learning."""
    from a2c_ppo_acktr.config.arguments import ConfigError, load_config
    from SFT.trainer import training_arguments

    repo = Path(__file__).resolve().parent.parent
    dist = {"zero_stage": zero_stage, "deepspeed_config": str(repo / "scripts/ds_config.json") if zero_stage else None}
    cfg = load_config(
        preset="debug",
        overrides={
            "ppo": {"max_grad_norm": 0.01},
            "sft": {"max_grad_norm": 0.7, "output_dir": str(tmp_path)},
            "dist": dist,
        },
    )
    args = training_arguments(cfg, has_eval=False)
    assert args.max_grad_norm == 0.7
    if zero_stage:
        assert args.hf_deepspeed_config.config["gradient_clipping"] == 0.7  # the JSON's "auto", filled from sft
    for preset in ("qwen2.5-vl-3b", "qwen2.5-vl-7b"):
        gpu = load_config(preset=preset)
        assert gpu.sft.max_grad_norm == 1.0 and gpu.ppo.max_grad_norm == 0.01
    with pytest.raises(ConfigError, match=r"sft\.max_grad_norm=0"):
        load_config(preset="debug", overrides={"sft": {"max_grad_norm": 0}})


@pytest.mark.slow
def test_sft_adapter_with_embedding_lora_holds_only_the_lora_factors(tmp_path, tiny_model_path):
    """LoRA on ``embed_tokens``: the saved adapter (and its checkpoints) hold the LoRA factors, not a
    copy of the base embedding matrix (peft's default when an embedding is a target)."""
    from safetensors import safe_open

    from a2c_ppo_acktr.config.arguments import EMBEDDING_LORA_TARGET, ModelConfig, load_config
    from a2c_ppo_acktr.policy.loading import load_vlm
    from SFT.trainer import run_sft

    rng = np.random.default_rng(7)
    (tmp_path / "data").mkdir()
    write_sft_rows(
        tmp_path / "data", [(sft_observation(rng, 1), format_response("Three chairs.", Answer("3"))) for _ in range(2)]
    )
    targets = f"{ModelConfig.lora_target_modules}|{EMBEDDING_LORA_TARGET}"
    cfg = load_config(
        preset="debug",
        overrides={
            "model": {"model_path": tiny_model_path, "device": "cpu", "lora_target_modules": targets},
            "sft": {
                "data_path": str(tmp_path / "data" / "train.jsonl"),
                "output_dir": str(tmp_path / "sft"),
                "max_steps": 1,
                "per_device_batch_size": 2,
                "save_steps": 1,
                "logging_steps": 1,
            },
            "log": {"progress_bar": False},
        },
    )
    adapter = run_sft(cfg, loaded=load_vlm(cfg.model))
    for path in (adapter, tmp_path / "sft" / "checkpoint-1"):
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
            keys = list(f.keys())
        assert any("lora_embedding_A" in k for k in keys) and all("lora_" in k for k in keys), (path, keys)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_sft_with_gradient_checkpointing_runs_no_backward_through_the_frozen_tower(tmp_path, tiny_family_path, family):
    """The frozen vision tower runs once per step (no recompute, no backward: nothing in it needs a
    gradient), while every decoder layer's LoRA weights get theirs, and the loss is the one
    without checkpointing."""
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.policy.loading import load_vlm
    from SFT.trainer import build_trainer

    tiny_model_path = tiny_family_path(family)
    rng = np.random.default_rng(0)
    data = write_sft_rows(
        tmp_path, [(sft_observation(rng, 2), '{"thoughts": "look", "action": "A"}') for _ in range(2)]
    )
    losses = {}
    for checkpointing in (True, False):
        cfg = load_config(
            preset="debug",
            overrides={
                "model": {"model_path": tiny_model_path, "device": "cpu", "gradient_checkpointing": checkpointing},
                "sft": {"data_path": str(data), "output_dir": str(tmp_path / f"out{checkpointing}")},
            },
        )
        torch.manual_seed(0)
        trainer = build_trainer(cfg, load_vlm(cfg.model))
        model = trainer.model
        model.train()
        tower_blocks = model.base_model.model.model.visual.blocks
        calls = []
        outputs_need_grad = []
        tower_blocks[0].register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
        tower_blocks[-1].register_forward_hook(
            lambda _m, _a, out: outputs_need_grad.append((out[0] if isinstance(out, tuple) else out).requires_grad)
        )
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
        loss = model(**batch).loss
        loss.backward()
        losses[checkpointing] = loss.item()
        if checkpointing:
            assert len(calls) == 1, (
                f"the frozen tower's first block ran {len(calls)} times (a recompute means autograd went through it)"
            )
            assert outputs_need_grad == [False], (
                "the frozen tower's activations are in autograd (input-embedding hooks)"
            )
            assert not any(p.requires_grad for p in model.base_model.model.model.visual.parameters())
            layers = {
                n.split(".layers.")[1].split(".")[0]
                for n, p in model.named_parameters()
                if "lora_" in n
                and ".layers." in n
                and "visual" not in n
                and p.grad is not None
                and p.grad.abs().sum() > 0
            }
            n_layers = model.base_model.model.config.get_text_config().num_hidden_layers
            assert layers == {str(i) for i in range(n_layers)}
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)

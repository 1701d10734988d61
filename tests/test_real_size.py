"""a2c_ppo_acktr/real_size.py: a preset's real architecture with random weights, built offline, loads
through the package's own loader, keeps the checkpoint's config values that were not reduced, and
only samples ids its (tiny) tokenizer knows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from a2c_ppo_acktr import real_size
from a2c_ppo_acktr.memory import KNOWN_CONFIGS

# What each checkpoint's model card on the hub gives as its size (safetensors parameters): an
# oracle from outside this package for the full-size build.
HUB_SIZES = {
    "qwen2.5-vl-3b": 3.75e9,
    "qwen2.5-vl-7b": 8.29e9,
    "qwen3-vl-4b": 4.44e9,
    "qwen3-vl-8b": 8.77e9,
    "vsgrpo": 2.21e9,
}  # vsgrpo: Qwen2-VL-2B
PROXY = real_size.Reductions(text_layers=2, vision_blocks=2, hidden=128, vision_hidden=160)
# The fields a reduction rewrites (the rest must be the checkpoint's).
REDUCED_TEXT = {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size"}
REDUCED_VISION = {
    "depth",
    "hidden_size",
    "num_heads",
    "intermediate_size",
    "out_hidden_size",
    "fullatt_block_indexes",
    "deepstack_visual_indexes",
}


@pytest.fixture(scope="module")
def proxy_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("real_size") / "qwen2.5-vl-3b"
    return str(real_size.build_real_size("qwen2.5-vl-3b", out, PROXY, dtype="float32"))


@pytest.fixture(scope="module")
def tokenizer():
    from a2c_ppo_acktr.tiny import build as tiny

    return tiny.build_tokenizer(tiny.tiny_spec("qwen2_5_vl"), tiny.training_corpus())


def test_the_gpu_presets_have_their_checkpoints_architecture():
    presets = real_size.real_size_presets()
    assert set(HUB_SIZES) <= set(presets)
    assert all(presets[p] in KNOWN_CONFIGS for p in presets)


@pytest.mark.parametrize("preset", sorted(HUB_SIZES))
def test_full_size_architecture_has_the_checkpoints_parameter_count(preset, tokenizer):
    """Built on the meta device (no memory): the parameter count the hub reports, to 3 digits."""
    config = real_size.build_config(real_size.hub_id_of(preset), tokenizer)
    model = real_size._instantiate(config, "bfloat16", "meta", seed=0)
    assert float(f"{sum(p.numel() for p in model.parameters()):.3g}") == HUB_SIZES[preset]


def _loaded(path: str, **over):
    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm

    cfg = ModelConfig(model_path=path, device="cpu", dtype="float32", **over)
    return cfg, load_vlm(cfg)


def test_reduced_build_loads_with_the_real_vocabulary_and_the_stored_values(proxy_dir):
    _, loaded = _loaded(proxy_dir)
    known = KNOWN_CONFIGS[real_size.hub_id_of("qwen2.5-vl-3b")]
    config = loaded.model.config
    text, vision = config.get_text_config(), config.vision_config
    assert loaded.family == "qwen2_5_vl"
    vocab = known["text_config"]["vocab_size"]
    assert loaded.model.get_input_embeddings().weight.shape == (vocab, 128)
    assert loaded.model.get_output_embeddings().weight.shape == (vocab, 128)
    assert (
        loaded.model.get_output_embeddings().weight.data_ptr() == loaded.model.get_input_embeddings().weight.data_ptr()
    )  # tied, as 3B
    assert (text.num_hidden_layers, text.hidden_size, vision.depth, vision.hidden_size, vision.out_hidden_size) == (
        2,
        128,
        2,
        160,
        128,
    )
    assert vision.fullatt_block_indexes == [1]  # the windowed tower keeps a full-attention block that exists
    for key, value in known["text_config"].items():
        if key not in REDUCED_TEXT | {"rope_theta", "rope_scaling"}:
            assert getattr(text, key) == value, key
    assert text.rope_parameters["rope_theta"] == known["text_config"]["rope_theta"]
    assert text.rope_parameters["mrope_section"] == known["text_config"]["rope_scaling"]["mrope_section"]
    for key, value in known["vision_config"].items():
        if key not in REDUCED_VISION:
            assert getattr(vision, key) == value, key
    size = loaded.processor.image_processor.size
    assert (size["shortest_edge"], size["longest_edge"]) == (known["min_pixels"], known["max_pixels"])
    record = json.loads((Path(proxy_dir) / real_size.BUILD_RECORD).read_text())
    assert record["architecture_of"] == "Qwen/Qwen2.5-VL-3B-Instruct" and record["vocab_rows"] == vocab


def test_the_policy_samples_only_ids_the_tokenizer_knows(proxy_dir):
    """Over 150k embedding rows and ~1.2k tokens: a bare sample almost surely leaves the tokenizer
    (what the check guards against), the policy's never does."""
    from a2c_ppo_acktr.policy.model import VLMPolicy

    cfg, loaded = _loaded(proxy_dir, max_new_tokens=12)
    tok_len = len(loaded.processor.tokenizer)
    torch.manual_seed(0)
    policy = VLMPolicy(cfg, loaded)
    rng = np.random.default_rng(0)
    obs = [
        {"images": [rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)], "text": f"Env {i}: where is the chair?"}
        for i in range(2)
    ]
    out = policy.act(obs)
    ids = torch.cat([torch.as_tensor(g) for g in out.generated_ids])
    assert ids.numel() > 0 and int(ids.max()) < tok_len
    enc = loaded.processor(text=["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"], return_tensors="pt")
    bare = loaded.model.generate(**enc, do_sample=True, max_new_tokens=12, min_new_tokens=12)
    assert int(bare[0, enc["input_ids"].shape[1] :].max()) >= tok_len


def test_qwen3_vl_reduced_build_keeps_a_deepstack_block(tmp_path):
    out = real_size.build_real_size(
        "qwen3-vl-4b",
        tmp_path / "m",
        real_size.Reductions(text_layers=2, vision_blocks=3, hidden=128, vision_hidden=128),
    )
    _, loaded = _loaded(str(out))
    vision, text = loaded.model.config.vision_config, loaded.model.config.get_text_config()
    assert loaded.family == "qwen3_vl" and vision.deepstack_visual_indexes == [2] and vision.depth == 3
    assert text.rope_parameters["mrope_section"] == [24, 20, 20] and text.max_position_embeddings == 262144
    assert (
        loaded.model.get_input_embeddings().weight.shape[0]
        == KNOWN_CONFIGS["Qwen/Qwen3-VL-4B-Instruct"]["text_config"]["vocab_size"]
    )


def test_qwen2_vl_reduced_build_names_its_tower_width_embed_dim(tmp_path):
    """Qwen2-VL (the vsgrpo preset's 2B): the tower's width is ``embed_dim`` with an MLP of ``mlp_ratio``
    x that, and ``hidden_size`` is the merger's output, the language model's width."""
    out = real_size.build_real_size(
        "vsgrpo", tmp_path / "m", real_size.Reductions(text_layers=2, vision_blocks=2, hidden=128, vision_hidden=160)
    )
    _, loaded = _loaded(str(out))
    vision, text = loaded.model.config.vision_config, loaded.model.config.get_text_config()
    assert loaded.family == "qwen2_vl" and (vision.depth, vision.embed_dim, vision.num_heads, vision.mlp_ratio) == (
        2,
        160,
        2,
        4,
    )
    assert vision.hidden_size == text.hidden_size == 128 and text.rope_parameters["mrope_section"] == [16, 24, 24]
    assert loaded.model.get_input_embeddings().weight.shape[0] == 151936
    fields = real_size.config_fields("Qwen/Qwen2-VL-7B-Instruct")
    assert (fields["vision_config"]["embed_dim"], fields["vision_config"]["hidden_size"]) == (1280, 3584)
    assert "out_hidden_size" not in fields["vision_config"]


def test_reductions_that_do_not_fit_the_architecture_say_what_fits():
    with pytest.raises(real_size.RealSizeError, match="multiple of the checkpoint's head dimension 128"):
        real_size.config_fields("Qwen/Qwen2.5-VL-3B-Instruct", real_size.Reductions(hidden=200))
    with pytest.raises(real_size.RealSizeError, match="--text-layers=0 must be >= 1"):
        real_size.Reductions(text_layers=0)
    fields = real_size.config_fields("Qwen/Qwen2.5-VL-7B-Instruct", real_size.Reductions(hidden=512, vision_blocks=20))
    # 7B: 28 heads over 4 key/value heads (7 per group) -> 4 heads over 1
    assert (fields["text_config"]["num_attention_heads"], fields["text_config"]["num_key_value_heads"]) == (4, 1)
    assert fields["vision_config"]["fullatt_block_indexes"] == [7, 15]
    assert (
        KNOWN_CONFIGS["Qwen/Qwen2.5-VL-7B-Instruct"]["text_config"]["hidden_size"] == 3584
    )  # the stored values are not edited


def test_a_device_that_is_not_there_is_refused_before_building(tmp_path):
    with pytest.raises(real_size.RealSizeError, match="use cpu, cuda or cuda:N"):
        real_size.build_real_size("qwen2.5-vl-3b", tmp_path / "m", PROXY, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(real_size.RealSizeError, match="CUDA is not available here; use --device cpu"):
            real_size.build_real_size("qwen2.5-vl-3b", tmp_path / "m", PROXY, device="cuda")
    assert not (tmp_path / "m").exists()


def test_a_bad_preset_is_one_line_listing_the_known_ones(tmp_path, capsys):
    from a2c_ppo_acktr.config.cli import run_main

    rc = run_main(
        lambda: real_size.main(["--preset", "qwen9-vl", "--out", str(tmp_path / "m")]),
        "python -m a2c_ppo_acktr.real_size",
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "no real-size architecture for preset 'qwen9-vl'; known: " in err[0] and all(p in err[0] for p in HUB_SIZES)
    assert not (tmp_path / "m").exists()


def test_an_existing_directory_with_files_is_never_written(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(real_size.RealSizeError, match="exists and is not empty"):
        real_size.build_real_size("qwen2.5-vl-3b", out, PROXY)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no temporary directory left behind


def test_profile_of_act_and_a_bare_generate_names_the_head_and_the_sampler(proxy_dir, tmp_path):
    """GPU_SMOKE_PROFILE's table: one profiled act and one bare generate, each with its operators, the
    float32 head's matmul and the sampler among them."""
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.real_size_probe import profile_decoders

    cfg, loaded = _loaded(proxy_dir, max_new_tokens=12)
    torch.manual_seed(0)
    policy = VLMPolicy(cfg, loaded)
    rng = np.random.default_rng(0)
    obs = [
        {"images": [rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)], "text": f"Env {i}: where is the chair?"}
        for i in range(2)
    ]
    out = tmp_path / "act_profile.txt"
    profile_decoders(policy, obs, tokens=4, path=str(out))
    text = out.read_text(encoding="utf-8")
    act, bare = text.split("== bare generate, 4 positions")
    assert act.startswith("== act, 4 positions")
    for part in (act, bare):
        assert "aten::multinomial" in part and ("aten::linear" in part or "aten::addmm" in part or "aten::mm" in part)

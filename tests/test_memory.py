"""The memory formula (a2c_ppo_acktr.memory) against what autograd keeps and what a CPU update peaks at;
parameter counts of the GPU presets' models; the docs table; loading straight onto the GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from a2c_ppo_acktr import memory
from a2c_ppo_acktr.config.arguments import ModelConfig, load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "hub_id, params, layers, H, kv, I",
    [
        # published sizes: 3.75e9 and 8.29e9 parameters (model cards); LoRA in closed form below
        ("Qwen/Qwen2.5-VL-3B-Instruct", 3.75e9, 36, 2048, 256, 11008),
        ("Qwen/Qwen2.5-VL-7B-Instruct", 8.29e9, 28, 3584, 512, 18944),
    ],
)
def test_known_configs_give_the_published_parameter_counts(hub_id, params, layers, H, kv, I):
    """Parameters counted on a meta-device model built from the shipped config.json numbers match
    the model cards; LoRA parameters (counted by matching the target regex on module names) match
    r * L * (9H + 2kv + 3I): q, o are H->H, k, v are H->kv, gate, up are H->I, down is I->H."""
    r = 128
    dims = memory.model_dims(ModelConfig(model_path=hub_id, lora_r=r, lora_alpha=256))
    assert dims.source.startswith("KNOWN_CONFIGS")  # offline: the shipped numbers, not a download
    assert dims.total_params == pytest.approx(params, rel=2e-3)
    assert dims.lora_params == r * layers * (9 * H + 2 * kv + 3 * I)


def _tiny_text_model(tmp_path, dtype, lora_dtype, H=64, I=96, heads=4, kv_heads=2, layers=3):
    """A random Qwen2.5-VL with LoRA on the language model (frozen base), its dims read back from
    the saved config the way the CLI reads a local model."""
    from peft import get_peft_model
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from a2c_ppo_acktr.policy.model import build_lora_config

    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=H,
            intermediate_size=I,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            num_hidden_layers=layers,
            vocab_size=256,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=H),
    )
    cfg.save_pretrained(tmp_path)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    mcfg = ModelConfig(model_path=str(tmp_path), lora_r=4, lora_alpha=8)
    model = get_peft_model(model, build_lora_config(mcfg))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(lora_dtype)  # DeepSpeed casts LoRA to the dtype; plain peft keeps float32
    return model.train(), memory.model_dims(mcfg), mcfg


@pytest.mark.parametrize(
    "dtype, lora_dtype, padded",
    [
        (torch.float32, torch.float32, False),
        (torch.float32, torch.float32, True),
        (torch.bfloat16, torch.bfloat16, True),  # DeepSpeed bf16
        (torch.bfloat16, torch.float32, False),  # bf16 without DeepSpeed: peft's float32 adapters
    ],
)
def test_activation_formula_equals_what_autograd_keeps(tmp_path, dtype, lora_dtype, padded):
    """Every tensor autograd saves for backward in a LoRA training forward (deduplicated by storage,
    parameters excluded) adds up to the formula's 'activations kept for backward' exactly."""
    model, dims, mcfg = _tiny_text_model(tmp_path, dtype, lora_dtype)
    B, T = 2, 48
    ids = torch.randint(3, 250, (B, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :7] = 0  # left padding: attention gets a mask
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)
    b, a = torch.finfo(dtype).bits // 8, torch.finfo(lora_dtype).bits // 8
    shapes = memory.Shapes(
        batch=B,
        prompt_tokens=T,
        response_tokens=0,
        padded=padded,
        num_envs=B,
        images=0,
        image_tokens=0,
        pixel_values=0,
        text_tokens=T,
        text_exact=True,
    )
    setup = memory.Setup(
        dtype_bytes=b,
        lora_bytes=a,
        zero_stage=0,
        gpus=1,
        gradient_checkpointing=False,
        reduce_bucket_elements=0,
        lora_r=mcfg.lora_r,
    )
    terms = {t.name: t.bytes for t in memory.estimate(dims, shapes, setup)}
    assert sum(saved.values()) == terms["activations kept for backward, no checkpointing"]


def test_cli_prints_every_term_with_its_formula(capsys):
    memory.main(["--preset", "debug", "--gpus", "1"])
    out = capsys.readouterr().out
    for name in (
        "weights",
        "Adam m, v",
        "gradients",
        "activations kept for backward, no checkpointing",
        "activations kept for backward, gradient checkpointing",
        "logits chunk",
        "rollout: KV cache",
    ):
        assert f"| {name}" in out
    assert "counted by the model's processor" in out  # the tiny model's own processor counts the prompt


def test_gpu_presets_fit_and_the_docs_show_the_commands_output():
    """Gradient checkpointing is what makes the GPU presets fit 40 GB-class cards, and
    docs/TRAINING.md holds exactly what the command prints (regenerate it when this fails)."""
    docs = (REPO / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    for preset in ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "debug"):
        run = load_config(preset=preset)
        table = memory.report(run, gpus=8)
        assert table in docs, (
            f"docs/TRAINING.md is out of date: paste `python -m a2c_ppo_acktr.memory --preset {preset}`"
        )
        if preset == "debug":
            continue
        assert run.model.gradient_checkpointing
        dims = memory.model_dims(run.model)
        shapes = memory.preset_shapes(run, dims)
        on = memory.setup_from_run(run, 8)
        off = memory.Setup(**{**on.__dict__, "gradient_checkpointing": False})
        peak_on = memory.totals(memory.estimate(dims, shapes, on))["peak"] / memory.GIB
        peak_off = memory.totals(memory.estimate(dims, shapes, off))["peak"] / memory.GIB
        assert peak_on < 32 < 60 < peak_off


# Runs in a fresh interpreter with memory.HONEST_MALLOC_ENV: resident memory then follows what torch
# allocates, and the high-water mark is this measurement's alone.
_MEASURE = r"""
import json, sys
import numpy as np, torch
torch.set_num_threads(1)
from a2c_ppo_acktr import memory
from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.config.arguments import EnvConfig, ModelConfig
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import Minibatch

path, gc_on, B, R = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
cfg = ModelConfig(model_path=path, device="cpu", lora_r=8, lora_alpha=16, gradient_checkpointing=gc_on)
policy = VLMPolicy(cfg, load_vlm(cfg))
allowed = torch.tensor(sorted(set(range(policy.vocab_size)) - set(policy.forbidden_ids.tolist())))
texts, images, gens = [], [], []
for i in range(B):  # long prompts of different lengths (left padding), responses of different lengths
    obs = memory.sample_observation(EnvConfig(image_size=56, num_sweep_frames=1 + i, image_history=1))
    obs["text"] = obs["text"] * (3 + i)
    texts.append(prompts.render_prompt(policy.processor, prompts.build_messages(obs)))
    images.append(obs["images"])
    gens.append(allowed[torch.randint(len(allowed), (R - 5 * i,), generator=torch.Generator().manual_seed(i))])
enc = policy._encode(texts, images)
z = torch.zeros(B)
ones = [torch.ones(len(g)) for g in gens]
mb = Minibatch(texts, images, policy._unpadded(enc), gens, ones, z, z, torch.randn(B), z, torch.arange(B),
               old_token_log_probs=[torch.zeros(len(g)) for g in gens])
policy.train()
peak = memory.measure_update_peak(policy, mb)
print(json.dumps({"peak": peak, "prompt": enc["input_ids"].shape[1], "images": len(images[-1]),
                  "pixel_values": int(enc["pixel_values"].numel()) // sum(len(im) for im in images)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_formula_predicts_the_measured_peak_of_a_tiny_model_update(tiny_model_path, gradient_checkpointing):
    """Peak resident memory above the start of one PPO minibatch (policy forward, reference forward
    for the KL, chunked log-probs, losses, backward) on the tiny model in float32, with long prompts
    so activations dominate, is the formula's 'update' total within 25%."""
    B, R = 3, 64
    env = {**os.environ, **memory.HONEST_MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, tiny_model_path, str(int(gradient_checkpointing)), str(B), str(R)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = ModelConfig(
        model_path=tiny_model_path, lora_r=8, lora_alpha=16, gradient_checkpointing=gradient_checkpointing
    )
    dims = memory.model_dims(cfg)
    shapes = memory.Shapes(
        batch=B,
        prompt_tokens=got["prompt"],
        response_tokens=R,
        padded=True,
        num_envs=B,
        images=got["images"],
        image_tokens=0,
        pixel_values=got["pixel_values"],
        text_tokens=0,
        text_exact=True,
    )
    setup = memory.Setup(
        dtype_bytes=4,
        lora_bytes=4,
        zero_stage=0,
        gpus=1,
        gradient_checkpointing=gradient_checkpointing,
        reduce_bucket_elements=0,
        lora_r=8,
    )
    heads = memory.head_params(dims.hidden, cfg.value_head_hidden, cfg.temp_head_hidden, cfg.use_temp_predictor)
    predicted = memory.totals(memory.estimate(dims, shapes, setup, heads=heads))["update"]
    assert got["peak"] > 20 * 2**20  # activations, not allocator noise, are what is compared
    assert abs(got["peak"] / predicted - 1) < 0.25, (got["peak"] / 2**20, predicted / 2**20)


def test_load_vlm_places_weights_on_the_rank_gpu_without_a_host_copy(monkeypatch, tiny_model_path):
    """On CUDA (faked) from_pretrained gets device_map={'': 'cuda:<LOCAL_RANK>'}; under ZeRO-3 and on
    CPU it gets no placement (zero.Init partitions; CPU loading is unchanged)."""
    import transformers
    import transformers.integrations

    from a2c_ppo_acktr.policy import loading

    calls = []

    class Stub:
        def to(self, device):
            calls.append(("to", device))
            return self

        def eval(self):
            return self

    def fake_from_pretrained(path, **kwargs):
        calls.append(("load", kwargs))
        return Stub()

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    cfg = ModelConfig(model_path=tiny_model_path, device="auto", dtype="bfloat16")
    loading.load_vlm(cfg)
    kwargs = calls[0][1]
    assert kwargs["device_map"] == {"": "cuda:1"} and kwargs["low_cpu_mem_usage"] is True
    assert kwargs["dtype"] is torch.bfloat16
    calls.clear()
    monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
    loading.load_vlm(cfg)
    assert "device_map" not in calls[0][1] and calls[1] == ("to", "cuda:1")
    calls.clear()
    loading.load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu"))
    assert "device_map" not in calls[0][1] and "low_cpu_mem_usage" not in calls[0][1]


def test_the_estimate_adds_the_assumed_gpu_overheads_and_says_which_terms_are_assumed():
    run = load_config(preset="qwen2.5-vl-3b")
    dims = memory.model_dims(run.model)
    shapes = memory.preset_shapes(run, dims)
    one, eight = (memory.estimate(dims, shapes, memory.setup_from_run(run, g)) for g in (1, 8))
    for terms, gpus in ((one, 1), (eight, 8)):
        over = {t.name: t for t in terms if t.group == "overhead"}
        assert all(t.basis == "assumed" for t in over.values())
        assert ("NCCL communicator buffers" in over) == (gpus > 1)
        tot = memory.totals(terms)
        assert tot["peak_with_overhead"] == pytest.approx(tot["peak"] + sum(t.bytes for t in over.values()))
        frag = over["caching allocator fragmentation"].bytes
        assert frag == pytest.approx(memory.FRAGMENTATION_SHARE * max(tot["update"], tot["rollout"]))
    table = memory.report(run, gpus=8)
    assert (
        "| basis |" in table
        and "| assumed |" in table
        and "| computed |" in table
        and "measured (CPU peak RSS)" in table
    )

"""Export: the LoRA adapter merged into the base weights gives the adapted model's logits, from a
plain directory that loads without peft; checkpoints are verified first; errors are one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.export import EXPORT_FILE, merge_adapter
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.common.prompts import build_messages, render_prompt
from numerics import f32_chain_tolerance, vlm_forward_terms

REPO = Path(__file__).resolve().parent.parent
TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)|lm_head"


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_merged_model_reproduces_the_adapted_logits(tmp_path, tiny_family_path, family):
    tiny_model_path = tiny_family_path(family)
    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=TARGETS,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    torch.manual_seed(0)
    policy = VLMPolicy(cfg)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)  # an adapter that changes the outputs
    policy.save_pretrained(tmp_path / "policy")
    out = merge_adapter(tmp_path / "policy", tmp_path / "merged", model_path=tiny_model_path)
    assert json.loads((out / EXPORT_FILE).read_text())["base_model"] == tiny_model_path
    assert not (out / "adapter_config.json").exists() and not list(tmp_path.glob(".tmp-*"))
    merged = load_vlm(ModelConfig(model_path=str(out), device="cpu"))
    obs = {
        "images": [np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)],
        "text": "How many chair(s) are in this room?",
    }
    enc = policy.processor(
        text=[render_prompt(policy.processor, build_messages(obs))], images=obs["images"], return_tensors="pt"
    )
    with torch.no_grad():
        adapted = policy.model(**enc).logits
        plain = merged.model(**enc).logits
        base = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu")).model(**enc).logits
    assert (adapted - base).abs().max() > 1e-2  # the adapter matters
    # W x + s B (A x) against (W + s B A) x, the merged weights rounded once more: each projection's
    # sums twice over, along a logit's path through the model, at the largest logit (numerics)
    hidden = policy.base_model.config.get_text_config().hidden_size
    terms = 2 * (vlm_forward_terms(policy.base_model.config, enc["input_ids"].shape[1]) + hidden)
    assert (adapted - plain).abs().max() < f32_chain_tolerance(terms, float(adapted.abs().max()))


def test_export_errors_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "a2c_ppo_acktr.export",
            "--adapter",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 2 and "holds no adapter_config.json" in res.stderr and "Traceback" not in res.stderr


def test_saved_adapters_name_their_local_base_model_by_absolute_path(tmp_path, tiny_model_path, monkeypatch):
    # peft records the base model as given; a relative local path would not load from elsewhere.
    import os
    import shutil

    from a2c_ppo_acktr.policy.loading import record_base_model

    local = tmp_path / "work" / "models" / "tiny"
    shutil.copytree(tiny_model_path, local)
    monkeypatch.chdir(tmp_path / "work")
    cfg = ModelConfig(
        model_path="models/tiny",
        device="cpu",
        lora_r=2,
        lora_alpha=4,
        lora_target_modules=TARGETS,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    VLMPolicy(cfg).save_pretrained("policy")
    recorded = json.loads(Path("policy/adapter_config.json").read_text())["base_model_name_or_path"]
    assert os.path.isabs(recorded) and Path(recorded) == local.resolve()
    # So an adapter alone (no checkpoint config, no --model-path) exports from another directory.
    from a2c_ppo_acktr.export import resolve_adapter

    monkeypatch.chdir(tmp_path)
    assert resolve_adapter(tmp_path / "work" / "policy") == (tmp_path / "work" / "policy", recorded)
    # A hub id (no such local directory) is kept as it is.
    hub = tmp_path / "hub_adapter"
    hub.mkdir()
    (hub / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-VL-3B-Instruct"}))
    record_base_model(hub)
    assert (
        json.loads((hub / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "Qwen/Qwen2.5-VL-3B-Instruct"
    )


def _export(args, capsys, cwd=REPO):
    """``(exit code, stderr)`` of the export command run in this process (as ``run_main`` runs it)."""
    from a2c_ppo_acktr.config.cli import run_main
    from a2c_ppo_acktr.export import main

    here = os.getcwd()
    os.chdir(cwd)
    try:
        capsys.readouterr()
        code = run_main(lambda: main([str(a) for a in args]), "export")
    finally:
        os.chdir(here)
    return code, capsys.readouterr().err


def _adapter(tmp_path, tiny_model_path):
    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        lora_r=2,
        lora_alpha=4,
        lora_target_modules=TARGETS,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    run = tmp_path / "run"
    VLMPolicy(cfg).save_pretrained(run / "checkpoints" / "policy")
    (run / "metrics.jsonl").write_text("{}\n")
    return run, run / "checkpoints" / "policy"


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_export_never_deletes_its_input_or_an_existing_directory(tmp_path, tiny_model_path, capsys):
    """An --out that is or holds the adapter, or lies inside it, or is the current directory, is
    refused before anything is written; an existing --out is refused, and with --overwrite moved
    aside (nothing deleted); no temporary directory is left behind."""
    run, policy = _adapter(tmp_path, tiny_model_path)
    before = _tree(run)
    for out, cwd in ((run, REPO), (policy, REPO), (policy / "merged", REPO), (".", run)):
        code, err = _export(["--adapter", policy, "--out", out, "--model-path", tiny_model_path], capsys, cwd=cwd)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "overlaps the input" in err or "current directory" in err
        assert _tree(run) == before
    existing = tmp_path / "merged"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    code, err = _export(["--adapter", policy, "--out", existing, "--model-path", tiny_model_path], capsys)
    assert code == 2 and "already holds output" in err and (existing / "mine.txt").read_text() == "keep me"
    code, err = _export(
        ["--adapter", policy, "--out", existing, "--model-path", tiny_model_path, "--overwrite"], capsys
    )
    assert code == 0, err
    assert (existing / EXPORT_FILE).is_file() and not (existing / "mine.txt").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("merged.old-")]
    assert len(aside) == 1 and (aside[0] / "mine.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_a_failed_export_leaves_no_temporary_directory(tmp_path, tiny_model_path, monkeypatch):
    _, policy = _adapter(tmp_path, tiny_model_path)

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space"):
        merge_adapter(policy, tmp_path / "out", model_path=tiny_model_path)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.rglob(".tmp-*")]


def test_the_merged_model_keeps_its_base_checkpoints_generation_config(tmp_path, tiny_model_path):
    """Loading sets the checkpoint's decoding defaults aside (sampling follows the run's config); the
    exported model is a checkpoint again, so they travel with it."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    shipped = {"do_sample": True, "temperature": 0.1, "top_p": 0.001, "top_k": 1, "repetition_penalty": 1.05}
    gc_file = base / "generation_config.json"
    gc_file.write_text(json.dumps({**json.loads(gc_file.read_text()), **shipped}), encoding="utf-8")
    _, adapter = _adapter(tmp_path, str(base))
    out = merge_adapter(adapter, tmp_path / "merged", model_path=str(base))
    written = json.loads((out / "generation_config.json").read_text())
    assert {k: written.get(k) for k in shipped} == shipped
    assert written["eos_token_id"] == json.loads(gc_file.read_text())["eos_token_id"]


def test_an_adapter_describes_itself_to_eval_and_to_a_warm_start(tmp_path, tiny_model_path, caplog):
    """eval_vsi.py --adapter without the SFT run's preset: the adapter's rank, alpha, targets and base
    model come from its adapter_config.json, with one warning line per contradicted setting; PPO's
    --sft-adapter adopts them the same way (the base model is warned about, never switched)."""
    import logging

    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.eval.evaluation import load_policy
    from a2c_ppo_acktr.policy.loading import adapter_settings, adopt_adapter_settings

    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        lora_r=3,
        lora_alpha=6,
        lora_target_modules=TARGETS,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    torch.manual_seed(0)
    VLMPolicy(cfg).save_pretrained(tmp_path / "adapter")
    saved = adapter_settings(tmp_path / "adapter")
    assert (saved["lora_r"], saved["lora_alpha"], saved["lora_target_modules"], saved["base_model"]) == (
        3,
        6,
        TARGETS,
        tiny_model_path,
    )
    run = load_config(preset="debug", overrides={"model": {"model_path": "tiny:qwen2_vl", "device": "cpu"}})
    assert run.model.lora_r != 3
    with caplog.at_level(logging.WARNING):
        policy = load_policy(run, adapter=str(tmp_path / "adapter"), take_base=True)
    assert (run.model.lora_r, run.model.lora_alpha, run.model.model_path) == (3, 6, tiny_model_path)
    notes = [r.getMessage() for r in caplog.records if "adapter" in r.getMessage()]
    assert any("LoRA r=3" in n and "model.lora_r=" in n for n in notes) and any(
        "names its base model" in n for n in notes
    )
    assert all("\n" not in n for n in notes)
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    own = {n.replace(".default", ""): p for n, p in policy.model.named_parameters() if "lora_A" in n}
    matched = [k for k in weights if "lora_A" in k and k in own]
    assert matched and all(
        torch.equal(own[k].detach(), weights[k]) for k in matched
    )  # the adapter's own weights, rank 3
    # a warm start: rank and alpha adopted, the configured base kept and named in the warning
    other = ModelConfig(model_path="tiny:qwen2_vl", device="cpu", lora_r=8, lora_alpha=16)
    notes = adopt_adapter_settings(other, tmp_path / "adapter")
    assert (other.lora_r, other.lora_alpha, other.model_path) == (3, 6, "tiny:qwen2_vl")
    assert any("was trained on" in n and "tiny:qwen2_vl" in n for n in notes)
    # a list of module names (other tools' adapters) becomes the equivalent regex
    conf = tmp_path / "adapter" / "adapter_config.json"
    data = json.loads(conf.read_text())
    data["target_modules"] = ["v_proj", "q_proj"]
    conf.write_text(json.dumps(data))
    import re

    regex = adapter_settings(tmp_path / "adapter")["lora_target_modules"]
    assert re.fullmatch(regex, "model.language_model.layers.0.self_attn.q_proj") and not re.fullmatch(
        regex, "model.layers.0.mlp.up_proj"
    )

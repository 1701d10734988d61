"""Tiny offline VLMs (``a2c_ppo_acktr/tiny/build.py``) and the model loader (``a2c_ppo_acktr/policy/loading.py``)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.tiny import build as tiny
from a2c_ppo_acktr.tiny import cli as tiny_cli
from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.policy.loading import (
    SUPPORTED_FAMILIES,
    ModelLoadError,
    detect_family,
    forbidden_token_ids,
    load_processor,
    load_vlm,
    resolve_model_path,
)
from numerics import f32_chain_tolerance, vlm_forward_terms


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(n)]


def _messages(num_images: int, text: str) -> list[dict]:
    content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": text}]
    return [
        {"role": "system", "content": [{"type": "text", "text": "You are an agent."}]},
        {"role": "user", "content": content},
    ]


def _batch(processor, prompts: list[tuple[int, str]], frames: list[np.ndarray]):
    """Processor inputs for prompts ``(num_images, text)``, taking images from ``frames`` in order."""
    texts = [
        processor.apply_chat_template(_messages(k, t), add_generation_prompt=True, tokenize=False) for k, t in prompts
    ]
    images, i = [], 0
    for k, _ in prompts:
        images.append(frames[i : i + k])
        i += k
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def _byte_level_decode(tokenizer, ids: list[int]) -> str:
    """GPT-2 byte-level BPE decoding: each vocabulary string's characters stand for bytes (printable
    Latin-1 for themselves, the other bytes shifted to 256+); special tokens are dropped."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    shifted = [b for b in range(256) if b not in printable]
    byte_of = {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(shifted)}
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    pieces = tokenizer.convert_ids_to_tokens([i for i in ids if i not in special])
    return bytes(byte_of[ch] for piece in pieces for ch in piece).decode("utf-8", errors="replace")


@pytest.mark.parametrize("family", tiny.QWEN_FAMILIES)
def test_family_loads_forwards_left_padded_and_generates(family, tiny_family_path):
    loaded = load_vlm(ModelConfig(model_path=f"tiny:{family}", device="cpu"))
    assert loaded.family == family
    assert loaded.path == tiny_family_path(family)
    model, processor = loaded.model, loaded.processor
    assert processor.tokenizer.padding_side == "left"
    assert not model.training

    frames = _frames(2)
    long_prompt = (1, "How many chairs are in this room? Look carefully at every frame before answering.")
    short_prompt = (1, "Count.")
    batch = _batch(processor, [long_prompt, short_prompt], frames)
    mask = batch["attention_mask"]
    # Left padding: the short row starts with padding and ends with real tokens.
    assert mask[0].all() and mask[1, 0] == 0 and mask[1, -1] == 1
    image_id = model.config.image_token_id
    merge = processor.image_processor.merge_size
    expected_image_tokens = int(batch["image_grid_thw"].prod(dim=1).sum()) // merge**2
    assert int((batch["input_ids"] == image_id).sum()) == expected_image_tokens

    # Another batch shape rounds the model's sums differently: a logit's path through the model at
    # this length plus lm_head's products, at the largest logit (numerics.f32_chain_tolerance).
    hidden = model.config.get_text_config().hidden_size

    def logit_tolerance(seq, logits):
        return f32_chain_tolerance(vlm_forward_terms(model.config, seq) + hidden, float(logits.abs().max()))

    with torch.no_grad():
        logits = model(**batch).logits
        # Each row alone (no padding) must give the same next-token logits as in the padded batch:
        # padding, masks and M-RoPE positions must not leak into real tokens.
        for row, (prompt, frame) in enumerate(zip([long_prompt, short_prompt], frames)):
            alone = model(**_batch(processor, [prompt], [frame])).logits
            torch.testing.assert_close(
                logits[row, -1], alone[0, -1], atol=logit_tolerance(logits.shape[1], alone[0, -1]), rtol=0
            )

    vocab = model.config.get_text_config().vocab_size
    assert logits.shape[-1] == vocab
    forbidden = forbidden_token_ids(processor, vocab_size=vocab)
    torch.manual_seed(0)
    out = model.generate(
        **batch,
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=True,
        suppress_tokens=forbidden,
        output_logits=True,
        return_dict_in_generate=True,
    )
    n = batch["input_ids"].shape[1]
    new = out.sequences[:, n:]
    assert new.shape == (2, 8)
    assert not set(new.flatten().tolist()) & set(forbidden)
    # The processor decodes generated ids as byte-level BPE does, written out independently below.
    tok = processor.tokenizer
    assert processor.batch_decode(new, skip_special_tokens=True) == [
        _byte_level_decode(tok, row) for row in new.tolist()
    ]
    # Re-forwarding prompt + generated tokens in one pass (what a PPO update does) reproduces the
    # logits generate saw step by step with its KV cache. Generated tokens are text tokens, so
    # mm_token_type_ids is extended with zeros: without it Qwen2/2.5-VL silently fall back to 1-D
    # positions (and Qwen3-VL raises).
    ones = torch.ones_like(new)
    full = dict(batch, input_ids=out.sequences, attention_mask=torch.cat([mask, ones], dim=1))
    full["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros_like(new)], dim=1)
    with torch.no_grad():
        refwd = model(**full).logits[:, n - 1 : -1]
    cached = torch.stack(out.logits, dim=1)
    torch.testing.assert_close(refwd, cached, atol=logit_tolerance(out.sequences.shape[1], cached), rtol=0)


@pytest.mark.slow
def test_same_seed_identical_different_seed_differs(tmp_path, monkeypatch):
    """The build is a function of its seed: two builds through the CLI are byte-identical, another
    seed gives other weights. Every stage runs (tokenizer, text and vision pre-training), shortened
    to a few steps: the same code as the default build, at a tenth of its time."""
    import dataclasses

    from safetensors.torch import load_file

    spec = tiny.tiny_spec("qwen2_5_vl")
    assert spec.pretrain_steps > 0 and spec.vision_pretrain_steps > 0  # the stages the short build keeps
    short = dataclasses.replace(spec, pretrain_steps=12, vision_pretrain_steps=12)
    monkeypatch.setattr(tiny, "tiny_spec", lambda family: short)
    first, again, other = tmp_path / "first", tmp_path / "again", tmp_path / "other"
    tiny_cli.main(["--family", "qwen2_5_vl", "--out", str(first), "--seed", "0"])
    tiny_cli.main(["--family", "qwen2_5_vl", "--out", str(again), "--seed", "0"])
    tiny.build_tiny_model("qwen2_5_vl", other, seed=1)
    ref, rebuilt, reseeded = (load_file(str(d / "model.safetensors")) for d in (first, again, other))
    assert ref.keys() == rebuilt.keys() == reseeded.keys()
    assert all(torch.equal(ref[k], rebuilt[k]) for k in ref)
    # Random matrices differ with another seed (norm weights start at 1 for every seed).
    randomly_initialised = [k for k in ref if ref[k].dim() == 2]
    assert randomly_initialised and all(not torch.equal(ref[k], reseeded[k]) for k in randomly_initialised)
    # The tokenizer does not depend on the weight seed and is trained deterministically.
    assert (
        (first / "tokenizer.json").read_bytes()
        == (again / "tokenizer.json").read_bytes()
        == (other / "tokenizer.json").read_bytes()
    )
    record = json.loads((first / "tiny_build.json").read_text())
    assert record["vision_pretrain"]["steps"] == 12  # the vision stage did run


@pytest.mark.parametrize("family", tiny.QWEN_FAMILIES)
def test_special_tokens_match_model_config(family, tiny_family_path):
    from transformers import AutoConfig

    path = tiny_family_path(family)
    tok = load_processor(path).tokenizer
    config = AutoConfig.from_pretrained(path)
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS}
    assert len(set(ids.values())) == len(tiny.SPECIAL_TOKENS)
    for t, i in ids.items():  # each special token is one atomic token, never split
        assert tok(t, add_special_tokens=False)["input_ids"] == [i]
    assert config.image_token_id == ids["<|image_pad|>"]
    assert config.video_token_id == ids["<|video_pad|>"]
    assert config.vision_start_token_id == ids["<|vision_start|>"]
    assert config.vision_end_token_id == ids["<|vision_end|>"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = config.get_text_config()
    assert text.vocab_size >= len(tok) and text.vocab_size % 64 == 0
    assert text.hidden_size // text.num_attention_heads == 2 * sum(text.rope_parameters["mrope_section"])


def test_tokenizer_writes_the_action_format_in_few_tokens(tiny_model_path):
    tok = load_processor(tiny_model_path).tokenizer
    answer = json.dumps({"thoughts": "", "action": {"answer": "B"}})
    move = json.dumps(
        {"thoughts": "The chair is to my left.", "action": {"rotation_angle_degrees": -90, "forward_meters": 1.5}}
    )
    # A byte-level tokenizer without merges would need one token per byte (43 for the answer).
    assert len(tok(answer)["input_ids"]) <= 16
    assert len(tok(move)["input_ids"]) <= 40
    for text in (answer, move, 'Größe 3.25 m², 家具 {"a": [1, 2]}\n\ttab'):
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text  # byte-level BPE round-trips any text exactly
        offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
        assert offsets[0][0] == 0 and offsets[-1][1] == len(text)  # offsets cover the text (span splitting)


def test_chat_template_is_qwen_format(tiny_model_path):
    processor = load_processor(tiny_model_path)
    messages = _messages(2, "Where?") + [{"role": "assistant", "content": [{"type": "text", "text": "Here."}]}]
    got = processor.apply_chat_template(messages, tokenize=False)
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    expected = (
        "<|im_start|>system\nYou are an agent.<|im_end|>\n"
        f"<|im_start|>user\n{vision}{vision}Where?<|im_end|>\n"
        "<|im_start|>assistant\nHere.<|im_end|>\n"
    )
    assert got == expected
    prompt = processor.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_forbidden_tokens_are_never_generated_when_suppressed(tiny_model_path):
    loaded = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu"))
    model, processor = loaded.model, loaded.processor
    tok = processor.tokenizer
    vocab = model.config.get_text_config().vocab_size
    forbidden = forbidden_token_ids(processor, vocab_size=vocab)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end not in forbidden
    for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>", "<|endoftext|>"):
        assert tok.convert_tokens_to_ids(t) in forbidden
    assert set(range(len(tok), vocab)) <= set(forbidden)  # unused embedding rows

    batch = _batch(processor, [(1, "Go."), (1, "Answer now.")], _frames(2))
    # Push every forbidden id far above the rest, so without suppression they would be sampled.
    bias = [[[i], 30.0] for i in forbidden]
    n = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    free = model.generate(**batch, max_new_tokens=8, do_sample=True, sequence_bias=bias)[:, n:]
    assert set(free.flatten().tolist()) & set(forbidden)
    torch.manual_seed(0)
    held = model.generate(**batch, max_new_tokens=8, do_sample=True, sequence_bias=bias, suppress_tokens=forbidden)[
        :, n:
    ]
    # What a row sampled: up to and including its <|im_end|>; generate pads a finished row with
    # <|endoftext|> (the pad token, which is forbidden as a sample, not as padding).
    sampled = [t for row in held.tolist() for t in (row[: row.index(im_end) + 1] if im_end in row else row)]
    assert sampled and not set(sampled) & set(forbidden)


def test_loader_applies_dtype_attention_and_pixel_budget(tiny_model_path):
    # min = max = one merged patch (28x28 pixels): every frame becomes exactly one image token.
    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        dtype="bfloat16",
        attn_implementation="eager",
        min_pixels=784,
        max_pixels=784,
    )
    loaded = load_vlm(cfg)
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "eager"
    batch = _batch(loaded.processor, [(2, "Two frames.")], _frames(2))
    assert int((batch["input_ids"] == loaded.model.config.image_token_id).sum()) == 2
    with torch.no_grad():
        assert torch.isfinite(loaded.model(**batch).logits.float()).all()


def test_missing_local_path_names_it_and_suggests_tiny(tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ModelLoadError) as err:
        load_vlm(ModelConfig(model_path=missing, device="cpu"))
    assert missing in str(err.value) and "tiny:qwen2_5_vl" in str(err.value)
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model_path(str(tmp_path))  # exists, but is not a saved model
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model_path(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path("outputs/sft/checkpoint-9")  # two slashes: a path, never a hub id


def test_unknown_tiny_family_and_uncached_hub_id_raise_offline():
    with pytest.raises(ModelLoadError, match="tiny:qwen3_vl"):
        resolve_model_path("tiny:gpt2")
    with pytest.raises(ModelLoadError, match="offline"):
        resolve_model_path("vsi-ppo-tests/definitely-not-cached-model")


def test_unsupported_model_type_lists_families(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(
        tmp_path
    )
    with pytest.raises(ModelLoadError) as err:
        load_vlm(ModelConfig(model_path=str(tmp_path), device="cpu"))
    message = str(err.value)
    assert "'bert'" in message and all(f in message for f in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    assert {detect_family(t) for t in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")} == {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
    assert set(tiny.FAMILIES) <= set(SUPPORTED_FAMILIES)


@pytest.mark.slow
def test_cache_builds_once_under_concurrency_then_reuses(tmp_path, monkeypatch):
    builds = []
    real_build = tiny.build_tiny_model

    def counting_build(family, out_dir, seed=0, base_dir=None):
        builds.append(family)
        return real_build(family, out_dir, seed=seed, base_dir=base_dir)

    monkeypatch.setattr(tiny, "build_tiny_model", counting_build)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.tiny_model_dir("qwen2_vl", cache_dir=tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(results) == 2 and results[0] == results[1]
    marker = results[0] / "tiny_build.json"
    mtime = marker.stat().st_mtime_ns
    assert tiny.tiny_model_dir("qwen2_vl", cache_dir=tmp_path) == results[0]
    assert len(builds) == 1 and marker.stat().st_mtime_ns == mtime
    # Only the finished directory and its lock file remain: no half-built temp directories.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [results[0].name]
    assert tiny.TINY_VERSION in results[0].name and tiny.spec_hash("qwen2_vl", tiny.default_seed()) in results[0].name


def test_tiny_seed_env_selects_the_build_and_rejects_a_bad_value_in_one_line(tmp_path, monkeypatch):
    """``$VSI_TINY_SEED`` picks the seed of ``tiny:<family>``'s build (its own cache directory); a
    value that is not a seed stops the load with one line that names the variable."""
    from a2c_ppo_acktr.common.errors import UserError

    built = []

    def fake_build(family, out, seed, base=None):  # the cache's bookkeeping only: no weights needed
        built.append(seed)
        (out / "tiny_build.json").write_text("{}")

    monkeypatch.setattr(tiny, "_build_in_clean_process", fake_build)
    monkeypatch.setenv("VSI_CACHE", str(tmp_path))
    monkeypatch.delenv(tiny.SEED_ENV, raising=False)
    assert tiny.default_seed() == 0
    for raw, seed in (("7", 7), (" 2 ", 2), ("", 0)):
        monkeypatch.setenv(tiny.SEED_ENV, raw)
        path = Path(resolve_model_path("tiny:qwen2_vl"))
        assert path.name.startswith(f"qwen2_vl-seed{seed}-") and tiny.spec_hash("qwen2_vl", seed) in path.name
        assert path == tiny.tiny_model_dir("qwen2_vl")  # built once, then the cache
    assert built == [7, 2, 0]
    assert tiny.tiny_model_dir("qwen2_vl", seed=5).name.startswith("qwen2_vl-seed5-")  # an explicit seed wins
    for bad in ("abc", "-1", "1.5", "0x10", str(2**32)):
        monkeypatch.setenv(tiny.SEED_ENV, bad)
        with pytest.raises(UserError, match=f"VSI_TINY_SEED={bad!r}.*integer from 0 to 4294967295") as err:
            resolve_model_path("tiny:qwen2_5_vl")
        assert "\n" not in str(err.value)
    assert built == [7, 2, 0, 5]


def test_pretraining_teaches_the_reply_format_not_the_task(tiny_model_path):
    """The build's few seconds of language modelling make a reply it never saw likely.

    A random model's loss on any text is about ln(vocab) (uniform logits); after pretraining an
    unseen action-format reply (new wording, numbers and answer) costs far less per token.
    """
    import math

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from a2c_ppo_acktr.common.prompts import Move, format_response

    info = json.loads((Path(tiny_model_path) / "tiny_build.json").read_text())
    first, last = info["pretrain_loss_first_last"]
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    vocab = len(tok)
    assert abs(first - math.log(vocab)) < 1.0 and last < first / 4
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    reply = format_response("The lamp is to my left; turning toward it.", Move(rotation_deg=75.0, forward_m=1.2))
    ids = tok(f"<|im_start|>assistant\n{reply}<|im_end|>\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    assert loss < 0.6 * math.log(vocab), loss


@pytest.mark.slow
def test_cache_build_writes_the_whole_model_on_a_nonzero_rank(tmp_path, monkeypatch):
    """Under torchrun, rank 1 may take the lock and build the cache. transformers' save_pretrained
    writes nothing on a rank other than 0, which once left a cache entry without config.json or
    weights that failed every later load; the build must come out whole whatever the rank."""
    import torch.distributed as dist

    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.config.arguments import ModelConfig

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)
    path = tiny.tiny_model_dir("qwen2_vl", cache_dir=tmp_path)
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    monkeypatch.undo()
    loaded = load_vlm(ModelConfig(model_path=str(path), device="cpu"))
    assert loaded.family == "qwen2_vl"


def test_untested_library_versions_stop_the_load_in_one_line(tiny_model_path, monkeypatch):
    from a2c_ppo_acktr.policy import loading

    assert loading.untested_versions() == []  # what the suite runs on is inside the pins
    assert (
        loading.untested_versions(
            {"transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0", "deepspeed": "0.19.8"}
        )
        == []
    )
    old = {"transformers": "4.57.1", "peft": "0.17.0", "accelerate": "1.15.0rc1", "deepspeed": "0.15.4"}
    bad = loading.untested_versions(old)
    assert [b.split()[0] for b in bad] == ["transformers", "peft", "deepspeed"], bad
    assert bad[0] == "transformers 4.57.1 (tested: >=5.24,<6.0)"
    assert loading.untested_versions({"transformers": "6.0.0.dev0"}) == [
        "transformers 6.0.0.dev0 (tested: >=5.24,<6.0)"
    ]
    monkeypatch.setattr(loading, "untested_versions", lambda installed=None: bad)
    monkeypatch.delenv(loading.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(ModelLoadError, match=r"untested library versions: transformers 4\.57\.1") as err:
        load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu"))
    assert "\n" not in str(err.value) and loading.ALLOW_UNTESTED_ENV in str(err.value)
    monkeypatch.setenv(loading.ALLOW_UNTESTED_ENV, "1")
    assert load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu")).family == "qwen2_5_vl"


def test_families_that_would_run_wrong_are_refused_with_the_reason():
    from a2c_ppo_acktr.policy.loading import REFUSED_FAMILIES

    for model_type, fragment in (("llava_onevision", "anyres"),):
        with pytest.raises(ModelLoadError, match=fragment) as err:
            detect_family(model_type)
        assert "\n" not in str(err.value) and model_type in REFUSED_FAMILIES
    assert not set(REFUSED_FAMILIES) & set(SUPPORTED_FAMILIES)


def test_a_prompt_past_the_models_positions_stops_in_one_line(tiny_model_path, tmp_path):
    """prompt + max_new_tokens > max_position_embeddings: one line naming the settings to lower,
    before any generation (a model past its positions degrades without an error)."""
    import shutil

    from a2c_ppo_acktr.policy.loading import ContextLengthError
    from a2c_ppo_acktr.policy.model import VLMPolicy

    path = tmp_path / "short"
    shutil.copytree(tiny_model_path, path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 300
    (path / "config.json").write_text(json.dumps(config))
    cfg = ModelConfig(
        model_path=str(path),
        device="cpu",
        max_new_tokens=16,
        lora_r=2,
        lora_alpha=4,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    policy = VLMPolicy(cfg)
    assert policy.context_limit == 300
    short = {"images": [], "text": "Hi"}
    long = {"images": _frames(8), "text": "How many chairs are in the room? " * 4}
    policy.act([short])  # fits
    with pytest.raises(
        ContextLengthError, match=r"a prompt of \d+ tokens \+ model.max_new_tokens 16 exceeds the model's 300 positions"
    ) as err:
        policy.act([short, long])
    assert "env.num_sweep_frames" in str(err.value) and "\n" not in str(err.value)


def test_auto_attention_is_flash_attention_only_where_it_can_run(monkeypatch):
    from a2c_ppo_acktr.policy import loading

    monkeypatch.setattr(loading, "flash_attn_importable", lambda: True)
    assert loading.resolve_attn_implementation("auto", "cuda", "bfloat16") == "flash_attention_2"
    assert loading.resolve_attn_implementation("auto", "cuda:3", "float16") == "flash_attention_2"
    assert (
        loading.resolve_attn_implementation("auto", "cuda", "float32") == "sdpa"
    )  # flash attention has no fp32 kernels
    assert loading.resolve_attn_implementation("auto", "cpu", "bfloat16") == "sdpa"
    assert loading.resolve_attn_implementation("eager", "cuda", "bfloat16") == "eager"  # an explicit choice is kept
    monkeypatch.setattr(loading, "flash_attn_importable", lambda: False)
    assert loading.resolve_attn_implementation("auto", "cuda", "bfloat16") == "sdpa"
    assert ModelConfig(attn_implementation="auto").attn_implementation == "auto"  # resolved at load, not in the config


def test_a_build_is_keyed_by_its_code_not_by_comments_docstrings_or_layout(tmp_path):
    """``code_digest`` (what the tiny build's cache key hashes of its modules) changes when the code
    changes and stays when only a comment, a docstring or the layout does."""
    module = tmp_path / "m.py"
    variants = {
        "base": '"""Doc."""\nSTEPS = 300\n\n\ndef f(x):\n    """Twice."""\n    return 2 * x  # double\n',
        "comment": '"""Doc."""\nSTEPS = 300  # a comment\n\n\ndef f(x):\n    """Twice."""\n    return 2 * x\n',
        "docstring": '"""Another doc."""\nSTEPS = 300\n\n\ndef f(x):\n    """Two times x."""\n    return 2 * x\n',
        "layout": '"""Doc."""\nSTEPS = (\n    300\n)\ndef f(x):\n    """Twice."""\n    return 2*x\n',
        "code": '"""Doc."""\nSTEPS = 301\n\n\ndef f(x):\n    """Twice."""\n    return 2 * x  # double\n',
        "no docstring, same code": "STEPS = 300\n\n\ndef f(x):\n    return 2 * x\n",
    }
    digests = {}
    for name, text in variants.items():
        module.write_text(text)
        digests[name] = tiny.code_digest(module)
    assert digests["code"] != digests["base"]
    assert {digests[k] for k in variants if k != "code"} == {digests["base"]}


@pytest.mark.slow
def test_a_build_on_top_of_another_starts_from_its_weights_and_checks_the_base(tmp_path, monkeypatch):
    """``qwen2_5_vl-rooms`` is a vision stage on top of the default build: with no steps it is the base
    weight for weight (so it starts from them, not from fresh ones), with steps it moves away; its
    record names the base; a base of another seed, or a directory that is no build, is refused."""
    import dataclasses

    from safetensors.torch import load_file

    base_spec = dataclasses.replace(tiny.tiny_spec("qwen2_5_vl"), pretrain_steps=12, vision_pretrain_steps=12)
    rooms = tiny.tiny_spec("qwen2_5_vl-rooms")
    assert rooms.vision_base == "qwen2_5_vl" and rooms.vision_pretrain_tasks == ("room_size",)
    specs = {
        "qwen2_5_vl": base_spec,
        "qwen2_5_vl-rooms": dataclasses.replace(rooms, vision_pretrain_steps=0),
        "qwen2_vl": tiny.tiny_spec("qwen2_vl"),
    }
    monkeypatch.setattr(tiny, "tiny_spec", lambda family: specs[family])
    monkeypatch.setattr(tiny, "_spec_hash", tiny._spec_hash.__wrapped__)  # uncached: the specs change below
    base, other_seed = tmp_path / "base", tmp_path / "base1"
    tiny.build_tiny_model("qwen2_5_vl", base, seed=0)
    tiny.build_tiny_model("qwen2_5_vl", other_seed, seed=1)
    same = tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "same", seed=0, base_dir=base)
    ref, copy = load_file(str(base / "model.safetensors")), load_file(str(same / "model.safetensors"))
    assert ref.keys() == copy.keys() and all(torch.equal(ref[k], copy[k]) for k in ref)
    record = json.loads((same / "tiny_build.json").read_text())
    assert record["base"] == {"build": "qwen2_5_vl", "spec_hash": tiny.spec_hash("qwen2_5_vl", 0)}
    # The base's definition is part of this build's: another base spec, another cache key.
    before = tiny.spec_hash("qwen2_5_vl-rooms", 0)
    specs["qwen2_5_vl"] = dataclasses.replace(base_spec, pretrain_steps=13)
    assert tiny.spec_hash("qwen2_5_vl-rooms", 0) != before
    specs["qwen2_5_vl"] = base_spec

    specs["qwen2_5_vl-rooms"] = dataclasses.replace(rooms, vision_pretrain_steps=3, vision_pretrain_scenes=3)
    moved = load_file(
        str(tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "moved", seed=0, base_dir=base) / "model.safetensors")
    )
    vision = [k for k in ref if ".visual." in k or k.startswith("visual.") or "visual" in k.split(".")[:3]]
    assert vision and any(not torch.equal(ref[k], moved[k]) for k in vision)

    # Its samples rendered beforehand (the quickstart renders them beside the base's build): the same weights.
    rendered = tmp_path / "rooms.npz"
    tiny_cli.main(["--family", "qwen2_5_vl-rooms", "--render-samples", str(rendered)])
    kept = rendered.read_bytes()
    with pytest.raises(SystemExit):  # an existing file is not replaced
        tiny_cli.main(["--family", "qwen2_5_vl-rooms", "--render-samples", str(rendered)])
    assert rendered.read_bytes() == kept
    from_file = tiny.build_tiny_model(
        "qwen2_5_vl-rooms", tmp_path / "from_file", seed=0, base_dir=base, samples_path=rendered
    )
    again = load_file(str(from_file / "model.safetensors"))
    assert all(torch.equal(moved[k], again[k]) for k in moved)
    specs["qwen2_5_vl-rooms"] = dataclasses.replace(rooms, vision_pretrain_steps=3, vision_pretrain_scenes=4)
    with pytest.raises(tiny.TinySamplesError, match=r"another vision pre-training .* \['scenes'\]"):
        tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "stale", seed=0, base_dir=base, samples_path=rendered)
    rendered.write_bytes(rendered.read_bytes()[:1000])
    with pytest.raises(tiny.TinySamplesError, match="is not a file of rendered vision pre-training samples"):
        tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "cut", seed=0, base_dir=base, samples_path=rendered)
    with pytest.raises(SystemExit):  # one line, before anything is claimed
        tiny_cli.main(["--family", "qwen2_5_vl-rooms", "--samples", str(rendered), "--out", str(tmp_path / "cli")])
    with pytest.raises(SystemExit):
        tiny_cli.main(
            ["--family", "qwen2_5_vl-rooms", "--render-samples", str(rendered), "--out", str(tmp_path / "cli")]
        )
    with pytest.raises(SystemExit):  # a build without a vision stage has nothing to render
        tiny_cli.main(["--family", "qwen2_vl", "--render-samples", str(tmp_path / "none.npz")])
    assert not (tmp_path / "cli").exists()

    with pytest.raises(tiny.TinyBaseError, match=r"holds the tiny build 'qwen2_5_vl' of seed 1 .* seed 0"):
        tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "wrong", seed=0, base_dir=other_seed)
    with pytest.raises(tiny.TinyBaseError, match="is not a tiny build"):
        tiny.build_tiny_model("qwen2_5_vl-rooms", tmp_path / "none", seed=0, base_dir=tmp_path / "missing")
    with pytest.raises(SystemExit):  # the CLI says it in one line before building anything
        tiny_cli.main(["--family", "qwen2_5_vl-rooms", "--base", str(other_seed), "--out", str(tmp_path / "cli")])
    assert not (tmp_path / "cli").exists()
    with pytest.raises(SystemExit):
        tiny_cli.main(["--family", "qwen2_5_vl", "--base", str(base), "--out", str(tmp_path / "cli")])

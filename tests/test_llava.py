"""LLaVA on the tiny offline ``llava`` model: loading, the policy's rollout/update invariants, what
trains, and one SFT run. Numbers are checked against invariants (ratio 1, KL 0, weights that must
or must not move), as for Qwen in test_policy.py and test_sft.py; what every family must do (greedy
acting, what an update moves, the projector's training) is one parametrized test each in
test_families.py."""

import copy
import json

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.tiny import build as tiny
from a2c_ppo_acktr.tiny import cli as tiny_cli
from a2c_ppo_acktr.policy.loading import LoadedVLM, ModelLoadError, load_processor, load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage
from SFT.data import IGNORE_INDEX, SFTCollator
from helpers import (
    NUM_ENVS,
    fresh_policy,
    policy_observations,
    policy_rollout,
    sft_observation,
    tiny_model_cfg,
    write_sft_rows,
)
from numerics import f32_tolerance, logit_terms, recorded_forwards, widest


@pytest.fixture(scope="module", params=["llava", "llava_next"])
def llava_path(tiny_family_path, request) -> str:
    """LLaVA-1.5's class and LLaVA-1.6's (llava_next: anyres tiles, RL4VLM's model class)."""
    return tiny_family_path(request.param)


@pytest.fixture(scope="module")
def llava_loaded(llava_path) -> LoadedVLM:
    return load_vlm(tiny_model_cfg(llava_path))


def _policy(loaded, **over) -> VLMPolicy:
    return fresh_policy(loaded, loaded.path, **over)


@pytest.fixture(scope="module")
def llava_storage(llava_loaded) -> RolloutStorage:
    """One rollout shared by the tests (every fresh policy starts from the same weights)."""
    return policy_rollout(_policy(llava_loaded))


# ----------------------------------------------------------------------------- the tiny model
def test_tiny_llava_is_a_real_llava_with_its_own_cache_key(llava_loaded, capsys):
    from transformers import LlavaForConditionalGeneration, LlavaNextForConditionalGeneration

    cls = {"llava": LlavaForConditionalGeneration, "llava_next": LlavaNextForConditionalGeneration}[llava_loaded.family]
    assert type(llava_loaded.model) is cls
    assert llava_loaded.model.config.text_config.model_type == "llama"
    assert llava_loaded.model.config.vision_config.model_type == "clip_vision_model"
    assert llava_loaded.family in tiny.FAMILIES and llava_loaded.family not in tiny.QWEN_FAMILIES
    keys = {f: tiny.spec_hash(f, 0) for f in tiny.FAMILIES}
    assert len(set(keys.values())) == len(keys)  # one cache directory per family
    tiny_cli.main(
        ["--family", llava_loaded.family]
    )  # the CLI (and so a build in a child process) takes LLaVA: cached, prints the dir
    assert capsys.readouterr().out.strip() == llava_loaded.path


def test_processor_expands_each_image_and_forbids_placeholders(llava_loaded):
    proc, cfg = llava_loaded.processor, llava_loaded.model.config
    tok = proc.tokenizer
    assert tok.padding_side == "left"
    image_id = cfg.image_token_id
    assert tok.convert_tokens_to_ids("<image>") == image_id
    obs = policy_observations(np.random.default_rng(0), 1)
    texts = [prompts.render_prompt(proc, prompts.build_messages(o)) for o in obs]
    assert [t.count("<image>") for t in texts] == [len(o["images"]) for o in obs]
    assert all(t.endswith("<|im_start|>assistant\n") for t in texts)
    enc = proc(text=texts, images=[im for o in obs for im in o["images"]], padding=True, return_tensors="pt")
    per_row = (enc["input_ids"] == image_id).sum(1).tolist()
    assert enc["pixel_values"].shape[0] == sum(len(o["images"]) for o in obs)
    if llava_loaded.family == "llava":
        assert per_row == [cfg.image_seq_length * len(o["images"]) for o in obs]  # 4 tokens a frame, any frame size
    else:  # anyres: the base view's 4 tokens plus each image's tiles and row ends, by its size
        assert enc["pixel_values"].dim() == 5 and enc["image_sizes"].shape == (enc["pixel_values"].shape[0], 2)
        assert all(n > cfg.image_seq_length * len(o["images"]) for n, o in zip(per_row, obs))
    assert (enc["attention_mask"][:, -1] == 1).all() and (enc["attention_mask"][:, 0] == 0).any()  # left padding
    policy = _policy(llava_loaded)
    forbidden = set(policy.forbidden_ids.tolist())
    assert image_id in forbidden and tok.convert_tokens_to_ids("<|im_end|>") not in forbidden
    assert policy.pad_id == tok.pad_token_id and policy.eos_ids
    # CLIP resizes to a fixed size: a Qwen-style pixel budget is refused with the fix, not misapplied.
    with pytest.raises(ModelLoadError, match="unset model.min_pixels"):
        load_processor(llava_loaded.path, min_pixels=28 * 28, max_pixels=56 * 56)


# ----------------------------------------------------------------------------- policy
def test_first_minibatch_ratio_is_one_and_kl_zero(llava_loaded, llava_storage):
    st = llava_storage
    assert len({len(p) for p in st.prompt_ids}) > 1 and max(len(im) for im in st.images) == 3
    assert all(len(g) >= 1 for g in st.generated_ids)
    policy = _policy(llava_loaded)
    # Positions as generate numbers them: from each row's first real token, whatever the padding.
    enc = policy._encode(st.prompts[:NUM_ENVS], st.images[:NUM_ENVS])
    positions = policy._with_positions(enc)["position_ids"]
    assert positions[:, -1].tolist() == [len(p) - 1 for p in st.prompt_ids[:NUM_ENVS]]
    assert (positions[enc["attention_mask"] == 0] == 0).all()
    policy.train()
    for mb in st.minibatches(2, torch.Generator().manual_seed(5)):  # a batch layout unlike act()'s
        with recorded_forwards(VLMPolicy) as forwards:
            out = policy.evaluate_actions(mb, with_kl=True)
        bounds = forwards[0]  # the same turns in other batches: rounding only (numerics.forward_bounds)
        assert (out.log_probs - mb.old_log_probs).exp().sub(1).abs().max().item() < bounds.ratio
        torch.testing.assert_close(out.values.detach(), mb.old_values, atol=bounds.value, rtol=0)
        assert out.kl.abs().max().item() < 1e-6  # adapter-disabled reference == policy before any update


def test_per_row_temperatures_score_alike_in_generate_and_recompute(llava_loaded):
    """A perturbed temperature head gives every row its own T; generate's log-probs, values and
    tokens equal the training forward's (``recompute``) under those temperatures."""
    policy = _policy(llava_loaded, temperature=0.8, min_temperature=0.3, max_temperature=2.0)
    with torch.no_grad():
        policy.temp_predictor.mlp[-1].weight.normal_(0.0, 1.0)
    obs = policy_observations(np.random.default_rng(7), 1)
    torch.manual_seed(3)
    got = policy.act(obs)
    assert got.temperatures.unique().numel() == NUM_ENVS
    policy.cfg.rollout_log_probs = "recompute"
    torch.manual_seed(3)
    with recorded_forwards(VLMPolicy) as forwards:
        again = policy.act(obs)
    assert [g.tolist() for g in again.generated_ids] == [g.tolist() for g in got.generated_ids]
    # generate's cached steps against one training forward: rounding only (numerics.forward_bounds);
    # get_values forwards the prompt alone, fewer positions than the recompute's
    bounds = widest(forwards)
    torch.testing.assert_close(again.log_probs, got.log_probs, atol=bounds.log_prob, rtol=0)
    torch.testing.assert_close(again.values, got.values, atol=bounds.value, rtol=0)
    torch.testing.assert_close(again.temperatures, got.temperatures, atol=bounds.temperature, rtol=0)
    torch.testing.assert_close(policy.get_values(obs), got.values, atol=bounds.value, rtol=0)  # same hidden state


# ----------------------------------------------------------------------------- SFT
def test_sft_collator_labels_only_the_reply(llava_loaded):
    proc = llava_loaded.processor
    tok = proc.tokenizer
    rng = np.random.default_rng(1)
    responses = [
        prompts.format_response("I count 3 chairs.", prompts.Answer("3")),
        prompts.format_response("Turn.", prompts.Move(-45.0, 1.0)),
    ]
    observations = [sft_observation(rng, 1), sft_observation(rng, 2)]
    rows = [
        {"messages": prompts.build_messages(o) + [prompts.assistant_message(r)], "images": o["images"]}
        for o, r in zip(observations, responses)
    ]
    batch = SFTCollator(proc, max_length=4096)(rows)
    image_id = llava_loaded.model.config.image_token_id
    for i, (obs, resp) in enumerate(zip(observations, responses)):
        rl = proc(
            text=[prompts.render_prompt(proc, prompts.build_messages(obs))], images=obs["images"], return_tensors="pt"
        )
        n = rl["input_ids"].shape[1]
        assert torch.equal(batch["input_ids"][i, :n], rl["input_ids"][0])  # the policy's own prompt tokens
        labelled = torch.nonzero(batch["labels"][i] != IGNORE_INDEX).flatten().tolist()
        assert labelled == list(range(n, int(batch["attention_mask"][i].sum())))
        assert tok.decode(batch["labels"][i, labelled]) == resp + "<|im_end|>"
        tokens_per_image = (
            4 if llava_loaded.family == "llava" else 24
        )  # llava_next, a 32 px square: base 4 + 2x2 tiles' 16 + 4 row ends
        assert (batch["input_ids"][i, :n] == image_id).sum() == tokens_per_image * len(obs["images"])
    with torch.no_grad():
        out = llava_loaded.model(**batch)
    targets = batch["labels"][:, 1:]
    mask = targets != IGNORE_INDEX
    logits = out.logits[:, :-1][mask].float()
    manual = torch.nn.functional.cross_entropy(logits, targets[mask])
    # the same logits, two cross-entropies: a log-sum-exp over V per label (at max |logit| + 1), then their mean
    atol = f32_tolerance(logit_terms(0, logits.shape[-1]), float(logits.abs().max()) + 1.0) + f32_tolerance(
        logits.shape[0], float(manual)
    )
    torch.testing.assert_close(out.loss, manual, atol=atol, rtol=0)


def test_sft_steps_train_language_lora_and_warm_start_the_policy(llava_loaded, tmp_path):
    from a2c_ppo_acktr.config.arguments import load_config
    from SFT.trainer import TRAIN_LOG, run_sft

    rng = np.random.default_rng(6)
    rows = [
        (sft_observation(rng, 1 + i % 2), prompts.format_response("Three chairs.", prompts.Answer("3")))
        for i in range(4)
    ]
    (tmp_path / "data").mkdir()
    write_sft_rows(tmp_path / "data", rows)
    cfg = load_config(
        preset="debug",
        overrides={
            "model": {"model_path": llava_loaded.path, "device": "cpu"},
            "sft": {
                "data_path": str(tmp_path / "data" / "train.jsonl"),
                "output_dir": str(tmp_path / "sft"),
                "max_steps": 2,
                "per_device_batch_size": 2,
                "save_steps": 2,
                "logging_steps": 1,
                "lr": 1e-2,
                "warmup_ratio": 0.0,
            },
            "log": {"progress_bar": False},
        },
    )
    model = copy.deepcopy(llava_loaded.model)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapter = run_sft(
        cfg,
        loaded=LoadedVLM(
            model=model, processor=llava_loaded.processor, family=llava_loaded.family, path=llava_loaded.path
        ),
    )
    log = [e for e in json.loads((tmp_path / "sft" / TRAIN_LOG).read_text()) if "loss" in e]
    assert [e["step"] for e in log] == [1, 2] and all(np.isfinite(e["loss"]) for e in log)
    trained = dict(model.named_parameters())  # peft injected LoRA into ``model`` in place
    lora_b = [n for n in trained if "lora_B" in n]
    assert lora_b and all("language_model" in n for n in lora_b)
    assert all(trained[n].detach().abs().sum() > 0 for n in lora_b)  # B starts at zero: every one moved
    base = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p for n, p in trained.items() if "lora_" not in n
    }
    assert set(base) == set(original)
    assert all(torch.equal(base[n].detach(), original[n]) for n in original)  # tower, projector, LM frozen
    # Warm start: the adapter loads into the policy key for key and moves it off the reference.
    policy = _policy(llava_loaded, lora_r=cfg.model.lora_r, lora_alpha=cfg.model.lora_alpha)
    policy.load_adapter(adapter)
    obs = policy_observations(np.random.default_rng(2), 0)
    act = policy.act(obs)
    st = RolloutStorage(1, NUM_ENVS)
    st.insert(act, torch.zeros(NUM_ENVS), torch.zeros(NUM_ENVS, dtype=torch.bool), torch.zeros(NUM_ENVS))
    st.compute_returns(torch.zeros(NUM_ENVS))
    mb = next(st.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    with torch.no_grad(), recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb, with_kl=True)
    assert (out.log_probs - mb.old_log_probs).abs().max().item() < forwards[0].log_prob
    assert out.kl.mean().item() > 1e-6


def test_llava_next_turns_with_different_tile_counts_share_a_minibatch(tiny_family_path):
    """A wide frame takes 1 x 2 tiles, a square one 2 x 2: the processor pads each batch to its own
    most tiles, so turns from two rollout steps are padded again when a minibatch joins them; the
    ratio is still 1."""
    loaded = load_vlm(tiny_model_cfg(tiny_family_path("llava_next")))
    policy = _policy(loaded)
    rng = np.random.default_rng(4)
    steps = [
        [{"images": [rng.integers(0, 256, shape, dtype=np.uint8)], "text": "How many chairs are in the room?"}]
        for shape in ((32, 96, 3), (48, 48, 3))
    ]
    st = RolloutStorage(2, 1)
    torch.manual_seed(0)
    for obs in steps:
        st.insert(policy.act(obs), torch.zeros(1), torch.zeros(1, dtype=torch.bool), torch.zeros(1))
    st.compute_returns(torch.zeros(1))
    tiles = [e.images[0]["pixel_values"].shape[1] for e in st.encodings]
    assert tiles == [3, 5]
    policy.train()
    (mb,) = list(st.minibatches(2, torch.Generator().manual_seed(0)))
    with recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb, with_kl=False)
    assert (out.log_probs - mb.old_log_probs).exp().sub(1).abs().max().item() < forwards[0].ratio

"""VLMPolicy on the tiny offline Qwen2.5-VL: rollout/update agreement, what trains, heads, KL, files."""

import copy
import dataclasses

import numpy as np
import pytest
import torch

import a2c_ppo_acktr.policy.distributions as dist
from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.config.arguments import EMBEDDING_LORA_TARGET, ModelConfig, PPOConfig
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage
from helpers import NUM_ENVS, NUM_STEPS, fresh_policy, policy_observations, policy_rollout, split_state, tiny_model_cfg
from numerics import f32_chain_tolerance, f32_tolerance, logit_terms, recorded_forwards, widest


@pytest.fixture(scope="module")
def storage(loaded, tiny_model_path) -> RolloutStorage:
    """One rollout shared by the tests: every fresh policy starts from the same weights, so the
    stored log-probs are on-policy for each of them. Tests must not modify it."""
    return policy_rollout(fresh_policy(loaded, tiny_model_path))


def test_first_minibatch_ratio_is_one_across_batch_layouts(loaded, tiny_model_path, storage):
    policy = fresh_policy(loaded, tiny_model_path)
    st = storage
    assert len({len(p) for p in st.prompt_ids}) > 1  # unequal prompt lengths: left padding differs per batch
    assert max(len(im) for im in st.images) == 3
    policy.train()
    gen = torch.Generator().manual_seed(5)
    for mb in st.minibatches(2, gen):  # batches mix turns of different steps: a different layout from act()
        with recorded_forwards(VLMPolicy) as forwards:
            out = policy.evaluate_actions(mb, with_kl=True)
        # Same turns, other batches: they differ by the rounding of the model's sums at this length,
        # at the magnitude of this forward's logits (numerics.forward_bounds).
        bounds = forwards[0]
        ratio = (out.log_probs - mb.old_log_probs).exp()
        assert (ratio - 1).abs().max().item() < bounds.ratio
        torch.testing.assert_close(out.values.detach(), mb.old_values, atol=bounds.value, rtol=0)
        # KL to the reference (adapter disabled) is 0 before any update: LoRA B starts at zero
        assert out.kl.abs().max().item() < 1e-6
    # the act() log-prob is the weighted sum of token log-probs of the generated ids (none masked)
    assert all(len(g) >= 1 for g in st.generated_ids)
    assert torch.isfinite(st.old_log_probs).all() and (st.old_log_probs < 0).all()


def test_rollout_log_prob_modes_agree(loaded, tiny_model_path, storage):
    """``generate`` mode (from generate's logits) and ``recompute`` mode (training forward) give the
    same tokens (same seed, same distribution), log-probs and values."""
    with recorded_forwards(VLMPolicy) as forwards:  # recompute's training forwards, inside act
        st = policy_rollout(fresh_policy(loaded, tiny_model_path, rollout_log_probs="recompute"))
    assert [g.tolist() for g in st.generated_ids] == [g.tolist() for g in storage.generated_ids]
    bounds = widest(forwards)  # generate's cached steps against one forward: rounding (numerics.forward_bounds)
    torch.testing.assert_close(st.old_log_probs, storage.old_log_probs, atol=bounds.log_prob, rtol=0)
    torch.testing.assert_close(st.values, storage.values, atol=bounds.value, rtol=0)


def test_temperature_head_gets_gradient_and_stays_in_range(loaded, tiny_model_path, storage):
    policy = fresh_policy(loaded, tiny_model_path, temperature=0.8, min_temperature=0.5, max_temperature=1.5)
    mb = next(storage.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    out = policy.evaluate_actions(mb)
    torch.testing.assert_close(out.temperatures.detach(), torch.full((NUM_ENVS,), 0.8))  # exact at init
    (-(out.log_probs * mb.advantages).mean()).backward()
    grad = policy.temp_predictor.mlp[-1].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    with torch.no_grad():  # push the head hard: the sigmoid keeps it in range
        policy.temp_predictor.mlp[-1].bias.fill_(1e4)
    assert policy.evaluate_actions(mb).temperatures.max().item() <= 1.5
    with torch.no_grad():
        policy.temp_predictor.mlp[-1].bias.fill_(-1e4)
    assert policy.evaluate_actions(mb).temperatures.min().item() >= 0.5


def test_fixed_temperature_when_predictor_off(loaded, tiny_model_path):
    policy = fresh_policy(loaded, tiny_model_path, use_temp_predictor=False, temperature=0.7)
    assert policy.temp_predictor is None
    assert not any(n.startswith("temp_predictor") for n, _ in policy.named_parameters())
    act = policy.act(policy_observations(np.random.default_rng(0), 0))
    assert torch.equal(act.temperatures, torch.full((NUM_ENVS,), 0.7))


def test_act_at_a_given_temperature_samples_and_scores_under_it(loaded, tiny_model_path):
    """Sampled evaluation: ``act(temperature=T)`` overrides the head for sampling and for the log-probs,
    in both rollout_log_probs modes, and leaves the head's own temperature in place afterwards."""
    policy = fresh_policy(loaded, tiny_model_path, temperature=0.8, min_temperature=0.2, max_temperature=2.0)
    obs = policy_observations(np.random.default_rng(5), 0)
    torch.manual_seed(11)
    got = policy.act(obs, temperature=0.3)
    assert torch.equal(got.temperatures, torch.full((NUM_ENVS,), 0.3))
    policy.cfg.rollout_log_probs = "recompute"
    try:
        torch.manual_seed(11)  # same draws: the same tokens, re-scored by the training forward
        with recorded_forwards(VLMPolicy) as forwards:
            again = policy.act(obs, temperature=0.3)
    finally:
        policy.cfg.rollout_log_probs = "generate"
    assert [g.tolist() for g in again.generated_ids] == [g.tolist() for g in got.generated_ids]
    # generate's cached steps against one training forward: rounding at max |logit| / 0.3 (numerics.forward_bounds)
    torch.testing.assert_close(again.log_probs, got.log_probs, atol=forwards[0].log_prob, rtol=0)
    enc = policy._encode(got.prompts, got.images)
    with torch.no_grad():
        at_head = policy._forward_turns(enc, got.generated_ids, got.token_weights, with_kl=False)
        with recorded_forwards(VLMPolicy) as forwards:
            at_03 = policy._forward_turns(enc, got.generated_ids, got.token_weights, with_kl=False, temperature=0.3)
    torch.testing.assert_close(at_03.log_probs, got.log_probs, atol=forwards[0].log_prob, rtol=0)
    assert (at_head.log_probs - got.log_probs).abs().max() > 1e-2  # the head's 0.8 scores them differently
    torch.testing.assert_close(policy.act(obs).temperatures, torch.full((NUM_ENVS,), 0.8))


def test_save_and_load_round_trip(loaded, tiny_model_path, tmp_path, storage):
    policy = fresh_policy(loaded, tiny_model_path)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    st = storage
    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter_config.json").is_file() and (tmp_path / "ckpt" / "heads.safetensors").is_file()
    other = fresh_policy(loaded, tiny_model_path)
    other.load_pretrained(tmp_path / "ckpt")
    mb = next(st.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        a, b = policy.evaluate_actions(mb), other.evaluate_actions(mb)
    torch.testing.assert_close(a.log_probs, b.log_probs)
    torch.testing.assert_close(a.values, b.values)
    torch.testing.assert_close(a.temperatures, b.temperatures)
    wrong = fresh_policy(loaded, tiny_model_path, lora_r=2, lora_alpha=4)
    with pytest.raises(ValueError, match="lora_r"):
        wrong.load_adapter(tmp_path / "ckpt")


def test_thought_tokens_found_with_the_real_tokenizer(loaded):
    """Byte-level BPE: the tokens marked as thoughts cover the thoughts value and nothing else."""
    from a2c_ppo_acktr.common import prompts
    from a2c_ppo_acktr.policy.distributions import response_token_weights, token_char_ends

    tok = loaded.processor.tokenizer
    text = prompts.format_response("the chair is left of the bed, café", prompts.Move(30, 1.5))
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert tok.decode(ids, skip_special_tokens=True) == text
    w = response_token_weights(tok, ids, 0.25)
    ends = token_char_ends(tok, ids)
    t0, t1 = prompts.response_spans(text)[0]
    starts = [0] + ends[:-1]
    thought_chars = "".join(text[s:e] for s, e, wi in zip(starts, ends, w.tolist()) if wi == 0.25)
    other_chars = "".join(text[s:e] for s, e, wi in zip(starts, ends, w.tolist()) if wi == 1.0)
    assert (
        text[t0:t1] in thought_chars and len(thought_chars) <= (t1 - t0) + 4
    )  # boundary tokens may carry a quote/comma
    assert "rotation_angle_degrees" in other_chars and "café" not in other_chars
    assert w[-1] == 1.0  # the end-of-turn token counts as action


def test_non_finite_loss_leaves_every_policy_weight_untouched(loaded, tiny_model_path, storage):
    policy = fresh_policy(loaded, tiny_model_path)
    st = copy.deepcopy(storage)
    st.advantages.fill_(float("nan"))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    out = PPO(policy, opt, PPOConfig(ppo_epochs=1, mini_batch_size=3, norm_adv=False), seed=0).update(st)
    assert out["losses/skipped_minibatches"] == 2
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), k


def _naive_forward_turns(policy, enc, generated_ids, token_weights, with_kl):
    """The training forward as it was before chunking: the model's full (B, R+1, V) logits, then
    process_logits / token_log_probs / token_entropy / token_kl on (B, R, V) float32 tensors. Also
    returns the processed logits ``z`` (and ``z_ref``) and the temperatures."""
    from a2c_ppo_acktr.policy.distributions import (
        masked_mean,
        process_logits,
        sequence_log_prob,
        token_entropy,
        token_kl,
        token_log_probs,
    )

    B, R = len(generated_ids), max(len(g) for g in generated_ids)
    resp = torch.full((B, R), policy.pad_id, dtype=torch.long)
    mask = torch.zeros(B, R, dtype=torch.bool)
    weights = torch.zeros(B, R)
    for i, (g, w) in enumerate(zip(generated_ids, token_weights)):
        resp[i, : len(g)], mask[i, : len(g)], weights[i, : len(g)] = g, True, w
    inputs = dict(enc)
    inputs["input_ids"] = torch.cat([enc["input_ids"], resp], 1)
    inputs["attention_mask"] = torch.cat([enc["attention_mask"], mask.long()], 1)
    if "mm_token_type_ids" in enc:
        inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(resp)], 1)
    with policy._catch_lm_head_input() as caught:
        logits = policy.model(**inputs, use_cache=False, logits_to_keep=R + 1).logits[:, :R]
    temps = policy._temperatures(caught[0][:, 0])
    z = process_logits(logits, temps, policy.forbidden_ids)
    out = {
        "log_probs": sequence_log_prob(token_log_probs(z, resp), weights, mask),
        "entropy": masked_mean(token_entropy(z), mask),
        "z": z,
        "temps": temps,
    }
    if with_kl:
        with torch.no_grad(), policy.model.disable_adapter():
            ref = policy.model(**inputs, use_cache=False, logits_to_keep=R + 1).logits[:, :R]
        out["z_ref"] = process_logits(ref, temps.detach(), policy.forbidden_ids)
        out["kl"] = masked_mean(token_kl(z, out["z_ref"]), mask)
    return out


def test_chunked_training_forward_equals_the_full_logits_computation(loaded, tiny_model_path, storage, monkeypatch):
    """Log-probs, entropy and KL of the (chunked, lm_head-applied-per-chunk) training forward equal the
    full-logits computation on a batch with unequal response lengths, and so do the gradients of a
    PPO-like loss into every trainable weight (LoRA, temperature head)."""
    policy = fresh_policy(loaded, tiny_model_path, temperature=0.8, min_temperature=0.5, max_temperature=1.5)
    with torch.no_grad():  # move the adapter off zero so that the KL and the LoRA-A gradients are not trivially 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    policy.train()
    mb = next(storage.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    # responses of lengths 1, 3, 5, ...: right padding inside the batch. The stored tokens and their
    # weights repeat to each length, since how long the sampled replies are depends on the build.
    lengths = [1 + 2 * i for i in range(len(mb.generated_ids))]
    mb = dataclasses.replace(
        mb,
        generated_ids=[g.repeat(-(-n // len(g)))[:n] for g, n in zip(mb.generated_ids, lengths)],
        token_weights=[w.repeat(-(-n // len(w)))[:n] for w, n in zip(mb.token_weights, lengths)],
    )
    assert [len(g) for g in mb.generated_ids] == [len(w) for w in mb.token_weights] == lengths
    enc = policy._encode(mb.prompts, mb.images)
    named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad and not n.startswith("value_head")]
    params = [p for _, p in named]

    def loss_of(out):
        return -(out["log_probs"] * mb.advantages).mean() - 0.1 * out["entropy"].mean() + 0.5 * out["kl"].mean()

    got = policy._forward_turns(enc, mb.generated_ids, mb.token_weights, with_kl=True)
    want = _naive_forward_turns(policy, enc, mb.generated_ids, mb.token_weights, with_kl=True)
    assert want["kl"].min() > 1e-4  # the adapter moved: a real KL is compared
    # Both sides run the same model forward; they differ in lm_head's blocking and the statistics'
    # sums: logit_terms(H, V) per token at max |z| + 1, a response chaining R of them (numerics).
    H, V = policy.base_model.get_output_embeddings().in_features, policy.vocab_size
    R = max(len(g) for g in mb.generated_ids)
    z = torch.cat([want["z"].detach(), want["z_ref"]])
    scale = float(z[torch.isfinite(z)].abs().max()) + 1.0
    token = f32_tolerance(logit_terms(H, V), scale)
    response = f32_chain_tolerance(R * logit_terms(H, V), scale) + f32_tolerance(
        R, float(want["log_probs"].detach().abs().max())
    )
    for key, atol in (("log_probs", response), ("entropy", token), ("kl", token)):
        torch.testing.assert_close(getattr(got, key), want[key], atol=atol, rtol=0)
    g_got = torch.autograd.grad(
        loss_of({"log_probs": got.log_probs, "entropy": got.entropy, "kl": got.kl}), params, allow_unused=True
    )
    want_loss = loss_of(want)
    g_want = torch.autograd.grad(want_loss, params, allow_unused=True, retain_graph=True)
    # every LoRA weight and the temperature head's output layer get a gradient (the head's first
    # layer sits behind its zero-initialised last one)
    moved = {n for (n, _), g in zip(named, g_got) if g is not None and g.abs().max() > 0}
    assert {n for n, _ in named if "lora_" in n or n.startswith("temp_predictor.mlp.2")} <= moved
    # A LoRA weight's gradient gathers every response position's logit_terms(H, V) at about its own
    # size. The temperature head's is dT/dtheta * dL/dT, and dL/dT sums z * dL/dz over a row's R
    # positions and vocabulary, terms that cancel to ~1% of their size: their absolute sum is its magnitude.
    dz = torch.autograd.grad(want_loss, want["z"], retain_graph=True)[0]
    cancelled = torch.where(torch.isfinite(want["z"]), dz * want["z"], 0.0).abs().sum((1, 2)) / want["temps"].detach()
    tokens = sum(len(g) for g in mb.generated_ids)
    for (name, p), g, w in zip(named, g_got, g_want):
        if w is None:
            continue
        if name.startswith("temp_predictor"):
            rows = [torch.autograd.grad(want["temps"][b], p, retain_graph=True)[0].abs() for b in range(len(cancelled))]
            atol = f32_chain_tolerance(R * logit_terms(H, V), float(sum(c * j for c, j in zip(cancelled, rows)).max()))
        else:
            atol = f32_chain_tolerance(tokens * logit_terms(H, V), float(w.abs().max()))
        torch.testing.assert_close(g, w, atol=atol, rtol=0, msg=name)
    # several chunks per batch (one position each) give the same numbers again, and lm_head never
    # computes logits for more positions than a chunk (the model's own call sees an empty slice)
    monkeypatch.setattr(dist, "LOGITS_CHUNK_ELEMENTS", policy.vocab_size)
    positions = []
    handle = policy.base_model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: positions.append(args[0].shape[:-1].numel())
    )
    small = policy._forward_turns(enc, mb.generated_ids, mb.token_weights, with_kl=True)
    handle.remove()
    assert max(positions) == 1 and positions.count(0) == 2  # policy and reference forwards
    torch.testing.assert_close(small.log_probs, got.log_probs, atol=response, rtol=0)
    torch.testing.assert_close(small.kl, got.kl, atol=token, rtol=0)


def test_gradient_checkpointing_keeps_ratio_one_and_trains_lora(loaded, tiny_model_path, storage):
    """With model.gradient_checkpointing on: the first PPO ratio is still 1, every LoRA-B weight gets a
    non-zero gradient equal to the one without checkpointing, and the frozen vision tower stays out
    of autograd (transformers' input-require-grads hooks would pull it in) when it runs in the update
    (``model.reuse_vision_outputs=false``; with it on the tower does not run there at all)."""
    plain = fresh_policy(loaded, tiny_model_path)
    ckpt = fresh_policy(loaded, tiny_model_path, gradient_checkpointing=True, reuse_vision_outputs=False)
    layers = [
        m
        for m in ckpt.base_model.modules()
        if hasattr(m, "gradient_checkpointing") and type(m).__name__.endswith("DecoderLayer")
    ]
    assert layers and all(m.gradient_checkpointing for m in layers)
    tower_grad = []
    ckpt.base_model.model.visual.patch_embed.register_forward_hook(
        lambda _m, _a, out: tower_grad.append(out.requires_grad)
    )
    mb = next(storage.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    grads = []
    for policy in (plain, ckpt):
        policy.train()
        out = policy.evaluate_actions(mb)
        (-(out.log_probs * mb.advantages).mean() - 0.01 * out.entropy.mean()).backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if "lora_B" in n})
    assert tower_grad and not any(tower_grad)
    assert grads[0].keys() == grads[1].keys() and len(grads[1]) > 0
    for name, g in grads[1].items():
        assert g.abs().max() > 0, f"{name} got no gradient under gradient checkpointing"
        torch.testing.assert_close(g, grads[0][name], atol=1e-7, rtol=1e-4)
    fresh = fresh_policy(loaded, tiny_model_path, gradient_checkpointing=True)
    opt = torch.optim.Adam(fresh.trainable_parameters(), lr=1e-2)
    with recorded_forwards(VLMPolicy) as forwards:
        metrics = PPO(fresh, opt, PPOConfig(ppo_epochs=1, mini_batch_size=3), seed=0).update(storage)
    assert metrics["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio


EMBED_TARGETS = f"{ModelConfig.lora_target_modules}|{EMBEDDING_LORA_TARGET}"


def test_embedding_lora_trains_the_prompt_words_and_checkpoints_only_the_adapter(
    loaded, tiny_model_path, storage, tmp_path
):
    """LoRA on ``embed_tokens`` (what lets the tiny model tell prompt words apart, docs/TRAINING.md):
    ratio 1 and KL 0 before the first step, its weights move, the base embedding does not, the
    reference (adapter off) still sees the base embedding, and a checkpoint holds the LoRA factors
    only (peft's default would copy the whole embedding matrix into every checkpoint)."""
    from safetensors import safe_open

    policy = fresh_policy(loaded, tiny_model_path, lora_target_modules=EMBED_TARGETS)
    embed_lora = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_embedding" in n}
    assert len(embed_lora) == 2 and all(p.requires_grad for n, p in policy.named_parameters() if "lora_embedding" in n)
    base = policy.model.get_input_embeddings().base_layer.weight.detach().clone()
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    with recorded_forwards(VLMPolicy) as forwards:
        out = PPO(policy, opt, PPOConfig(ppo_epochs=2, mini_batch_size=3), seed=0).update(storage)
    assert out["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio and out["losses/kl_ref"] < 1e-6
    moved = [
        n for n, p in policy.named_parameters() if "lora_embedding" in n and not torch.equal(p.detach(), embed_lora[n])
    ]
    assert len(moved) == 2  # A moves on step one (B starts random), B from step two
    assert torch.equal(policy.model.get_input_embeddings().base_layer.weight, base)
    ids = torch.as_tensor(storage.prompt_ids[0][-8:]).reshape(1, -1)  # words the update saw
    with torch.no_grad():
        adapted = policy.model.get_input_embeddings()(ids)
        with policy.model.disable_adapter():
            reference = policy.model.get_input_embeddings()(ids)
    torch.testing.assert_close(reference, base[ids])
    assert not torch.allclose(adapted, reference)

    policy.save_pretrained(tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any("lora_embedding_A" in k for k in keys) and all("lora_" in k for k in keys), keys
    other = fresh_policy(loaded, tiny_model_path, lora_target_modules=EMBED_TARGETS)
    other.load_pretrained(tmp_path / "ckpt")
    mb = next(storage.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        torch.testing.assert_close(policy.evaluate_actions(mb).log_probs, other.evaluate_actions(mb).log_probs)


# Qwen2.5-VL-Instruct's generation_config.json, plus knobs other checkpoints ship: all decoding
# defaults that, if generate read them, would sample from another distribution than the trained one.
SHIPPED_DECODING = {
    "do_sample": True,
    "temperature": 0.1,
    "top_p": 0.001,
    "top_k": 1,
    "repetition_penalty": 1.05,
    "min_p": 0.9,
}


@pytest.fixture(scope="module")
def shipped_path(tiny_model_path, tmp_path_factory):
    """The tiny model with SHIPPED_DECODING in its generation_config.json."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("shipped") / "model"
    shutil.copytree(tiny_model_path, path)
    gc_file = path / "generation_config.json"
    gc_file.write_text(json.dumps({**json.loads(gc_file.read_text()), **SHIPPED_DECODING}), encoding="utf-8")
    return str(path)


def test_a_checkpoints_decoding_defaults_never_reach_the_rollout(shipped_path):
    """Sampling is the run's (temperature 1, no truncation, no penalty) whatever the checkpoint ships:
    the rollout's log-probs equal the training forward's, and the draws are not the shipped top_k=1 /
    min_p=0.9 argmax path (with them, 2 of the 9 replies leave it; without, 9)."""
    loaded = load_vlm(tiny_model_cfg(shipped_path))
    for key, value in SHIPPED_DECODING.items():
        assert getattr(loaded.shipped_generation_config, key) == value
    kept = loaded.model.generation_config.to_diff_dict()
    assert not set(SHIPPED_DECODING) & set(kept), kept
    assert kept["eos_token_id"] == loaded.shipped_generation_config.eos_token_id
    torch.manual_seed(0)
    policy = VLMPolicy(tiny_model_cfg(shipped_path, use_temp_predictor=False, temperature=1.0), loaded)
    rng = np.random.default_rng(3)
    observations = [policy_observations(rng, t) for t in range(3)]
    greedy = [policy.act(obs, greedy=True).generated_ids for obs in observations]
    torch.manual_seed(1)
    sampled = [policy.act(obs) for obs in observations]
    differ = sum(
        g.tolist() != s.tolist()
        for got, greedy_ids in zip(sampled, greedy)
        for g, s in zip(greedy_ids, got.generated_ids)
    )
    assert differ >= 6, f"only {differ} of 9 sampled replies left the greedy path"
    for got in sampled:
        assert torch.equal(got.temperatures, torch.ones(NUM_ENVS))
        enc = policy._encode(got.prompts, got.images)
        with torch.no_grad(), recorded_forwards(VLMPolicy) as forwards:
            again = policy._forward_turns(enc, got.generated_ids, got.token_weights, with_kl=False)
        torch.testing.assert_close(
            again.log_probs, got.log_probs, atol=forwards[0].log_prob, rtol=0
        )  # ratio 1 from the first step


def test_qwen3_vl_acts_updates_and_round_trips_its_adapter(tiny_family_path, tmp_path):
    """Qwen3-VL (DeepStack features, 16-pixel patches) through the PPO path on its tiny model: the first
    ratio is 1 with the KL to the reference 0, one update moves LoRA and the heads only, and the saved
    adapter scores like the policy that saved it."""
    path = tiny_family_path("qwen3_vl")
    loaded = load_vlm(tiny_model_cfg(path))
    assert loaded.family == "qwen3_vl"
    policy = fresh_policy(loaded, path)
    st = policy_rollout(policy)
    policy.train()
    mb = next(st.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
    with recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb, with_kl=True)
    assert (out.log_probs - mb.old_log_probs).exp().sub(1).abs().max().item() < forwards[
        0
    ].ratio and out.kl.abs().max().item() < 1e-6
    frozen, lora, heads = split_state(policy)
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-3)
    PPO(policy, opt, PPOConfig(ppo_epochs=1, mini_batch_size=NUM_ENVS)).update(st)
    after_frozen, after_lora, after_heads = split_state(policy)
    assert all(torch.equal(frozen[k], after_frozen[k]) for k in frozen)
    assert any(not torch.equal(lora[k], after_lora[k]) for k in lora) and any(
        not torch.equal(heads[k], after_heads[k]) for k in heads
    )
    policy.save_pretrained(tmp_path / "policy")
    other = fresh_policy(loaded, path)
    other.load_pretrained(tmp_path / "policy")
    with torch.no_grad():
        a, b = policy.evaluate_actions(mb), other.evaluate_actions(mb)
    torch.testing.assert_close(a.log_probs, b.log_probs)
    torch.testing.assert_close(a.values, b.values)


def test_rollout_and_update_exclude_the_same_forbidden_ids(loaded, tiny_model_path, monkeypatch):
    """The sampler (generate's processor) and the training forward mask the same ids, the image and
    video pads. Leaving them out of the training forward moves a reply's log-prob by ~6e-4 on the tiny
    model, under the float32 ratio bound of the agreement tests, so the ids are pinned here directly."""
    from a2c_ppo_acktr.policy import sampling, training_forward

    seen: dict[str, list[int]] = {}
    real_process, real_stats = sampling.process_logits, training_forward.chunked_token_stats

    def process(logits, temperatures, forbidden, *args, **kwargs):
        seen["rollout"] = forbidden.tolist()
        return real_process(logits, temperatures, forbidden, *args, **kwargs)

    def stats(inputs, tokens, temperatures, forbidden, *args, **kwargs):
        seen["update"] = forbidden.tolist()
        return real_stats(inputs, tokens, temperatures, forbidden, *args, **kwargs)

    monkeypatch.setattr(sampling, "process_logits", process)
    monkeypatch.setattr(training_forward, "chunked_token_stats", stats)
    policy = fresh_policy(loaded, tiny_model_path)
    st = policy_rollout(policy)
    (mb,) = list(st.ordered_minibatches(NUM_ENVS * NUM_STEPS))
    with torch.no_grad():
        policy.evaluate_actions(mb)
    pads = {policy.processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>")}
    assert seen["rollout"] == seen["update"] == policy.forbidden_ids.tolist() and pads <= set(seen["update"])


def test_a_checkpoint_written_before_the_policy_was_split_loads_unchanged(loaded, tiny_model_path, tmp_path):
    """``tests/data/policy_checkpoint`` was written by the policy before acting, the training forward
    and its files moved to their own modules (an r=1 adapter and both heads, every weight moved off
    its initialisation): it loads, every saved tensor lands where it was, and saving it again writes
    the same tensors under the same names."""
    from pathlib import Path

    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    saved = Path(__file__).parent / "data" / "policy_checkpoint"
    policy = fresh_policy(loaded, tiny_model_path, lora_r=1, lora_alpha=2)
    policy.load_pretrained(saved)
    heads, adapter = load_file(str(saved / "heads.safetensors")), load_file(str(saved / "adapter_model.safetensors"))
    assert heads and adapter and any(k.startswith("temp_predictor.") for k in heads)
    for name, value in heads.items():
        owner, key = name.split(".", 1)
        assert torch.equal(getattr(policy, owner).state_dict()[key], value), name
    own = get_peft_model_state_dict(policy.model)
    assert set(own) == set(adapter) and all(torch.equal(own[k], v) for k, v in adapter.items())
    assert all(float(v.abs().sum()) > 0 for k, v in adapter.items() if "lora_B" in k)  # not the zero initialisation
    policy.save_pretrained(tmp_path / "again")
    for file in ("heads.safetensors", "adapter_model.safetensors"):
        before, after = load_file(str(saved / file)), load_file(str(tmp_path / "again" / file))
        assert set(before) == set(after) and all(torch.equal(before[k], after[k]) for k in before), file

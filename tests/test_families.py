"""What every model family's policy must do, one test per property, parametrized over the tiny
Qwen2.5-VL, LLaVA-1.5 and LLaVA-NeXT builds: greedy acting, an update that moves the language
model's LoRA and the heads only, and ``train_vision=projector`` training the projector's copy only
(the reference keeps the original). The family's module names come from ``VISION_MODULES``."""

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.algo.storage import RolloutStorage
from a2c_ppo_acktr.config.arguments import PPOConfig
from a2c_ppo_acktr.policy.loading import LoadedVLM, load_vlm
from a2c_ppo_acktr.policy.model import VISION_MODULES, VLMPolicy
from helpers import fresh_policy, policy_observations, policy_rollout, split_state, tiny_model_cfg
from numerics import recorded_forwards


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava", "llava_next"])
def family_loaded(tiny_family_path, request) -> LoadedVLM:
    return load_vlm(tiny_model_cfg(tiny_family_path(request.param)))


@pytest.fixture(scope="module")
def family_storage(family_loaded) -> RolloutStorage:
    """One rollout shared by the tests (every fresh policy starts from the same weights)."""
    return policy_rollout(fresh_policy(family_loaded, family_loaded.path))


def _in(names: list[str], name: str) -> bool:
    return any(f".{m}." in f".{name}" for m in names)


def test_greedy_act_is_deterministic_cut_after_eos_and_never_emits_forbidden_ids(family_loaded):
    policy = fresh_policy(family_loaded, family_loaded.path, max_new_tokens=16)
    obs = policy_observations(np.random.default_rng(3), 0)
    a, b = policy.act(obs, greedy=True), policy.act(obs, greedy=True)
    assert [g.tolist() for g in a.generated_ids] == [g.tolist() for g in b.generated_ids]
    forbidden = set(policy.forbidden_ids.tolist())
    for g in a.generated_ids:
        assert not forbidden & set(g.tolist())
        eos_at = [i for i, t in enumerate(g.tolist()) if t in policy.eos_ids]
        # cut right after the first EOS, kept as the last token; no EOS only when the length ran out
        assert eos_at == [len(g) - 1] or (eos_at == [] and len(g) == policy.cfg.max_new_tokens)
    # The batch decodes as each prompt would alone (left padding and positions do not leak).
    alone = policy.act(obs[1:2], greedy=True)
    assert alone.generated_ids[0].tolist() == a.generated_ids[1].tolist()


def test_update_moves_language_lora_and_heads_only(family_loaded, family_storage):
    policy = fresh_policy(family_loaded, family_loaded.path)
    tower = VISION_MODULES[family_loaded.family]["tower"]
    frozen0, lora0, heads0 = split_state(policy)
    assert any(_in(tower, n) for n in frozen0) and lora0 and heads0
    assert not any(_in(tower, n) for n in lora0)  # LoRA on the language model only
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    with recorded_forwards(VLMPolicy) as forwards:
        out = PPO(policy, opt, PPOConfig(ppo_epochs=1, mini_batch_size=3, ent_coef=0.01), seed=0).update(family_storage)
    assert (
        out["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio
    )  # the first minibatch's rounding against act's
    assert out["losses/kl_ref"] < 1e-6 and out["losses/skipped_minibatches"] == 0
    frozen1, lora1, heads1 = split_state(policy)
    changed = [n for n in frozen0 if not torch.equal(frozen0[n], frozen1[n])]
    assert not changed, f"frozen weights moved: {changed[:3]}"
    unmoved = [n for n in lora0 if torch.equal(lora0[n], lora1[n])]
    assert not unmoved, f"LoRA weights that did not move: {unmoved[:3]}"
    for name in heads0:
        if name != "temp_predictor.mlp.0.weight":  # behind a zero-initialised layer: no gradient on step one
            assert not torch.equal(heads0[name], heads1[name]), f"head weight {name} did not move"
    mb = next(family_storage.minibatches(3, torch.Generator().manual_seed(0)))
    assert policy.evaluate_actions(mb, with_kl=True).kl.mean().item() > 0  # the adapter now differs from the reference


def test_train_vision_projector_trains_the_projectors_copy_only(family_loaded, family_storage):
    policy = fresh_policy(family_loaded, family_loaded.path, train_vision="projector")
    projector = VISION_MODULES[family_loaded.family]["projector"]
    tower = [m for m in VISION_MODULES[family_loaded.family]["tower"] if m not in projector]
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert any(_in(projector, n) and "modules_to_save" in n for n in trainable)
    assert all(_in(projector, n) or "lora_" in n or n.startswith(("value_head", "temp_predictor")) for n in trainable)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    with recorded_forwards(VLMPolicy) as forwards:
        out = PPO(policy, opt, PPOConfig(ppo_epochs=1, mini_batch_size=3), seed=0).update(family_storage)
    assert out["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio
    after = dict(policy.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert {n for n in moved if _in(projector, n)} == {
        n for n in trainable if _in(projector, n)
    }  # every projector copy weight
    # The tower and the reference's projector (peft's original_module) stay.
    assert not any("original_module" in n or (_in(tower, n) and not _in(projector, n)) for n in moved)

"""The frozen vision tower runs once per image per rollout step (``model.reuse_vision_outputs``): act
keeps each image's tower output with its turn, and the update forwards those instead of the pixels.
Nothing the update computes may change (log-probs, values, entropies, the KL to every reference,
gradients), the tower must not run in the update, a reference that changes the pixels must still
see them, and nothing is reused when the tower or its projector trains."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.policy.encoding import ImageFeatureStore, TurnEncoding
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VISION_MODULES, VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage
from helpers import NUM_ENVS, fresh_policy, policy_observations, tiny_model_cfg
from numerics import f32_chain_tolerance, recorded_forwards, vlm_forward_terms, widest


@contextlib.contextmanager
def tower_calls(policy: VLMPolicy):
    """How many times the vision tower's top module runs inside the block."""
    name = VISION_MODULES[policy.family]["tower"][0]
    tower = next(m for n, m in policy.base_model.named_modules() if n == name or n.endswith("." + name))
    calls: list[int] = []
    handle = tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def _policy(path: str, loaded, **over) -> VLMPolicy:
    return fresh_policy(loaded, path, max_new_tokens=6, **over)  # a copy of the model; the same heads and LoRA init


def _rollout(policy: VLMPolicy, steps: int = 2) -> tuple[RolloutStorage, list[int]]:
    rng = np.random.default_rng(3)
    torch.manual_seed(3)
    st = RolloutStorage(steps, NUM_ENVS)
    per_act = []
    for t in range(steps):
        with tower_calls(policy) as calls:
            act = policy.act(policy_observations(rng, t))
        per_act.append(len(calls))
        st.insert(
            act,
            torch.linspace(-1, 1, NUM_ENVS),
            torch.zeros(NUM_ENVS, dtype=torch.bool),
            torch.zeros(NUM_ENVS, dtype=torch.bool),
        )
    st.compute_returns(torch.zeros(NUM_ENVS))
    return st, per_act


def _evaluate(policy: VLMPolicy, st: RolloutStorage, **kw):
    mb = next(st.minibatches(st.num_steps * NUM_ENVS, torch.Generator().manual_seed(0)))
    policy.train()
    with tower_calls(policy) as calls, recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb, **kw)
    return mb, out, len(calls), widest(forwards)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llava", "llava_next"])
def test_the_update_forwards_the_rollouts_vision_outputs_and_computes_the_same(tiny_family_path, family):
    path = tiny_family_path(family)
    loaded = load_vlm(tiny_model_cfg(path))
    reuse, fresh = _policy(path, loaded), _policy(path, loaded, reuse_vision_outputs=False)
    assert reuse.vision.owner is not None and fresh.vision.owner is None
    st, per_act = _rollout(reuse)
    assert per_act == [1, 1]  # one tower pass per step (generate's prefill)
    assert all(e.vision is not None and len(e.vision) == len(e.images) for e in st.encodings)
    mb, out, calls, bounds = _evaluate(reuse, st, with_kl=True)
    _, again, fresh_calls, _ = _evaluate(fresh, st, with_kl=True)
    assert calls == 0 and fresh_calls == 2  # none in the update (policy and reference), else one each
    torch.testing.assert_close(out.log_probs, again.log_probs, atol=bounds.log_prob, rtol=0)
    torch.testing.assert_close(out.values, again.values, atol=bounds.value, rtol=0)
    torch.testing.assert_close(out.kl, again.kl, atol=bounds.token, rtol=0)
    assert ((out.log_probs - mb.old_log_probs).exp() - 1).abs().max() < bounds.ratio  # ratio 1 before any step
    (out.log_probs.sum() + out.values.sum()).backward()
    (again.log_probs.sum() + again.values.sum()).backward()
    # The same function of the same weights on tower outputs computed in other batches: the
    # gradients differ by the rounding of a forward and a backward through the model at this length,
    # at each gradient's magnitude (numerics: f32_chain_tolerance, as the forward bounds are made).
    seq = max(len(p) for p in mb.prompt_ids) + max(len(g) for g in mb.generated_ids)
    terms = 2 * vlm_forward_terms(reuse.base_model.config, seq)
    checked = 0
    for (name, p), q in zip(reuse.named_parameters(), fresh.parameters()):
        if p.requires_grad and "lora_B" in name:
            assert q.grad.abs().max() > 0, f"{name}: no gradient"
            torch.testing.assert_close(
                p.grad, q.grad, atol=f32_chain_tolerance(terms, float(q.grad.abs().max())), rtol=0
            )
            checked += 1
    assert checked > 0


def test_a_reference_that_changes_the_pixels_still_runs_the_tower_on_them(loaded, tiny_model_path):
    reuse, fresh = _policy(tiny_model_path, loaded), _policy(tiny_model_path, loaded, reuse_vision_outputs=False)
    st, _ = _rollout(reuse)
    for reference in ("masked_images", "noised_images"):
        _, out, calls, bounds = _evaluate(reuse, st, with_kl=True, reference=reference, noise_seed=4)
        _, again, _, _ = _evaluate(fresh, st, with_kl=True, reference=reference, noise_seed=4)
        assert calls == 1  # the reference's pass over its own pixels; the policy's pass reuses
        assert out.kl.abs().max() > 1e-4  # the images matter: the probe saw other pixels than the policy
        torch.testing.assert_close(out.kl, again.kl, atol=bounds.token, rtol=0)


def test_recompute_mode_and_a_shared_prefill_run_the_tower_once_per_act(loaded, tiny_model_path):
    policy = _policy(tiny_model_path, loaded, rollout_log_probs="recompute")
    _, per_act = _rollout(policy)
    assert per_act == [1, 1]  # the recompute forward takes the prefill's outputs
    obs = policy_observations(np.random.default_rng(0), 0)
    with tower_calls(policy) as calls:
        act = policy.act([obs[0], obs[1], obs[0], obs[1]])
    assert len(calls) == 1 and act.encodings[0].vision[0]["pooled"] is act.encodings[2].vision[0]["pooled"]


@pytest.mark.parametrize(
    "over",
    [{"train_vision": "projector"}, {"lora_target_modules": r".*(visual\.merger\.mlp\.0|language_model.*q_proj)"}],
)
def test_nothing_is_reused_when_the_vision_side_trains(loaded, tiny_model_path, over):
    policy = _policy(tiny_model_path, loaded, **over)
    assert policy.vision.owner is None
    st, _ = _rollout(policy, steps=1)
    assert all(e.vision is None for e in st.encodings)
    _, out, calls, _ = _evaluate(policy, st)
    assert calls == 1
    out.log_probs.sum().backward()
    vision_grads = [p.grad for n, p in policy.named_parameters() if p.requires_grad and "visual" in n]
    assert vision_grads and any(g is not None and g.abs().max() > 0 for g in vision_grads)


def test_the_store_keeps_one_vision_encoding_per_distinct_image():
    rng = np.random.default_rng(0)
    frame, other = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)

    def turn(value: float) -> TurnEncoding:
        return TurnEncoding(
            tokens={"input_ids": torch.tensor([1, 2])},
            images=[{"pixel_values": torch.ones(2, 3)}] * 2,
            vision=[{"pooled": torch.full((2, 5), value)}, {"pooled": torch.full((2, 5), value + 1)}],
        )

    store = ImageFeatureStore()
    first = store.share(turn(1.0), [frame, other])
    again = store.share(turn(7.0), [frame.copy(), other.copy()])  # the same images, encoded in another batch
    assert again.vision[0] is first.vision[0] and again.vision[1] is first.vision[1]
    assert float(again.vision[0]["pooled"][0, 0]) == 1.0  # the first encoding of an image is kept
    assert store.nbytes() == 2 * (2 * 3 * 4) + 2 * (2 * 5 * 4)  # one copy of each image's pixels and of its encoding
    with pytest.raises(ValueError, match="1 vision encodings for a turn of 2 images"):
        store.share(TurnEncoding(tokens={}, images=[{}, {}], vision=[{}]), [frame, other])
    store.clear()
    assert store.nbytes() == 0

"""Each observation's images are processed once: ``act`` keeps each row's processor output,
the storage keeps one copy per distinct image, and every minibatch of every epoch forwards those
tensors without running the processor, giving what re-processing would give."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.algo.ppo import PPO
from a2c_ppo_acktr.config.arguments import ModelConfig, PPOConfig
from a2c_ppo_acktr.policy.encoding import ImageFeatureStore, collate, split_rows
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage
from helpers import fresh_policy, observation_rows, tiny_model_cfg
from numerics import recorded_forwards

NUM_ENVS, NUM_STEPS = 3, 2
MAX_NEW_TOKENS = 8


def _observations(rng, step, sweep):
    """Rows with 0-3 images of different sizes; the first image of every row is the episode's sweep
    frame, the same on every step (as VSI's sweep repeats on every turn)."""
    texts = ["How far is the bed from the sofa?" + " again" * (n + 2 * step) for n in range(NUM_ENVS)]
    rows = observation_rows(rng, texts, [(n + step) % 3 for n in range(NUM_ENVS)], shape=lambda k: (28 + 14 * k, 28))
    return [{**row, "images": [sweep[n], *row["images"]]} for n, row in enumerate(rows)]


def _rollout(policy, seed=0):
    rng = np.random.default_rng(seed)
    sweep = [rng.integers(0, 256, (42, 42, 3), dtype=np.uint8) for _ in range(NUM_ENVS)]
    st = RolloutStorage(NUM_STEPS, NUM_ENVS)
    for t in range(NUM_STEPS):
        # fresh arrays with the same content, as the env returns: sharing must go by content
        act = policy.act(_observations(rng, t, [s.copy() for s in sweep]))
        st.insert(act, torch.linspace(-1, 1, NUM_ENVS), torch.zeros(NUM_ENVS), torch.zeros(NUM_ENVS))
    st.compute_returns(torch.zeros(NUM_ENVS))
    return st


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llava"])
def test_split_then_collate_gives_the_processor_batch_back(tiny_family_path, family):
    """Any subset of rows in any order collates to what the processor makes of those rows."""
    loaded = load_vlm(ModelConfig(model_path=tiny_family_path(family), device="cpu"))
    rng = np.random.default_rng(1)
    obs = [
        {
            "images": [
                rng.integers(0, 256, (28 + 14 * k, 42, 3), dtype=np.uint8) for k in range(n % 3 + (family == "llava"))
            ],
            "text": "Which is closer?" + " more" * n,
        }
        for n in range(4)
    ]
    texts = [prompts.render_prompt(loaded.processor, prompts.build_messages(o)) for o in obs]

    def process(rows):
        flat = [im for r in rows for im in obs[r]["images"]]
        return dict(
            loaded.processor(text=[texts[r] for r in rows], images=flat or None, padding=True, return_tensors="pt")
        )

    turns = split_rows(process(range(4)), [len(o["images"]) for o in obs])
    for rows in ([0, 1, 2, 3], [3, 1], [2, 0, 1]):
        got, want = collate([turns[r] for r in rows], loaded.processor.tokenizer.pad_token_id), process(rows)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), f"{family}: {key} differs for rows {rows}"


def test_update_forwards_the_rollout_tensors_without_the_processor(loaded, tiny_model_path, monkeypatch):
    """The processor runs once per act and never in the update (2 epochs); the first ratio is 1."""
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=MAX_NEW_TOKENS)
    calls = []
    real = type(policy.processor).__call__
    monkeypatch.setattr(
        type(policy.processor), "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    st = _rollout(policy)
    assert len(calls) == NUM_STEPS
    assert all(e is not None for e in st.encodings)
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-3)
    with recorded_forwards(VLMPolicy) as forwards:
        out = PPO(policy, opt, PPOConfig(ppo_epochs=2, mini_batch_size=2)).update(st)
    assert len(calls) == NUM_STEPS
    assert (
        out["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio
    )  # the first minibatch's rounding against act's


def test_kept_encodings_score_like_reprocessed_images(loaded, tiny_model_path):
    """A minibatch forwarded from the kept tensors gives the log-probs, values and KL the old path
    (processor on the raw images, prompt ids checked) gives."""
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=MAX_NEW_TOKENS)
    st = _rollout(policy)
    policy.train()
    for mb in st.minibatches(3, torch.Generator().manual_seed(3)):
        assert mb.encodings is not None
        kept = policy.evaluate_actions(mb, with_kl=True)
        again = policy.evaluate_actions(dataclasses.replace(mb, encodings=None), with_kl=True)
        for name in ("log_probs", "values", "entropy", "kl"):
            torch.testing.assert_close(getattr(kept, name), getattr(again, name), atol=1e-6, rtol=0)


def test_a_turn_paired_with_another_turns_ids_is_refused(loaded, tiny_model_path):
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=MAX_NEW_TOKENS)
    st = _rollout(policy)
    mb = next(st.minibatches(2, torch.Generator().manual_seed(0)))
    swapped = dataclasses.replace(mb, encodings=mb.encodings[::-1])
    if torch.equal(swapped.encodings[0].input_ids, mb.prompt_ids[0]):
        pytest.skip("the two turns happen to share their prompt ids")
    with pytest.raises(ValueError, match="paired a turn's encoding with another turn's prompt ids"):
        policy.evaluate_actions(swapped)


def test_storage_keeps_one_copy_of_an_image_shown_on_several_turns(loaded, tiny_model_path):
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=MAX_NEW_TOKENS)
    st = _rollout(policy)
    # each env's sweep frame (first image) is one tensor on both steps, other images are their own
    for n in range(NUM_ENVS):
        a, b = st.encodings[n], st.encodings[NUM_ENVS + n]
        assert a.images[0]["pixel_values"] is b.images[0]["pixel_values"]
    distinct = {id(im["pixel_values"]) for e in st.encodings for im in e.images}
    assert len(st.image_store) == len(distinct) == NUM_ENVS + sum(len(im) - 1 for im in st.images)
    st.after_update()
    assert len(st.image_store) == 0 and all(e is None for e in st.encodings)


def test_store_shares_only_equal_features():
    """Equal raw bytes but different processed tensors (a processor that depended on the batch) are
    kept apart; equal ones share the first copy."""
    from a2c_ppo_acktr.policy.encoding import TurnEncoding

    img = np.zeros((4, 4, 3), np.uint8)

    def turn(v):
        return TurnEncoding(tokens={"input_ids": torch.arange(3)}, images=[{"pixel_values": torch.full((2, 5), v)}])

    store = ImageFeatureStore()
    first = store.share(turn(1.0), [img])
    same = store.share(turn(1.0), [img.copy()])
    other = store.share(turn(2.0), [img.copy()])
    assert same.images[0] is first.images[0] and other.images[0] is not first.images[0]
    assert torch.equal(other.images[0]["pixel_values"], torch.full((2, 5), 2.0))
    with pytest.raises(ValueError, match="2 raw images for a turn encoded with 1"):
        store.share(turn(1.0), [img, img])


def test_pixels_are_kept_in_the_model_dtype_and_score_the_same(tiny_model_path):
    """bf16 policy: the kept pixels are bf16 (half the memory) and forward exactly like the float32
    processor output, which the vision tower casts to bf16 first."""
    policy = VLMPolicy(tiny_model_cfg(tiny_model_path, max_new_tokens=MAX_NEW_TOKENS, dtype="bfloat16"))
    st = _rollout(policy)
    assert {im["pixel_values"].dtype for e in st.encodings for im in e.images} == {torch.bfloat16}
    mb = next(st.minibatches(3, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        kept = policy.evaluate_actions(mb)
        again = policy.evaluate_actions(dataclasses.replace(mb, encodings=None))
    assert torch.equal(kept.log_probs, again.log_probs) and torch.equal(kept.values, again.values)


def test_an_output_the_cache_cannot_split_falls_back_to_reprocessing(loaded, tiny_model_path, monkeypatch, caplog):
    """A processor output encoding.py does not know (another model family) is not kept: a warning,
    and the update re-processes the raw images with the prompt-ids check, ratio still 1."""
    from a2c_ppo_acktr.policy import sampling

    def refuse(*_a, **_k):
        raise ValueError("processor output 'novel' is unknown")

    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=MAX_NEW_TOKENS)
    monkeypatch.setattr(sampling, "split_rows", refuse)
    with caplog.at_level("WARNING", logger="a2c_ppo_acktr.policy.sampling"):
        st = _rollout(policy)
    assert all(e is None for e in st.encodings) and "'novel' is unknown" in caplog.text
    assert all(len(p) > 0 for p in st.prompt_ids)
    with recorded_forwards(VLMPolicy) as forwards:
        out = PPO(
            policy, torch.optim.Adam(policy.trainable_parameters(), lr=1e-3), PPOConfig(ppo_epochs=1, mini_batch_size=3)
        ).update(st)
    assert out["debug/first_minibatch_ratio_max_dev"] < forwards[0].ratio

"""One prefill per distinct prompt (``model.shared_prefill``): rows of an ``act`` batch that repeat a
prompt (a group's siblings) are processed and prefilled once, and generate continues every row from
that cache. What sampling, the heads and the update see must not change: the same tokens under the
same seed, the same stored prompt ids and processor tensors, log-probs and values equal (recompute:
bit for bit) or within float32 rounding (generate's own logits), while the forwards that run cover
the distinct prompts once plus one token per row."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.policy.model import VLMPolicy
from helpers import QUESTIONS, fresh_policy, observation_rows
from numerics import f32_chain_tolerance, head_terms, recorded_forwards, vlm_forward_terms, widest


def _observations(order: list[int]) -> list[dict]:
    """Rows showing prompts ``order[i]`` of three distinct prompts of unequal lengths and images
    (1-3 frames of different sizes), repeated out of order."""
    words = [QUESTIONS[0], (QUESTIONS[1] + " ") * 2, QUESTIONS[2]]
    distinct = observation_rows(np.random.default_rng(7), words, [1, 2, 3])
    # copies, not the same objects: rows are matched by content
    return [{"images": [im.copy() for im in distinct[k]["images"]], "text": str(distinct[k]["text"])} for k in order]


ORDER = [1, 0, 1, 2, 0, 1]


@contextlib.contextmanager
def model_forwards(policy: VLMPolicy):
    """(rows, tokens) of every forward of the transformers model, generate's steps included."""
    calls: list[tuple[int, int]] = []

    def hook(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        calls.append((int(ids.shape[0]), int(ids.shape[1])))

    handle = policy.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


@contextlib.contextmanager
def processor_rows(policy: VLMPolicy):
    """Rows of every processor run of ``policy``."""
    rows: list[int] = []
    original = policy._process

    def spy(texts, images):
        rows.append(len(texts))
        return original(texts, images)

    policy._process = spy
    try:
        yield rows
    finally:
        del policy._process


def _act(policy: VLMPolicy, observations: list[dict], shared: bool, **kw):
    policy.cfg.shared_prefill = shared
    torch.manual_seed(11)
    with model_forwards(policy) as calls, processor_rows(policy) as processed:
        out = policy.act(observations, **kw)
    return out, calls, processed


def _same_turns(a, b) -> None:
    assert [g.tolist() for g in a.generated_ids] == [g.tolist() for g in b.generated_ids]
    assert a.texts == b.texts
    assert all(torch.equal(x, y) for x, y in zip(a.prompt_ids, b.prompt_ids))
    for x, y in zip(a.encodings, b.encodings):  # the update forwards exactly what it forwarded before
        assert x.tokens.keys() == y.tokens.keys() and all(torch.equal(x.tokens[k], y.tokens[k]) for k in x.tokens)
        assert len(x.images) == len(y.images)
        assert all(u.keys() == v.keys() and all(torch.equal(u[k], v[k]) for k in u) for u, v in zip(x.images, y.images))


@pytest.mark.parametrize("mode", ["recompute", "generate"])
def test_repeated_prompts_are_prefilled_once_and_change_nothing_the_update_reads(loaded, tiny_model_path, mode):
    policy = fresh_policy(loaded, tiny_model_path, rollout_log_probs=mode, max_new_tokens=8)
    obs = _observations(ORDER)
    plain, plain_calls, plain_processed = _act(policy, obs, shared=False)
    shared, shared_calls, shared_processed = _act(policy, obs, shared=True)
    _same_turns(plain, shared)
    P = max(len(p) for p in plain.prompt_ids)
    assert plain_processed == [6] and shared_processed == [3]  # the processor sees each prompt once
    # without sharing generate's first step forwards every row's whole prompt; with it the three
    # distinct prompts are forwarded once (all but their last token), then one token per row
    assert plain_calls[0] == (6, P)
    assert shared_calls[:2] == [(3, P - 1), (6, 1)]
    decode_steps = [c for c in plain_calls[1:] if c == (6, 1)]
    assert [c for c in shared_calls[2:] if c == (6, 1)] == decode_steps  # the same decode steps after that
    if mode == "recompute":  # the heads and log-probs come from the same training forward on the same tensors
        assert torch.equal(plain.log_probs, shared.log_probs)
        assert torch.equal(plain.values, shared.values)
        assert torch.equal(plain.temperatures, shared.temperatures)
    else:  # generate's logits, cached against uncached prompt positions: rounding (numerics.forward_bounds)
        policy.cfg.rollout_log_probs = "recompute"
        with recorded_forwards(VLMPolicy) as forwards:
            _act(policy, obs, shared=True)
        bounds = widest(forwards)
        torch.testing.assert_close(shared.log_probs, plain.log_probs, atol=2 * bounds.log_prob, rtol=0)
        torch.testing.assert_close(shared.values, plain.values, atol=2 * bounds.value, rtol=0)
        torch.testing.assert_close(shared.temperatures, plain.temperatures, atol=2 * bounds.temperature, rtol=0)


def test_greedy_shares_and_blind_distinct_and_single_batches_run_as_before(loaded, tiny_model_path):
    """Greedy decoding shares too; blind prompts (text only, whose positions only generate derives
    from the padding), a batch of distinct prompts and a one-row batch run as before (one
    processor run over every row, generate's first step on whole prompts)."""
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=8)
    obs = _observations(ORDER)
    plain, _, _ = _act(policy, obs, shared=False, greedy=True)
    shared, calls, processed = _act(policy, obs, shared=True, greedy=True)
    _same_turns(plain, shared)
    assert processed == [3] and calls[1] == (6, 1)
    plain, _, _ = _act(policy, obs, shared=False, blind=True)
    blind, calls, processed = _act(policy, obs, shared=True, blind=True)
    _same_turns(plain, blind)
    assert processed == [6] and calls[0] == (6, max(len(p) for p in plain.prompt_ids))
    for order in ([0, 1, 2], [2]):
        _, calls, processed = _act(policy, _observations(order), shared=True)
        assert processed == [len(order)] and calls[0][0] == len(order) and calls[0][1] > 1


def test_images_decide_sameness_not_only_text(loaded, tiny_model_path):
    """Two rows with one text and different pixels are two prompts."""
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=4)
    obs = _observations([0, 0, 0])
    obs[2]["images"][0][0, 0, 0] ^= 1
    _, calls, processed = _act(policy, obs, shared=True)
    assert processed == [2] and calls[0][0] == 2


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "llava", "llava_next"])
def test_every_family_decodes_the_same_tokens_from_the_shared_cache(tiny_family_path, family):
    """Each family's positions (Qwen-VL's multimodal rope offsets, copied per row; LLaVA's from the
    mask) continue the shared cache as its own prefill would."""
    from a2c_ppo_acktr.policy.loading import load_vlm
    from helpers import tiny_model_cfg

    path = tiny_family_path(family)
    policy = fresh_policy(load_vlm(tiny_model_cfg(path)), path, max_new_tokens=6)
    obs = _observations(ORDER)
    plain, _, _ = _act(policy, obs, shared=False)
    shared, calls, processed = _act(policy, obs, shared=True)
    _same_turns(plain, shared)
    assert processed == [3] and calls[1] == (6, 1)
    # the value head on the last prompt token's hidden state, cached against uncached prefix: rounding
    # of the model's sums over the prompt, then the head (numerics, as in test_forward_economy)
    P = max(len(p) for p in plain.prompt_ids)
    terms = vlm_forward_terms(policy.base_model.config, P) + head_terms(policy.value_head)
    torch.testing.assert_close(
        shared.values, plain.values, atol=f32_chain_tolerance(terms, float(plain.values.abs().max()) + 1.0), rtol=0
    )

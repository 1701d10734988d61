"""Stopping is part of the action: a finished reply ends with its EOS token, and EOS's log-prob is in
the action's log-prob, in the rollout and in the update, for Qwen2.5-VL and LLaVA.

The tiny models rarely stop by themselves, and how likely a build is to stop is its own, so a
forward hook on ``lm_head`` sets the end-of-turn token's logit from the others': at the starting
temperature 1 every position draws it with probability exactly :data:`_P_EOS`, whatever the
weights. Sampled replies stop after a few tokens, and EOS's log-prob, ``log(_P_EOS)``, weighs in
the sum. The expected numbers are computed independently of :meth:`Sampler.trim` and of the
training forward: the reply is cut at the first EOS of ``generate``'s raw output, and its log-prob
is summed from a plain full-logits forward of each prompt alone (no padding, no chunking).
"""

import math

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.algo.storage import RolloutStorage
from helpers import NUM_ENVS, fresh_policy, policy_observations, tiny_model_cfg
from numerics import recorded_forwards


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava"])
def family_loaded(request, tiny_family_path):
    return load_vlm(tiny_model_cfg(tiny_family_path(request.param)))


# Each sampled token is EOS with this probability: a reply stops within max_new_tokens 10 with
# probability 1 - 0.75**10 = 0.94, and has at least 3 tokens with probability 0.75**2 = 0.56.
_P_EOS = 0.25
# The other stop ids sit this far below the largest logit: e^-30 per step at temperature 1.
_OTHER_STOPS_BELOW = 30.0
# Sampling seeds to try for a rollout whose replies all stop, one of them after 3 tokens or more: each
# try fails with probability below 1 - 0.94**3 + 0.44**3 = 0.25, so all of them with below 1e-12.
_TRIES = 20


def _construct_eos(policy, eos_id: int):
    """Hook ``lm_head`` so that at temperature 1 ``eos_id`` has probability :data:`_P_EOS` at every
    position and the other stop tokens practically none (every finished reply ends with ``eos_id``).

    EOS's logit becomes ``logsumexp`` of the logits the policy may sample other than the stop
    tokens (not the forbidden ids, masked before sampling) plus ``logit(_P_EOS)``: a function of the
    position's own logits, so generation, the training forward and the reference forward below see
    the same distribution.
    """
    stops = torch.zeros(policy.vocab_size, dtype=torch.bool)
    stops[policy.eos_ids] = True
    others = stops.clone()
    others[eos_id] = False
    candidates = ~stops
    candidates[policy.forbidden_ids.cpu()] = False
    lift = math.log(_P_EOS / (1.0 - _P_EOS))

    def hook(_module, _args, out):
        allowed = out.masked_fill(~candidates.to(out.device), float("-inf"))
        top = allowed.max(-1, keepdim=True).values
        out = torch.where(others.to(out.device), top - _OTHER_STOPS_BELOW, out)
        eos = torch.logsumexp(allowed, -1, keepdim=True) + lift
        return out.index_copy(-1, torch.tensor([eos_id], device=out.device), eos)

    return policy.base_model.get_output_embeddings().register_forward_hook(hook)


def _independent_log_probs(policy, prompt, images, reply, temperature):
    """Per-token log-probs of ``reply`` after ``prompt`` alone: full logits / T, forbidden ids at -inf."""
    enc = policy.processor(text=[prompt], images=list(images) or None, return_tensors="pt")
    P = enc["input_ids"].shape[1]
    ids = torch.cat([enc["input_ids"], torch.tensor([reply])], dim=1)
    inputs = dict(enc, input_ids=ids, attention_mask=torch.ones_like(ids))
    if "mm_token_type_ids" in enc:  # the reply is text
        inputs["mm_token_type_ids"] = torch.cat(
            [enc["mm_token_type_ids"], torch.zeros(1, len(reply), dtype=enc["mm_token_type_ids"].dtype)], 1
        )
    with torch.no_grad():
        logits = policy.model(**inputs, use_cache=False).logits[0, P - 1 : P - 1 + len(reply)].float()
    z = logits / temperature
    z[:, policy.forbidden_ids] = float("-inf")
    return torch.log_softmax(z, dim=-1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


def _until_stop(new: list[int], stop_ids: list[int]) -> list[int]:
    """``new`` up to and including its first stop token, or ``[]`` when it has none."""
    stop = next((j for j, t in enumerate(new) if t in stop_ids), None)
    return [] if stop is None else new[: stop + 1]


def test_finished_action_ends_with_eos_and_its_log_prob_counts(family_loaded, monkeypatch):
    # thought_prob_coef 1: every token weighs 1 and the action log-prob is a plain sum
    policy = fresh_policy(family_loaded, family_loaded.path, thought_prob_coef=1.0)
    eos_id = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos_id in policy.eos_ids
    raw = []
    generate = policy.model.generate

    def recording_generate(*args, **kwargs):
        raw.append(generate(*args, **kwargs))
        return raw[-1]

    monkeypatch.setattr(policy.model, "generate", recording_generate)
    handle = _construct_eos(policy, eos_id)
    try:
        obs = policy_observations(np.random.default_rng(0), 0)
        for seed in range(_TRIES):  # a sample, not the property, decides a try (see _TRIES)
            raw.clear()
            torch.manual_seed(seed)
            act = policy.act(obs)
            P = policy._encode(act.prompts, act.images)["input_ids"].shape[1]
            # generate pads after the first stop token; a reply that did not stop has none
            replies = [_until_stop(raw[0][i, P:].tolist(), policy.eos_ids) for i in range(NUM_ENVS)]
            if all(replies) and max(len(r) for r in replies) >= 3:
                break
        else:
            pytest.fail(f"none of {_TRIES} sampled rollouts had every reply stopped and one of 3 tokens or more")
        # The hook fixes EOS's probability at temperature 1, where the head starts for every state: its
        # last layer is zero with bias logit((1 - 0.5) / (1.5 - 0.5)) = 0, and 0.5 + 1 * sigmoid(0) is 1 exactly.
        assert torch.equal(act.temperatures, torch.ones(NUM_ENVS))
        assert all(r[-1] == eos_id for r in replies)
        assert [g.tolist() for g in act.generated_ids] == replies  # EOS kept as the last token, nothing after it
        storage = RolloutStorage(1, NUM_ENVS)
        storage.insert(act, torch.zeros(NUM_ENVS), torch.ones(NUM_ENVS), torch.zeros(NUM_ENVS))
        storage.compute_returns(torch.zeros(NUM_ENVS))
        mb = next(storage.minibatches(NUM_ENVS, torch.Generator().manual_seed(0)))
        with torch.no_grad(), recorded_forwards(VLMPolicy) as forwards:
            trained = policy.evaluate_actions(mb).log_probs
        # generate's cached steps, the padded training batch and each turn alone compute the same
        # sums in other orders: rounding only, well under the EOS token's |log-prob| (numerics.forward_bounds)
        atol = forwards[0].log_prob
        for i, reply in enumerate(replies):
            token_lp = _independent_log_probs(policy, act.prompts[i], act.images[i], reply, float(act.temperatures[i]))
            # EOS was drawn with probability _P_EOS: leaving its log-prob out would change the sum
            assert float(token_lp[-1]) == pytest.approx(math.log(_P_EOS), abs=forwards[0].token)
            # rollout (generate's logits) and update (training forward) both include EOS's log-prob
            assert float(act.log_probs[i]) == pytest.approx(float(token_lp.sum()), abs=atol)
            j = int((mb.indices == i).nonzero())
            assert float(trained[j]) == pytest.approx(float(token_lp.sum()), abs=atol)
    finally:
        handle.remove()

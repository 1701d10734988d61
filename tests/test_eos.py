"""Stopping is part of the action: a finished reply ends with its EOS token, and EOS's log-prob is in
the action's log-prob, in the rollout and in the update (issue 17), for Qwen2.5-VL and LLaVA.

The tiny models rarely stop by themselves, so a forward hook on ``lm_head`` lifts the end-of-turn
token's logit to one below the largest at every position: sampled replies stop after a few tokens,
and EOS is drawn with a probability far from 1, so its log-prob weighs in the sum. The expected
numbers are computed independently of :meth:`VLMPolicy._trim` and of the training forward: the
reply is cut at the first EOS of ``generate``'s raw output, and its log-prob is summed from a
plain full-logits forward of each prompt alone (no padding, no chunking).
"""
import numpy as np
import pytest
import torch

from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.rl.storage import RolloutStorage
from helpers import NUM_ENVS, fresh_policy, policy_observations, tiny_model_cfg
from numerics import recorded_forwards



@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava"])
def family_loaded(request, tiny_family_path):
    return load_vlm(tiny_model_cfg(tiny_family_path(request.param)))


def _lift_eos(policy, eos_id: int, gap: float = 1.0):
    """Hook ``lm_head`` so that ``eos_id``'s logit is the largest logit minus ``gap`` everywhere."""
    column = torch.zeros(policy.vocab_size, dtype=torch.bool)
    column[eos_id] = True

    def hook(_module, _args, out):
        return torch.where(column.to(out.device), out.max(-1, keepdim=True).values - gap, out)

    return policy.base_model.get_output_embeddings().register_forward_hook(hook)


def _independent_log_probs(policy, prompt, images, reply, temperature):
    """Per-token log-probs of ``reply`` after ``prompt`` alone: full logits / T, forbidden ids at -inf."""
    enc = policy.processor(text=[prompt], images=list(images) or None, return_tensors="pt")
    P = enc["input_ids"].shape[1]
    ids = torch.cat([enc["input_ids"], torch.tensor([reply])], dim=1)
    inputs = dict(enc, input_ids=ids, attention_mask=torch.ones_like(ids))
    if "mm_token_type_ids" in enc:  # the reply is text
        inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(reply), dtype=enc["mm_token_type_ids"].dtype)], 1)
    with torch.no_grad():
        logits = policy.model(**inputs, use_cache=False).logits[0, P - 1 : P - 1 + len(reply)].float()
    z = logits / temperature
    z[:, policy.forbidden_ids] = float("-inf")
    return torch.log_softmax(z, dim=-1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


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
    handle = _lift_eos(policy, eos_id)
    try:
        obs = policy_observations(np.random.default_rng(0), 0)
        torch.manual_seed(0)
        act = policy.act(obs)
        P = policy._encode(act.prompts, act.images)["input_ids"].shape[1]
        replies = []
        for i in range(NUM_ENVS):
            new = raw[0][i, P:].tolist()
            stop = next(j for j, t in enumerate(new) if t in policy.eos_ids)  # generate pads after the first EOS
            replies.append(new[: stop + 1])
        assert all(r[-1] == eos_id for r in replies) and max(len(r) for r in replies) >= 3  # the lift worked
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
            assert token_lp[-1] < -0.1  # EOS was not a sure thing: leaving it out would change the sum
            # rollout (generate's logits) and update (training forward) both include EOS's log-prob
            assert float(act.log_probs[i]) == pytest.approx(float(token_lp.sum()), abs=atol)
            j = int((mb.indices == i).nonzero())
            assert float(trained[j]) == pytest.approx(float(token_lp.sum()), abs=atol)
    finally:
        handle.remove()

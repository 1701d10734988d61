"""The EMA reference policy (ppo.reference=ema), perception-aware token weighting
(ppo.perception_weighting, VPPO) and validation with a best policy (log.val_interval): closed
forms, independent recomputations on the tiny VLM, and end-to-end runs that resume exactly."""

import dataclasses
import json
import math

import pytest
import torch

from a2c_ppo_acktr.algo import perception
from a2c_ppo_acktr.config.arguments import ConfigError, PPOConfig, load_config
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.policy.references import masked_images
from a2c_ppo_acktr.eval.validation import BEST_DIR, BestPolicy, read_best
from helpers import NUM_ENVS, NUM_STEPS, fresh_policy, policy_rollout, run_overrides
from tests.numerics import recorded_forwards


# ------------------------------------------------------------------------ perception arithmetic
def test_top_token_masks_pick_the_global_top_fraction():
    deps = [torch.tensor([0.1, 0.9, 0.3]), torch.tensor([0.5]), torch.tensor([0.0, 0.7, 0.2, 0.8])]
    top = perception.top_token_masks(deps, 0.4)  # ceil(0.4 * 8) = 4 tokens: 0.9, 0.8, 0.7, 0.5
    assert [t.tolist() for t in top] == [[False, True, False], [True], [False, True, False, True]]
    assert sum(int(t.sum()) for t in perception.top_token_masks(deps, 1.0)) == 8
    assert sum(int(t.sum()) for t in perception.top_token_masks(deps, 0.01)) == 1  # at least one token
    with pytest.raises(ValueError, match="top_frac"):
        perception.top_token_masks(deps, 0.0)


def test_reweight_and_advantage_scales_closed_forms():
    w = [torch.tensor([0.5, 1.0, 1.0]), torch.tensor([1.0])]
    top = [torch.tensor([True, False, True]), torch.tensor([False])]
    out = perception.reweight(w, top, top_weight=2.0, rest_weight=0.0)
    assert [o.tolist() for o in out] == [[1.0, 0.0, 2.0], [0.0]]
    scales = perception.advantage_scales(torch.tensor([0.2, 0.6, 1.0]), adv_min=0.9)
    torch.testing.assert_close(scales, torch.tensor([0.9, 0.95, 1.0]))
    assert perception.advantage_scales(torch.tensor([0.3, 0.3]), 0.5).tolist() == [1.0, 1.0]  # no spread: unchanged


def test_masked_images_replace_pixels_only():
    inputs = {
        "input_ids": torch.arange(6)[None],
        "pixel_values": torch.randn(4, 3),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
    }
    zero = masked_images(inputs)
    assert torch.equal(zero["pixel_values"], torch.zeros(4, 3)) and zero["input_ids"] is inputs["input_ids"]
    a, b = masked_images(inputs, noise=True, seed=3), masked_images(inputs, noise=True, seed=3)
    assert torch.equal(a["pixel_values"], b["pixel_values"]) and not torch.equal(
        a["pixel_values"], inputs["pixel_values"]
    )
    with pytest.raises(ValueError, match="no image tensor"):
        masked_images({"input_ids": inputs["input_ids"]})


# ------------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ppo.reference=ema", "dist.zero_stage=3"], "ppo.reference=ema keeps a full copy"),
        (["ppo.reference=ema", "model.use_lora=false"], "averages the LoRA adapter"),
        (["ppo.ema_decay=1.5"], "ppo.ema_decay=1.5 must be in"),
        (["ppo.perception_top_weight=0", "ppo.perception_rest_weight=0"], "not both 0"),
        (["ppo.perception_mask=blur"], "ppo.perception_mask='blur' is not allowed"),
        (["log.val_interval=1", "log.val_seed=0"], "overlap the training scenes"),
        (["log.val_interval=1", "log.val_seed=12340"], "overlap"),  # the eval scenes 12345..
    ],
)
def test_config_errors_name_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(preset="debug", overrides=overrides)


# ------------------------------------------------------------------------ EMA reference on the tiny VLM
def _lora(policy):
    """The adapter's weights, named as the EMA names them (inside ``policy.model``)."""
    return [(n, p) for n, p in policy.model.named_parameters() if "lora_" in n]


LM_HEAD_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)|lm_head"


@pytest.mark.parametrize("targets", ["default", "with_lm_head"])
def test_ema_reference_kl_closed_forms(loaded, tiny_model_path, targets):
    """At initialisation the EMA reference is the policy (KL 0); the update is the closed-form
    average; an EMA holding the adapter with lora_B = 0 is the base model (KL and its gradient = the
    base reference's, also with a LoRA'd lm_head as in cpu-demo: no gradient through the reference);
    the trained weights are bit-identical after the reference forward."""
    over = {} if targets == "default" else {"lora_target_modules": LM_HEAD_TARGETS}
    policy = fresh_policy(loaded, tiny_model_path, **over)
    if targets == "with_lm_head":
        assert any("lm_head" in n for n, _ in _lora(policy))
    st = policy_rollout(policy, seed=4)
    mb = next(st.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        for n, p in _lora(policy):
            if "lora_B" in n:
                p.normal_(0.0, 0.05)
    policy.init_ema_reference()
    before = {n: p.detach().clone() for n, p in _lora(policy)}
    assert policy.evaluate_actions(mb, with_kl=True, reference="ema").kl.abs().max().item() < 1e-6
    assert all(torch.equal(p, before[n]) for n, p in _lora(policy))
    base_kl = policy.evaluate_actions(mb, with_kl=True, reference="base").kl
    assert (base_kl > 1e-6).all()
    # "start" is the frozen copy once there is one (a warm start's adapter), the adapter disabled before
    assert policy.evaluate_actions(mb, with_kl=True, reference="start").kl.abs().max().item() < 1e-6
    # the closed form of one update: ema = d * ema + (1 - d) * w, with the weights moved meanwhile
    with torch.no_grad():
        for n, p in _lora(policy):
            p.add_(0.01)
    policy.update_ema_reference(0.9)
    state = policy.ema_reference_state()
    for n, p in _lora(policy):
        torch.testing.assert_close(state[n], 0.9 * before[n] + 0.1 * p.detach())
    # an EMA equal to the base model (lora_B = 0) gives exactly the base reference's KL
    zeroed = {n: (torch.zeros_like(t) if "lora_B" in n else t) for n, t in state.items()}
    policy.load_ema_reference_state(zeroed)
    params = [p for _, p in _lora(policy)]
    ema_kl = policy.evaluate_actions(mb, with_kl=True, reference="ema").kl
    base_kl = policy.evaluate_actions(mb, with_kl=True, reference="base").kl
    torch.testing.assert_close(ema_kl, base_kl, rtol=1e-4, atol=1e-6)
    for g_ema, g_base in zip(torch.autograd.grad(ema_kl.sum(), params), torch.autograd.grad(base_kl.sum(), params)):
        torch.testing.assert_close(g_ema, g_base, rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError, match="saved EMA reference holds"):
        policy.load_ema_reference_state({k: v for k, v in list(zeroed.items())[1:]})


# ------------------------------------------------------------------------ perception on the tiny VLM
def test_visual_dependency_equals_an_independent_masked_forward(loaded, tiny_model_path):
    """The k1 form of the perception KL is log p(token | real images) - log p(token | masked
    images); the second term recomputed through another path (the minibatch's own encodings with
    zeroed pixels, an ordinary forward) must agree. The full KL is >= 0 and > 0 somewhere: images
    matter to the policy."""
    policy = fresh_policy(loaded, tiny_model_path)
    st = policy_rollout(policy, seed=5)
    policy.eval()
    mb = next(st.minibatches(NUM_ENVS * NUM_STEPS, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        k1 = policy.evaluate_actions(mb, with_kl=True, kl_estimator="k1", reference="masked_images")
        zeroed = [  # vision=None: the zeroed pixels go through the tower, not the rollout's encodings of the real ones
            dataclasses.replace(
                e,
                images=[
                    {k: torch.zeros_like(v) if k.startswith("pixel_values") else v for k, v in img.items()}
                    for img in e.images
                ],
                vision=None,
            )
            for e in mb.encodings
        ]
        masked = policy.evaluate_actions(dataclasses.replace(mb, encodings=zeroed))
        full = policy.evaluate_actions(mb, with_kl=True, reference="masked_images")
    m = k1.token_mask
    torch.testing.assert_close(k1.token_kl[m], (k1.token_log_probs - masked.token_log_probs)[m], rtol=1e-4, atol=1e-5)
    assert (full.token_kl[m] >= -1e-6).all() and full.token_kl[m].max() > 1e-4


def test_perception_apply_keeps_the_ratio_and_scales_advantages(loaded, tiny_model_path):
    policy = fresh_policy(loaded, tiny_model_path)
    st = policy_rollout(policy, seed=6)
    cfg = PPOConfig(
        mini_batch_size=NUM_ENVS,
        perception_weighting=True,
        perception_top_frac=0.4,
        perception_top_weight=3.0,
        perception_rest_weight=0.5,
        perception_adv_min=0.8,
    )
    old_weights = [w.clone() for w in st.token_weights]
    adv = st.advantages.clone()
    metrics = perception.apply(policy, st, cfg)
    n_tokens = sum(w.numel() for w in old_weights)
    factors = torch.cat([new / old for new, old in zip(st.token_weights, old_weights)])
    assert int((factors == 3.0).sum()) == math.ceil(0.4 * n_tokens) and int(
        (factors == 0.5).sum()
    ) == n_tokens - math.ceil(0.4 * n_tokens)
    ratio = st.advantages / adv
    assert ratio.min().item() == pytest.approx(0.8, abs=1e-6) and ratio.max().item() == pytest.approx(1.0, abs=1e-6)
    assert metrics["perception/adv_scale_mean"] == pytest.approx(ratio.mean().item(), rel=1e-5)
    # the re-summed rollout log-probs are what the update computes with the new weights: ratio 1
    policy.train()
    for mb in st.minibatches(2, torch.Generator().manual_seed(1)):
        with recorded_forwards(VLMPolicy) as forwards:
            out = policy.evaluate_actions(mb)
        # act's forward against this batch's: rounding only (numerics.forward_bounds)
        assert (out.log_probs - mb.old_log_probs).abs().max().item() < forwards[0].log_prob


# ------------------------------------------------------------------------ best policy
def test_best_policy_keeps_the_highest_score_and_replaces_atomically(tmp_path):
    best = BestPolicy(tmp_path)
    saved = []

    def save(target):
        target.mkdir(parents=True)
        (target / "w.txt").write_text(str(len(saved)))
        saved.append(target)

    assert best.update(2, {"score": 0.3, "per_type": {}}, save)
    assert not best.update(4, {"score": 0.3, "per_type": {}}, save)  # a tie keeps the earlier policy
    assert not best.update(6, {"score": 0.1, "per_type": {}}, save)
    assert best.update(8, {"score": 0.5, "per_type": {}}, save)
    assert read_best(tmp_path)["iteration"] == 8 and read_best(tmp_path)["score"] == 0.5
    assert (tmp_path / BEST_DIR / "policy" / "w.txt").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == [BEST_DIR]  # no temporary left behind
    again = BestPolicy(tmp_path)
    again.load_state(best.state())
    assert not again.is_better(0.5) and again.is_better(0.51)
    with pytest.raises(FileNotFoundError, match="log.val_interval"):
        read_best(tmp_path / "other")


# ------------------------------------------------------------------------ end to end
def _overrides(out, **extra):
    defaults = {
        "log.save_interval": "1",
        "ppo.num_iterations": "3",
        "ppo.reference": "ema",
        "ppo.ema_decay": "0.5",
        "ppo.kl_coef": "0.05",
        "ppo.perception_weighting": "true",
        "ppo.perception_rest_weight": "0.5",
    }
    return run_overrides(out, defaults, extra)


@pytest.mark.slow
def test_ema_perception_and_validation_train_resume_exactly_and_validation_changes_nothing(tmp_path):
    """3 iterations without validation equal 2 with validation + resume + 1 with validation, weight
    for weight and in every training metric: validation draws nothing from the run's streams, and
    the EMA reference and the best score travel in the checkpoint."""
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.rl.run_state import EMA_FILE
    from a2c_ppo_acktr.rl.train import run_training

    plain = run_training(load_config(preset="debug", overrides=_overrides(tmp_path / "plain")))
    val = {"log.val_interval": "1", "log.val_episodes": "3"}
    run_training(
        load_config(preset="debug", overrides=_overrides(tmp_path / "val", **val, **{"log.stop_after_iterations": "2"}))
    )
    resumed = run_training(
        load_config(preset="debug", overrides=_overrides(tmp_path / "val", **val, **{"log.resume": "auto"}))
    )
    a, b = torch.load(plain / "trainable.pt"), torch.load(resumed / "trainable.pt")
    assert all(torch.equal(a[n], b[n]) for n in a)
    ea, eb = torch.load(plain / EMA_FILE), torch.load(resumed / EMA_FILE)
    assert all(torch.equal(ea[n], eb[n]) for n in ea)
    assert any(not torch.equal(ea[n], a[f"model.{n}"]) for n in ea)  # the reference trails the weights
    rows, vrows = read_metrics(tmp_path / "plain" / "metrics.jsonl"), read_metrics(tmp_path / "val" / "metrics.jsonl")
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "val/", "perception/seconds"))}  # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in vrows]
    assert all(r["losses/kl_ref"] >= 0 and "perception/dependency_mean" in r for r in rows)
    # the best policy is the first iteration with the highest validation score
    scores = [r["val/score"] for r in vrows]
    best = read_best(tmp_path / "val")
    assert best["score"] == max(scores) and best["iteration"] == scores.index(max(scores)) + 1
    assert (tmp_path / "val" / BEST_DIR / "policy" / "adapter_config.json").is_file()
    assert json.loads((resumed / "trainer_state.json").read_text())["best_val"]["score"] == max(scores)


def test_ema_decay_one_keeps_the_starting_weights_as_the_reference(tmp_path):
    """ppo.ema_decay=1: the reference stays at the weights the run started with (a fresh adapter's
    lora_B is zero) while the trained adapter moves away from it."""
    from a2c_ppo_acktr.run.logger import read_metrics
    from a2c_ppo_acktr.rl.run_state import EMA_FILE
    from a2c_ppo_acktr.rl.train import run_training

    out = run_training(
        load_config(
            preset="debug",
            overrides=_overrides(tmp_path / "frozen", **{"ppo.ema_decay": "1", "ppo.perception_weighting": "false"}),
        )
    )
    ema, trained = torch.load(out / EMA_FILE), torch.load(out / "trainable.pt")
    lora_b = [n for n in ema if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(ema[n]) == 0 for n in lora_b)
    assert any(torch.count_nonzero(trained[f"model.{n}"]) > 0 for n in lora_b)
    rows = read_metrics(tmp_path / "frozen" / "metrics.jsonl")
    assert all(r["losses/kl_ref"] > 0 for r in rows)

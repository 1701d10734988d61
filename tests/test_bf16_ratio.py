"""bf16 and the ratio invariant: ``model.rollout_log_probs=auto`` picks act's mode from the dtype and
``ppo.old_log_probs`` (and the saved config keeps the resolved mode), and with ``old_log_probs=rollout``
in bf16 the default act mode keeps the first PPO ratio near 1 (docs/TRAINING.md, "The first ratio")."""

from __future__ import annotations

import statistics

import pytest
import yaml

from a2c_ppo_acktr.config.arguments import ConfigError, ModelConfig, RunConfig, load_config


@pytest.mark.parametrize(
    "dtype, old_log_probs, mode",
    [
        ("float32", "update", "generate"),
        ("bfloat16", "update", "generate"),
        ("float32", "rollout", "generate"),
        ("bfloat16", "rollout", "recompute"),
        ("float16", "rollout", "recompute"),
    ],
)
def test_auto_rollout_log_probs_resolves_by_dtype_and_old_log_probs_and_round_trips(
    tmp_path, dtype, old_log_probs, mode
):
    """act re-scores its replies only where they are the update's old log-probs (ppo.old_log_probs=rollout)
    in low precision; with the update's own recompute (the default) they are only monitored."""
    cfg = load_config(preset="debug", overrides={"model": {"dtype": dtype}, "ppo": {"old_log_probs": old_log_probs}})
    assert cfg.model.rollout_log_probs == mode
    path = tmp_path / "config.yaml"
    cfg.save(path)
    assert yaml.safe_load(path.read_text())["model"]["rollout_log_probs"] == mode  # the mode used, not "auto"
    assert RunConfig.from_yaml(path) == cfg
    for explicit in ("generate", "recompute"):  # an explicit choice is never overridden
        over = {"model": {"dtype": dtype, "rollout_log_probs": explicit}, "ppo": {"old_log_probs": old_log_probs}}
        assert load_config(preset="debug", overrides=over).model.rollout_log_probs == explicit
    # Outside a run (evaluation) an unresolved auto follows the dtype.
    assert ModelConfig(dtype=dtype).recompute_rollout_log_probs == (dtype != "float32")


def test_gpu_presets_recompute_old_log_probs_in_the_update_and_bad_modes_are_rejected():
    for preset in ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b"):
        cfg = load_config(preset=preset)
        assert (cfg.model.dtype, cfg.ppo.old_log_probs, cfg.model.rollout_log_probs) == (
            "bfloat16",
            "update",
            "generate",
        )
        assert (cfg.ppo.ratio_level, cfg.ppo.loss_agg) == ("token", "token-mean")
        # Trained on act's own log-probs, bf16 re-scores them in the rollout's layout.
        assert (
            load_config(preset=preset, overrides={"ppo": {"old_log_probs": "rollout"}}).model.rollout_log_probs
            == "recompute"
        )
    with pytest.raises(ConfigError, match=r"model.rollout_log_probs='cached'.*'auto'"):
        ModelConfig(rollout_log_probs="cached")
    with pytest.raises(ConfigError, match=r"ppo.old_log_probs='recompute'.*'update'"):
        load_config(preset="debug", overrides={"ppo": {"old_log_probs": "recompute"}})


@pytest.mark.slow
def test_bf16_default_mode_keeps_the_first_minibatch_ratio_near_one():
    """The tiny model in bf16 on CPU, 4 seeds x the debug preset's and the GPU presets' temperatures,
    old log-probs from the rollout (``ratio_check``): every turn's ``|ratio - 1|`` stays under the bf16
    bound in act's default mode there, few turns exceed the typical level, and ``generate`` mode
    (cached decoding's logits) exceeds it on several times as many turns, which is why bf16 with
    ``old_log_probs=rollout`` re-scores with ``recompute`` (~25 s)."""
    from a2c_ppo_acktr.gpu_smoke import TEMPERATURE_SETTINGS, TYPICAL_DEV, ratio_bound, ratio_check

    def run(mode: dict) -> list:
        return [
            ratio_check("cpu", "bfloat16", model_overrides={**temps, **mode}, setting=name, seed=seed)
            for name, temps in TEMPERATURE_SETTINGS.items()
            for seed in range(4)
        ]

    def share_over_typical(results: list) -> float:
        return statistics.mean(d > TYPICAL_DEV for r in results for d in r.turn_devs)

    default, generate = run({}), run({"rollout_log_probs": "generate"})
    assert {r.rollout_log_probs for r in default} == {"recompute"} and {r.rollout_log_probs for r in generate} == {
        "generate"
    }
    worst = max(r.ratio_max_dev for r in default)
    print(
        f"bf16 default mode: max |ratio-1| {worst:.3g}, turns over {TYPICAL_DEV:g}: {share_over_typical(default):.1%} "
        f"(generate mode: {share_over_typical(generate):.1%})"
    )
    assert worst < ratio_bound("bfloat16", 0.1)  # the GPU presets' clip range
    assert share_over_typical(default) <= 0.15
    assert share_over_typical(generate) >= 2 * share_over_typical(default)


@pytest.mark.parametrize("lora_on_head", [False, True])
def test_a_bf16_lm_head_gives_float32_logits_of_the_exact_product(tiny_model_path, lora_on_head):
    """bf16 rounding of the logits (0.06-0.25 at real sizes, divided by the temperature) is gone: the
    head returns the float32 product of the bf16 hidden states and weights, with LoRA's term when
    lm_head is adapted, and the chunked log-probs see it."""
    import torch
    from numerics import f32_tolerance

    from a2c_ppo_acktr.policy.model import VLMPolicy

    targets = r".*language_model.*\.(q_proj|v_proj)" + (r"|lm_head" if lora_on_head else "")
    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        dtype="bfloat16",
        lora_r=2,
        lora_alpha=4,
        lora_target_modules=targets,
        value_head_hidden=8,
        temp_head_hidden=8,
    )
    torch.manual_seed(0)
    policy = VLMPolicy(cfg)
    head = policy.model.get_output_embeddings()
    linear = getattr(head, "base_layer", head)
    assert (linear is not head) == lora_on_head and linear.weight.dtype == torch.bfloat16
    if lora_on_head:
        with torch.no_grad():
            head.lora_B["default"].weight.normal_(0.0, 0.5)  # an adapter term that is not zero
    x = torch.randn(5, linear.in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16) * 4
    with torch.no_grad():
        got = head(x)
        exact = x.double() @ linear.weight.double().T
        # float32 products of bf16 values are exact; only the H-term sums round, at most sum |x w| each
        # (LoRA computes in float32: its H and r terms and the add, at sum |x A^T B^T| s)
        terms, magnitude = linear.in_features, x.double().abs() @ linear.weight.double().abs().T
        if lora_on_head:
            a, b = head.lora_A["default"].weight.double(), head.lora_B["default"].weight.double()
            exact = exact + (x.double() @ a.T @ b.T) * head.scaling["default"]
            terms += a.shape[-1] + a.shape[0] + 1
            magnitude = magnitude + (x.double().abs() @ a.abs().T @ b.abs().T) * head.scaling["default"]
        rounded = torch.nn.functional.linear(x, linear.weight)  # what a plain bf16 head returns
    assert got.dtype == torch.float32
    tol = f32_tolerance(terms, float(magnitude.max()))
    assert (got.double() - exact).abs().max() < tol
    assert (rounded.double() - exact).abs().max() > 10 * (got.double() - exact).abs().max()


def test_heads_compute_in_float32_when_deepspeed_casts_them_to_bf16(tiny_model_path):
    """DeepSpeed's bf16 engine casts every parameter, the value and temperature heads' included; the
    heads still compute in float32 (the bf16 weights' exact values), with gradients into them."""
    import torch
    from numerics import f32_tolerance

    from a2c_ppo_acktr.policy.model import VLMPolicy

    cfg = ModelConfig(
        model_path=tiny_model_path, device="cpu", lora_r=2, lora_alpha=4, value_head_hidden=8, temp_head_hidden=8
    )
    torch.manual_seed(0)
    policy = VLMPolicy(cfg)
    with torch.no_grad():
        policy.temp_predictor.mlp[-1].weight.normal_(0.0, 1.0)  # a head whose output depends on the input
    policy.value_head.to(torch.bfloat16)
    policy.temp_predictor.to(torch.bfloat16)
    hidden = torch.randn(4, policy.value_head[0].in_features, generator=torch.Generator().manual_seed(2)).to(
        torch.bfloat16
    )
    values, temps = policy._values(hidden), policy.temp_predictor(hidden)
    assert values.dtype == temps.dtype == torch.float32
    wide = {k: v.double() for k, v in policy.value_head.state_dict().items()}
    want = torch.tanh(hidden.double() @ wide["0.weight"].T + wide["0.bias"]) @ wide["2.weight"].T + wide["2.bias"]
    # float32 against exact: the first layer's products and bias round at up to sum |w h| + |b|, passed
    # through tanh (slope <= 1) and the output weights; then the output layer's own sum
    first = float((hidden.double().abs() @ wide["0.weight"].abs().T + wide["0.bias"].abs()).max())
    out_w = float(wide["2.weight"].abs().sum())
    bound = f32_tolerance(hidden.shape[-1] + 1, first * out_w) + f32_tolerance(
        wide["2.weight"].shape[-1] + 1, out_w + float(wide["2.bias"].abs().max())
    )
    assert (values.double() - want.squeeze(-1)).abs().max() < bound
    lin0, lin2 = policy.value_head[0], policy.value_head[2]
    in_bf16 = torch.nn.functional.linear(
        torch.tanh(torch.nn.functional.linear(hidden, lin0.weight, lin0.bias)), lin2.weight, lin2.bias
    ).squeeze(-1)  # a plain bf16 head
    assert (in_bf16.double() - want.squeeze(-1)).abs().max() > 10 * (values.double() - want.squeeze(-1)).abs().max()
    grads = torch.autograd.grad(
        values.sum() + temps.sum(), [policy.value_head[0].weight, policy.temp_predictor.mlp[0].weight]
    )
    assert all(g.dtype == torch.bfloat16 and g.abs().max() > 0 for g in grads)


def test_a_copied_float32_head_computes_with_its_own_weights():
    """The float32 forward is bound to its layer: a deep copy (a reference head, a snapshot) uses the
    copy's weights, not the original's."""
    import copy

    import torch

    from a2c_ppo_acktr.policy.temp_predictor import compute_in_float32

    head = compute_in_float32(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1)))
    twin = copy.deepcopy(head).to(torch.bfloat16)
    with torch.no_grad():
        twin[2].bias.fill_(5.0)
    x = torch.ones(4, 3)
    assert (twin(x) - head(x)).abs().min() > 1.0 and twin(x).dtype == torch.float32


def test_float32_weight_cache_reuses_one_exact_cast_and_follows_in_place_updates():
    """Inside float32_weight_cache a no-grad call reuses the weight's cast until the weight changes in
    place; a grad-enabled call and any call outside the block cast afresh; the block frees the copy."""
    import torch

    from a2c_ppo_acktr.policy.temp_predictor import compute_in_float32, float32_weight, float32_weight_cache

    layer = compute_in_float32(torch.nn.Linear(5, 3)).to(torch.bfloat16)
    x = torch.randn(2, 5)
    with float32_weight_cache(layer), torch.no_grad():
        first = float32_weight(layer)
        assert first.dtype == torch.float32 and torch.equal(first, layer.weight.float())
        assert float32_weight(layer) is first
        y = layer(x)
        layer.weight.add_(1.0)  # an optimizer step's in-place update: the version moves
        second = float32_weight(layer)
        assert second is not first and torch.equal(second, layer.weight.float())
        assert torch.equal(layer(x), torch.nn.functional.linear(x, second, layer.bias.float()))
        assert not torch.equal(layer(x), y)
    with float32_weight_cache(layer):
        assert float32_weight(layer) is not float32_weight(layer)  # grad enabled: no cache
    assert float32_weight(layer) is not float32_weight(layer) and not hasattr(layer, "_vsi_float32_weight")
    f32 = compute_in_float32(torch.nn.Linear(5, 3))
    with float32_weight_cache(f32), torch.no_grad():
        assert float32_weight(f32) is f32.weight  # float32 weights are used as they are


def test_act_casts_the_float32_lm_head_once_per_generate_with_the_same_numbers(tiny_model_path, monkeypatch):
    """A bf16 policy's act casts lm_head's weight once for all its decoded tokens, and samples the same
    tokens with bitwise the same log-probs as casting at every token."""
    import contextlib

    import numpy as np
    import torch

    from a2c_ppo_acktr.policy import model as policy_model
    from a2c_ppo_acktr.policy import sampling
    from a2c_ppo_acktr.policy import temp_predictor

    cfg = ModelConfig(
        model_path=tiny_model_path,
        device="cpu",
        dtype="bfloat16",
        lora_r=2,
        lora_alpha=4,
        value_head_hidden=8,
        temp_head_hidden=8,
        max_new_tokens=6,
        rollout_log_probs="generate",
    )
    torch.manual_seed(0)
    policy = policy_model.VLMPolicy(cfg)
    head = policy.model.get_output_embeddings()
    head = getattr(head, "base_layer", head)
    rng = np.random.default_rng(0)
    obs = [
        {"images": [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)], "text": f"Question {i}: where is it?"}
        for i in range(2)
    ]
    real = temp_predictor.float32_weight
    casts: list[torch.Tensor] = []

    def spy(layer):
        w = real(layer)
        if layer is head:
            casts.append(w)
        return w

    monkeypatch.setattr(temp_predictor, "float32_weight", spy)
    torch.manual_seed(1)
    cached = policy.act(obs)
    calls = len(casts)
    assert calls >= 2 and all(w is casts[0] for w in casts), "one cast per generate"
    monkeypatch.setattr(sampling, "float32_weight_cache", lambda module: contextlib.nullcontext())
    torch.manual_seed(1)
    fresh = policy.act(obs)
    assert len({id(w) for w in casts[calls:]}) == len(casts) - calls  # without the block: a cast per call
    assert [g.tolist() for g in cached.generated_ids] == [g.tolist() for g in fresh.generated_ids]
    assert all(torch.equal(a, b) for a, b in zip(cached.token_log_probs, fresh.token_log_probs))

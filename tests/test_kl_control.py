"""The KL settings as one object (algo/kl.py) and the update's metric tally (algo/tally.py)."""

from __future__ import annotations

import math

import pytest
import torch

from a2c_ppo_acktr.algo.kl import KLControl
from a2c_ppo_acktr.algo.tally import UpdateTally
from a2c_ppo_acktr.config.arguments import PPOConfig


def test_the_reference_forward_runs_always_in_the_loss_else_only_for_the_monitor():
    in_loss = KLControl(PPOConfig(kl_coef=0.1), monitor_interval=3)
    assert in_loss.in_loss and all(in_loss.with_reference(first, n, True) for first in (True, False) for n in range(4))
    monitor = KLControl(PPOConfig(kl_coef=0.0), monitor_interval=3)
    assert not monitor.in_loss
    assert [monitor.with_reference(True, n, True) for n in range(7)] == [True, False, False, True, False, False, True]
    assert not monitor.with_reference(False, 0, True) and not monitor.with_reference(
        True, 0, False
    )  # no LoRA: no reference
    reward = KLControl(PPOConfig(kl_coef=0.1, kl_penalty="reward"))
    assert not reward.in_loss and not reward.adapts  # a reward penalty is not in the loss and does not adapt here


def test_the_adaptive_coefficient_moves_toward_the_target_by_at_most_20_percent():
    kl = KLControl(PPOConfig(kl_coef=0.1, kl_adaptive=True, kl_target=0.05))
    assert kl.adapts
    kl.adapt(1.0)  # far above target: capped at +20%
    assert kl.coef == pytest.approx(0.12)
    kl.adapt(0.0)  # far below: -20%
    assert kl.coef == pytest.approx(0.096)
    assert not KLControl(PPOConfig(kl_coef=0.1)).adapts
    with pytest.raises(ValueError, match="kl_ref_interval=0 must be >= 1"):
        KLControl(PPOConfig(), monitor_interval=0)


def test_the_estimator_reaches_the_forward_only_when_it_is_not_the_exact_kl():
    assert KLControl(PPOConfig(kl_estimator="full")).forward_options() == {}
    assert KLControl(PPOConfig(kl_estimator="k3")).forward_options() == {"kl_estimator": "k3"}


def test_the_tally_means_counted_minibatches_and_keeps_the_kl_apart():
    t = UpdateTally()
    t.add({"policy_loss": torch.tensor(1.0), "kl_ref": torch.tensor(0.3), "ratio_max_dev": torch.tensor(9.0)})
    t.add({"policy_loss": torch.tensor(3.0)})
    t.skipped += 1
    t.first_dev = torch.tensor(0.25)
    t.end_window(True, 2.0)
    t.end_window(False, float("inf"))
    mean, kl_ref, first = t.read()
    assert mean == {"policy_loss": 2.0} and kl_ref == pytest.approx(0.3) and first == 0.25
    assert t.mean_grad_norm() == 2.0 and (t.windows, t.window_steps, t.counted) == (2, 1, 2)
    empty_mean, empty_kl, empty_first = UpdateTally().read()
    assert empty_mean == {} and math.isnan(empty_kl) and math.isnan(empty_first)


def test_a_reference_is_one_class_and_unknown_names_are_listed():
    from a2c_ppo_acktr.common import choices
    from a2c_ppo_acktr.policy import references

    assert {type(r).__name__ for r in references.REFERENCES.values()} == {
        "StartingPolicy",
        "AdapterDisabled",
        "MovingAverage",
    }
    assert references.reference_named("noised_images").noise and not references.reference_named("masked_images").noise
    with pytest.raises(
        ValueError,
        match=r"reference='frozen' is not one of \['start', 'base', 'ema', 'masked_images', 'noised_images'\]",
    ):
        references.reference_named("frozen")
    with pytest.raises(ImportError, match="ppo.reference"):  # a class registered without its name in choices.py
        choices.check_registry("ppo.reference", [*references.REFERENCES, "frozen"], choices.REFERENCES)

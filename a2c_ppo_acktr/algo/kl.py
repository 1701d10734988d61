"""The KL to the reference policy as one object: where it acts, how it is estimated, how its
coefficient adapts, and when it is only monitored.

* where: in the loss (``ppo.kl_penalty=loss``, ``kl_coef * KL`` added per minibatch) or in the reward
  (``reward``: ``-kl_coef * KL`` of each response subtracted from its reward before the advantages);
* estimator: the exact KL over the vocabulary (``full``) or a sample estimator (``k1``, ``k2``, ``k3``;
  :func:`a2c_ppo_acktr.policy.distributions.sample_kl`);
* adaptive coefficient (``ppo.kl_adaptive``, Ziegler et al. 2019): a proportional controller toward
  ``ppo.kl_target``, at most :data:`KL_CONTROLLER_MAX_STEP` per update;
* monitor: with the KL out of the loss, the reference forward runs only on the first minibatch of
  every ``log.kl_ref_interval``-th update, for ``losses/kl_ref``. The decision depends only on the
  update count and the coefficient, which every process holds alike, so all ranks run the same
  forwards (under ZeRO-3 a forward is a collective).
"""

from __future__ import annotations

from typing import Any

from a2c_ppo_acktr.config.arguments import PPOConfig

# The adaptive KL controller moves kl_coef by at most this fraction per update (Ziegler et al. 2019).
KL_CONTROLLER_MAX_STEP = 0.2


def adapt_kl_coef(kl_coef: float, kl: float, kl_target: float) -> float:
    """Proportional controller: grow ``kl_coef`` when KL is above target, shrink it when below."""
    error = max(-KL_CONTROLLER_MAX_STEP, min(KL_CONTROLLER_MAX_STEP, kl / kl_target - 1.0))
    return kl_coef * (1.0 + error)


class KLControl:
    """The run's KL settings and its coefficient (the one piece of state: it adapts and is checkpointed).

    Args:
        cfg: ``ppo.kl_coef``, ``kl_penalty``, ``kl_estimator``, ``kl_adaptive``, ``kl_target``.
        monitor_interval: ``log.kl_ref_interval`` (>= 1).
    """

    def __init__(self, cfg: PPOConfig, monitor_interval: int = 1) -> None:
        if monitor_interval < 1:
            raise ValueError(f"kl_ref_interval={monitor_interval} must be >= 1 (log.kl_ref_interval)")
        self.coef = float(cfg.kl_coef)
        self.penalty = cfg.kl_penalty
        self.estimator = cfg.kl_estimator
        self.adaptive = bool(cfg.kl_adaptive)
        self.target = cfg.kl_target
        self.monitor_interval = int(monitor_interval)

    @property
    def in_loss(self) -> bool:
        """The KL term is part of the loss (a positive coefficient, ``kl_penalty=loss``)."""
        return self.coef > 0 and self.penalty == "loss"

    def with_reference(self, first_minibatch: bool, num_updates: int, has_reference: bool) -> bool:
        """Whether a minibatch runs the reference forward: always when the KL is in the loss, else on
        the first minibatch of every ``monitor_interval``-th update (the monitor)."""
        if self.in_loss:
            return True
        return first_minibatch and has_reference and num_updates % self.monitor_interval == 0

    @property
    def adapts(self) -> bool:
        """The coefficient adapts after each update that measured the KL (adaptive, in the loss)."""
        return self.adaptive and self.in_loss

    def adapt(self, kl_ref: float) -> None:
        """Move the coefficient toward ``kl_target`` given the update's measured KL (mean over processes)."""
        self.coef = adapt_kl_coef(self.coef, kl_ref, self.target)

    def forward_options(self) -> dict[str, Any]:
        """The policy forward's keyword for the estimator, only where it is not the default (exact KL)."""
        return {"kl_estimator": self.estimator} if self.estimator != "full" else {}

"""Perception-aware token weighting (``ppo.perception_weighting``), after VPPO (Huang et al. 2025,
"Spotlight on Token Perception for Multimodal Reinforcement Learning").

A generated token's *visual dependency* is ``KL(p(. | prompt with the real images) || p(. | prompt
with masked images))`` at its position, both at the row's sampling temperature. After each rollout
one no-grad pass (:func:`measure`) computes it for every stored token, and :func:`apply`:

* multiplies the log-prob weight of the rollout's ``perception_top_frac`` most dependent tokens by
  ``perception_top_weight`` and of the others by ``perception_rest_weight`` (VPPO's gradient filter is
  1 and 0). Each turn's stored rollout log-prob is re-summed with the new weights from the same
  pass's per-token log-probs, so the first PPO minibatch still sees ratio 1;
* scales each turn's advantage into ``[perception_adv_min, 1]`` by its mean dependency, min-max over
  the rollout (the most dependent response keeps its advantage).

The policy here acts with one response per turn, so VPPO's trajectory is a turn (one response).
The functions on plain tensors (:func:`top_token_masks`, :func:`reweight`, :func:`advantage_scales`)
hold the arithmetic; :func:`apply` runs them on a :class:`~a2c_ppo_acktr.algo.storage.RolloutStorage`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from a2c_ppo_acktr.algo.ppo import forward_in_storage_order
from a2c_ppo_acktr.config.arguments import PPOConfig
from a2c_ppo_acktr.policy.distributions import sequence_log_prob


def top_token_masks(dependencies: Sequence[Tensor], top_frac: float) -> list[Tensor]:
    """Which tokens are among the ``ceil(top_frac * n)`` most dependent of all ``n`` tokens.

    Args:
        dependencies: one ``(R_i,)`` tensor per response.
        top_frac: fraction in ``(0, 1]``.

    Returns:
        One ``(R_i,)`` bool tensor per response. Ties at the threshold are broken by position in the
        concatenation (``torch.topk`` on the CPU is deterministic), so exactly ``k`` are chosen.
    """
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"top_frac={top_frac} must be in (0, 1]")
    lengths = [int(d.numel()) for d in dependencies]
    flat = torch.cat([d.detach().float().cpu().reshape(-1) for d in dependencies]) if dependencies else torch.zeros(0)
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    k = min(flat.numel(), math.ceil(top_frac * flat.numel()))
    if k > 0:
        chosen[torch.topk(flat, k, sorted=False).indices] = True
    return list(chosen.split(lengths))


def reweight(
    token_weights: Sequence[Tensor], top: Sequence[Tensor], top_weight: float, rest_weight: float
) -> list[Tensor]:
    """``w * top_weight`` on the chosen tokens, ``w * rest_weight`` elsewhere (``(R_i,)`` each)."""
    return [
        w * torch.where(t, torch.tensor(float(top_weight)), torch.tensor(float(rest_weight)))
        for w, t in zip(token_weights, top)
    ]


def advantage_scales(mean_dependency: Tensor, adv_min: float) -> Tensor:
    """``adv_min + (1 - adv_min) * (d - min d) / (max d - min d)``; all ones when every ``d`` is equal."""
    d = mean_dependency.float()
    spread = d.max() - d.min() if d.numel() else torch.tensor(0.0)
    if d.numel() == 0 or float(spread) <= 0:
        return torch.ones_like(d)
    return adv_min + (1.0 - adv_min) * (d - d.min()) / spread


@dataclass
class Measurement:
    """Per stored turn (flat index ``t * num_envs + n``): its tokens' dependencies and log-probs."""

    dependencies: list[Tensor]  # (R_i,) KL(real || masked) per generated token
    log_probs: list[Tensor]  # (R_i,) per-token log-probs with the real images (the rollout's, to rounding)


def measure(policy: Any, storage: Any, mini_batch_size: int, mask: str = "zero", seed: int = 0) -> Measurement:
    """One no-grad pass over the stored turns, in storage order: the policy with the real images and
    with masked ones (``mask``: zero | noise; the noise of chunk k is seeded from ``seed`` and k)."""
    total = storage.step * storage.num_envs
    deps: list[Tensor] = [torch.zeros(0)] * total
    lps: list[Tensor] = [torch.zeros(0)] * total
    reference = "noised_images" if mask == "noise" else "masked_images"
    options = lambda k: {"reference": reference, "noise_seed": seed * 1_000_003 + k}  # noqa: E731
    for mb, out in forward_in_storage_order(policy, storage, mini_batch_size, options):
        kl, lp, m = out.token_kl.float().cpu(), out.token_log_probs.float().cpu(), out.token_mask.cpu()
        for row, i in enumerate(mb.indices.tolist()):
            deps[i] = kl[row][m[row]].clamp_min(0.0)  # a KL; rounding can leave -1e-9
            lps[i] = lp[row][m[row]]
    return Measurement(deps, lps)


def apply(policy: Any, storage: Any, cfg: PPOConfig, seed: int = 0) -> dict[str, float]:
    """Measure the rollout's visual dependencies and reweight ``storage`` in place (token weights,
    rollout log-probs, advantages: call after ``compute_returns``). Returns ``perception/*`` metrics."""
    if storage.advantages is None:
        raise RuntimeError("perception weighting scales the advantages: call compute_returns first")
    t0 = time.perf_counter()
    m = measure(policy, storage, cfg.mini_batch_size, cfg.perception_mask, seed)
    total = storage.step * storage.num_envs
    weights = [storage.token_weights[i] for i in range(total)]
    for i, (w, d) in enumerate(zip(weights, m.dependencies)):
        if w.numel() != d.numel():
            raise RuntimeError(f"turn {i}: {w.numel()} token weights but {d.numel()} measured tokens")
    top = top_token_masks(m.dependencies, cfg.perception_top_frac)
    new_weights = reweight(weights, top, cfg.perception_top_weight, cfg.perception_rest_weight)
    for i, (w, lp) in enumerate(zip(new_weights, m.log_probs)):
        storage.token_weights[i] = w
        storage.old_log_probs.view(-1)[i] = float(
            sequence_log_prob(lp[None], w[None], torch.ones(1, lp.numel(), dtype=torch.bool))
        )
    mean_dep = torch.stack([d.mean() if d.numel() else torch.tensor(0.0) for d in m.dependencies])
    scales = advantage_scales(mean_dep, cfg.perception_adv_min).view(storage.num_steps, storage.num_envs)
    storage.advantages = storage.advantages * scales
    flat = torch.cat(m.dependencies) if m.dependencies else torch.zeros(0)
    chosen = torch.cat(top) if top else torch.zeros(0, dtype=torch.bool)
    return {
        "perception/dependency_mean": float(flat.mean()) if flat.numel() else float("nan"),
        "perception/dependency_top_min": float(flat[chosen].min()) if bool(chosen.any()) else float("nan"),
        "perception/adv_scale_mean": float(scales.mean()),
        "perception/seconds": time.perf_counter() - t0,
    }

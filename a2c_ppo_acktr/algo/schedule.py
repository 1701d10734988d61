"""The optimizer and its learning-rate schedule: AdamW over the adapter and the heads (two groups),
linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math

import torch

from a2c_ppo_acktr.config.arguments import PPOConfig


def lr_factor(iteration: int, cfg: PPOConfig) -> float:
    """Learning-rate multiplier used during iteration ``iteration`` (0-based).

    Linear warmup over ``warmup_iterations`` (from ``1/warmup`` to 1), then ``constant`` (1) or
    ``cosine`` decay from 1 to ``min_lr_ratio`` at the last iteration.
    """
    if iteration < cfg.warmup_iterations:
        return (iteration + 1) / cfg.warmup_iterations
    if cfg.lr_schedule == "constant":
        return 1.0
    decay_iters = cfg.num_iterations - cfg.warmup_iterations
    if decay_iters <= 1:
        return 1.0
    progress = (iteration - cfg.warmup_iterations) / (decay_iters - 1)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(policy: torch.nn.Module, cfg: PPOConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters: one group for the adapter/backbone (``lr``), one for the
    value and temperature heads (``policy.head_parameters()``, ``head_lr``, default ``lr``).

    Raises:
        ValueError: the policy has no trainable parameter.
    """
    head_ids = {id(p) for p in policy.head_parameters()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the policy has no trainable parameters; enable model.use_lora or the heads")
    body = [p for p in trainable if id(p) not in head_ids]
    heads = [p for p in trainable if id(p) in head_ids]
    head_lr = cfg.head_lr if cfg.head_lr is not None else cfg.lr
    groups = [
        g
        for g in ({"params": body, "lr": cfg.lr, "name": "body"}, {"params": heads, "lr": head_lr, "name": "heads"})
        if g["params"]
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)

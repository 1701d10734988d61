"""The training steps the tiny models' build shares: the reply-format pre-training (:mod:`tiny`) and
the vision pre-training (:mod:`a2c_ppo_acktr.tiny.vision`) both run :func:`next_token_training` on batches of
:func:`text_rows`. Part of the build: editing this module invalidates old builds (``tiny.spec_hash``).
"""

from __future__ import annotations

from typing import Optional, Sequence


def text_rows(docs: Sequence[Sequence[int]], pad: int, width: Optional[int] = None):
    """Right-padded ``(input_ids, attention_mask)`` of token-id documents (``width``: at least the longest)."""
    import torch

    width = max([len(d) for d in docs] + [width or 0])
    ids = torch.full((len(docs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(docs), width), dtype=torch.long)
    for k, d in enumerate(docs):
        ids[k, : len(d)] = torch.tensor(d)
        mask[k, : len(d)] = 1
    return ids, mask


def next_token_training(model, make_batch, steps: int, lr: float, seed: int) -> list[float]:
    """``steps`` full-parameter AdamW steps on ``model(**make_batch(rng)).loss``: a short warm-up then a
    linear decay to zero, gradients clipped at norm 1, on one CPU thread so the same seed gives
    identical weights everywhere. ``make_batch`` draws from the seeded ``numpy`` generator it is given.

    Returns:
        The loss of every step.
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (1.0 - s / steps))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses: list[float] = []
    model.train()
    try:
        for _ in range(steps):
            loss = model(**make_batch(rng)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
        model.eval()
    return losses

"""The training steps the tiny models' build shares: the reply-format pre-training (:mod:`tiny`) and
the vision pre-training (:mod:`a2c_ppo_acktr.tiny.vision`) both run :func:`next_token_training` on batches of
:func:`text_rows`. Part of the build: editing this module invalidates old builds (``tiny.spec_hash``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence


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


@contextlib.contextmanager
def linear_patch_embeds(model) -> Iterator[int]:
    """Run the Qwen-VL patch embeddings of ``model`` as the matrix product they are, inside the block.

    The patch embedding is a ``Conv3d`` whose kernel equals its stride: each patch meets the kernel once,
    so it is a linear map of the flattened patch. On CPU the convolution's backward was a sixth of a
    room-size training step; the product gives the same values up to summation order. The modules are
    restored on exit, so the saved model is the family's own. Yields the number of modules replaced.
    """
    import torch

    replaced = []
    for module in model.modules():
        proj = getattr(module, "proj", None)
        if not (
            isinstance(proj, torch.nn.Conv3d)
            and type(module).__name__.endswith("PatchEmbed")
            and tuple(proj.kernel_size) == tuple(proj.stride)
            and tuple(proj.padding) == (0, 0, 0)
            and tuple(proj.dilation) == (1, 1, 1)
            and proj.groups == 1
        ):
            continue

        def forward(hidden_states, proj=proj):
            weight = proj.weight.view(proj.out_channels, -1)
            return torch.nn.functional.linear(
                hidden_states.reshape(-1, weight.shape[1]).to(weight.dtype), weight, proj.bias
            )

        module.forward = forward
        replaced.append(module)
    try:
        yield len(replaced)
    finally:
        for module in replaced:
            del module.forward  # the class's own forward again


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
        with linear_patch_embeds(model):
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

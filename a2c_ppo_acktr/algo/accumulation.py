"""Gradient accumulation windows that step the optimizer exactly once per window, on every backend.

PPO cuts an epoch into minibatches and steps the optimizer every ``grad_accum_steps`` of them (a
*window*). Three backends do this differently, and the differences are where training goes silently
wrong:

- plain PyTorch: ``(loss / k).backward()``, then clip and step at the end of the window;
- accelerate without DeepSpeed (single process or DDP): ``accelerator.backward`` divides by ``k``;
  the prepared optimizer steps only when told to (and only while accelerate's ``sync_gradients``
  is true, which it stays because :mod:`accelerate`'s ``accumulate()`` is never entered);
- DeepSpeed: the *engine* owns the window. ``accelerator.backward`` would step the engine on every
  backward unless ``accumulate()`` was entered (accelerate 1.x sets the engine's boundary from
  ``sync_gradients``), which gave ``k`` times too many Adam steps, each on ``1/k`` of the gradient.
  So this module drives the engine itself: it sets the boundary flag before every backward
  (``engine.set_gradient_accumulation_boundary``), lets ``engine.backward`` scale by ``1/k``, and
  calls ``engine.step()`` once at the end of the window.

Skipping: the caller decides before any backward whether a minibatch's loss is finite on every
process (one reduced flag), so all processes skip the same minibatches and no collective is left
unmatched. A skipped minibatch does no backward at all. A window whose every minibatch was skipped
takes no optimizer step on any backend: weights and optimizer state (Adam moments, step count) stay
exactly as they were. When only the last minibatch of a window is skipped, DeepSpeed still needs a
backward marked as the boundary (ZeRO-2 builds the partitioned gradient only then), so a zero loss
over the trainable weights is back-propagated in its place; it adds nothing to the gradient.

Under DeepSpeed a gradient that is non-finite although every loss was finite is not caught here (the
engine clips and steps inside ``engine.step``); fp16 loss scaling skips such steps itself, and the
step count reported excludes them (``engine.was_step_applied``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from a2c_ppo_acktr.run.distributed import full_trainable


class AccumulationWindow:
    """Backward and optimizer stepping for one training process, in windows of ``steps`` minibatches.

    Args:
        policy: the (possibly prepared) policy module; under DeepSpeed the ``DeepSpeedEngine``.
        optimizer: the (possibly prepared) optimizer.
        steps: minibatches per optimizer step (``ppo.grad_accum_steps``).
        max_grad_norm: clip the global gradient norm to this (under DeepSpeed the engine clips
            with its ``gradient_clipping``, which :mod:`a2c_ppo_acktr.run.distributed` sets to the same value).
        accelerator: an ``accelerate.Accelerator`` or None.
        deepspeed: whether ``policy`` is a DeepSpeed engine.
    """

    def __init__(
        self,
        policy: Any,
        optimizer: Any,
        steps: int,
        max_grad_norm: float,
        accelerator: Any = None,
        deepspeed: bool = False,
    ) -> None:
        if steps < 1:
            raise ValueError(f"grad_accum_steps={steps} must be >= 1")
        self.policy, self.optimizer, self.steps, self.max_grad_norm = policy, optimizer, steps, max_grad_norm
        self.accelerator, self.deepspeed = accelerator, deepspeed
        if deepspeed:
            engine_steps = int(policy.gradient_accumulation_steps())
            if engine_steps != steps:
                raise ValueError(
                    f"the DeepSpeed engine accumulates {engine_steps} micro-batches but ppo.grad_accum_steps={steps}; "
                    "build the engine from a2c_ppo_acktr.run.distributed.deepspeed_config_dict (it sets "
                    "gradient_accumulation_steps)"
                )
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self._position = 0  # minibatches seen in the current window
        self._has_grad = False  # some minibatch of the window was back-propagated
        self._last_was_boundary = False

    @property
    def at_boundary(self) -> bool:
        """Whether the next minibatch is the last one of its window."""
        return self._position == self.steps - 1

    def backward(self, loss: Tensor) -> None:
        """Back-propagate one minibatch's (finite) loss, scaled by ``1/steps``."""
        boundary = self.at_boundary
        if self.deepspeed:
            self.policy.set_gradient_accumulation_boundary(boundary)
            self.policy.backward(loss)  # the engine divides by its gradient_accumulation_steps
        elif self.accelerator is not None:
            self.accelerator.backward(loss)  # divides by accelerator.gradient_accumulation_steps
        else:
            (loss / self.steps).backward()
        self._has_grad = True
        self._last_was_boundary = boundary

    def skip(self) -> None:
        """Record a minibatch skipped on every process (no backward)."""
        self._last_was_boundary = False

    def end_minibatch(self) -> Optional[tuple[bool, float]]:
        """Close the current minibatch; at the end of a window step the optimizer (or not).

        Returns:
            None inside a window; at its end ``(stepped, grad_norm)``: whether the optimizer
            stepped, and the global gradient norm before clipping (NaN when there was no step or the
            backend does not report it).
        """
        self._position += 1
        if self._position < self.steps:
            return None
        self._position = 0
        has_grad, self._has_grad = self._has_grad, False
        if self.deepspeed:
            return self._end_deepspeed(has_grad)
        if not has_grad:
            self.optimizer.zero_grad()
            return False, float("nan")
        if self.accelerator is not None:
            norm = self.accelerator.clip_grad_norm_(self._params, self.max_grad_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        norm = float("nan") if norm is None else float(norm)
        stepped = math.isfinite(norm)
        if stepped:
            self.optimizer.step()
        self.optimizer.zero_grad()
        return stepped, norm

    def _end_deepspeed(self, has_grad: bool) -> tuple[bool, float]:
        engine = self.policy
        if not has_grad:
            # No backward ran in this window on any process: nothing accumulated, nothing to step.
            return False, float("nan")
        if not self._last_was_boundary:
            # The window's last minibatch was skipped: ZeRO builds the reduced gradient partition in
            # the boundary backward, so run one that adds zero to every trainable gradient.
            engine.set_gradient_accumulation_boundary(True)
            # Under ZeRO-3 the trainable weights are partitioned: gathered, the zero loss has the
            # full-shape gradients the engine's reduce-scatter hooks expect.
            with full_trainable(engine) as params:
                engine.backward(sum((p * 0.0).sum() for _, p in params))
        engine.step()
        engine.set_gradient_accumulation_boundary(False)
        stepped = bool(engine.was_step_applied()) if hasattr(engine, "was_step_applied") else True
        norm = engine.get_global_grad_norm()
        norm = float("nan") if norm is None else float(norm)
        return stepped, norm

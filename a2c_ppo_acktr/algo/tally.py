"""What one PPO update measures, summed on the device and read to the host once.

A minibatch's loss metrics are detached device scalars; :class:`UpdateTally` adds them up (the KL to
the reference apart: it is measured on some minibatches only), counts skipped minibatches and the
optimizer windows, and :meth:`UpdateTally.read` copies every sum to the host in one transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class UpdateTally:
    """Sums over the minibatches of one update."""

    sums: dict[str, Tensor] = field(default_factory=dict)
    counted: int = 0  # minibatches with a finite loss (backward done)
    skipped: int = 0  # minibatches skipped for a non-finite loss
    grad_norms: list[float] = field(default_factory=list)
    windows: int = 0  # optimizer windows ended
    window_steps: int = 0  # windows that stepped
    first_dev: Optional[Tensor] = None  # max |ratio - 1| of the first minibatch
    kl_ref_sum: Optional[Tensor] = None
    kl_ref_count: int = 0

    def add(self, metrics: dict[str, Tensor]) -> None:
        """A counted minibatch's metrics (``kl_ref`` where measured; ``ratio_max_dev`` is not summed)."""
        self.counted += 1
        for name, val in metrics.items():
            if name == "kl_ref":
                self.kl_ref_sum = val if self.kl_ref_sum is None else self.kl_ref_sum + val
                self.kl_ref_count += 1
            elif name != "ratio_max_dev":
                self.sums[name] = val if name not in self.sums else self.sums[name] + val

    def end_window(self, stepped: bool, norm: float) -> None:
        """An optimizer window ended (``stepped``: the optimizer stepped; ``norm``: its gradient norm)."""
        self.grad_norms.append(norm)
        self.windows += 1
        self.window_steps += int(stepped)

    def read(self) -> tuple[dict[str, float], float, float]:
        """``(means, kl_ref, first_dev)``: the mean of every summed metric over counted minibatches,
        the mean measured KL to the reference (NaN when none was) and the first minibatch's ratio
        deviation, from one device-to-host copy."""
        names = sorted(self.sums)
        parts = [self.sums[n].float().reshape(1) for n in names]
        parts += [t.float().reshape(1) for t in (self.kl_ref_sum, self.first_dev) if t is not None]
        host = torch.cat(parts).tolist() if parts else []
        mean = {n: host[i] / self.counted for i, n in enumerate(names)}
        kl_ref = host[len(names)] / self.kl_ref_count if self.kl_ref_sum is not None else float("nan")
        first = host[-1] if self.first_dev is not None else float("nan")
        return mean, kl_ref, first

    def mean_grad_norm(self) -> float:
        """Mean of the finite gradient norms (NaN when none)."""
        finite = [g for g in self.grad_norms if math.isfinite(g)]
        return sum(finite) / len(finite) if finite else float("nan")

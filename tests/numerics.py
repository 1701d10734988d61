"""Float32 comparison bounds derived from the arithmetic, not tuned to one CPU.

Two float32 computations of the same value that add ``terms`` rounded terms in different orders
(another kernel's blocking, chunked against whole, batched against one row) differ by at most about
``terms * eps * magnitude``, where ``magnitude`` bounds the terms and partial sums: each addition
rounds to within eps of its result. The bound does not depend on which CPU, SIMD width or thread
count computed either side; a tolerance written as a bare 1e-6 does.
"""
from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps


def f32_tolerance(terms: int, magnitude: float) -> float:
    """``terms * eps32 * magnitude`` (see the module docstring)."""
    return terms * EPS32 * float(magnitude)


def logit_terms(hidden: int, vocab: int) -> int:
    """Rounded additions behind one token statistic: ``hidden`` products per logit, then a
    log-sum-exp (and an entropy or KL sum) over ``vocab`` logits."""
    return hidden + 2 * vocab

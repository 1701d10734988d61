"""Equality of observations, field by field: what lets a rollout compute a value or a prompt
prefill once for rows that show the same thing (a group's siblings on one shared state, a one-turn
episode cut on the state it answered)."""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import numpy as np
import torch


def image_key(image: np.ndarray) -> tuple:
    """Content key of a raw image: shape, dtype and a 128-bit digest of its bytes (SHA-256 cut to 16
    bytes: the CPU's SHA instructions make it faster than BLAKE2b; bench/README.md has the figures)."""
    arr = np.ascontiguousarray(image)
    return arr.shape, arr.dtype.str, hashlib.sha256(arr.data).digest()[:16]


def same_observation(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are equal in every field: dicts key by key, sequences item by item,
    arrays and tensors element by element with equal shapes and dtypes, other values by type and
    ``==``. Anything the policy reads from an observation is therefore the same for both."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(np.array_equal(a, b))
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_observation(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_observation(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def find_equal(obs: Any, candidates: Sequence[Any]) -> Optional[int]:
    """The index of the first candidate equal to ``obs`` (:func:`same_observation`; the ``text``
    fields of dicts are compared first, as they are cheap), or None."""
    text = obs.get("text") if isinstance(obs, dict) else None
    for j, c in enumerate(candidates):
        if (not isinstance(c, dict) or c.get("text") == text) and same_observation(c, obs):
            return j
    return None


def unique_rows(batch: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """``batch`` without repeats (first occurrences, in order), and for each row the index of its
    copy in that list."""
    unique: list[Any] = []
    where: list[int] = []
    for obs in batch:
        k = find_equal(obs, unique)
        if k is None:
            k = len(unique)
            unique.append(obs)
        where.append(k)
    return unique, where

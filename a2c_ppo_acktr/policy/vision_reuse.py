"""The frozen vision tower's outputs, caught while acting and forwarded again instead of the pixels.

While nothing in the tower or projector trains (``model.train_vision=none``, no adapter there) and
``model.reuse_vision_outputs`` is on, an image's encoding cannot change between the rollout and the
update. :class:`VisionReuse` catches the encoder's outputs (``get_image_features``) of ``act``'s
forwards, splits them per image (:mod:`a2c_ppo_acktr.policy.vision_cache`), keeps each row's with the
rollout (:attr:`~a2c_ppo_acktr.policy.encoding.TurnEncoding.vision`), and the training forward takes
them back as ``mm_encoder_outputs``: the update runs no tower. Inside :meth:`VisionReuse.cache_block`
(one per rollout) an image already encoded in the block is not encoded again.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from a2c_ppo_acktr.common.sameness import image_key
from a2c_ppo_acktr.policy.encoding import TurnEncoding
from a2c_ppo_acktr.policy.vision_cache import VisionOutputCache, output_entries, vision_outputs

Entries = list[dict[str, Tensor]]  # one encoding per image


def distinct_rows(rows: Sequence[Any], where: Sequence[int]) -> list[Any]:
    """The distinct prompts' entries of ``rows``, in the distinct prompts' order, where row ``i`` is
    distinct prompt ``where[i]`` (its first row stands for it)."""
    first = {k: i for i, k in reversed(list(enumerate(where)))}
    return [rows[first[k]] for k in range(len(first))]


def reusable_vision(
    base: nn.Module, trainable: nn.Module, tower: Optional[Sequence[str]], reuse: bool, train_vision: str
) -> Optional[nn.Module]:
    """The module whose ``get_image_features`` encodes images and whose forward takes them back as
    ``mm_encoder_outputs``, when ``reuse`` (``model.reuse_vision_outputs``) is on and nothing in the
    vision tower or projector (module suffixes ``tower``) trains in ``trainable`` (``train_vision=none``
    and no adapter there); else None."""
    inner = getattr(base, "model", None)
    if not (
        reuse
        and train_vision == "none"
        and tower
        and inner is not None
        and callable(getattr(inner, "get_image_features", None))
        and "mm_encoder_outputs" in inspect.signature(inner.forward).parameters
    ):
        return None
    trains = any(p.requires_grad and any(f".{v}." in f".{n}" for v in tower) for n, p in trainable.named_parameters())
    return None if trains else inner


class VisionReuse:
    """Catches, splits, caches and forwards again the outputs of ``owner``'s vision encoder.

    Args:
        owner: :func:`reusable_vision`'s module, or None (nothing is reused: every method is then a
            no-op that returns None or its input).
        cache_images: the per-rollout cache's size in images (``model.vision_cache_images``; 0: off).
    """

    def __init__(self, owner: Optional[nn.Module], cache_images: int) -> None:
        self.owner = owner
        self.cache_images = int(cache_images)
        self.cache: Optional[VisionOutputCache] = None  # open inside cache_block()

    @contextlib.contextmanager
    def cache_block(self) -> Iterator[Optional[VisionOutputCache]]:
        """Inside this block the encoder runs only on images not encoded in it: yields the
        :class:`~a2c_ppo_acktr.policy.vision_cache.VisionOutputCache`, or None where nothing is
        reused or the size is 0."""
        previous = self.cache
        self.cache = VisionOutputCache(self.cache_images) if self.owner is not None and self.cache_images > 0 else None
        try:
            yield self.cache
        finally:
            self.cache = previous

    def image_keys(
        self, images: Sequence[Sequence[np.ndarray]], where: Optional[list[int]] = None
    ) -> Optional[list[tuple]]:
        """The content keys of the images the next encoder call encodes (rows in order; after a
        shared prefill, the distinct prompts' rows: row ``i`` is distinct prompt ``where[i]``), or
        None outside :meth:`cache_block`."""
        if self.cache is None:
            return None
        rows = images if where is None else distinct_rows(images, where)
        return [image_key(im) for row in rows for im in row]

    @contextlib.contextmanager
    def capture(self, keys: Optional[Sequence[tuple]] = None) -> Iterator[list[Any]]:
        """The encoder's outputs of the forwards in the block, in call order; nothing is captured
        when the outputs are not reused. With ``keys`` (:meth:`image_keys`) the block's first encoder
        call is served from the open cache: the tower runs on its images not yet encoded only."""
        caught: list[Any] = []
        owner = self.owner
        if owner is None:
            yield caught
            return
        original = owner.get_image_features
        pending = [keys]

        @functools.wraps(original)  # generate reads the encoder's signature to pick its inputs
        def spy(*args: Any, **kwargs: Any) -> Any:
            out = None
            cache, want = self.cache, pending.pop() if pending else None
            if cache is not None and want is not None:
                out = cache.encode(original, args, kwargs, want)
            if out is None:
                out = original(*args, **kwargs)
            caught.append(out)
            return out

        owner.get_image_features = spy
        try:
            yield caught
        finally:
            del owner.get_image_features  # the instance attribute: the method is back

    def entries(self, caught: list[Any], images_per_row: Sequence[int]) -> Optional[list[Entries]]:
        """Each row's per-image encodings (on the model's device) from the outputs :meth:`capture`
        caught, or None (not reused, or an output this cannot split per image)."""
        if self.owner is None:
            return None
        flat: Entries = []
        for out in caught:
            entries = output_entries(out)
            if entries is None:
                return None
            flat += entries
        if len(flat) != int(sum(images_per_row)):
            return None
        rows, start = [], 0
        for n in images_per_row:
            rows.append(flat[start : start + n])
            start += n
        return rows

    def row_entries(
        self, caught: list[Any], images: Sequence[Sequence[np.ndarray]], where: Optional[list[int]]
    ) -> Optional[list[Entries]]:
        """Each row's encodings from the outputs caught while acting, or None: the rows' images in
        order, or, after a shared prefill, the distinct prompts' images (row ``i`` is distinct prompt
        ``where[i]``)."""
        if where is None:
            return self.entries(caught, [len(row) for row in images])
        distinct = self.entries(caught, [len(row) for row in distinct_rows(images, where)])
        return None if distinct is None else [distinct[k] for k in where]

    @staticmethod
    def attach(
        encodings: Optional[list[TurnEncoding]], vision: Optional[list[Entries]]
    ) -> Optional[list[TurnEncoding]]:
        """``encodings`` with each row's encodings attached, on the CPU (kept with the rollout)."""
        if encodings is None or vision is None:
            return encodings
        for e, row in zip(encodings, vision):
            e.vision = [{k: v.cpu() for k, v in entry.items()} for entry in row]
        return encodings

    @staticmethod
    def fresh(inputs: dict[str, Any]) -> dict[str, Any]:
        """``inputs`` with a new ``mm_encoder_outputs`` dict per forward (a forward may fill it in)."""
        if "mm_encoder_outputs" not in inputs:
            return inputs
        return {**inputs, "mm_encoder_outputs": dict(inputs["mm_encoder_outputs"])}

    @staticmethod
    def forward_inputs(
        inputs: dict[str, Any], entries: Sequence[dict[str, Tensor]], device: torch.device
    ) -> dict[str, Any]:
        """``inputs`` with the pixels replaced by the kept encodings of its images (in order): the
        forward then skips the tower."""
        out = {k: v for k, v in inputs.items() if not k.startswith("pixel_values")}
        if entries:
            out["mm_encoder_outputs"] = {"image": vision_outputs(entries, device)}
        return out

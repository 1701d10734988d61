"""The frozen vision tower's outputs, per image: split, kept across the steps of a rollout, put back.

A VSI prompt repeats its sweep frames at every turn of an episode, and grouped envs repeat a scene's
frames across rows. While the tower is frozen (``model.reuse_vision_outputs``), an image's encoding
does not change, so :class:`VisionOutputCache` keeps each one keyed by the image's content
(:func:`~a2c_ppo_acktr.common.sameness.image_key`) and :meth:`VisionOutputCache.encode` runs the
tower only on the images of a call it has not seen. The policy opens one cache per rollout
(``VLMPolicy.vision_cache``), so what a step computes depends only on that rollout's own steps and a
resumed run computes what an uninterrupted one did.

An encoding is one dict per image: ``"pooled"`` (the visual tokens the language model reads) and
Qwen3-VL's ``"deepstack.<layer>"`` features; :func:`output_entries` reads them from an encoder
output and :func:`vision_outputs` builds the object a forward takes back as
``mm_encoder_outputs["image"]``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Hashable, Optional, Sequence

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPooling


@dataclass
class VisionOutputs(BaseModelOutputWithPooling):
    """The vision encoder's output as a forward reads it from ``mm_encoder_outputs["image"]``:
    ``pooler_output``, one tensor of visual tokens per image, and Qwen3-VL's deepstack features (per
    layer, per image)."""

    deepstack_features: Optional[list[tuple[Tensor, ...]]] = None


def output_entries(out: Any) -> Optional[list[dict[str, Tensor]]]:
    """One encoding per image of an encoder output (detached, where the output lies), or None when
    its deepstack features do not split like its visual tokens."""
    pooled = list(out.pooler_output)
    entries: list[dict[str, Tensor]] = [{"pooled": t.detach()} for t in pooled]
    for layer, feats in enumerate(getattr(out, "deepstack_features", None) or []):
        if len(feats) != len(entries):
            return None
        for entry, t in zip(entries, feats):
            entry[f"deepstack.{layer}"] = t.detach()
    return entries


def vision_outputs(entries: Sequence[dict[str, Tensor]], device: Any) -> VisionOutputs:
    """The encoder output a forward takes as ``mm_encoder_outputs["image"]`` for ``entries`` (its
    images, in order), on ``device``."""
    layers = (
        sorted((k for k in entries[0] if k.startswith("deepstack.")), key=lambda k: int(k.split(".")[1]))
        if entries
        else []
    )
    return VisionOutputs(
        pooler_output=tuple(e["pooled"].to(device) for e in entries),
        deepstack_features=[tuple(e[k].to(device) for e in entries) for k in layers] or None,
    )


def vision_cache_of(policy: Any) -> ContextManager:
    """``policy.vision_cache()`` (:meth:`~a2c_ppo_acktr.policy.model.VLMPolicy.vision_cache`: the
    frozen tower runs once per distinct image inside the block), or a block that does nothing for an
    object without one (a teacher, a test's stub)."""
    opener = getattr(policy, "vision_cache", None)
    return opener() if callable(opener) else contextlib.nullcontext()


class VisionOutputCache:
    """Image encodings keyed by image content, at most ``capacity`` of them (least recently used out).

    ``misses`` counts the images the tower encoded, ``hits`` the images served without it (kept from
    an earlier call, or equal to another image of the same call).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a vision output cache holds at least one image, got capacity {capacity}")
        self.capacity = int(capacity)
        self._entries: OrderedDict[Hashable, dict[str, Tensor]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> Optional[dict[str, Tensor]]:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, entry: dict[str, Tensor]) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def encode(
        self, encoder: Callable[..., Any], args: tuple, kwargs: dict[str, Any], keys: Sequence[Hashable]
    ) -> Optional[VisionOutputs]:
        """``encoder(*args, **kwargs)`` for images whose content keys are ``keys`` (in the call's
        order), running ``encoder`` only on the images not cached (each distinct one once).

        The call must carry its images as ``pixel_values`` (one row per image, or Qwen-VL's patch
        rows with ``image_grid_thw``) and no other per-image tensor. Returns None, with nothing
        cached, for a call this cannot split per image (another image count than ``keys``, another
        per-image tensor: nothing encoded; an output whose parts do not split per image: found after
        encoding): the caller then runs ``encoder`` on the whole call itself.
        """
        try:
            bound = inspect.signature(encoder).bind(*args, **kwargs)
        except TypeError:
            return None
        arguments = bound.arguments
        pixels, grid = arguments.get("pixel_values"), arguments.get("image_grid_thw")
        others = [
            k for k, v in arguments.items() if isinstance(v, Tensor) and k not in ("pixel_values", "image_grid_thw")
        ]
        if not isinstance(pixels, Tensor) or others:
            return None
        sizes = [1] * pixels.shape[0] if grid is None else [int(n) for n in grid.prod(-1).tolist()]
        if len(sizes) != len(keys) or sum(sizes) != pixels.shape[0]:
            return None
        # The call's encodings are gathered first, so a capacity below the call's image count evicts
        # only after it is served.
        found = {k: self._entries[k] for k in keys if k in self._entries}
        first: dict[Hashable, int] = {}
        for i, key in enumerate(keys):
            if key not in found:
                first.setdefault(key, i)
        todo = sorted(first.values())
        if todo:
            chunks = torch.split(pixels, sizes)
            arguments["pixel_values"] = torch.cat([chunks[i] for i in todo])
            if grid is not None:
                arguments["image_grid_thw"] = grid[torch.tensor(todo, dtype=torch.long, device=grid.device)]
            fresh = output_entries(encoder(*bound.args, **bound.kwargs))
            if fresh is None or len(fresh) != len(todo):
                return None
            # Copies: a slice of the call's output would keep the whole call's tensor alive in the cache.
            found.update((keys[i], {k: v.clone() for k, v in entry.items()}) for i, entry in zip(todo, fresh))
        for key in dict.fromkeys(keys):
            self.put(key, found[key])
        entries = [found[k] for k in keys]
        self.misses += len(todo)
        self.hits += len(keys) - len(todo)
        return vision_outputs(entries, pixels.device)

"""Processor outputs kept per turn, so that each observation's images are processed once.

``VLMPolicy.act`` runs the processor on a batch of N prompts: left-padded token tensors ``(N, P)``
(``input_ids``, ``attention_mask``, ``mm_token_type_ids``) and image tensors whose first dimension runs
over the images of all rows in order (``pixel_values``: Qwen-VL ``(sum of patches, D)``, LLaVA
``(images, 3, H, W)``, LLaVA-1.6 ``(images, tiles, 3, H, W)`` with ``image_sizes``; ``image_grid_thw``
``(images, 3)``). :func:`split_rows` cuts that batch into one
:class:`TurnEncoding` per row (padding removed, images separated), :func:`collate` rebuilds a batch
of any turns in any order, exactly as the processor would lay it out (left padding, images
concatenated in row order). The update then forwards the very tensors the rollout forwarded: no
processor run per minibatch and no way for a re-tokenisation to drift from the rollout's.

Memory: pixels are kept on the CPU in the model's dtype (the vision tower casts them to it as its
first step, so the cast changes no number) and :class:`ImageFeatureStore` keeps one copy of an image
that several turns show (the sweep frames repeat on every turn of an episode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from a2c_ppo_acktr.common.sameness import image_key

# Keys whose first dimension runs over images: split per image (or per patch, see _image_rows).
IMAGE_KEYS = frozenset({"pixel_values", "image_grid_thw", "image_sizes"})
# Left-padding value of each token key other than input_ids (whose pad is the tokenizer's pad id).
TOKEN_PAD = {"attention_mask": 0, "mm_token_type_ids": 0, "token_type_ids": 0}


@dataclass
class TurnEncoding:
    """One turn's processor output, unpadded.

    Attributes:
        tokens: per token key a ``(P,)`` tensor (``input_ids``, ``attention_mask``, ...): the real
            tokens of the prompt, no padding.
        images: per image of the turn, in order, its slice of every image key (``pixel_values``
            ``(patches, D)`` or ``(1, 3, H, W)``, ``image_grid_thw`` ``(1, 3)``, ...).
    """

    tokens: dict[str, Tensor]
    images: list[dict[str, Tensor]]
    # Per image, the frozen vision encoder's output in the rollout (``pooled``: the image's visual
    # tokens as the language model receives them; ``deepstack.<l>``: Qwen3-VL's features for deepstack
    # layer l), which the update forwards instead of running the tower again; None: not kept (a
    # turn whose pixels are changed after the rollout must drop them, or the change is not seen).
    vision: Optional[list[dict[str, Tensor]]] = None

    @property
    def input_ids(self) -> Tensor:
        return self.tokens["input_ids"]

    def nbytes(self) -> int:
        """Bytes held by this turn's tensors (shared image slices counted once per turn)."""
        tensors = list(self.tokens.values()) + [t for im in self.images for t in im.values()]
        tensors += [t for im in self.vision or [] for t in im.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def _image_rows(enc: Mapping[str, Tensor], key: str, num_images: int) -> list[int]:
    """How many rows of ``enc[key]`` belong to each image.

    Raises:
        ValueError: the tensor's first dimension is neither one row per image nor, with
            ``image_grid_thw``, one row per patch.
    """
    rows = int(enc[key].shape[0])
    if rows == num_images:
        return [1] * num_images
    grid = enc.get("image_grid_thw")
    if grid is not None and rows == int(grid.prod(-1).sum()):
        return [int(n) for n in grid.prod(-1).tolist()]
    raise ValueError(
        f"the processor's {key!r} has {rows} rows for {num_images} images; a2c_ppo_acktr.policy.encoding only splits "
        "tensors "
        "with one row per image or one per patch (image_grid_thw); extend _image_rows for this model family"
    )


def split_rows(
    enc: Mapping[str, Tensor], images_per_row: Sequence[int], dtype: Optional[torch.dtype] = None
) -> list[TurnEncoding]:
    """Cut a left-padded processor batch into one :class:`TurnEncoding` per row.

    Args:
        enc: the processor's output for B rows (tensors on any device; the result is on the CPU).
        images_per_row: ``(B,)`` number of images of each row, in the processor's order.
        dtype: cast floating image tensors to it (the model's dtype: what the vision tower casts
            them to first, so nothing changes but the memory they take).

    Returns:
        B encodings; ``collate(result)`` equals ``enc``.

    Raises:
        ValueError: a key is neither a token tensor ``(B, P)`` nor a known image tensor.
    """
    ids = enc["input_ids"]
    B, P = ids.shape
    if len(images_per_row) != B:
        raise ValueError(f"{len(images_per_row)} image counts for {B} rows")
    keep = enc["attention_mask"].bool().cpu()
    num_images = int(sum(images_per_row))
    tokens: dict[str, list[Tensor]] = {}
    per_image: dict[str, list[Tensor]] = {}
    for key, value in enc.items():
        if not isinstance(value, Tensor):
            continue
        if key in IMAGE_KEYS:
            value = value.cpu()
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            per_image[key] = list(value.split(_image_rows(enc, key, num_images)))
        elif tuple(value.shape) == (B, P):
            value = value.cpu()
            tokens[key] = [row[mask] for row, mask in zip(value, keep)]
        else:
            raise ValueError(
                f"processor output {key!r} of shape {tuple(value.shape)} is neither a token tensor ({B}, {P}) nor one "
                "of "
                f"{sorted(IMAGE_KEYS)}; add it to a2c_ppo_acktr.policy.encoding.IMAGE_KEYS or TOKEN_PAD"
            )
    out: list[TurnEncoding] = []
    start = 0
    for b, n in enumerate(images_per_row):
        images = [{k: v[j] for k, v in per_image.items()} for j in range(start, start + n)]
        start += n
        out.append(TurnEncoding(tokens={k: v[b] for k, v in tokens.items()}, images=images))
    return out


def collate(turns: Sequence[TurnEncoding], pad_id: int) -> dict[str, Tensor]:
    """A processor-style batch of ``turns``: token tensors left-padded to ``(B, P_max)``, image
    tensors concatenated in row order. On the CPU; the inverse of :func:`split_rows`.

    Args:
        turns: the turns of the batch, in order.
        pad_id: the tokenizer's pad id (fills ``input_ids`` padding; other keys pad with 0).
    """
    if not turns:
        raise ValueError("collate needs at least one turn")
    length = max(len(t.input_ids) for t in turns)
    out: dict[str, Tensor] = {}
    for key in turns[0].tokens:
        rows = [t.tokens[key] for t in turns]
        batch = torch.full(
            (len(rows), length), pad_id if key == "input_ids" else TOKEN_PAD.get(key, 0), dtype=rows[0].dtype
        )
        for i, row in enumerate(rows):
            batch[i, length - len(row) :] = row
        out[key] = batch
    images = [im for t in turns for im in t.images]
    if images:
        for key in images[0]:
            out[key] = torch.cat(_pad_tiles([im[key] for im in images]))
    return out


def _pad_tiles(parts: list[Tensor]) -> list[Tensor]:
    """LLaVA-1.6's ``pixel_values`` ``(1, tiles, 3, H, W)``: its processor pads every image of a batch
    to the batch's most tiles (the model keeps each image's own count, read from ``image_sizes``), so
    turns from different batches are padded again to the most here. Other tensors pass unchanged."""
    if parts[0].dim() != 5 or len({p.shape[1] for p in parts}) == 1:
        return parts
    most = max(p.shape[1] for p in parts)
    return [torch.nn.functional.pad(p, (0, 0, 0, 0, 0, 0, 0, most - p.shape[1])) for p in parts]


class ImageFeatureStore:
    """One copy of the processed features of each distinct image held by a rollout.

    A turn's image whose raw bytes equal an earlier turn's, and whose processed tensors are equal
    too (checked, not assumed: a processor that depended on the batch would simply not share), is
    replaced by the stored copy. The vision encoder's output of an image (:attr:`TurnEncoding.vision`)
    is kept once per distinct image too: the first one seen (another batch computes it up to float
    rounding, so equality is not asked there; one image, one encoding per rollout).
    """

    def __init__(self) -> None:
        self._features: dict[tuple, dict[str, Tensor]] = {}
        self._vision: dict[tuple, dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return len(self._features)

    def share(self, turn: TurnEncoding, raw_images: Sequence[np.ndarray]) -> TurnEncoding:
        """``turn`` with each image's tensors replaced by the stored copy where one is equal."""
        if len(raw_images) != len(turn.images):
            raise ValueError(f"{len(raw_images)} raw images for a turn encoded with {len(turn.images)}")
        if turn.vision is not None and len(turn.vision) != len(turn.images):
            raise ValueError(f"{len(turn.vision)} vision encodings for a turn of {len(turn.images)} images")
        shared = []
        vision: Optional[list[dict[str, Tensor]]] = None if turn.vision is None else []
        for j, (raw, feats) in enumerate(zip(raw_images, turn.images)):
            key = image_key(raw)
            known = self._features.get(key)
            if (
                known is not None
                and known.keys() == feats.keys()
                and all(torch.equal(known[k], feats[k]) for k in feats)
            ):
                shared.append(known)
            else:
                # Clone: a slice would keep the whole batch tensor of its rollout step alive.
                feats = {k: v.clone() for k, v in feats.items()}
                self._features.setdefault(key, feats)
                shared.append(feats)
            if vision is not None:
                seen = self._vision.get(key)
                if seen is None or seen.keys() != turn.vision[j].keys():
                    seen = {k: v.clone() for k, v in turn.vision[j].items()}
                    self._vision.setdefault(key, seen)
                vision.append(seen)
        return TurnEncoding(tokens=turn.tokens, images=shared, vision=vision)

    def nbytes(self) -> int:
        """Bytes of the distinct image features (and vision encodings) held."""
        held = list(self._features.values()) + list(self._vision.values())
        return sum(t.numel() * t.element_size() for f in held for t in f.values())

    def clear(self) -> None:
        self._features.clear()
        self._vision.clear()

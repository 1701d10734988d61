"""SFT data: labelled trajectories -> chat samples, the Dataset, the collator and the grouped sampler.

Every sample's prompt is built by :func:`a2c_ppo_acktr.common.prompts.build_messages` on the very
observation the policy saw, and the collator tokenizes the prompt with
:func:`a2c_ppo_acktr.common.prompts.render_prompt` exactly as the RL policy does, then appends the
assistant's tokens. So an SFT sample and the RL prompt of the same observation share their prompt
tokens, and the loss covers only what the policy itself would generate (the reply and the
end-of-turn token).

Dataset rows (JSONL, one per sample)::

    {"messages": [system, user, (assistant, user)*, assistant],   # HF chat format
     "images": ["../labels/images/<episode>/<hash>.png", ...],      # relative to the JSONL's folder
     "episode_id": ..., "turn": ..., "scene_id": ..., "question_type": ..., "score": ...}
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import atomic
from a2c_ppo_acktr.config.arguments import ConfigError, LabelConfig
from a2c_ppo_acktr.common.jsonl import JsonlError, iter_jsonl, write_jsonl
from a2c_ppo_acktr.common.prompts import Invalid, assistant_message, build_messages, parse_action, render_prompt

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value the loss skips (prompt, image and padding tokens)
TRAIN_FILE = "train.jsonl"
VAL_FILE = "val.jsonl"
STATS_FILE = "stats.json"
DATASET_FILES = (TRAIN_FILE, VAL_FILE, STATS_FILE)  # what vlm_traj_preprocess.py writes


# ---------------------------------------------------------------------------------------------
# Trajectories -> samples
# ---------------------------------------------------------------------------------------------
def usable_label(turn: dict) -> bool:
    """Whether a labelled turn can be a training target: the teacher answered and its output is a
    legal action of the env it was labelled in (the labeller's ``valid``, parsed by that env; a
    file without it, from before other envs, is parsed as a VSI reply)."""
    if turn.get("teacher_error") is not None:
        return False
    if "valid" in turn:
        return bool(turn["valid"])
    return not isinstance(parse_action(turn.get("teacher_output", "")), Invalid)


def _messages_for(turns: Sequence[dict], target: dict, system: str | None = None) -> tuple[list[dict], list[str]]:
    """Messages ``[system, (user, assistant)* for context turns, user, assistant(target label)]``.

    Context turns show what was actually executed (that is what the next observation's feedback
    describes); the last assistant message is the teacher's label for the last observation. The
    system message is the episode's own ``system`` (a game's) or VSI's.
    """
    messages: list[dict] = []
    images: list[str] = []
    for i, turn in enumerate(list(turns) + [target]):
        obs = {"images": turn["images"], "text": turn["observation_text"], "system": system}
        system_message, user = build_messages(obs)
        if i == 0:
            messages.append(system_message)
        messages.append(user)
        images.extend(turn["images"])
        reply = turn["teacher_output"] if turn is target else turn["executed"]
        messages.append(assistant_message(reply))
    return messages, images


_EPISODE_FIELDS = {"episode_id": str, "scene_id": str, "question_type": str, "turns": list}
_TURN_FIELDS = {"images": list, "observation_text": str, "teacher_output": str, "executed": str}


def check_episode(episode: dict, where: str, label_dir: Optional[Path] = None) -> None:
    """Refuse a labelled episode whose fields have the wrong types, or whose image paths leave the
    label directory (absolute, with ``..``, or, given ``label_dir``, through a symbolic link: each
    path is resolved), before anything is built from it.

    Raises:
        ConfigError: naming ``where`` (file and line), the field and what was expected.
    """
    from a2c_ppo_acktr.common.safe_paths import PathOutsideRoot, inside
    from a2c_ppo_acktr.config.arguments import ConfigError

    def bad(field: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(
            f"{where}: {field} is {type(value).__name__} {str(value)[:80]!r}, expected {expected}; the file is not a "
            "labeller's output"
        )

    for name, kind in _EPISODE_FIELDS.items():
        if not isinstance(episode.get(name), kind):
            raise bad(name, episode.get(name), kind.__name__)
    score = episode.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise bad("score", score, "a finite number")
    for t, turn in enumerate(episode["turns"]):
        if not isinstance(turn, dict):
            raise bad(f"turns[{t}]", turn, "an object")
        for name, kind in _TURN_FIELDS.items():
            if name == "executed" and name not in turn:
                continue  # only context turns need it
            if not isinstance(turn.get(name), kind):
                raise bad(f"turns[{t}].{name}", turn.get(name), kind.__name__)
        for image in turn["images"]:
            if not isinstance(image, str):
                raise bad(f"turns[{t}].images", image, "a list of relative paths")
            parts = Path(image).parts
            if not image or Path(image).is_absolute() or ".." in parts:
                raise ConfigError(
                    f"{where}: turns[{t}].images holds {image[:80]!r}; image paths must stay inside the label directory"
                )
            if label_dir is not None:
                try:
                    inside(label_dir, label_dir / image, f"{where}: turns[{t}].images", shown=image[:80])
                except PathOutsideRoot as e:
                    raise ConfigError(str(e)) from None


def episode_samples(episode: dict, cfg: LabelConfig) -> list[dict]:
    """The SFT samples of one labelled episode (image paths still relative to the label folder).

    Args:
        episode: One line of ``trajectories.jsonl`` (see :mod:`a2c_ppo_acktr.labels.labeling`).
        cfg: ``per_turn`` and ``history_turns`` choose the samples.

    Returns:
        Samples with ``messages``, ``images`` and bookkeeping fields.
    """
    turns = episode["turns"]
    if cfg.per_turn:
        targets = [t for t in range(len(turns)) if usable_label(turns[t])]
        contexts = {t: turns[max(0, t - cfg.history_turns) : t] for t in targets}
    else:
        last = len(turns) - 1
        targets = [last] if turns and usable_label(turns[last]) else []
        contexts = {last: turns[:last]}
    out = []
    for t in targets:
        messages, images = _messages_for(contexts[t], turns[t], episode.get("system"))
        out.append(
            {
                "messages": messages,
                "images": images,
                "episode_id": episode["episode_id"],
                "turn": t,
                "scene_id": episode["scene_id"],
                "question_type": episode["question_type"],
                "score": episode["score"],
            }
        )
    return out


def split_scenes(scene_ids: Sequence[str], val_fraction: float, seed: int) -> set[str]:
    """The validation scenes: a seeded ``round(val_fraction * n)`` of them (at least one when
    ``val_fraction > 0`` and there are two or more scenes), so no scene is in both splits."""
    scenes = sorted(set(scene_ids))
    if val_fraction <= 0 or len(scenes) < 2:
        return set()
    n_val = min(max(1, round(val_fraction * len(scenes))), len(scenes) - 1)
    rng = random.Random(seed)
    return set(rng.sample(scenes, n_val))


def build_sft_dataset(
    trajectories: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: LabelConfig,
    seed: int = 0,
    overwrite: bool = False,
) -> dict:
    """Labelled trajectories -> ``out_dir/train.jsonl``, ``out_dir/val.jsonl`` and ``out_dir/stats.json``.

    A dataset already in ``out_dir`` is never replaced: it is refused, or with ``overwrite`` its files
    are moved aside to ``NAME.old-<time>`` (:func:`a2c_ppo_acktr.run.rundir.claim_output_files`; the
    folder's other files stay where they are).

    Args:
        trajectories: ``trajectories.jsonl`` written by the labeller (its images beside it).
        out_dir: Where the dataset goes; image paths are rewritten relative to it.
        cfg: ``min_score``, ``per_turn``, ``history_turns``, ``val_fraction``.
        seed: Seed of the scene split.
        overwrite: Move an existing dataset's files aside instead of refusing.

    Returns:
        Counts: episodes read/kept, samples per split, turns skipped for unusable labels.

    Raises:
        ConfigError: no usable episode, a dataset already in ``out_dir`` (without ``overwrite``), or
            text that cannot be written as UTF-8.
    """
    from a2c_ppo_acktr.labels.labeling import latest_episodes, read_episodes

    trajectories = Path(trajectories)
    label_dir = trajectories.parent
    out_dir = Path(out_dir)
    if not trajectories.is_file():
        raise FileNotFoundError(
            f"{trajectories} does not exist: label.out_dir={str(label_dir)!r} holds no labelled trajectories; "
            "run vlm_traj_label.py into it first, or point --label.out_dir at the labeller's output"
        )
    # An episode labelled again (after a teacher failure) appears twice: its last line counts.
    lines = read_episodes(trajectories)
    for n, ep in enumerate(lines, 1):
        check_episode(ep, f"{trajectories} (episode {n})", label_dir)
    episodes, superseded = latest_episodes(lines)
    kept = [e for e in episodes if e["score"] >= cfg.min_score]
    # Refused before anything is written: an existing dataset in out_dir is never replaced by an empty one.
    if not episodes:
        raise ConfigError(
            f"{trajectories} holds no episode; label some with vlm_traj_label.py first (nothing was written to "
            f"{out_dir})"
        )
    if not kept:
        raise ConfigError(
            f"none of the {len(episodes)} episodes in {trajectories} scores >= label.min_score={cfg.min_score}; "
            f"lower label.min_score (nothing was written to {out_dir})"
        )
    from a2c_ppo_acktr.run.rundir import check_output_path, claim_output_files, directory_lock

    out_dir = check_output_path(out_dir, option="label.dataset_dir")
    val_scenes = split_scenes([e["scene_id"] for e in kept], cfg.val_fraction, seed)
    splits: dict[str, list[dict]] = {TRAIN_FILE: [], VAL_FILE: []}
    unusable = 0
    for n, ep in enumerate(kept, 1):
        unusable += sum(not usable_label(t) for t in ep["turns"])
        for sample in episode_samples(ep, cfg):
            sample["images"] = [os.path.relpath(label_dir / p, out_dir) for p in sample["images"]]
            _check_utf8(sample, f"episode {ep.get('episode_id', n)} of {trajectories}")
            splits[VAL_FILE if ep["scene_id"] in val_scenes else TRAIN_FILE].append(sample)
    with directory_lock(out_dir):
        claim_output_files(out_dir, DATASET_FILES, overwrite=overwrite, option="label.dataset_dir")
        for name, rows in splits.items():
            write_jsonl(rows, out_dir / name)
        stats = _dataset_stats(episodes, superseded, kept, splits, val_scenes, unusable, cfg)
        atomic.write_json(stats, out_dir / STATS_FILE)
    return stats


def _check_utf8(sample: dict, where: str) -> None:
    """A sample must be writable as UTF-8 (a path that is not, a lone surrogate from a JSON escape)."""
    try:
        json.dumps(sample, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{where} holds text that is not UTF-8 ({e.reason} in {e.object[max(0, e.start - 40) : e.end + 10]!r}); "
            "the label directory's "
            "path and the episodes' text must be UTF-8: rename the folder, or relabel"
        ) from None


def _dataset_stats(
    episodes: list, superseded: int, kept: list, splits: dict, val_scenes: set, unusable: int, cfg: LabelConfig
) -> dict:
    stats = {
        "episodes": len(episodes),
        "superseded_lines": superseded,
        "episodes_kept": len(kept),
        "train_samples": len(splits[TRAIN_FILE]),
        "val_samples": len(splits[VAL_FILE]),
        "val_scenes": sorted(val_scenes),
        "unusable_turns": unusable,
        "min_score": cfg.min_score,
        "per_turn": cfg.per_turn,
        "history_turns": cfg.history_turns,
    }
    return stats


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------
# Frames of real VLM runs are at most a few megapixels; far more is a decompression bomb (a small PNG
# that decodes to gigabytes). Checked from the header, before decoding.
MAX_IMAGE_PIXELS = 4096 * 4096


def load_image(path: str | os.PathLike) -> np.ndarray:
    """A PNG/JPEG file as a uint8 HxWx3 array (what the env's observations hold).

    Raises:
        ValueError: the image has more than :data:`MAX_IMAGE_PIXELS` pixels.
    """
    from PIL import Image

    with Image.open(path) as img:
        too_large = _too_large(img)
        if too_large:
            raise ValueError(f"{path} is {too_large}: refused")
        return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()


def _too_large(img: Any) -> Optional[str]:
    """What is wrong with an opened image's size (from its header: nothing decoded yet), or None."""
    if img.width * img.height > MAX_IMAGE_PIXELS:
        return f"{img.width}x{img.height} pixels, more than {MAX_IMAGE_PIXELS} (a decompression bomb?)"
    return None


def _image_problem(path: Path) -> Optional[str]:
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        return "missing"
    try:
        with Image.open(path) as img:
            too_large = _too_large(img)
            if too_large:
                return f"too large ({too_large})"
            img.verify()
    except (OSError, UnidentifiedImageError, SyntaxError, Image.DecompressionBombError) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def resolve_data_files(data_path: str | os.PathLike) -> tuple[Path, Optional[Path]]:
    """``(train, val or None)`` from a dataset folder (train.jsonl/val.jsonl) or one JSONL file."""
    p = Path(data_path)
    if p.is_dir():
        train, val = p / TRAIN_FILE, p / VAL_FILE
        if not train.is_file():
            raise FileNotFoundError(
                f"{train} not found; build the dataset with vlm_traj_preprocess.py or point sft.data_path at a JSONL "
                "file"
            )
        return train, (val if val.is_file() and val.stat().st_size > 0 else None)
    if not p.is_file():
        raise FileNotFoundError(
            f"sft.data_path={str(p)!r} does not exist; pass the folder written by vlm_traj_preprocess.py or a JSONL "
            "file"
        )
    return p, None


def count_image_placeholders(messages: Sequence[Any]) -> Optional[int]:
    """``{"type": "image"}`` parts over all messages, or None when a message is malformed."""
    n = 0
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), list):
            return None
        n += sum(1 for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")
    return n


class SFTDataset:
    """Rows of an SFT JSONL file; images are checked up front and decoded lazily.

    A row with a missing or unreadable image is logged with the path and skipped (``skipped``
    counts them), or raises when ``strict_images`` is on.
    """

    def __init__(self, path: str | os.PathLike, strict_images: bool = False) -> None:
        self.path = Path(path)
        self.root = self.path.parent
        self.rows: list[dict] = []
        self.skipped = 0
        for lineno, row in iter_jsonl(self.path, fix="rebuild the dataset with vlm_traj_preprocess.py"):
            messages = row.get("messages")
            if (
                not isinstance(messages, list)
                or not messages
                or not isinstance(messages[-1], dict)
                or messages[-1].get("role") != "assistant"
            ):
                raise JsonlError(
                    f"{self.path}:{lineno} needs 'messages' ending with an assistant message; rebuild the dataset with "
                    "vlm_traj_preprocess.py"
                )
            images = row.get("images", [])
            if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
                raise JsonlError(f"{self.path}:{lineno}: 'images' must be a list of paths, got {images!r}")
            placeholders = count_image_placeholders(messages)
            if placeholders is None:
                raise JsonlError(f"{self.path}:{lineno}: every message needs a 'role' and a 'content' list of parts")
            if placeholders != len(images):
                raise JsonlError(
                    f"{self.path}:{lineno} has {len(images)} image(s) for {placeholders} image placeholder(s) in its "
                    "messages; "
                    'each {"type": "image"} part takes the next path of \'images\' (rebuild the row or the dataset)'
                )
            problems = [(p, why) for p in row.get("images", []) if (why := _image_problem(self.root / p))]
            if problems:
                where = ", ".join(f"{self.root / p} ({why})" for p, why in problems)
                if strict_images:
                    raise FileNotFoundError(
                        f"{self.path}:{lineno}: image {where}; fix the files or set sft.strict_images=false to skip "
                        "such rows"
                    )
                logger.warning("skipping %s:%d: image %s", self.path, lineno, where)
                self.skipped += 1
                continue
            self.rows.append(row)
        if self.skipped:
            logger.warning("%s: skipped %d row(s) with missing or unreadable images", self.path, self.skipped)
        if not self.rows:
            raise JsonlError(
                f"{self.path} holds no usable rows ({self.skipped} skipped for images); rebuild it with "
                "vlm_traj_preprocess.py"
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        return {"messages": row["messages"], "images": [load_image(self.root / p) for p in row.get("images", [])]}

    def image_counts(self) -> list[int]:
        return [len(r.get("images", [])) for r in self.rows]

    def text_lengths(self) -> list[int]:
        """Characters of text per row: a cheap proxy for token length within one image count."""
        return [sum(len(part.get("text", "")) for m in r["messages"] for part in m["content"]) for r in self.rows]


# ---------------------------------------------------------------------------------------------
# Collator
# ---------------------------------------------------------------------------------------------
@dataclass
class EncodedSample:
    """One tokenized sample before batching.

    Attributes:
        input_ids: ``(L,)`` prompt tokens (images expanded) then target tokens.
        labels: ``(L,)`` ``IGNORE_INDEX`` on the prompt, the target ids after it.
        prompt_length: Tokens of the prompt.
        token_extras: Other per-token tensors from the processor (e.g. ``mm_token_type_ids``), ``(L,)``.
        vision: Per-image tensors (``pixel_values``, ``image_grid_thw``...) to concatenate on dim 0.
    """

    input_ids: Any
    labels: Any
    prompt_length: int
    token_extras: dict
    vision: dict


class SFTCollator:
    """Tokenizes ``{"messages", "images"}`` rows into a right-padded training batch.

    The prompt (every message but the last) is rendered with ``render_prompt`` and run through the
    processor with its images, exactly as the policy encodes an observation. The target is what the
    chat template writes after that prompt for the final assistant message (the reply and the
    end-of-turn token, trailing whitespace dropped), tokenized on its own and appended: these are
    the tokens the policy would generate, and the only ones with labels.
    """

    def __init__(self, processor: Any, max_length: int) -> None:
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.max_length = max_length
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")

    def target_text(self, messages: list[dict]) -> tuple[str, str]:
        """``(prompt_text, target_text)`` for a conversation ending with an assistant message."""
        prompt_text = render_prompt(self.processor, messages[:-1])
        full = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        if not full.startswith(prompt_text):
            raise ValueError(
                "the chat template renders the conversation differently from the generation prompt "
                f"(prompt ends {prompt_text[-60:]!r}, conversation there reads "
                f"{full[len(prompt_text) - 60 : len(prompt_text)]!r}); "
                "SFT needs a template whose generation prompt is a prefix of the rendered assistant turn"
            )
        return prompt_text, full[len(prompt_text) :].rstrip()

    def encode(self, messages: list[dict], images: Sequence[np.ndarray]) -> EncodedSample:
        import torch

        prompt_text, target = self.target_text(messages)
        enc = self.processor(text=[prompt_text], images=list(images) or None, return_tensors="pt")
        prompt_ids = enc["input_ids"][0]
        n_prompt = int(prompt_ids.shape[0])
        if n_prompt >= self.max_length:
            raise ValueError(
                f"a prompt of {n_prompt} tokens (with {len(images)} images) leaves no room for the reply within "
                f"sft.max_length={self.max_length}; raise sft.max_length or lower model.max_pixels / env.image_history"
            )
        target_ids = torch.tensor(self.tokenizer(target, add_special_tokens=False)["input_ids"], dtype=prompt_ids.dtype)
        target_ids = target_ids[: self.max_length - n_prompt]  # a reply longer than the budget is cut, never the prompt
        input_ids = torch.cat([prompt_ids, target_ids])
        labels = torch.cat([torch.full((n_prompt,), IGNORE_INDEX, dtype=prompt_ids.dtype), target_ids])
        token_extras, vision = {}, {}
        for key, value in enc.items():
            if key in ("input_ids", "attention_mask") or not torch.is_tensor(value):
                continue
            if value.dim() == 2 and value.shape == enc["input_ids"].shape:
                # Per-token (mm_token_type_ids): the reply tokens are text, type 0.
                token_extras[key] = torch.cat([value[0], torch.zeros(len(target_ids), dtype=value.dtype)])
            else:
                vision[key] = value
        return EncodedSample(input_ids, labels, n_prompt, token_extras, vision)

    def __call__(self, rows: Sequence[dict]) -> dict:
        import torch

        samples = [self.encode(r["messages"], r["images"]) for r in rows]
        length = max(int(s.input_ids.shape[0]) for s in samples)
        n = len(samples)
        batch = {
            "input_ids": torch.full((n, length), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((n, length), dtype=torch.long),
            "labels": torch.full((n, length), IGNORE_INDEX, dtype=torch.long),
        }
        extra_keys = sorted({k for s in samples for k in s.token_extras})
        for key in extra_keys:
            batch[key] = torch.zeros((n, length), dtype=torch.long)
        for i, s in enumerate(samples):
            L = int(s.input_ids.shape[0])
            batch["input_ids"][i, :L] = s.input_ids
            batch["attention_mask"][i, :L] = 1
            batch["labels"][i, :L] = s.labels
            for key in extra_keys:
                if key in s.token_extras:
                    batch[key][i, :L] = s.token_extras[key]
        vision_keys = sorted({k for s in samples for k in s.vision})
        for key in vision_keys:
            parts = [s.vision[key] for s in samples if key in s.vision]
            batch[key] = torch.cat(parts, dim=0)
        return batch


# ---------------------------------------------------------------------------------------------
# Grouped batching
# ---------------------------------------------------------------------------------------------
class ModalityGroupedBatchSampler:
    """Batches whose samples all have the same image count, similar lengths inside a batch.

    Mixing a 1-image and a 10-image sample pads the short one by hundreds of tokens; grouping by
    image count removes that, and sorting by length inside shuffled mega-batches (as HF's
    ``LengthGroupedSampler``) trims the rest while keeping the order random. Batch order is
    reshuffled every epoch (``set_epoch``).

    Args:
        image_counts: Images per sample.
        lengths: Length proxy per sample.
        batch_size: Samples per batch.
        seed: Base seed; epoch ``e`` uses ``seed + e``.
        mega_batch_mult: Batches per mega-batch sorted by length.
    """

    def __init__(
        self,
        image_counts: Sequence[int],
        lengths: Sequence[int],
        batch_size: int,
        seed: int = 0,
        mega_batch_mult: int = 8,
    ) -> None:
        if len(image_counts) != len(lengths):
            raise ValueError(f"image_counts ({len(image_counts)}) and lengths ({len(lengths)}) differ in length")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.image_counts = list(image_counts)
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.mega_batch_mult = mega_batch_mult
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(self.image_counts):
            groups.setdefault(c, []).append(i)
        out: list[list[int]] = []
        mega = self.batch_size * self.mega_batch_mult
        for count in sorted(groups):
            idx = [groups[count][j] for j in rng.permutation(len(groups[count]))]
            for m in range(0, len(idx), mega):
                chunk = sorted(idx[m : m + mega], key=lambda i: -self.lengths[i])
                out.extend(chunk[b : b + self.batch_size] for b in range(0, len(chunk), self.batch_size))
        return [out[j] for j in rng.permutation(len(out))]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        counts: dict[int, int] = {}
        for c in self.image_counts:
            counts[c] = counts.get(c, 0) + 1
        mega = self.batch_size * self.mega_batch_mult
        total = 0
        for n in counts.values():
            full, rest = divmod(n, mega)
            total += full * self.mega_batch_mult + math.ceil(rest / self.batch_size)
        return total

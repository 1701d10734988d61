"""Vision pre-training of the tiny model on this project's own renders.

A randomly initialised vision tower is a frozen random projection: LoRA on the language model then
learns nothing from the frames (measured: policies trained on it answer the same with every frame
zeroed). A real checkpoint's tower was trained on captions; the tiny one is trained here on facts
that this project's generators know exactly about every frame they draw:

* ``numberline``: a NumberLine frame (``gym_cards`` drawing, numbers 0..9): "what is the current
  number?" / "what is the target number?" -> one digit (chance 10%);
* ``left_right``: a rendered procedural room: "which is further left in the picture, the A or the B?"
  for two visible objects of different categories, far enough apart -> a category name (chance 50%);
* ``present``: a rendered procedural room: "is there a C in the picture?" -> ``yes`` / ``no`` for a
  category of the room that is or is not visible (chance 50%).

Opt-in tasks (:data:`OPT_IN_TASKS`, never in :data:`TASKS`, so the default build's samples and
weights do not depend on them), on MiniGrid Empty-Random-6x6 frames as the env draws them
(``view="full"``: the whole grid from above, the agent a red triangle, the goal the green cell in the
bottom-right corner); every (cell, direction) state is one frame, split 4:1 by a fixed rule:

* ``minigrid_facing``: "which way does the red triangle point?" -> ``right`` / ``down`` / ``left`` /
  ``up`` (chance 25%);
* ``minigrid_action``: "what is the best next action?" -> the env's BFS oracle's action, ``turn
  left`` / ``turn right`` / ``move forward`` (chance: its most common answer).

and on EZPoints frames (a deal's frame with the oracle's first 0..3 units typed under ``Formula:``,
by a fixed rule): every hand the game deals
(ranks, order) in every suit pair, split 4:1 by a fixed rule on the suits, so a held-out frame is a
dealt hand in suits it was never seen in:

* ``ezpoints_cards``: "what number does the left (right) card count?" -> ``2`` .. ``10`` (J, Q, K
  count 10; chance: the most common answer).

and on procedural rooms as the VSI env shows them (:data:`ROOM_SWEEP_FRAMES` frames of the
360-degree sweep from a random free pose, as the cpu-demo preset's ``env.num_sweep_frames``):

* ``room_size``: VSI-Bench's room-size question -> the floor area in whole square meters. Scored by
  VSI-Bench's mean relative accuracy (MRA), not by exact match; chance: the best constant's MRA.

Each sample is one user turn (the frame, then the question) and one assistant turn (the answer),
trained by next-token prediction on the answer only, with the whole model (tower, merger, language
model) trainable. :func:`probe` asks the same questions greedily about renders the pre-training never
saw (other NumberLine (target, current) pairs, other procedural scenes) and scores exact answers.

Everything is seeded: the same seed gives the same samples, hence the same weights on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

TASKS = ("numberline", "left_right", "present")
# Tasks a caller must name; never part of the default tuple above.
OPT_IN_TASKS = ("minigrid_facing", "minigrid_action", "ezpoints_cards", "room_size")
MINIGRID_TASKS = ("minigrid_facing", "minigrid_action")
ALL_TASKS = TASKS + OPT_IN_TASKS
MINIGRID_ID = "MiniGrid-Empty-Random-6x6-v0"
MINIGRID_FACING = ("right", "down", "left", "up")  # minigrid's agent_dir 0..3
# NumberLine frames are drawn with numbers 0..MAX_DIGIT; the probe holds out whole (target, current) pairs.
MAX_DIGIT = 9
# Procedural scene seeds: pre-training draws from [SCENE_SEED_TRAIN, +n), the probe from SCENE_SEED_PROBE
# on, both apart from the envs' training (env.scene_seed = 0..) and evaluation (eval.seed = 12345..) scenes.
SCENE_SEED_TRAIN = 500_000
SCENE_SEED_PROBE = 600_000
# An object counts as visible with this many pixels in a frame of side S: fraction * S^2.
VISIBLE_FRACTION = 0.01
# Two objects are "left" of each other only when their pixel centroids are this fraction of the width apart.
LEFT_RIGHT_MARGIN = 0.15
ROOM_SWEEP_FRAMES = 4  # the cpu-demo preset's env.num_sweep_frames
MRA_TASKS = ("room_size",)  # scored by mean relative accuracy, not exact match


@dataclass(frozen=True)
class VisionSample:
    """One pre-training or probe sample.

    Attributes:
        image: (H, W, 3) uint8 frame, or (N, H, W, 3): N frames, in order, before the question.
        question: The user's text after the frame(s).
        answer: The exact expected reply.
        task: One of :data:`TASKS`.
    """

    image: np.ndarray
    question: str
    answer: str
    task: str

    @property
    def frames(self) -> list[np.ndarray]:
        """The sample's frames, in order."""
        return list(self.image) if self.image.ndim == 4 else [self.image]


# ------------------------------------------------------------------------------------ NumberLine
def numberline_pairs(held_out: bool) -> list[tuple[int, int]]:
    """(target, current) pairs, ``target != current``, split 4:1 by a fixed rule (held out: ``(t + 2c) % 5 == 0``)."""
    pairs = [(t, c) for t in range(MAX_DIGIT + 1) for c in range(MAX_DIGIT + 1) if t != c]
    return [p for p in pairs if ((p[0] + 2 * p[1]) % 5 == 0) == held_out]


def numberline_frame(target: int, current: int, image_size: int) -> np.ndarray:
    """The NumberLine env's own frame for this state."""
    from a2c_ppo_acktr.envs.cards.numberline import NumberLineEnv

    env = NumberLineEnv(max_position=MAX_DIGIT, image_size=image_size)
    obs, _ = env.reset(seed=0, options={"start": current, "target": target})
    return np.asarray(obs["images"][0])


def numberline_samples(pairs: Sequence[tuple[int, int]], image_size: int) -> list[VisionSample]:
    """Two samples per pair: its current and its target number."""
    out = []
    for target, current in pairs:
        image = numberline_frame(target, current, image_size)
        out.append(VisionSample(image, "What is the current number in the picture?", str(current), "numberline"))
        out.append(VisionSample(image, "What is the target number in the picture?", str(target), "numberline"))
    return out


# ------------------------------------------------------------------------------------ rooms
def _scene_frames(seed: int, image_size: int, num_frames: int) -> tuple[Any, list[Any]]:
    """A procedural scene and ``num_frames`` frames of a sweep from a random free pose in it."""
    from a2c_ppo_acktr.config.arguments import EnvConfig
    from a2c_ppo_acktr.envs.navigation import sample_free_pose
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene
    from a2c_ppo_acktr.envs.renderer import Pose, Renderer

    cfg = EnvConfig(image_size=image_size)
    scene = make_procedural_scene(seed, cfg.procedural_min_room, cfg.procedural_max_room)
    renderer = Renderer.for_env(scene, cfg)
    rng = np.random.default_rng(seed)
    start = sample_free_pose(scene, rng, cfg.agent_radius)
    poses = [Pose(start.x, start.y, (start.yaw_deg + k * 360.0 / num_frames) % 360.0) for k in range(num_frames)]
    return scene, renderer.render_many(poses)


def room_samples(seeds: Iterable[int], image_size: int, frames_per_scene: int = 8) -> list[VisionSample]:
    """``left_right`` and ``present`` samples from sweeps of the procedural scenes ``seeds``.

    Per frame at most one of each, so every frame counts alike; categories are compared by name, so
    two chairs never make a left/right question and "is there a chair" means any chair.
    """
    out: list[VisionSample] = []
    min_pixels = max(1, int(round(VISIBLE_FRACTION * image_size * image_size)))
    for seed in seeds:
        scene, frames = _scene_frames(seed, image_size, frames_per_scene)
        rng = np.random.default_rng([seed, 1])
        labels = {o.object_id: o.label for o in scene.objects}
        room_labels = sorted(set(labels.values()))
        for frame in frames:
            ids = frame.object_ids
            counts = np.bincount(ids[ids >= 0], minlength=max(labels, default=0) + 1)
            visible = [i for i in np.flatnonzero(counts >= min_pixels) if int(i) in labels]
            # Per category: pixel count and the mean column of its pixels.
            seen: dict[str, tuple[int, float]] = {}
            for i in visible:
                cols = np.nonzero(ids == i)[1]
                lab = labels[int(i)]
                n, x = seen.get(lab, (0, 0.0))
                seen[lab] = (n + cols.size, (n * x + cols.sum()) / (n + cols.size))
            names = sorted(seen)
            pairs = [
                (a, b)
                for k, a in enumerate(names)
                for b in names[k + 1 :]
                if abs(seen[a][1] - seen[b][1]) >= LEFT_RIGHT_MARGIN * image_size
            ]
            if pairs:
                a, b = pairs[int(rng.integers(len(pairs)))]
                if rng.random() < 0.5:
                    a, b = b, a
                left = a if seen[a][1] < seen[b][1] else b
                out.append(
                    VisionSample(
                        frame.rgb, f"Which is further left in the picture, the {a} or the {b}?", left, "left_right"
                    )
                )
            # Visible: at least min_pixels; absent: no pixel at all (a sliver is neither).
            any_pixel = {labels[int(i)] for i in np.flatnonzero(counts > 0) if int(i) in labels}
            absent = [lab for lab in room_labels if lab not in any_pixel]
            if names and absent:
                want = rng.random() < 0.5
                pool = names if want else absent
                lab = pool[int(rng.integers(len(pool)))]
                out.append(
                    VisionSample(frame.rgb, f"Is there a {lab} in the picture?", "yes" if want else "no", "present")
                )
    return out


def room_size_samples(seeds: Iterable[int], image_size: int, num_frames: int = ROOM_SWEEP_FRAMES) -> list[VisionSample]:
    """``room_size`` samples: per scene of ``seeds``, its sweep of ``num_frames`` frames and VSI-Bench's
    room-size question, answered with the floor area rounded to whole square meters."""
    from a2c_ppo_acktr.envs.questions import ROOM_SIZE_QUESTION

    out: list[VisionSample] = []
    for seed in seeds:
        scene, frames = _scene_frames(seed, image_size, num_frames)
        area = int(round(float(scene.room_area)))
        out.append(VisionSample(np.stack([f.rgb for f in frames]), ROOM_SIZE_QUESTION, str(area), "room_size"))
    return out


# ------------------------------------------------------------------------------------ MiniGrid
def minigrid_states(held_out: bool, minigrid_id: str = MINIGRID_ID) -> list[tuple[int, int, int]]:
    """Every agent state ``(x, y, dir)`` of the Empty grid off the goal, split 4:1 by a fixed rule
    (held out: ``(x + 2 y + 3 dir) % 5 == 0``)."""
    env = _minigrid_env(minigrid_id, 64)
    w, h = env.inner.width, env.inner.height
    goal = (w - 2, h - 2)
    states = [(x, y, d) for y in range(1, h - 1) for x in range(1, w - 1) for d in range(4) if (x, y) != goal]
    return [s for s in states if ((s[0] + 2 * s[1] + 3 * s[2]) % 5 == 0) == held_out]


def _minigrid_env(minigrid_id: str, image_size: int) -> Any:
    from a2c_ppo_acktr.envs.minigrid_text import MiniGridTextEnv

    env = MiniGridTextEnv(minigrid_id=minigrid_id, image_size=image_size, view="full")
    env.reset(seed=0)
    return env


def minigrid_frame(env: Any, x: int, y: int, direction: int) -> tuple[np.ndarray, str]:
    """The env's own full-view frame with the agent put at ``(x, y)`` facing ``direction``, and the
    oracle's action there. Changes ``env``'s agent pose."""
    import json

    from a2c_ppo_acktr.envs.minigrid_text import oracle_reply

    env.inner.agent_pos = (x, y)
    env.inner.agent_dir = direction
    return env._draw(), json.loads(oracle_reply(env.inner))["action"]


def minigrid_samples(
    states: Sequence[tuple[int, int, int]], image_size: int, tasks: Sequence[str], minigrid_id: str = MINIGRID_ID
) -> list[VisionSample]:
    """Per state, one sample of each MiniGrid task in ``tasks``."""
    env = _minigrid_env(minigrid_id, image_size)
    out = []
    for x, y, d in states:
        image, action = minigrid_frame(env, x, y, d)
        if "minigrid_facing" in tasks:
            out.append(
                VisionSample(
                    image,
                    "Which way does the red triangle point in the picture?",
                    MINIGRID_FACING[d],
                    "minigrid_facing",
                )
            )
        if "minigrid_action" in tasks:
            out.append(
                VisionSample(image, "What is the best next action to reach the green goal?", action, "minigrid_action")
            )
    return out


# ------------------------------------------------------------------------------------ EZPoints
def ezpoints_deals(held_out: bool) -> list[tuple[tuple[int, str], tuple[int, str]]]:
    """Every (left, right) card pair EZPoints deals, as ((rank, suit), (rank, suit)), split 4:1
    (held out: ``(3 * suit_left + suit_right + rank_left) % 5 == 0``, suits by their index)."""
    from a2c_ppo_acktr.envs.cards.drawing import SUITS

    ranks = set()
    for first in range(2, 14):
        v = min(first, 10)
        for second in {12 - v} | ({12 // v} if 12 % v == 0 else set()):
            ranks |= {(first, second), (second, first)}
    out = []
    for a, b in sorted(ranks):
        for i, sa in enumerate(SUITS):
            for j, sb in enumerate(SUITS):
                if ((3 * i + j + a) % 5 == 0) == held_out:
                    out.append(((a, sa), (b, sb)))
    return out


def ezpoints_samples(deals: Sequence[tuple[tuple[int, str], tuple[int, str]]], image_size: int) -> list[VisionSample]:
    """Two samples per deal: the number the left and the right card counts in the game."""
    from a2c_ppo_acktr.envs.cards.ezpoints import EZPointsEnv

    env = EZPointsEnv(image_size=image_size)
    out = []
    for k, (left, right) in enumerate(deals):
        obs, _ = env.reset(seed=0, options={"cards": [left, right]})
        # The frames of play show the formula typed so far: the k-th deal shows the oracle's first k % 4 units.
        for _ in range(k % 4):
            obs, *_ = env.step(env.oracle_reply())
        image = np.asarray(obs["images"][0])
        for side, (rank, _) in (("left", left), ("right", right)):
            out.append(
                VisionSample(image, f"What number does the {side} card count?", str(min(rank, 10)), "ezpoints_cards")
            )
    return out


# ------------------------------------------------------------------------------------ data sets
def _samples(image_size: int, num_scenes: int, tasks: Sequence[str], held_out: bool) -> list[VisionSample]:
    unknown = sorted(set(tasks) - set(ALL_TASKS))
    if unknown:
        raise ValueError(f"unknown vision pre-training task(s) {unknown}; choose from {list(ALL_TASKS)}")
    out = numberline_samples(numberline_pairs(held_out=held_out), image_size) if "numberline" in tasks else []
    if set(MINIGRID_TASKS) & set(tasks):
        out += minigrid_samples(minigrid_states(held_out), image_size, tasks)
    if "ezpoints_cards" in tasks:
        out += ezpoints_samples(ezpoints_deals(held_out), image_size)
    first = SCENE_SEED_PROBE if held_out else SCENE_SEED_TRAIN
    scenes = range(first, first + num_scenes)
    if {"left_right", "present"} & set(tasks):
        out += [s for s in room_samples(scenes, image_size) if s.task in tasks]
    if "room_size" in tasks:
        out += room_size_samples(scenes, image_size)
    return out


def training_samples(image_size: int, num_scenes: int, tasks: Sequence[str] = TASKS) -> list[VisionSample]:
    """The pre-training set: the training NumberLine pairs and ``num_scenes`` training scenes, for ``tasks``."""
    return _samples(image_size, num_scenes, tasks, held_out=False)


def probe_samples(image_size: int, num_scenes: int, tasks: Sequence[str] = TASKS) -> list[VisionSample]:
    """Renders the pre-training never saw: the held-out NumberLine pairs and other scenes, for ``tasks``."""
    return _samples(image_size, num_scenes, tasks, held_out=True)


def save_samples(path: str | Path, samples: Sequence[VisionSample], meta: dict) -> Path:
    """Write ``samples`` and ``meta`` (what they were drawn for) to one ``.npz`` file, atomically: a
    reader sees the whole file or none. Frames are stored as they are (uint8), so :func:`load_samples`
    gives the same samples bit for bit."""
    import json
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = [{"question": s.question, "answer": s.answer, "task": s.task} for s in samples]
    arrays = {f"image_{k:06d}": s.image for k, s in enumerate(samples)}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, meta=np.array(json.dumps({"meta": meta, "samples": text})), **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_samples(path: str | Path) -> tuple[list[VisionSample], dict]:
    """The samples and the ``meta`` that :func:`save_samples` wrote to ``path``.

    Raises:
        ValueError: ``path`` is not such a file (unreadable, truncated, or frames missing).
    """
    import json
    import zipfile

    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            head = json.loads(str(data["meta"]))
            samples = [
                VisionSample(data[f"image_{k:06d}"], t["question"], t["answer"], t["task"])
                for k, t in enumerate(head["samples"])
            ]
    except (OSError, KeyError, ValueError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a file of rendered vision pre-training samples ({err})") from None
    return samples, head["meta"]


# ------------------------------------------------------------------------------------ encoding
def _user_text(question: str, num_frames: int = 1) -> str:
    """A user turn of the chat template holding ``num_frames`` frames, then the question, and the assistant's
    opening."""
    frames = "<|vision_start|><|image_pad|><|vision_end|>" * num_frames
    return f"<|im_start|>user\n{frames}{question}<|im_end|>\n<|im_start|>assistant\n"


def _process(
    processor: Any, texts: Sequence[str], samples: Sequence[VisionSample], padding_side: str, zero_images: bool = False
) -> Any:
    """The processor's batch of ``texts`` with each sample's frame (zeros of its shape with
    ``zero_images``), padded on ``padding_side``; the tokenizer's own side is restored after."""
    tok = processor.tokenizer
    images = [np.zeros_like(f) if zero_images else f for s in samples for f in s.frames]
    side = tok.padding_side
    tok.padding_side = padding_side
    try:
        return processor(text=list(texts), images=images, padding=True, return_tensors="pt")
    finally:
        tok.padding_side = side


def encode_batch(processor: Any, samples: Sequence[VisionSample]) -> dict:
    """Processor inputs and labels (loss on the answer and its ``<|im_end|>`` only), right-padded.

    Raises:
        RuntimeError: The answer's tokens are not the end of the row's tokens (the chat text changed).
    """
    import torch

    tok = processor.tokenizer
    batch = _process(
        processor,
        [_user_text(s.question, len(s.frames)) + f"{s.answer}<|im_end|>\n" for s in samples],
        samples,
        "right",
    )
    labels = torch.full_like(batch["input_ids"], -100)
    for k, s in enumerate(samples):
        answer = tok(f"{s.answer}<|im_end|>\n", add_special_tokens=False)["input_ids"]
        end = int(batch["attention_mask"][k].sum())
        if batch["input_ids"][k, end - len(answer) : end].tolist() != answer:
            raise RuntimeError(
                f"the answer {s.answer!r} does not tokenize alone at the end of its row; the chat text changed"
            )
        labels[k, end - len(answer) : end] = batch["input_ids"][k, end - len(answer) : end]
    batch["labels"] = labels
    return dict(batch)


def encode_each(processor: Any, samples: Sequence[VisionSample]) -> list[dict]:
    """Every sample's :func:`encode_batch` row on its own (a batch of one), for :func:`collate`.

    The processor's work (resizing, normalising, patching the frames; tokenising) is then done once
    per sample instead of once per draw (it was about a sixth of a room-size step's time). The rows stay
    in memory: the rooms build's 1000 four-frame samples hold about 1.2 GB of pixel values.
    """
    return [encode_batch(processor, [s]) for s in samples]


def collate(rows: Sequence[dict], pad: int) -> dict:
    """The batch :func:`encode_batch` gives for the samples of ``rows`` (rows of :func:`encode_each`, in
    order), tensor for tensor: per-token tensors right-padded (``input_ids`` with ``pad``, ``labels``
    with -100, the others with 0), the frames' tensors concatenated."""
    import torch

    width = max(int(r["input_ids"].shape[1]) for r in rows)
    fill = {"input_ids": pad, "labels": -100}
    out = {}
    for key, first in rows[0].items():
        if tuple(first.shape) == tuple(rows[0]["input_ids"].shape):  # per token
            out[key] = torch.cat(
                [torch.nn.functional.pad(r[key], (0, width - r[key].shape[1]), value=fill.get(key, 0)) for r in rows]
            )
        else:
            out[key] = torch.cat([r[key] for r in rows])
    return out


def pretrain_vision(
    model: Any,
    processor: Any,
    samples: Sequence[VisionSample],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    text_docs: Sequence[Sequence[int]] = (),
    text_per_batch: int = 0,
    balance_tasks: bool = False,
) -> list[float]:
    """Full-parameter next-token training on ``samples``' answers (plus ``text_docs`` replayed).

    ``text_docs`` (token ids of reply-format documents, see ``tiny.reply_documents``) keep the reply
    grammar the text pre-training taught: ``text_per_batch`` of them join every batch as rows
    without an image. ``balance_tasks`` draws each batch's rows evenly over the samples' tasks (a
    task with few samples is then seen as often as one with many) instead of uniformly over the
    pooled samples. One thread, seeded: the same inputs give the same weights.

    Returns:
        The loss of every step.
    """
    from a2c_ppo_acktr.tiny.training import next_token_training

    if steps <= 0:
        return []
    if not samples:
        raise ValueError("vision pre-training got no samples")
    pad = processor.tokenizer.pad_token_id
    rows = encode_each(processor, samples)
    by_task: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        by_task.setdefault(sample.task, []).append(i)
    groups = list(by_task.values()) if balance_tasks and len(by_task) > 1 else [list(range(len(samples)))]

    def batch(rng) -> dict:
        shares = [batch_size // len(groups) + (k < batch_size % len(groups)) for k in range(len(groups))]
        picked = [
            rows[i]
            for group, share in zip(groups, shares)
            for i in rng.choice(group, size=min(share, len(group)), replace=False)
        ]
        out = collate(picked, pad)
        if text_docs and text_per_batch > 0:
            docs = [
                text_docs[i]
                for i in rng.choice(len(text_docs), size=min(text_per_batch, len(text_docs)), replace=False)
            ]
            out = _append_text_rows(out, docs, pad)
        return out

    return next_token_training(model, batch, steps, lr, seed)


def _append_text_rows(batch: dict, docs: Sequence[Sequence[int]], pad: int) -> dict:
    """``batch`` with image-free rows of token ids appended (loss on every token of them)."""
    import torch

    from a2c_ppo_acktr.tiny.training import text_rows

    ids, mask = text_rows(docs, pad, width=batch["input_ids"].shape[1])
    width = ids.shape[1]

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    shape = tuple(batch["input_ids"].shape)
    out = dict(batch)
    out["input_ids"] = torch.cat([widen(batch["input_ids"], pad), ids])
    out["attention_mask"] = torch.cat([widen(batch["attention_mask"], 0), mask])
    out["labels"] = torch.cat([widen(batch["labels"], -100), ids.masked_fill(mask == 0, -100)])
    # Per-token side inputs of the processor (mm_token_type_ids): text rows are all text (0).
    for key, value in batch.items():
        if key not in out or key in ("input_ids", "attention_mask", "labels"):
            continue
        if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
            out[key] = torch.cat([widen(value, 0), torch.zeros((len(docs), width), dtype=value.dtype)])
    return out


# ------------------------------------------------------------------------------------ probe
def _score(task: str, reply: str, answer: str) -> float:
    """One probe answer's score: VSI-Bench's MRA for :data:`MRA_TASKS`, else exact match."""
    if task in MRA_TASKS:
        from a2c_ppo_acktr.common.scoring import mean_relative_accuracy

        try:
            value = float(reply)
        except ValueError:
            return 0.0
        return mean_relative_accuracy(value, float(answer))
    return float(reply == answer)


def probe(
    model: Any, processor: Any, samples: Sequence[VisionSample], batch_size: int = 16, zero_images: bool = False
) -> dict[str, float]:
    """Greedy answers to ``samples``' questions; the mean score per task (exact match, or MRA for
    :data:`MRA_TASKS`).

    Args:
        zero_images: Ask about zeroed frames instead (same tokens): what the text alone gives.
    """
    import torch

    tok = processor.tokenizer
    correct: dict[str, list[float]] = {}
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        batch = _process(processor, [_user_text(s.question, len(s.frames)) for s in chunk], chunk, "left", zero_images)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=6, do_sample=False)
        replies = tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        for s, reply in zip(chunk, replies):
            correct.setdefault(s.task, []).append(_score(s.task, reply.strip(), s.answer))
    return {task: float(np.mean(v)) for task, v in correct.items()}


def chance_levels(samples: Sequence[VisionSample]) -> dict[str, float]:
    """The best constant answer's score per task (what a policy blind to the frame can reach
    without reading the question; ``left_right`` questions name both answers, so 0.5 there; for
    :data:`MRA_TASKS` the best whole-number constant's MRA)."""
    out: dict[str, float] = {}
    for task in sorted({s.task for s in samples}):
        answers = [s.answer for s in samples if s.task == task]
        if task in MRA_TASKS:
            values = [float(a) for a in answers]
            out[task] = max(
                float(np.mean([_score(task, str(c), a) for a in answers])) for c in range(1, int(max(values)) + 2)
            )
        elif task == "left_right":
            out[task] = 0.5
        else:
            out[task] = max(answers.count(a) for a in set(answers)) / len(answers)
    return out

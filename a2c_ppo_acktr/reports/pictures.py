"""Trajectory pictures: an episode's frames with each turn's caption, and a top-down map beside them."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from a2c_ppo_acktr.reports.records import EpisodeRecord, TurnRecord, is_game_type, is_success


@dataclass(frozen=True)
class PictureLayout:
    """Pixel layout of a trajectory picture.

    The picture is ``header`` pixels of question text on top; below it, left to right, one tile per
    turn (``tile`` square, with ``caption`` pixels of text under it) and the top-down map
    (``map_size`` square). Width = ``max(turns, 1) * tile + map_size``; height = ``header +
    max(tile + caption, map_size)``. An invalid turn's caption shows at most ``raw_chars``
    characters of the model's raw output (JSON-escaped, so newlines and quotes are visible).
    """

    tile: int = 192
    caption: int = 150
    map_size: int = 384
    header: int = 56
    raw_chars: int = 240

    def size(self, num_turns: int) -> tuple[int, int]:
        """``(width, height)`` of the picture of an episode with ``num_turns`` turns."""
        return max(num_turns, 1) * self.tile + self.map_size, self.header + max(self.tile + self.caption, self.map_size)


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _wrap(text: str, width_chars: int, max_lines: int) -> list[str]:
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        lines += textwrap.wrap(para, width_chars) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: max(width_chars - 3, 0)] + "..."
    return lines


def _to_tile(image: np.ndarray, tile: int):
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    scale = tile / max(img.size)
    new = (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale)))
    # Nearest keeps small rendered frames crisp when blown up.
    return img.resize(new, Image.NEAREST)


def _caption_geometry(layout: PictureLayout) -> tuple[int, int]:
    """``(characters per line, lines)`` of a turn's caption under its tile."""
    return max(8, layout.tile // 6), max(1, (layout.caption - 4) // 13)


def turn_caption(step: TurnRecord, layout: PictureLayout = PictureLayout()) -> list[str]:
    """The lines drawn under a turn's tile: ``turn: action``, then the thoughts.

    An invalid turn shows, after its parse reason (at most 3 lines), the model's raw output as
    ``raw: "..."``: JSON-escaped (a newline reads ``\\n``; the default bitmap font has no glyph for
    control or non-ASCII characters), cut at ``layout.raw_chars`` characters and wrapped; the
    thoughts follow if lines are left.
    """
    chars, max_lines = _caption_geometry(layout)
    if step.valid:
        return _wrap(f"{step.turn}: {step.action}\n{step.thoughts}", chars, max_lines)
    lines = _wrap(f"{step.turn}: {step.action}", chars, min(3, max_lines))
    raw = json.dumps(step.text)
    if len(raw) > layout.raw_chars:
        raw = raw[: max(layout.raw_chars - 3, 0)] + "..."
    if max_lines > len(lines):
        lines += _wrap(f"raw: {raw}", chars, max_lines - len(lines))
    if step.thoughts and max_lines > len(lines):
        lines += _wrap(step.thoughts, chars, max_lines - len(lines))
    return lines


def picture_header(record: EpisodeRecord) -> tuple[str, str]:
    """``(heading, status line)`` on top of a trajectory picture.

    VSI: ``[type] question options`` and ``answer: ...   ground truth: ...   score: ...   turns: ...``.
    Game: ``[task] question`` and ``won``/``lost``/``lost (turn limit)``, ``return``, ``turns`` and
    ``invalid`` (turns); answers, options and ground truth are not shown.
    """
    if is_game_type(record.question_type):
        outcome = "won" if is_success(record.score) else ("lost (turn limit)" if record.truncated else "lost")
        return (
            f"[{record.question_type}] {record.question or ''}".rstrip(),
            f"{outcome}   return: {record.reward:.2f}   turns: {record.turns}   invalid: {record.num_invalid}",
        )
    answer = record.answer if record.answer is not None else "(no answer)"
    opts = "  ".join(record.options) if record.options else ""
    return (
        f"[{record.question_type}] {record.question} {opts}",
        f"answer: {answer}   ground truth: {record.ground_truth}   score: {record.score:.2f}   turns: {record.turns}",
    )


def trajectory_picture(
    record: EpisodeRecord,
    frames: Sequence[np.ndarray],
    topdown: np.ndarray,
    path: str | os.PathLike,
    layout: PictureLayout = PictureLayout(),
) -> Path:
    """Draw one episode: question header, per-turn frames captioned with thoughts and action
    (:func:`turn_caption`; an invalid turn in red with the model's raw output), map.

    A game episode (``question_type`` a game task) gets the header ``[task] <question>`` and
    ``won``/``lost`` (``lost (turn limit)`` when truncated) with its return, turns and invalid
    turns; no answer, ground truth or options are shown, and no turn's ``pose`` is read. Its
    ``topdown`` is the game's full-state image at the end of the episode; a picture that is not
    square is fitted into the map square keeping its aspect ratio (pixel art scaled up by nearest
    neighbour, so it stays crisp).

    Args:
        record: The evaluated episode (its ``steps`` give the captions).
        frames: The view the agent had when deciding each turn, one per step (uint8 HxWx3).
        topdown: The top-down map (uint8 HxWx3), e.g. from ``topdown.render_topdown`` with the path,
            the objects asked about and the answer; for a game, its full-state image.
        path: Output PNG; its size is ``layout.size(len(record.steps))``.
    """
    from PIL import Image, ImageDraw

    if len(frames) != len(record.steps):
        raise ValueError(
            f"trajectory_picture got {len(frames)} frames for {len(record.steps)} turns; pass one frame per turn"
        )
    width, height = layout.size(len(record.steps))
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    small, tiny = _font(13), _font(11)
    game = is_game_type(record.question_type)
    head, status = picture_header(record)
    head_lines = _wrap(head, max(20, width // 7), 2) + [status]
    for i, line in enumerate(head_lines):
        draw.text((6, 3 + 17 * i), line, fill="black", font=small)
    top = layout.header
    for i, (step, frame) in enumerate(zip(record.steps, frames)):
        x0 = i * layout.tile
        tile = _to_tile(frame, layout.tile)
        canvas.paste(tile, (x0 + (layout.tile - tile.size[0]) // 2, top + (layout.tile - tile.size[1]) // 2))
        colour = "black" if step.valid else "firebrick"
        for j, line in enumerate(turn_caption(step, layout)):
            draw.text((x0 + 3, top + layout.tile + 2 + 13 * j), line, fill=colour, font=tiny)
    tmap = Image.fromarray(np.ascontiguousarray(topdown, dtype=np.uint8)).convert("RGB")
    if game:
        scale = layout.map_size / max(tmap.size)
        size = (max(1, round(tmap.size[0] * scale)), max(1, round(tmap.size[1] * scale)))
        tmap = tmap.resize(size, Image.NEAREST if scale >= 1 else Image.BILINEAR)
        canvas.paste(
            tmap, (width - layout.map_size + (layout.map_size - size[0]) // 2, top + (layout.map_size - size[1]) // 2)
        )
    else:
        tmap = tmap.resize((layout.map_size, layout.map_size), Image.BILINEAR)
        canvas.paste(tmap, (width - layout.map_size, top))
    path = Path(path)
    canvas.save(path, format="PNG")
    return path

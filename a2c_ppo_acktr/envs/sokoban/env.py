"""Sokoban (``Sokoban-v0``): push every box onto a target, one move a turn, the room seen from above.

Rules, from ``mpSchrader/gym-sokoban`` (``gym_sokoban/envs/sokoban_env.py``):

* actions: the words ``up``, ``down``, ``left``, ``right``, gym-sokoban's push actions 1-4: the player
  steps one cell; stepping into a box pushes it one cell when the cell beyond is floor without a
  box, else nothing moves; walls block. (The original's "no operation" and push-less "move" actions
  are not offered.)
* classic reward per turn: -0.1, +1 when a box reaches a target, -1 when a box leaves one, +10 when
  the last box reaches its target, which ends the episode (``terminated``);
* the turn cap (gym-sokoban's ``max_steps``, 120) ends it ``truncated``, and so does an optional
  per-episode budget of reply tokens (``max_episode_tokens``, counted by
  :func:`~a2c_ppo_acktr.envs.cards.common.count_tokens`: words and punctuation marks), which stops a
  policy that thinks at length on every move;
* levels: :mod:`.generation` (default 6x6 with one box, a small start for a VLM agent; the
  original's default is 10x10 with 4 boxes);
* the image: a top view, one tile a cell: wall, floor, target, box, box on target, player and player
  on target (the original's seven tiles), drawn here as flat shapes.

Optional shaped reward (``reward_mode="shaped"``; the system the issue cites used one combining an
average step reward, a final bonus and distance shaping, without a formula we could check, so this
is our definition): every valid turn earns ``shaped_distance_coef * (D_before - D_after)``, where
``D`` is the summed distance from each box to its nearest target (potential-based shaping, Ng et
al. 1999, so it does not change which policies are optimal); an invalid reply earns
``invalid_penalty``; the turn that ends the episode (either way) also earns
``shaped_average_coef * mean(classic rewards of the episode's turns)`` plus ``shaped_final_bonus``
when solved. ``info["classic_reward"]`` always carries the classic reward.

An invalid reply (:func:`~a2c_ppo_acktr.envs.cards.common.parse_reply`) costs ``invalid_penalty``,
uses the turn and moves nothing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image, ImageDraw

from a2c_ppo_acktr.common.prompts import Invalid
from a2c_ppo_acktr.envs.cards.common import Outcome, Reply, TokenGameEnv, format_reply
from a2c_ppo_acktr.envs.sokoban.generation import Level, generate_level
from a2c_ppo_acktr.envs.sokoban.solver import ACTIONS, apply_move, box_distance, solve

VOCABULARY = ACTIONS
PROMPT = (
    "You are playing Sokoban. The image shows the room from above: dark grey cells are walls, beige cells are floor, "
    "cells with a red ring are targets, brown crates are boxes (a box on a target turns green), "
    "and the blue circle is you. Your goal is to push every box onto a target.\n"
    "Each turn you move one cell up, down, left or right. Moving into a box pushes it one cell further if that cell is "
    "free floor; you cannot pull boxes, and walls block you. A box pushed into a corner can never be moved out.\n"
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{"thoughts": "<find yourself, the boxes and the targets, then plan which box to push where>", '
    '"action": "<up, down, left or right>"}'
)
REWARD_MODES = ("classic", "shaped")


@dataclass(frozen=True)
class SokobanConfig:
    """Sokoban settings.

    Attributes:
        dim_room: (height, width) of the grid, border walls included.
        num_boxes: Boxes (and targets) per level.
        max_turns: Turns before ``truncated`` (gym-sokoban's ``max_steps`` is 120).
        invalid_penalty: Reward of a reply that is not one of the four words.
        tile_size: Pixels per cell side (the original draws 16).
        reward_mode: ``classic`` (gym-sokoban's) or ``shaped`` (see the module docstring).
        penalty_for_step, reward_box_on_target, penalty_box_off_target, reward_finished: The
            classic reward's terms (gym-sokoban's values).
        shaped_distance_coef, shaped_average_coef, shaped_final_bonus: The shaped reward's terms.
        num_gen_steps: Random-walk steps of the room; None: ``int(1.7 * (height + width))`` (the original).
        p_change_directions: Probability that the random walk turns before a step.
        gen_max_states, gen_max_depth: Reverse-play search budget (the original: 300000 states,
            depth 300). Smaller budgets generate faster and explore less of a large room.
        max_generation_attempts: Rooms drawn before giving up.
        level_seed: ``reset(options={"level_index": k})`` generates level ``k`` from the seed
            ``(level_seed, k)``, the same level in every env and run (held-out evaluation sets).
        solver_max_expansions: A* budget of the oracle.
        max_episode_tokens: Reply tokens an episode may use (None: no budget); the turn that reaches
            it ends the episode ``truncated``.
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    max_turns: int = 120
    invalid_penalty: float = -1.0
    tile_size: int = 32
    reward_mode: str = "classic"
    penalty_for_step: float = -0.1
    reward_box_on_target: float = 1.0
    penalty_box_off_target: float = -1.0
    reward_finished: float = 10.0
    shaped_distance_coef: float = 1.0
    shaped_average_coef: float = 1.0
    shaped_final_bonus: float = 10.0
    num_gen_steps: Optional[int] = None
    p_change_directions: float = 0.35
    gen_max_states: int = 300_000
    gen_max_depth: int = 300
    max_generation_attempts: int = 100
    level_seed: int = 0
    solver_max_expansions: int = 200_000
    max_episode_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        dim = tuple(int(v) for v in self.dim_room)
        object.__setattr__(self, "dim_room", dim)  # YAML gives a list
        if len(dim) != 2 or min(dim) < 3:
            raise ValueError(f"dim_room={self.dim_room} must be (height, width), each at least 3 (the border is wall)")
        if self.num_boxes < 1 or (dim[0] - 2) * (dim[1] - 2) < self.num_boxes + 2:
            raise ValueError(
                f"num_boxes={self.num_boxes} must be >= 1 and leave room inside a {dim[0]}x{dim[1]} grid; use fewer "
                "boxes or a larger dim_room"
            )
        if self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns} must be >= 1")
        if self.tile_size < 4:
            raise ValueError(f"tile_size={self.tile_size} must be at least 4 pixels")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode={self.reward_mode!r} is not one of {list(REWARD_MODES)}")
        for name in (
            "invalid_penalty",
            "penalty_for_step",
            "reward_box_on_target",
            "penalty_box_off_target",
            "reward_finished",
            "shaped_distance_coef",
            "shaped_average_coef",
            "shaped_final_bonus",
        ):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)} must be a finite number")
        if self.num_gen_steps is not None and self.num_gen_steps < 1:
            raise ValueError(
                f"num_gen_steps={self.num_gen_steps} must be >= 1, or None for int(1.7 * (height + width))"
            )
        if not 0.0 <= self.p_change_directions <= 1.0:
            raise ValueError(f"p_change_directions={self.p_change_directions} must lie in [0, 1]")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens={self.max_episode_tokens} must be >= 1, or None for no budget")
        if min(self.gen_max_states, self.gen_max_depth, self.max_generation_attempts, self.solver_max_expansions) < 1:
            raise ValueError(
                "gen_max_states, gen_max_depth, max_generation_attempts and solver_max_expansions must be >= 1"
            )

    @property
    def gen_steps(self) -> int:
        """The random walk's steps (``num_gen_steps`` or the original's ``int(1.7 * (height + width))``)."""
        return (
            self.num_gen_steps if self.num_gen_steps is not None else int(1.7 * (self.dim_room[0] + self.dim_room[1]))
        )


class SokobanEnv(TokenGameEnv):
    """Gymnasium env ``Sokoban-v0`` (see the module docstring).

    Privileged state: ``level`` (the level as dealt), ``player``, ``boxes``.
    """

    config_class = SokobanConfig
    task_type_name = "sokoban"

    def __init__(self, cfg: SokobanConfig | None = None, render_mode: str | None = None, **overrides) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.level: Optional[Level] = None
        self.player: tuple[int, int] = (0, 0)
        self.boxes: frozenset = frozenset()
        self._classic: list[float] = []

    def _vocabulary(self) -> tuple[str, ...]:
        return VOCABULARY

    def _token_budget(self) -> Optional[int]:
        return self.cfg.max_episode_tokens

    def _image_shape(self) -> tuple[int, int, int]:
        h, w = self.cfg.dim_room
        return (h * self.cfg.tile_size, w * self.cfg.tile_size, 3)

    # ------------------------------------------------------------------ game
    def _deal(self, options: dict) -> None:
        """Options: ``level`` (a :class:`Level` of this env's ``dim_room``) or ``level_index``
        (level k of ``level_seed``); otherwise a level from ``np_random``."""
        cfg = self.cfg
        if "level" in options:
            level = options["level"]
            if not isinstance(level, Level) or (level.height, level.width) != cfg.dim_room:
                raise ValueError(f"options['level'] must be a Level of size {cfg.dim_room}, got {level!r}")
        else:
            rng = (
                np.random.default_rng([cfg.level_seed, int(options["level_index"])])
                if "level_index" in options
                else self.np_random
            )
            level = generate_level(
                rng,
                *cfg.dim_room,
                cfg.num_boxes,
                cfg.gen_steps,
                cfg.p_change_directions,
                cfg.gen_max_states,
                cfg.gen_max_depth,
                cfg.max_generation_attempts,
            )
        self.level = level
        self.player, self.boxes = level.player, level.boxes
        self._classic = []

    def _play(self, token: str) -> Outcome:
        cfg, targets = self.cfg, self.level.targets
        on_before = len(self.boxes & targets)
        distance_before = box_distance(targets, self.boxes)
        player, boxes, pushed = apply_move(self.level.floor, self.player, self.boxes, token)
        moved = player != self.player
        self.player, self.boxes = player, boxes
        on_after = len(boxes & targets)
        solved = boxes == targets
        classic = cfg.penalty_for_step
        if on_after > on_before:
            classic += cfg.reward_box_on_target
        elif on_after < on_before:
            classic += cfg.penalty_box_off_target
        if solved:
            classic += cfg.reward_finished
        self._classic.append(classic)
        if cfg.reward_mode == "classic":
            reward = classic
        else:
            reward = cfg.shaped_distance_coef * (distance_before - box_distance(targets, boxes))
        if pushed:
            feedback = f"you pushed a box {token}."
        elif moved:
            feedback = f"you moved {token}."
        else:
            feedback = f"you tried to move {token} but were blocked; nothing moved."
        return Outcome(reward, solved, False, feedback, success=solved)

    def _end_step(self, reward: float, parsed: Reply, terminated: bool, truncated: bool) -> float:
        if isinstance(parsed, Invalid):
            self._classic.append(self.cfg.invalid_penalty)
        if self.cfg.reward_mode == "shaped" and (terminated or truncated):
            reward += self.cfg.shaped_average_coef * float(np.mean(self._classic))
            reward += self.cfg.shaped_final_bonus if self.boxes == self.level.targets else 0.0
        return reward

    def _prompt(self) -> str:
        return f"{PROMPT}\nTurns left: {max(self.cfg.max_turns - self.turn, 0)}."

    def _game_info(self) -> dict:
        targets = self.level.targets
        return {
            "player": self.player,
            "boxes": tuple(sorted(self.boxes)),
            "boxes_on_target": len(self.boxes & targets),
            "box_distance": box_distance(targets, self.boxes),
            "classic_reward": self._classic[-1] if self._classic and self.turn else 0.0,
        }

    # ------------------------------------------------------------------ drawing
    def _draw(self) -> np.ndarray:
        level, t = self.level, self.cfg.tile_size
        codes = np.full((level.height, level.width), _WALL, dtype=np.int64)
        for cell in level.floor:
            codes[cell] = _TARGET if cell in level.targets else _FLOOR
        for cell in self.boxes:
            codes[cell] = _BOX_ON_TARGET if cell in level.targets else _BOX
        codes[self.player] = _PLAYER_ON_TARGET if self.player in level.targets else _PLAYER
        tiles = _tiles(t)  # (7, t, t, 3)
        grid = tiles[codes]  # (H, W, t, t, 3)
        return np.ascontiguousarray(grid.transpose(0, 2, 1, 3, 4).reshape(level.height * t, level.width * t, 3))

    # ------------------------------------------------------------------ teacher
    def solver_reply(self) -> str:
        return oracle_reply(self.level, self.player, self.boxes, self.cfg.solver_max_expansions)


def oracle_reply(level: Level, player: tuple[int, int], boxes: frozenset, max_expansions: int = 200_000) -> str:
    """The oracle's reply: the first move of a shortest solution from this position (a pure function).

    Without a solution (a box was pushed where it cannot leave) it still replies with a legal move,
    ``up``, and says so.
    """
    plan = solve(level.floor, level.targets, player, boxes, max_expansions)
    if not plan:
        return format_reply("No sequence of pushes solves the level from here; I move up.", "up")
    shown = " ".join(plan[:12]) + (" ..." if len(plan) > 12 else "")
    return format_reply(f"A shortest solution from here takes {len(plan)} moves: {shown}; I move {plan[0]}.", plan[0])


# ---------------------------------------------------------------------------------------------
# Tiles (gym-sokoban's surface order: wall, floor, target, box on target, box, player, player on target)
# ---------------------------------------------------------------------------------------------
_WALL, _FLOOR, _TARGET, _BOX_ON_TARGET, _BOX, _PLAYER, _PLAYER_ON_TARGET = range(7)
_WALL_RGB, _MORTAR_RGB = (70, 70, 78), (45, 45, 52)
_FLOOR_RGB = (222, 212, 186)
_TARGET_RGB = (215, 40, 40)
_BOX_RGB, _BOX_EDGE_RGB = (150, 100, 45), (90, 58, 22)
_BOX_ON_TARGET_RGB, _BOX_ON_TARGET_EDGE_RGB = (60, 165, 70), (25, 95, 35)
_PLAYER_RGB = (40, 80, 220)


@functools.lru_cache(maxsize=16)
def _tiles(t: int) -> np.ndarray:
    """The seven tiles at ``t`` pixels, (7, t, t, 3) uint8, read-only."""

    def canvas(rgb: tuple) -> tuple[Image.Image, ImageDraw.ImageDraw]:
        img = Image.new("RGB", (t, t), rgb)
        return img, ImageDraw.Draw(img)

    def ring(draw: ImageDraw.ImageDraw) -> None:
        m = t * 0.12
        draw.ellipse([m, m, t - 1 - m, t - 1 - m], outline=_TARGET_RGB, width=max(1, t // 10))

    def crate(draw: ImageDraw.ImageDraw, fill: tuple, edge: tuple) -> None:
        m = max(1, t // 10)
        w = max(1, t // 12)
        draw.rectangle([m, m, t - 1 - m, t - 1 - m], fill=fill, outline=edge, width=w)
        draw.line([(m, m), (t - 1 - m, t - 1 - m)], fill=edge, width=w)
        draw.line([(m, t - 1 - m), (t - 1 - m, m)], fill=edge, width=w)

    def person(draw: ImageDraw.ImageDraw) -> None:
        m = t * 0.3
        draw.ellipse([m, m, t - 1 - m, t - 1 - m], fill=_PLAYER_RGB)

    wall, d = canvas(_WALL_RGB)
    half = max(1, t // 2)
    d.line([(0, half), (t, half)], fill=_MORTAR_RGB, width=max(1, t // 16))
    d.line([(half, 0), (half, half)], fill=_MORTAR_RGB, width=max(1, t // 16))
    d.line([(t // 4, half), (t // 4, t)], fill=_MORTAR_RGB, width=max(1, t // 16))
    floor, _ = canvas(_FLOOR_RGB)
    target, d = canvas(_FLOOR_RGB)
    ring(d)
    box_on_target, d = canvas(_FLOOR_RGB)
    crate(d, _BOX_ON_TARGET_RGB, _BOX_ON_TARGET_EDGE_RGB)
    box, d = canvas(_FLOOR_RGB)
    crate(d, _BOX_RGB, _BOX_EDGE_RGB)
    player, d = canvas(_FLOOR_RGB)
    person(d)
    player_on_target, d = canvas(_FLOOR_RGB)
    ring(d)
    person(d)
    tiles = np.stack(
        [np.asarray(im, dtype=np.uint8) for im in (wall, floor, target, box_on_target, box, player, player_on_target)]
    )
    tiles.setflags(write=False)
    return tiles

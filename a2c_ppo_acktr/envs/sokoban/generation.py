"""Procedural Sokoban levels, solvable by construction, as ``mpSchrader/gym-sokoban`` makes them.

From ``gym_sokoban/envs/room_utils.py`` (``generate_room``), with ``np.random.Generator`` draws in
place of the module-level ``random``/``np.random`` state:

1. Room: a random walk of ``num_steps`` steps (default ``int(1.7 * (height + width))``) starting on
   a random cell, turning to a random direction with probability ``p_change_directions`` (0.35)
   before each step, stamps one of five 3x3 masks (a line, a column, three L/square shapes) centred
   on each position; the border is wall.
2. Placement: the player on a uniform floor cell, then each target on a uniform free floor cell,
   each with its box on it (the solved state).
3. Reverse play: a depth-first search from the solved state over reverse moves (the player steps
   to a free cell and may pull the box behind it along), depth at most ``max_depth`` (300), at
   most ``max_states`` states (300000 in the original), actions in the order pull up, down,
   left, right, then move up, down, left, right. Each state scores ``pulls * displacement``, the
   number of pulls on the path times the summed Manhattan distance of every box from its own
   target, or 0 when a box or the player covers a target. The first best-scoring state is the
   level; a level with score 0 is discarded and a new room drawn.

Reversing the pulls is a solution, so every level is solvable. Two readings of the original's code:
the score counts every pull (the code meant to count switches between boxes, but passes its
caller's ``last_pull`` on, so every pull counts); a state is the player and the box positions (the
original hashes the room array, whose box codes also mark which boxes were pulled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

Cell = tuple[int, int]  # (row, column), row 0 at the top

# gym-sokoban's CHANGE_COORDINATES: up, down, left, right
DIRECTIONS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # the random walk's own order
_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=np.int64,
)


@dataclass(frozen=True)
class Level:
    """A Sokoban position: the fixed room and where the movable things are.

    Attributes:
        height, width: Grid size, walls included.
        floor: Cells that are not wall.
        targets: Target cells (as many as boxes).
        boxes: Box cells.
        player: The player's cell.
    """

    height: int
    width: int
    floor: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    def to_text(self) -> str:
        """The level in the usual Sokoban text notation (``#`` wall, ``.`` target, ``$`` box, ``*`` box
        on target, ``@`` player, ``+`` player on target, space floor), one row a line."""
        rows = []
        for r in range(self.height):
            line = []
            for c in range(self.width):
                cell = (r, c)
                if cell not in self.floor:
                    line.append("#")
                elif cell == self.player:
                    line.append("+" if cell in self.targets else "@")
                elif cell in self.boxes:
                    line.append("*" if cell in self.targets else "$")
                else:
                    line.append("." if cell in self.targets else " ")
            rows.append("".join(line))
        return "\n".join(rows)

    @classmethod
    def from_text(cls, text: str) -> "Level":
        """Parse :meth:`to_text`'s notation (ragged lines are padded with wall).

        Raises:
            ValueError: On an unknown character, no player or several, or boxes and targets in
                different numbers.
        """
        lines = text.split("\n")
        height, width = len(lines), max(len(line) for line in lines)
        floor, targets, boxes, players = set(), set(), set(), []
        for r, line in enumerate(lines):
            for c, ch in enumerate(line):
                if ch == "#":
                    continue
                if ch not in " .$*@+":
                    raise ValueError(f"unknown character {ch!r} at row {r}, column {c}; use # . $ * @ + or space")
                floor.add((r, c))
                if ch in ".*+":
                    targets.add((r, c))
                if ch in "$*":
                    boxes.add((r, c))
                if ch in "@+":
                    players.append((r, c))
        if len(players) != 1:
            raise ValueError(f"a level needs exactly one player (@ or +), found {len(players)}")
        if len(boxes) != len(targets) or not boxes:
            raise ValueError(
                f"a level needs as many boxes as targets, and at least one; found {len(boxes)} boxes, {len(targets)} "
                "targets"
            )
        return cls(height, width, frozenset(floor), frozenset(targets), frozenset(boxes), players[0])


class GenerationError(RuntimeError):
    """No level could be generated with the given settings."""


def room_topology(
    rng: np.random.Generator, height: int, width: int, num_steps: int, p_change_directions: float
) -> np.ndarray:
    """The floor mask (bool, ``height x width``) of a random-walk room (step 1 of the module docstring)."""
    direction = _WALK_DIRECTIONS[int(rng.integers(4))]
    position = np.array([int(rng.integers(1, height)), int(rng.integers(1, width))])
    level = np.zeros((height, width), dtype=np.int64)
    for _ in range(num_steps):
        if rng.random() < p_change_directions:
            direction = _WALK_DIRECTIONS[int(rng.integers(4))]
        position = position + direction
        position[0] = max(min(position[0], height - 2), 1)
        position[1] = max(min(position[1], width - 2), 1)
        mask = _MASKS[int(rng.integers(len(_MASKS)))]
        r, c = position - 1
        level[r : r + 3, c : c + 3] += mask
    floor = level > 0
    floor[:, [0, width - 1]] = False
    floor[[0, height - 1], :] = False
    return floor


def place_player_and_targets(
    rng: np.random.Generator, floor: np.ndarray, num_boxes: int
) -> Optional[tuple[Cell, list[Cell]]]:
    """The player's cell and the targets (step 2), or None when the room has too few floor cells."""
    free = [tuple(int(v) for v in cell) for cell in np.argwhere(floor)]
    if len(free) <= num_boxes + 1:
        return None
    player = free.pop(int(rng.integers(len(free))))
    targets = [free.pop(int(rng.integers(len(free)))) for _ in range(num_boxes)]
    return player, targets


def reverse_play(
    floor: frozenset[Cell], targets: list[Cell], player: Cell, max_states: int, max_depth: int
) -> tuple[int, Cell, tuple[Cell, ...]]:
    """Step 3: the best-scoring state reachable by reverse play from the solved state.

    An iterative depth-first search visiting states in the recursive original's order.

    Returns:
        ``(score, player, boxes)``, box ``i`` being the one that started on ``targets[i]``.
    """
    target_set = set(targets)
    best: tuple[int, Cell, tuple[Cell, ...]] = (-1, player, tuple(targets))
    visited: set = set()
    # (player, boxes, pulls, ttl); ttl as the original's: decremented on entry, the state dropped at 0
    stack = [(player, tuple(targets), 0, max_depth)]
    while stack and len(visited) < max_states:
        p, boxes, pulls, ttl = stack.pop()
        ttl -= 1
        if ttl <= 0:
            continue
        box_set = frozenset(boxes)
        key = (p, box_set)
        if key in visited:
            continue
        visited.add(key)
        if p in target_set or not box_set.isdisjoint(target_set):
            score = 0
        else:
            score = pulls * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
        if score > best[0]:
            best = (score, p, boxes)
        children = []
        for action in range(8):
            dr, dc = DIRECTIONS[action % 4]
            nxt = (p[0] + dr, p[1] + dc)
            if nxt not in floor or nxt in box_set:
                continue  # the original recurses into the unchanged, already visited state
            new_boxes, new_pulls = boxes, pulls
            if action < 4:
                behind = (p[0] - dr, p[1] - dc)
                if behind in box_set:
                    i = boxes.index(behind)
                    new_boxes = boxes[:i] + (p,) + boxes[i + 1 :]
                    new_pulls += 1
            children.append((nxt, new_boxes, new_pulls, ttl))
        stack.extend(reversed(children))
    return best


def generate_level(
    rng: np.random.Generator,
    height: int,
    width: int,
    num_boxes: int,
    num_steps: int,
    p_change_directions: float = 0.35,
    max_states: int = 300_000,
    max_depth: int = 300,
    max_attempts: int = 100,
) -> Level:
    """A solvable level (the module docstring's three steps, redrawn until the score is positive).

    Raises:
        GenerationError: After ``max_attempts`` rooms without a level of positive score.
    """
    for _ in range(max_attempts):
        floor_mask = room_topology(rng, height, width, num_steps, p_change_directions)
        placed = place_player_and_targets(rng, floor_mask, num_boxes)
        if placed is None:
            continue
        player, targets = placed
        floor = frozenset(tuple(int(v) for v in cell) for cell in np.argwhere(floor_mask))
        score, start, boxes = reverse_play(floor, targets, player, max_states, max_depth)
        if score > 0:
            return Level(height, width, floor, frozenset(targets), frozenset(boxes), start)
    raise GenerationError(
        f"no {height}x{width} level with {num_boxes} boxes in {max_attempts} rooms; use a larger dim_room, "
        "fewer boxes, more generation steps or more max_generation_attempts"
    )

"""A* over Sokoban positions (player cell, box cells): the oracle's planner.

Moves are the env's (:data:`ACTIONS`, push semantics): a step into a box pushes it when the cell
beyond is free floor. The search runs over pushes (:func:`solve`); each move costs 1 and the
heuristic, the summed distance from each box to its nearest target, never overestimates (each push
moves one box one cell) and drops by at most the cost of an edge, so the first plan found is a
shortest one in moves. Pushes onto a dead cell (a non-target cell from which no push sequence
reaches any target, found by pulling back from the targets) are cut: no solution passes there.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from typing import Optional

from a2c_ppo_acktr.envs.sokoban.generation import DIRECTIONS, Cell, Level

ACTIONS = ("up", "down", "left", "right")  # the env's vocabulary, in gym-sokoban's direction order
_STEP = dict(zip(ACTIONS, DIRECTIONS))


def apply_move(
    floor: frozenset[Cell], player: Cell, boxes: frozenset[Cell], action: str
) -> tuple[Cell, frozenset[Cell], bool]:
    """One move with push semantics (gym-sokoban's push actions 1-4).

    Returns:
        ``(player, boxes, pushed)``; a blocked move leaves both unchanged.
    """
    dr, dc = _STEP[action]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in floor and beyond not in boxes:
            return nxt, (boxes - {nxt}) | {beyond}, True
        return player, boxes, False
    if nxt in floor:
        return nxt, boxes, False
    return player, boxes, False


def box_distance(targets: frozenset[Cell], boxes: frozenset[Cell]) -> int:
    """Summed Manhattan distance from each box to its nearest target (0 when solved)."""
    return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets) for b in boxes)


@functools.lru_cache(maxsize=256)
def live_cells(floor: frozenset[Cell], targets: frozenset[Cell]) -> frozenset[Cell]:
    """Cells from which a box can still be pushed onto some target (ignoring other boxes)."""
    live = set(targets)
    frontier = list(targets)
    while frontier:
        cell = frontier.pop()
        for dr, dc in DIRECTIONS:
            # a box at `prev` pushed by (dr, dc) lands on `cell`; the pusher stands at prev - (dr, dc)
            prev = (cell[0] - dr, cell[1] - dc)
            pusher = (prev[0] - dr, prev[1] - dc)
            if prev in floor and pusher in floor and prev not in live:
                live.add(prev)
                frontier.append(prev)
    return frozenset(live)


def _walk(floor: frozenset[Cell], boxes: frozenset[Cell], start: Cell) -> tuple[dict, dict[Cell, int]]:
    """Breadth-first walk from ``start`` around the boxes.

    Returns:
        ``(came, steps)``: cell -> (previous cell, action) (the start -> None), and cell -> moves.
    """
    came: dict[Cell, Optional[tuple[Cell, str]]] = {start: None}
    steps = {start: 0}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for cell in frontier:
            for action in ACTIONS:
                dr, dc = _STEP[action]
                nxt = (cell[0] + dr, cell[1] + dc)
                if nxt in floor and nxt not in boxes and nxt not in came:
                    came[nxt] = (cell, action)
                    steps[nxt] = steps[cell] + 1
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return came, steps


def _path(came: dict[Cell, Optional[tuple[Cell, str]]], cell: Cell) -> list[str]:
    actions = []
    while came[cell] is not None:
        cell, action = came[cell]
        actions.append(action)
    return actions[::-1]


@functools.lru_cache(maxsize=4096)
def solve(
    floor: frozenset[Cell],
    targets: frozenset[Cell],
    player: Cell,
    boxes: frozenset[Cell],
    max_expansions: int = 200_000,
) -> Optional[tuple[str, ...]]:
    """A shortest move sequence putting every box on a target.

    A* over pushes: a state is the player's cell and the boxes right after a push (or at the
    start); an edge walks to a cell beside a box (breadth-first, around the boxes) and pushes it,
    costing the walk's length plus one. Every solution is walks and pushes, so the cheapest path is
    a shortest solution in moves.

    Args:
        floor, targets, player, boxes: The position (see :class:`~.generation.Level`).
        max_expansions: States expanded before giving up.

    Returns:
        The actions (empty when already solved), or None when there is no solution (or none was
        found within ``max_expansions``).
    """
    live = live_cells(floor, targets)
    if not boxes <= live:
        return None
    start = (player, boxes)
    parent: dict = {start: None}  # state -> (previous state, cell pushed from, push action)
    cost = {start: 0}
    order = itertools.count()  # ties broken by insertion: the plan is reproducible
    heap = [(box_distance(targets, boxes), next(order), 0, start)]
    expansions = 0
    while heap:
        _, _, g_popped, state = heapq.heappop(heap)
        if g_popped > cost[state]:
            continue  # a stale entry: the state was reached more cheaply since
        p, bx = state
        if bx == targets:
            return _plan(floor, parent, state)
        expansions += 1
        if expansions > max_expansions:
            return None
        _, depth = _walk(floor, bx, p)
        for box in sorted(bx):
            for action in ACTIONS:
                dr, dc = _STEP[action]
                stand = (box[0] - dr, box[1] - dc)
                dest = (box[0] + dr, box[1] + dc)
                if stand not in depth or dest not in live or dest in bx:
                    continue
                child = (box, (bx - {box}) | {dest})
                g = cost[state] + depth[stand] + 1
                if child not in cost or g < cost[child]:
                    cost[child] = g
                    parent[child] = (state, stand, action)
                    heapq.heappush(heap, (g + box_distance(targets, child[1]), next(order), g, child))
    return None


def _plan(floor: frozenset[Cell], parent: dict, state: tuple) -> tuple[str, ...]:
    """The moves from the start to ``state``: each edge's walk, then its push."""
    edges = []
    while parent[state] is not None:
        previous, stand, action = parent[state]
        edges.append((previous, stand, action))
        state = previous
    moves: list[str] = []
    for (p, bx), stand, action in reversed(edges):
        moves.extend(_path(_walk(floor, bx, p)[0], stand))
        moves.append(action)
    return tuple(moves)


def solve_level(level: Level, max_expansions: int = 200_000) -> Optional[tuple[str, ...]]:
    """:func:`solve` on a :class:`~.generation.Level`."""
    return solve(level.floor, level.targets, level.player, level.boxes, max_expansions)

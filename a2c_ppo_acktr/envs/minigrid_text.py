"""MiniGrid as a text-action env: any ``MiniGrid-*`` or ``BabyAI-*`` gymnasium id, played in words.

The env wraps one inner env of the ``minigrid`` package (Farama, >= 3.0), made with
``gymnasium.make(minigrid_id, render_mode=None).unwrapped`` and kept without wrappers, so that it
pickles with the rest of the env's attributes (the training loop saves ``vars(env)`` for an exact
resume). Its rules, layouts, rewards, termination and truncation are minigrid's own:

* actions: the seven words of :data:`VOCABULARY`, minigrid's ``Actions`` 0..6 in order (``turn
  left``, ``turn right``, ``move forward``, ``pick up``, ``drop``, ``toggle``, ``done``). Every id
  offers all seven even where only some matter (Empty needs the first three; ``done`` does nothing
  in most minigrid envs): the prompt lists them with their meaning, as minigrid's action space does;
* reward: minigrid's, 0 on every step except success, ``1 - 0.9 * step_count / max_steps``, where
  ``step_count`` counts the inner env's steps, i.e. the valid replies only;
* ``terminated`` and ``truncated`` are the inner env's (the goal reached, lava, a mission's
  verifier; ``max_steps`` steps), and ``info["success"]`` is ``terminated`` with a positive reward;
* layouts: ``reset(seed=s)`` seeds ``self.np_random``, which draws the seed of the inner env's reset,
  so ``s`` fixes the layout (``options={"layout_seed": k}`` resets the inner env with ``k`` itself:
  the same layout in every env and run, for held-out evaluation sets).

Observation: ``{"images": (image,), "text": prompt}`` (the base class's shape, see
:mod:`a2c_ppo_acktr.envs.cards.common`). The image is ``image_size`` x ``image_size`` RGB:

* ``view="agent"`` (default): minigrid's egocentric partial view (``get_frame(agent_pov=True)``,
  ``agent_view_size`` cells a side, 7 in most envs), the agent at the bottom centre pointing up;
  cells it sees are drawn lighter, cells hidden behind walls and closed doors are black (beyond the
  grid's edge minigrid draws walls);
* ``view="full"``: the whole grid from above with the agent as a triangle pointing where it faces
  (``get_frame(highlight=False, agent_pov=False)``: without minigrid's lighter field-of-view cone,
  which says nothing the triangle does not when the whole grid is shown). A grid that is not square
  is centred on a black square first.

The grid is drawn at the smallest whole tile size that reaches ``image_size`` and box-filtered down
to it (224 = 7 x 32 draws the default agent view exactly). The text is :data:`PROMPT`, what the image
shows (:data:`VIEW_TEXT`), the mission, what the agent carries (an egocentric image barely shows it)
and the turns left; never the agent's coordinates or where the goal is: the image shows those.
``overview_image()`` (the picture beside a trajectory) is always the full grid, with the cells the
agent sees drawn lighter.

Turn cap: ``max_turns`` (None: the inner env's ``max_steps``; a number: at most ``max_steps``),
resolved each episode, counting every turn, valid or not; minigrid truncates at ``max_steps`` valid
steps, which the cap reaches first or together.

``info`` adds ``mission``, ``agent_pos`` ``(x, y)``, ``agent_dir`` (minigrid's 0..3: right, down,
left, up), ``carrying`` (``"yellow key"`` or None), ``step_count`` (minigrid's) and ``state_hash``
(:func:`state_hash`; at reset it names the layout dealt).

An invalid reply (:func:`~a2c_ppo_acktr.envs.cards.common.parse_reply`) costs ``invalid_penalty``,
uses the turn and does not step the inner env (its ``step_count``, hence the success reward, is
unchanged). ``oracle_reply`` is a privileged BFS planner (:func:`oracle_reply`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Optional

import gymnasium as gym
import numpy as np
from PIL import Image

from a2c_ppo_acktr.envs.cards.common import Outcome, TokenGameConfig, TokenGameEnv, format_reply

try:
    import minigrid  # noqa: F401 - importing it registers the MiniGrid-* and BabyAI-* ids
    from minigrid.minigrid_env import MiniGridEnv
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("a2c_ppo_acktr.envs.minigrid_text needs the minigrid package: pip install 'minigrid>=3'") from e

VOCABULARY = ("turn left", "turn right", "move forward", "pick up", "drop", "toggle", "done")  # minigrid Actions 0..6
TESTED_IDS = ("MiniGrid-DoorKey-6x6-v0", "MiniGrid-Empty-Random-6x6-v0")
ID_PREFIXES = ("MiniGrid-", "BabyAI-")
VIEWS = ("agent", "full")

PROMPT = (
    "You are an agent in MiniGrid, a world of square cells. Complete the mission given below.\n"
    "In the image, black cells are empty floor, grey cells are walls, the green square is the goal, and orange cells "
    "with waves are lava (stepping into lava ends the game). Keys, balls and boxes are drawn in their colour. A door "
    "is a coloured square: with a handle when closed, dark with a key slot when locked, and only a thin frame along "
    "one side when open.\n"
    "Each turn you take one action:\n"
    '"turn left": turn 90 degrees to your left, staying in your cell;\n'
    '"turn right": turn 90 degrees to your right, staying in your cell;\n'
    '"move forward": step one cell forward (walls, closed doors and objects block you);\n'
    '"pick up": pick up the key, ball or box in front of you (you carry at most one object);\n'
    '"drop": put the object you carry on the empty cell in front of you;\n'
    '"toggle": open or close the door in front of you (a locked door opens only while you carry the key of its '
    "colour), or open the box in front of you;\n"
    '"done": say that the mission is complete (most missions end by themselves, and then this does nothing).\n'
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{"thoughts": "<describe what you see and where things are relative to you, then plan your next action>", '
    '"action": "<one of the actions above>"}'
)
VIEW_TEXT = {
    "agent": (
        "The image shows what you can see, {n} x {n} cells: you are the red triangle at the bottom centre, always "
        "pointing up, so up in the image is forward, and the image's left and right are your left and right. What "
        "you can see is drawn lighter (empty floor dark grey, walls light grey); cells hidden behind walls and "
        "closed doors are black."
    ),
    "full": "The image shows the whole grid from above: you are the red triangle, pointing in the direction you face.",
}


@dataclass(frozen=True)
class MiniGridConfig(TokenGameConfig):
    """MiniGrid settings.

    Attributes:
        minigrid_id: The gymnasium id of the inner env, ``MiniGrid-...`` or ``BabyAI-...`` (one that
            the minigrid package registers; checked when the env is made).
        view: ``agent`` (the egocentric partial view) or ``full`` (the whole grid); see the module
            docstring.
        image_size: Side of the square observation image in pixels (224: the default 7-cell agent
            view at 32 pixels a cell).
        invalid_penalty: Reward of a reply that is not one of the seven actions. minigrid's rewards
            lie in [0, 1] (success pays ``1 - 0.9 * steps / max_steps``, at least 0.1), so the card
            games' -1 would outweigh any success; -0.1 is the smallest success reward: ten invalid
            replies cost about as much as the best success earns, while a valid but useless action
            costs only ``0.9 / max_steps`` of the final reward (0.0025 in DoorKey-6x6).
        max_turns: Turns per episode (valid or not) before ``truncated``. None (default): the inner
            env's ``max_steps`` (minigrid's own time limit: 144 in Empty-Random-6x6, 360 in
            DoorKey-6x6); a number: the smaller of it and ``max_steps``. The cap is resolved each
            episode (BabyAI levels set ``max_steps`` in their reset) and shown as "Turns left".
    """

    minigrid_id: str = "MiniGrid-Empty-Random-6x6-v0"
    view: str = "agent"
    image_size: int = 224
    invalid_penalty: float = -0.1
    max_turns: Optional[int] = None
    min_image_size: ClassVar[int] = 64  # below it a cell of the 7-cell view is under 10 pixels

    def __post_init__(self) -> None:
        if self.max_turns is None:
            # The same checks with a concrete turn count; the env resolves None to max_steps.
            dataclasses.replace(self, max_turns=1)
            return
        super().__post_init__()
        if not isinstance(self.minigrid_id, str) or not self.minigrid_id.startswith(ID_PREFIXES):
            raise ValueError(
                f"minigrid_id={self.minigrid_id!r} is not a minigrid id; it must start with 'MiniGrid-' or 'BabyAI-', "
                f"e.g. {TESTED_IDS[0]!r}"
            )
        if self.view not in VIEWS:
            raise ValueError(f"view={self.view!r} is not one of {list(VIEWS)}")


class MiniGridTextEnv(TokenGameEnv):
    """A minigrid env played with the seven action words (see the module docstring).

    Privileged state: ``inner``, the unwrapped minigrid env (grid, ``agent_pos``, ``agent_dir``,
    ``carrying``, ``step_count``, ``mission``).

    Args:
        cfg: The config; None uses the defaults.
        render_mode: None or ``"rgb_array"``.
        **overrides: Field overrides of ``cfg`` (e.g. ``minigrid_id="MiniGrid-DoorKey-6x6-v0"``).

    Raises:
        ValueError: ``minigrid_id`` is not registered by the minigrid package (the message lists
            similar ids), or a config value is out of range.
        TypeError: An override names no config field.
    """

    config_class = MiniGridConfig
    task_type_name = "minigrid"

    def __init__(self, cfg: MiniGridConfig | None = None, render_mode: str | None = None, **overrides: Any) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.inner: MiniGridEnv = _make_inner(self.cfg.minigrid_id)
        self.layout_seed: Optional[int] = None  # the seed of the inner env's last reset

    def _vocabulary(self) -> tuple[str, ...]:
        return VOCABULARY

    shows_turns_left = True  # "Turns left: N" in every observation

    def _turn_cap(self) -> int:
        steps = int(self.inner.max_steps)
        return steps if self.cfg.max_turns is None else min(self.cfg.max_turns, steps)

    # ------------------------------------------------------------------ game
    def _deal(self, options: dict) -> None:
        """Option ``layout_seed`` (an int >= 0) seeds the inner reset itself; otherwise
        ``self.np_random`` draws that seed."""
        if "layout_seed" in options:
            seed = options["layout_seed"]
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"options['layout_seed'] must be an int >= 0, got {seed!r}")
            seed = int(seed)
        else:
            seed = int(self.np_random.integers(2**31))
        self.inner.reset(seed=seed)
        self.layout_seed = seed

    def _play(self, token: str) -> Outcome:
        env = self.inner
        front = tuple(int(v) for v in env.front_pos)
        cell = env.grid.get(*front)
        before = _Before(
            pos=tuple(int(v) for v in env.agent_pos),
            carrying=env.carrying,
            front=front,
            cell=cell,
            door=(cell.is_open, cell.is_locked) if cell is not None and cell.type == "door" else None,
        )
        _, reward, terminated, truncated, _ = env.step(VOCABULARY.index(token))
        reward, terminated = float(reward), bool(terminated)
        success = terminated and reward > 0
        feedback = _describe_step(env, token, before)
        if terminated:
            feedback += " The mission is complete." if success else " The episode ended without success."
        return Outcome(reward, terminated, bool(truncated), feedback, success=success)

    def _draw(self) -> np.ndarray:
        return self._frame(self.cfg.view, highlight=False)

    def overview_image(self, **_: Any) -> np.ndarray:
        """The picture beside a trajectory: the whole grid, the cells the agent sees drawn lighter
        (minigrid's own full render), whichever view the agent plays with."""
        return self._frame("full", highlight=True)

    def _frame(self, view: str, highlight: bool) -> np.ndarray:
        """The grid drawn as ``view`` at ``image_size`` x ``image_size`` (uint8 RGB)."""
        env, size = self.inner, self.cfg.image_size
        if view == "agent":  # minigrid's POV render always draws the visible cells lighter
            frame = env.get_frame(tile_size=math.ceil(size / env.agent_view_size), agent_pov=True)
        else:
            frame = env.get_frame(
                highlight=highlight, tile_size=math.ceil(size / max(env.width, env.height)), agent_pov=False
            )
        h, w = frame.shape[:2]
        if h != w:  # a grid that is not square: centre it on a black square
            side = max(h, w)
            square = np.zeros((side, side, 3), dtype=np.uint8)
            top, left = (side - h) // 2, (side - w) // 2
            square[top : top + h, left : left + w] = frame
            frame = square
        if frame.shape[0] != size:
            frame = np.asarray(Image.fromarray(frame).resize((size, size), Image.Resampling.BOX))
        return np.ascontiguousarray(frame, dtype=np.uint8)

    def _prompt(self) -> str:
        env = self.inner
        view = VIEW_TEXT[self.cfg.view].format(n=env.agent_view_size)
        carrying = f"the {_name(env.carrying)}" if env.carrying is not None else "nothing"
        turns_left = max(self._turn_cap() - self.turn, 0)
        return f"{PROMPT}\n{view}\nMission: {env.mission}\nYou carry: {carrying}.\nTurns left: {turns_left}."

    def _game_info(self) -> dict:
        env = self.inner
        return {
            "mission": env.mission,
            "agent_pos": tuple(int(v) for v in env.agent_pos),
            "agent_dir": int(env.agent_dir),
            "carrying": _name(env.carrying) if env.carrying is not None else None,
            "step_count": int(env.step_count),
            "state_hash": state_hash(env),
        }

    # ------------------------------------------------------------------ teacher
    def solver_reply(self) -> str:
        return oracle_reply(self.inner)


def make_minigrid_text_env(minigrid_id: str, **overrides: Any) -> MiniGridTextEnv:
    """A :class:`MiniGridTextEnv` of ``minigrid_id``.

    Args:
        minigrid_id: A ``MiniGrid-*`` or ``BabyAI-*`` id, e.g. one of :data:`TESTED_IDS`.
        **overrides: Other :class:`MiniGridConfig` fields, and ``render_mode``.

    Raises:
        ValueError, TypeError: As :class:`MiniGridTextEnv`.
    """
    return MiniGridTextEnv(minigrid_id=minigrid_id, **overrides)


def state_hash(env: MiniGridEnv) -> str:
    """16 hex digits naming the grid (objects, colours, door states), the agent's pose and what it
    carries: equal states, equal hashes (the first one names the layout dealt)."""
    digest = hashlib.sha256(env.grid.encode().tobytes())
    carrying = env.carrying.encode() if env.carrying is not None else ()
    digest.update(
        repr((tuple(int(v) for v in env.agent_pos), int(env.agent_dir), tuple(int(v) for v in carrying))).encode()
    )
    return digest.hexdigest()[:16]


def _make_inner(minigrid_id: str) -> MiniGridEnv:
    """The unwrapped minigrid env of ``minigrid_id``.

    Raises:
        ValueError: The id is not registered (the message names similar registered ids).
    """
    if minigrid_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith(ID_PREFIXES))
        close = difflib.get_close_matches(minigrid_id, known, n=5, cutoff=0.5)
        examples = close or list(TESTED_IDS) + known[:3]
        raise ValueError(
            f"minigrid_id={minigrid_id!r} is not registered by minigrid {getattr(minigrid, '__version__', '?')} "
            f"({len(known)} ids are); did you mean one of {examples}?"
        )
    env = gym.make(minigrid_id, render_mode=None, disable_env_checker=True).unwrapped
    if not isinstance(env, MiniGridEnv):
        raise ValueError(f"minigrid_id={minigrid_id!r} makes a {type(env).__name__}, not a minigrid MiniGridEnv")
    return env


# ---------------------------------------------------------------------------------------------
# Feedback: what one action did, read from the state before and after it
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Before:
    pos: tuple[int, int]
    carrying: Any  # the carried WorldObj or None
    front: tuple[int, int]
    cell: Any  # the WorldObj in front, or None
    door: Optional[tuple[bool, bool]]  # (is_open, is_locked) of a door in front


def _name(obj: Any) -> str:
    """``"yellow key"``, ``"wall"``, ``"goal"``: an object's plain name (colour first where it matters)."""
    if obj.type in ("wall", "goal", "lava"):
        return obj.type
    return f"{obj.color} {obj.type}"


def _the(obj: Any) -> str:
    """``"the yellow key"``, ``"a wall"``, ``"lava"``: the object's name in a sentence."""
    if obj.type == "wall":
        return "a wall"
    return "lava" if obj.type == "lava" else f"the {_name(obj)}"


def _describe_step(env: MiniGridEnv, token: str, before: _Before) -> str:
    """One truthful sentence about what ``token`` did (compared with the state ``before`` it)."""
    cell, carrying = before.cell, env.carrying
    if token in ("turn left", "turn right"):
        return f"you turned {token.split()[1]}."
    if token == "move forward":
        if tuple(int(v) for v in env.agent_pos) != before.pos:
            return "you moved forward" + (
                f" onto {_the(cell)}." if cell is not None and cell.type in ("goal", "lava") else "."
            )
        blocker = cell if cell is not None else env.grid.get(*before.front)  # an obstacle may have moved in
        if blocker is None:
            return "you did not move forward."
        if blocker.type == "door":
            return f"you could not move forward: the {_name(blocker)} is {'locked' if blocker.is_locked else 'closed'}."
        return f"you could not move forward: {_the(blocker)} is in the way."
    if token == "pick up":
        if before.carrying is None and carrying is not None:
            return f"you picked up the {_name(carrying)}."
        if cell is None:
            return "you could not pick anything up: the cell in front of you is empty."
        if not cell.can_pickup():
            return f"you could not pick up {_the(cell)}: it cannot be carried."
        if before.carrying is not None:
            return (
                f"you could not pick up the {_name(cell)}: you already carry the {_name(before.carrying)}; drop it "
                "first."
            )
        return "you tried to pick something up; nothing happened."
    if token == "drop":
        if before.carrying is None:
            return "you carry nothing to drop."
        if carrying is None:
            return f"you dropped the {_name(before.carrying)} in front of you."
        return f"you could not drop the {_name(before.carrying)}: the cell in front of you is not empty."
    if token == "toggle":
        if cell is None:
            return "nothing happened: there is nothing in front of you to toggle."
        if before.door is not None:
            was_open, was_locked = before.door
            if was_locked and cell.is_open:
                return f"you unlocked the {_name(cell)} with the {_name(before.carrying)} and opened it."
            if was_locked:
                return f"the {_name(cell)} is locked; you need the {cell.color} key to open it."
            return f"you {'opened' if cell.is_open else 'closed'} the {_name(cell)}."
        if cell.type == "box":
            inside = env.grid.get(*before.front)
            return f"you opened the {_name(cell)}" + (
                f"; it held {_the(inside)}." if inside is not None else "; it was empty."
            )
        return f"nothing happened: {_the(cell)} cannot be toggled."
    return "you said done."  # token == "done"; whether it ended the mission follows in _play


# ---------------------------------------------------------------------------------------------
# The oracle: breadth-first search over (x, y, direction) on the full grid (privileged)
# ---------------------------------------------------------------------------------------------
_DIR_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid's agent_dir 0..3: right, down, left, up
_TURN, _FORWARD = ("turn left", "turn right"), "move forward"


def _walkable(cell: Any) -> bool:
    """A cell the oracle walks through: empty floor, an open door, anything else overlappable but
    lava (it ends the episode) and the goal (it ends it too: only a target, never a way)."""
    return cell is None or (cell.can_overlap() and cell.type not in ("lava", "goal"))


def plan_to_face(env: MiniGridEnv, targets: Iterable[tuple[int, int]]) -> Optional[list[str]]:
    """The shortest list of turn and forward actions after which the agent faces a cell of ``targets``.

    Args:
        env: The minigrid env (read, not changed).
        targets: Grid cells ``(x, y)``.

    Returns:
        The action words (empty when the agent already faces a target), or None when no target can
        be faced by walking over :func:`_walkable` cells.
    """
    targets = set(targets)
    if not targets:
        return None
    grid = env.grid
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
    parent: dict[tuple[int, int, int], Optional[tuple[tuple[int, int, int], str]]] = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        x, y, d = state
        dx, dy = _DIR_VEC[d]
        if (x + dx, y + dy) in targets:
            plan = []
            while parent[state] is not None:
                state, word = parent[state]
                plan.append(word)
            return plan[::-1]
        moves = [((x, y, (d - 1) % 4), _TURN[0]), ((x, y, (d + 1) % 4), _TURN[1])]
        fx, fy = x + dx, y + dy
        if 0 <= fx < grid.width and 0 <= fy < grid.height and _walkable(grid.get(fx, fy)):
            moves.insert(0, ((fx, fy, d), _FORWARD))
        for nxt, word in moves:
            if nxt not in parent:
                parent[nxt] = (state, word)
                frontier.append(nxt)
    return None


def _cells(env: MiniGridEnv, keep: Callable[[Any], bool]) -> list[tuple[tuple[int, int], Any]]:
    grid = env.grid
    out = []
    for y in range(grid.height):
        for x in range(grid.width):
            cell = grid.get(x, y)
            if cell is not None and keep(cell):
                out.append(((x, y), cell))
    return out


def _step_towards(plan: list[str], arrive: str, at_target: str, on_the_way: str) -> str:
    """The reply: ``arrive`` when the plan is empty (the agent faces the target), else its first move."""
    if not plan:
        return format_reply(at_target, arrive)
    return format_reply(f"{on_the_way} It is {len(plan) + 1} actions away; I {plan[0]}.", plan[0])


def oracle_reply(env: MiniGridEnv) -> str:
    """The oracle's reply for a mission that ends on the goal square (Empty, DoorKey, ...).

    A privileged planner over the full grid; it re-plans every turn, in this order: (1) walk to the
    goal and step onto it, if it can be reached over floor and open doors; (2) else open the nearest
    reachable closed door; (3) else, for a locked door, toggle it when carrying its key, else fetch
    the key (dropping whatever else is carried first). Each step walks by :func:`plan_to_face`, so
    the moves are shortest for the current subgoal. Lava is never entered.

    Args:
        env: The minigrid env (read, not changed).

    Returns:
        The reply text ``{"thoughts": ..., "action": ...}``.

    Raises:
        ValueError: The agent already stands on the goal (the episode is over).
        RuntimeError: The grid has no goal square (missions such as "pick up the ball" are not
            planned), or no subgoal above can be reached.
    """
    goals = [pos for pos, _ in _cells(env, lambda c: c.type == "goal")]
    here = env.grid.get(int(env.agent_pos[0]), int(env.agent_pos[1]))
    if here is not None and here.type == "goal":
        raise ValueError("the agent stands on the goal; the episode is over")
    if not goals:
        raise RuntimeError(
            f"the oracle plans only missions that end on the goal square; this grid has none (mission {env.mission!r})"
        )
    plan = plan_to_face(env, goals)
    if plan is not None:
        return _step_towards(
            plan, _FORWARD, "The goal is right in front of me, so I move forward onto it.", "I head for the goal."
        )

    closed = _cells(env, lambda c: c.type == "door" and not c.is_open and not c.is_locked)
    plan = plan_to_face(env, [pos for pos, _ in closed])
    if plan is not None:
        return _step_towards(
            plan,
            "toggle",
            "A closed door is in front of me; I open it to find the way to the goal.",
            "The goal cannot be reached yet; I go to open the nearest closed door.",
        )

    locked = _cells(env, lambda c: c.type == "door" and c.is_locked)
    carrying = env.carrying
    if carrying is not None and carrying.type == "key":
        mine = [pos for pos, door in locked if door.color == carrying.color]
        plan = plan_to_face(env, mine)
        if plan is not None:
            return _step_towards(
                plan,
                "toggle",
                f"I carry the {carrying.color} key and face the locked {carrying.color} door; I toggle it to unlock "
                "it.",
                f"I carry the {carrying.color} key for the locked {carrying.color} door, so I go to the door.",
            )
    colors = {door.color for _, door in locked}
    keys = _cells(env, lambda c: c.type == "key" and c.color in colors)
    plan = plan_to_face(env, [pos for pos, _ in keys])
    if plan is not None:
        names = " or ".join(sorted({f"{key.color} key" for _, key in keys}))
        if carrying is not None:
            front = tuple(int(v) for v in env.front_pos)
            if env.grid.get(*front) is None:
                return format_reply(
                    f"I need the {names} but carry the {_name(carrying)}, so I drop it here first.", "drop"
                )
            free = [(x, y) for x in range(env.grid.width) for y in range(env.grid.height) if env.grid.get(x, y) is None]
            plan = plan_to_face(env, free)
            if plan:
                return format_reply(
                    f"I need the {names} but carry the {_name(carrying)}; I {plan[0]} to find a free cell to drop it "
                    "on.",
                    plan[0],
                )
        else:
            return _step_towards(
                plan,
                "pick up",
                f"The {names} is in front of me; I pick it up to unlock the door.",
                f"The way to the goal is through a locked door and I do not have its key, so I fetch the {names} "
                "first.",
            )
    raise RuntimeError(
        "the oracle found no plan: the goal, a closed door and the key of a locked door are all out of reach (mission "
        f"{env.mission!r})"
    )

"""What the card games (and Sokoban) share: the one-token reply format, its parser, the base env.

Reply format
    The agent writes ONE JSON object per turn, ``{"thoughts": "...", "action": "<token>"}``, where
    the token is one word of the game's action vocabulary (``"+"``, ``"hit"``, ``"10"``, ``"up"``).
    :func:`parse_reply` reads it and never raises: it returns the vocabulary token or an
    :class:`~a2c_ppo_acktr.common.prompts.Invalid` whose reason is shown to the agent next turn. The object
    is found by the same scanner as the VSI reply (``prompts.reply_action_value``: the first complete
    object with an ``action`` member, outside ``<think>`` blocks, keys given twice refused), so the
    two formats agree on everything but the type of ``action``. RL4VLM instead searched the text
    after ``"action":`` for vocabulary substrings and played a RANDOM action when it found none or
    several (``VLM_PPO/a2c_ppo_acktr/rl_utils.py``, ``text_projection``); here such a reply is
    invalid: it costs ``invalid_penalty``, uses the turn and changes nothing else (STYLE.md: no
    silent fallback).

Observations
    ``{"images": (uint8 H x W x 3,), "text": str}``, the shape of the VSI env's observations: one
    image (the game as the original draws it) and the text: the game's prompt, the state the
    original puts in its prompt (the formula so far) and what happened last turn.
"""

from __future__ import annotations

import json
import math
import re
import string
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Optional, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# The reply scanner is the VSI format's own (one home for reading a reply object); prompts.py keeps
# it private today. TODO(issue: other envs): expose it there as a public name and import that.
from a2c_ppo_acktr.envs.base import env_config
from a2c_ppo_acktr.envs.protocol import OracleStyle, attribute_state
from a2c_ppo_acktr.common.prompts import Invalid, reply_action_value

# The system message of every game (each game's own instructions open its observation text, as in
# RL4VLM, where the whole prompt was one user message).
GAME_SYSTEM_PROMPT = (
    "You are an agent playing a game shown in the image. Follow the instructions in each message and reply with ONE "
    "JSON object."
)
MAX_TEXT_LENGTH = 4096  # observation text bound (the longest prompt is ~1 kB)
MAX_ACTION_LENGTH = 4096  # action text bound of the declared space; step() accepts any string
_PRINTABLE = frozenset(string.printable)

Reply = Union[str, Invalid]

# The one reason of a game oracle's replies with thoughts="brief" (the action is the solver's own).
BRIEF_GAME_THOUGHTS = "I choose the action that brings me closer to winning."
# Attributes that are settings or spaces, not the state of a game (get_state).
_NOT_STATE = frozenset({"cfg", "render_mode", "observation_space", "action_space", "spec", "vocabulary"})


def printable(text: str) -> str:
    """Replace characters outside ``string.printable`` (e.g. echoed model output) with ``?``."""
    return "".join(c if c in _PRINTABLE else "?" for c in text)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TOKEN_PIECES = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: Any) -> int:
    """An approximate token count of a reply: its words and punctuation marks. The env has no
    tokenizer; BPE tokenizers split words further, so this undercounts long words a little and is
    the same for every model (a budget means the same thing whatever the policy)."""
    return len(_TOKEN_PIECES.findall(text)) if isinstance(text, str) else 0


def format_reply(thoughts: str, token: str) -> str:
    """The canonical reply text ``{"thoughts": ..., "action": token}`` (oracles and SFT use it).

    Raises:
        TypeError: If ``thoughts`` or ``token`` is not a string.
    """
    if not isinstance(thoughts, str) or not isinstance(token, str):
        raise TypeError(f"format_reply needs two strings, got {type(thoughts).__name__} and {type(token).__name__}")
    return json.dumps({"thoughts": thoughts, "action": token}, ensure_ascii=False)


def parse_reply(text: Any, vocabulary: Sequence[str]) -> Reply:
    """Read the agent's one-token action from its reply; never raises.

    The object must hold an ``action`` (and may hold a ``thoughts`` string) and no other key. The
    action is a string matched against ``vocabulary`` after stripping surrounding whitespace, first
    exactly, then ignoring case (``"Hit"`` is ``hit``); an integer (``10`` or ``10.0``) is read as
    its decimal text, so ``"action": 10`` is the card ``"10"``.

    Args:
        text: The decoded model output (any object; non-strings are invalid).
        vocabulary: The game's action tokens.

    Returns:
        The token exactly as written in ``vocabulary``, or an :class:`Invalid` saying what was wrong.
    """
    try:
        return _parse_reply(text, tuple(vocabulary))
    except Exception as e:  # noqa: BLE001 - the contract is "never raises": a bug here must not crash rollouts
        return Invalid(f"could not read the output ({type(e).__name__}: {e})")


def _parse_reply(text: Any, vocabulary: tuple[str, ...]) -> Reply:
    value = reply_action_value(text)
    if isinstance(value, Invalid):
        return value
    choices = ", ".join(repr(v) for v in vocabulary)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return Invalid(f"'action' must be one of {choices} as a string, got {_short(value)}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return Invalid(f"'action' must be one of {choices}, got {_short(value)}")
        value = int(value)
    word = str(value).strip()
    if word in vocabulary:
        return word
    folded = [v for v in vocabulary if v.lower() == word.lower()]
    if len(folded) == 1:
        return folded[0]
    return Invalid(f"{_short(word)} is not an action; choose one of {choices}")


# ---------------------------------------------------------------------------------------------
# Configuration and the base env
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenGameConfig:
    """What every one-token game (:class:`TokenGameEnv`) takes; each game's config subclasses it.

    Attributes:
        image_size: Side of the square observation image in pixels.
        invalid_penalty: Reward of a reply that does not parse as one vocabulary token.
        max_turns: Turns per episode (valid or not) before ``truncated``.
    """

    image_size: int = 300
    invalid_penalty: float = -1.0
    max_turns: int = 300
    min_image_size: ClassVar[int] = 16  # a game whose picture needs more raises it
    too_small: ClassVar[str] = "to draw the game legibly"  # the error's reason below min_image_size

    def __post_init__(self) -> None:
        if self.image_size < self.min_image_size:
            raise ValueError(
                f"image_size={self.image_size} is too small {self.too_small}; use at least {self.min_image_size}"
            )
        if not math.isfinite(self.invalid_penalty):
            raise ValueError(f"invalid_penalty={self.invalid_penalty} must be a finite number such as -1.0")
        if self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns} must be >= 1")


@dataclass(frozen=True)
class CardGameConfig(TokenGameConfig):
    """What every card game takes.

    Attributes:
        image_size: Side of the square observation image in pixels (the original draws 300x300;
            the layout scales with it).
        invalid_penalty: Reward of a reply that does not parse as one vocabulary token. -1 is what
            the original gives for an illegal action (a card not in hand).
        max_turns: Turns per episode (valid or not) before ``truncated``; 300 is the
            ``max_episode_steps`` the original registers for every id. The games' own limits
            (NumberLine's step cap, the formula length of EZPoints/Points24) apply besides.
    """

    min_image_size: ClassVar[int] = 64  # below it the cards' digits are not legible
    too_small: ClassVar[str] = "to draw the cards legibly (the original is 300)"


class Outcome(NamedTuple):
    """What one legal action did to the game."""

    reward: float
    terminated: bool
    truncated: bool
    feedback: str  # one sentence for the next observation's "Last turn:" line
    success: bool = False  # the game was won on this step


def feedback_for_invalid(reply: Invalid) -> str:
    """The "Last turn:" sentence after an invalid reply."""
    return f"invalid reply ({reply.reason}); the turn was used. Reply with one JSON object as instructed."


class TokenGameEnv(gym.Env):
    """Base of the one-token text games: spaces, turn counting, invalid replies, observations.

    A subclass sets ``config_class`` and implements :meth:`_deal` (start a game from
    ``self.np_random``), :meth:`_play` (apply one legal token), :meth:`_draw` (the image),
    :meth:`_prompt` (the text before the feedback line), :meth:`_game_info` and
    :meth:`solver_reply` (the oracle's action); its ``vocabulary`` is set from its module's one constant.

    Args:
        cfg: The game's config; None uses the defaults.
        render_mode: None or ``"rgb_array"`` (``render()`` returns the current image).
        **overrides: Field overrides of ``cfg`` (e.g. ``image_size=128``), validated by the config.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 2}
    config_class: ClassVar[type] = TokenGameConfig
    task_type_name: ClassVar[str] = ""  # the report category (``numberline``, ``sokoban``, ...)

    def __init__(self, cfg: Optional[Any] = None, render_mode: Optional[str] = None, **overrides: Any) -> None:
        cfg = cfg if cfg is not None else self.config_class()
        if not isinstance(cfg, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(cfg).__name__}")
        self.cfg = cfg = env_config(cfg, overrides, render_mode, self.metadata["render_modes"])
        self.render_mode = render_mode
        self.vocabulary: tuple[str, ...] = self._vocabulary()
        size = self._image_shape()
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Sequence(spaces.Box(0, 255, size, np.uint8), stack=False),
                "text": spaces.Text(MAX_TEXT_LENGTH, charset=string.printable),
                "system": spaces.Text(MAX_TEXT_LENGTH, charset=string.printable),
            }
        )
        self.action_space = spaces.Text(MAX_ACTION_LENGTH, charset=string.printable)
        self.turn = 0
        self.tokens_used = 0  # reply tokens (count_tokens) this episode
        self._deal_info: dict = {}
        self._feedback = ""
        self._done = True
        self._success = False
        self._episode_reward = 0.0
        self._image: Optional[np.ndarray] = None

    # ------------------------------------------------------------------ hooks
    def _vocabulary(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _image_shape(self) -> tuple[int, int, int]:
        return (self.cfg.image_size, self.cfg.image_size, 3)

    def _token_budget(self) -> Optional[int]:
        """Reply tokens (:func:`count_tokens`) an episode may use before ``truncated``; None: no budget."""
        return None

    # Whether the observation's text shows the turns left (the turn cap is then part of the state).
    shows_turns_left = False

    def _turn_cap(self) -> int:
        """Turns before ``truncated``: ``max_turns``, or less where the game has its own cap."""
        return self.cfg.max_turns

    def _deal(self, options: dict) -> None:
        raise NotImplementedError

    def _play(self, token: str) -> Outcome:
        raise NotImplementedError

    def _draw(self) -> np.ndarray:
        raise NotImplementedError

    def _prompt(self) -> str:
        raise NotImplementedError

    def _game_info(self) -> dict:
        raise NotImplementedError

    def solver_reply(self) -> str:
        """The reply text of the game's solver for the current state (the oracle's action)."""
        raise NotImplementedError

    def _end_step(self, reward: float, parsed: Reply, terminated: bool, truncated: bool) -> float:
        """The step's final reward once it is known whether the episode ended (Sokoban's shaped
        reward adds its end-of-episode terms here); the card games keep ``reward``."""
        return reward

    # ------------------------------------------------------------------ episode
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        """Deal a new game from ``self.np_random`` (reseeded by ``seed``).

        Returns:
            ``(observation, info)``.
        """
        super().reset(seed=seed)
        self._deal(dict(options or {}))
        self.turn = 0
        self._done = False
        self._success = False
        self._episode_reward = 0.0
        self.tokens_used = 0
        self._feedback = "none yet (this is the start)."
        self._image = self._draw()
        self._deal_info = self._game_info()
        return self._observation(), self._info(action=None)

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        """Play the reply text ``action`` for one turn (see the module docstring)."""
        if self._done:
            raise RuntimeError("step() called on a finished episode (or before reset()); call reset() first")
        parsed = parse_reply(action, self.vocabulary)
        self.turn += 1
        if isinstance(parsed, Invalid):
            reward, terminated, game_truncated = float(self.cfg.invalid_penalty), False, False
            self._feedback = feedback_for_invalid(parsed)
        else:
            outcome = self._play(parsed)
            reward, terminated, game_truncated = float(outcome.reward), outcome.terminated, outcome.truncated
            self._success = outcome.success
            self._feedback = outcome.feedback
            self._image = self._draw()
        self.tokens_used += count_tokens(action)
        budget = self._token_budget()
        over_budget = budget is not None and self.tokens_used >= budget
        if over_budget and not terminated:
            self._feedback += f" The episode's budget of {budget} reply tokens is used up."
        at_cap = self.turn >= self._turn_cap()
        truncated = not terminated and (game_truncated or at_cap or over_budget)
        reward = float(self._end_step(reward, parsed, terminated, truncated))
        self._done = terminated or truncated
        self._episode_reward += reward
        info = self._info(action=parsed)
        # The turn cap ended the episode and every observation showed the turns left: see TextEnv.
        info["time_limit_announced"] = bool(truncated and at_cap and not over_budget and self.shows_turns_left)
        return self._observation(), reward, terminated, truncated, info

    def _observation(self) -> dict:
        text = f"{self._prompt()}\nLast turn: {self._feedback}"
        # A fresh array every call: callers keep observations.
        return {"images": (self._image.copy(),), "text": printable(text), "system": GAME_SYSTEM_PROMPT}

    def _info(self, action: Optional[Reply]) -> dict:
        return {
            "action": action,
            "valid": not isinstance(action, Invalid),
            "turn": self.turn,
            "tokens_used": self.tokens_used,
            "success": self._success,
            "score": float(self._success),
            **self._game_info(),
        }

    # ------------------------------------------------------------------ what the pipeline asks (envs/registry.py)
    @property
    def task_type(self) -> str:
        """The report category of every episode (the game's name)."""
        return self.task_type_name

    def parse(self, text: Any) -> Reply:
        """The vocabulary token ``text`` plays, or an :class:`Invalid` (never raises)."""
        return parse_reply(text, self.vocabulary)

    def random_reply(self, rng: np.random.Generator) -> str:
        """A reply with a uniformly random token of the vocabulary (the chance agent, labelling's exploration)."""
        return format_reply("A random action.", self.vocabulary[int(rng.integers(len(self.vocabulary)))])

    def chance_reply(self, rng: np.random.Generator, answer_prob: float = 0.5) -> str:
        """The chance agent's reply: a random token (a game has no answer to weigh)."""
        return self.random_reply(rng)

    def oracle_reply(self, style: OracleStyle = OracleStyle()) -> str:
        """The oracle's reply: the solver's action, under one fixed reason (:data:`BRIEF_GAME_THOUGHTS`)
        with ``style.thoughts="brief"``."""
        reply = self.solver_reply()
        return format_reply(BRIEF_GAME_THOUGHTS, self.parse(reply)) if style.thoughts == "brief" else reply

    def get_state(self) -> dict:
        """The game in progress and the env's generator (its attributes but the settings and spaces)."""
        return attribute_state(self, _NOT_STATE)

    def set_state(self, state: dict) -> None:
        """Inverse of :meth:`get_state`."""
        vars(self).update(state)

    def episode_fields(self) -> dict:
        """What a report or a labelled episode records about the current game: the deal (as
        ``question``, the game state when it was dealt) under a ``scene_id`` that names it, so equal
        deals share an id (SFT's split keeps them on one side)."""
        deal = repr(sorted(self._deal_info.items()))
        return {
            "scene_id": f"{self.task_type}-{zlib.crc32(deal.encode('utf-8')):08x}",
            "dataset": self.task_type,
            "question_type": self.task_type,
            "question": printable(deal),
            "options": None,
            "ground_truth": "",
            "object_ids": [],
        }

    def overview_image(self, **_: Any) -> np.ndarray:
        """The picture beside a trajectory: the game's current image (the whole board or table)."""
        return self._image.copy()

    @property
    def episode_reward(self) -> float:
        """Sum of rewards so far this episode."""
        return self._episode_reward

    def render(self) -> Optional[np.ndarray]:
        """The current image (H, W, 3) uint8 in ``rgb_array`` mode; None otherwise."""
        if self.render_mode != "rgb_array" or self._image is None:
            return None
        return self._image.copy()

"""The env contract: what training, labelling, SFT preprocessing and evaluation ask of an env.

Every env the registry makes (:mod:`a2c_ppo_acktr.envs.registry`: VSI, the gym-cards games,
MiniGrid, Sokoban) is a :class:`TextEnv`, and the loops use these members only, never an env's
internals: a new env that implements them runs through the whole pipeline.
:class:`~a2c_ppo_acktr.envs.batch.BatchEnv` saves and restores its envs through
``get_state``/``set_state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from a2c_ppo_acktr.common.choices import THOUGHT_STYLES


@dataclass(frozen=True)
class OracleStyle:
    """How the oracle writes (``label.oracle_*`` settings).

    Attributes:
        thoughts: ``"full"`` (a reason with the scene's names and numbers) or ``"brief"`` (one fixed
            sentence per question type; a game's: ``envs.cards.common.BRIEF_GAME_THOUGHTS``).
        max_moves: VSI: turns toward the question's first object before answering (0 answers at once).
        face_tolerance_deg: VSI: the object counts as faced within this angle of the view axis.
    """

    thoughts: str = "full"
    max_moves: int = 1
    face_tolerance_deg: float = 20.0

    def __post_init__(self) -> None:
        if self.thoughts not in THOUGHT_STYLES:
            raise ValueError(f"oracle thoughts={self.thoughts!r} is not one of {list(THOUGHT_STYLES)}")
        if self.max_moves < 0:
            raise ValueError(f"oracle max_moves={self.max_moves} must be >= 0")


@runtime_checkable
class TextEnv(Protocol):
    """A gymnasium env whose action is the model's reply text.

    Besides gymnasium's ``reset(seed=..., options=...)`` and ``step(text)``, returning observations
    ``{"images": (uint8 HxWx3, ...), "text": str}`` (plus ``"system"``, a game's system prompt) and,
    at an episode's end, ``info["score"]`` in [0, 1] (VSI: the benchmark's score of the answer; a
    game: 1 when won or solved), an env has the members below.

    A step ``truncated`` at a turn limit that every observation showed (VSI's and MiniGrid's "Turns
    left") sets ``info["time_limit_announced"]``: the time left is then part of the state, so the end
    is a termination of that MDP and the learner bootstraps no value there (Pardo et al. 2018, "Time
    Limits in Reinforcement Learning"); a limit the agent is not told stays a truncation.
    """

    turn: int  # turns taken this episode

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]: ...

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]: ...

    def close(self) -> None: ...

    @property
    def episode_reward(self) -> float:
        """Sum of rewards so far this episode."""
        ...

    @property
    def task_type(self) -> str:
        """The report category of the current episode (VSI: its question type; a game: its name)."""
        ...

    def parse(self, text: Any) -> Any:
        """The action ``text`` asks for, or :class:`~a2c_ppo_acktr.common.prompts.Invalid` (never raises)."""
        ...

    def random_reply(self, rng: np.random.Generator) -> str:
        """A random legal reply (labelling's exploration)."""
        ...

    def chance_reply(self, rng: np.random.Generator, answer_prob: float) -> str:
        """The chance agent's reply (eval's dummy): VSI answers at random with probability
        ``answer_prob`` (always on the last turn) and moves otherwise; a game plays a random token."""
        ...

    def oracle_reply(self, style: OracleStyle = OracleStyle()) -> str:
        """The privileged oracle's reply for the current state (:mod:`a2c_ppo_acktr.envs.oracle`)."""
        ...

    def episode_fields(self) -> dict:
        """What a report or a labelled episode records about the current episode: ``scene_id``,
        ``dataset``, ``question_type``, ``question``, ``options``, ``ground_truth``, ``object_ids``."""
        ...

    def overview_image(self, **kwargs: Any) -> np.ndarray:
        """The picture of the whole state beside a trajectory (VSI: the top-down map; a game: the board)."""
        ...

    def get_state(self) -> dict:
        """Everything that makes the env's future deterministic (its generator, the episode in
        progress); picklable."""
        ...

    def set_state(self, state: dict) -> None:
        """Inverse of :meth:`get_state`."""
        ...


def attribute_state(env: Any, not_state: frozenset[str]) -> dict:
    """An env's state as its attributes, all but ``not_state`` (settings, spaces, caches and objects
    rebuilt from the state): the default :meth:`TextEnv.get_state`."""
    return {k: v for k, v in vars(env).items() if k not in not_state}

"""Sokoban as a text-action gymnasium env (``Sokoban-v0``), with gym-sokoban's rules and levels.

* :mod:`.generation`: seeded procedural levels, solvable by construction (a random-walk room, then
  reverse play from the solved state, as ``mpSchrader/gym-sokoban``'s ``room_utils.py`` does);
* :mod:`.solver`: an A* solver over (player, boxes) states, the oracle's planner;
* :mod:`.env`: the env (its prompt, action vocabulary, rewards, drawing and oracle teacher).

Importing this package imports gymnasium only and registers nothing; :func:`register` registers
:data:`ENV_IDS`, and the env module is imported when an env is made.
"""

from __future__ import annotations

ENV_IDS = ("Sokoban-v0",)
ENTRY_POINTS = {"Sokoban-v0": "a2c_ppo_acktr.envs.sokoban.env:SokobanEnv"}


def register() -> None:
    """Register every id of :data:`ENV_IDS` with gymnasium (idempotent).

    Raises:
        ValueError: If an id is already registered with another entry point (for example by the
            ``gym_sokoban`` package imported in the same process).
    """
    from a2c_ppo_acktr.envs.base import register_entry_points

    register_entry_points(
        {env_id: ENTRY_POINTS[env_id] for env_id in ENV_IDS},
        "do not import gym_sokoban in the same process as a2c_ppo_acktr's Sokoban",
    )

"""The gym-cards games of RL4VLM as text-action gymnasium envs.

Four games from ``RL4VLM/RL4VLM`` (``gym-cards/gym_cards/envs/*.py``), with the original rules,
rewards, termination and drawings, played by a VLM that replies in the project's one format
``{"thoughts": "...", "action": "<token>"}`` (:mod:`.common`):

=========================== ======================================== ==========================
id                          game                                     action vocabulary
=========================== ======================================== ==========================
``gym_cards/NumberLine-v0`` move the current number to the target    ``-`` ``+``
``gym_cards/EZPoints-v0``   type a formula of two cards equal to 12   ``1``..``10`` ``+ * =``
``gym_cards/Points24-v0``   type a formula of four cards equal to 24  ``1``..``10`` ``+ - * / ( ) =``
``gym_cards/Blackjack-v0``  Sutton & Barto blackjack (infinite deck)  ``stand`` ``hit``
=========================== ======================================== ==========================

The ids keep the original's ``gym_cards/`` namespace: scripts ported from RL4VLM name the same ids,
and a bare ``Blackjack-v0`` would be taken by gymnasium for an old version of its own
``Blackjack-v1`` (``gym.make`` then warns that the env is out of date).

Importing this package imports gymnasium only and registers nothing; :func:`register` registers
:data:`ENV_IDS`, and a game's module is imported when its env is made.
"""

from __future__ import annotations

ENV_IDS = (
    "gym_cards/NumberLine-v0",
    "gym_cards/EZPoints-v0",
    "gym_cards/Points24-v0",
    "gym_cards/Blackjack-v0",
)
ENTRY_POINTS = {
    "gym_cards/NumberLine-v0": "a2c_ppo_acktr.envs.cards.numberline:NumberLineEnv",
    "gym_cards/EZPoints-v0": "a2c_ppo_acktr.envs.cards.ezpoints:EZPointsEnv",
    "gym_cards/Points24-v0": "a2c_ppo_acktr.envs.cards.points24:Points24Env",
    "gym_cards/Blackjack-v0": "a2c_ppo_acktr.envs.cards.blackjack:BlackjackEnv",
}


def register() -> None:
    """Register every id of :data:`ENV_IDS` with gymnasium (idempotent).

    Raises:
        ValueError: If an id is already registered with another entry point (for example by
            RL4VLM's own ``gym_cards`` package imported in the same process).
    """
    from a2c_ppo_acktr.envs.base import register_entry_points

    register_entry_points(
        {env_id: ENTRY_POINTS[env_id] for env_id in ENV_IDS},
        "do not import RL4VLM's gym_cards package in the same process as a2c_ppo_acktr's card games",
    )

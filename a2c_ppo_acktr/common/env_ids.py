"""The env ids ``env.env_id`` accepts, without importing any env (the config validates against them
and must stay light; :mod:`a2c_ppo_acktr.envs.registry` builds the envs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from a2c_ppo_acktr.common.entry_points import is_entry_point

VSI_ID = "VSI-v0"
CARD_NAMESPACE = "gym_cards/"  # RL4VLM's; the gymnasium ids of the card games carry it
CARD_IDS = ("NumberLine-v0", "EZPoints-v0", "Points24-v0", "Blackjack-v0")
SOKOBAN_ID = "Sokoban-v0"
MINIGRID_PREFIXES = ("MiniGrid-", "BabyAI-")
# The ids the issue names and the tests and presets exercise (any minigrid id works).
TESTED_IDS = (VSI_ID, *CARD_IDS, "MiniGrid-DoorKey-6x6-v0", "MiniGrid-Empty-Random-6x6-v0", SOKOBAN_ID)


class UnknownEnvError(ValueError):
    """``env.env_id`` names no env of the registry."""


def canonical_id(env_id: str) -> str:
    """``env_id`` without RL4VLM's ``gym_cards/`` namespace (``gym_cards/NumberLine-v0`` -> ``NumberLine-v0``).

    Raises:
        UnknownEnvError: The id names no env (the message lists the known ones).
    """
    name = env_id[len(CARD_NAMESPACE) :] if env_id.startswith(CARD_NAMESPACE) else env_id
    if (
        name == VSI_ID
        or name in CARD_IDS
        or name == SOKOBAN_ID
        or name.startswith(MINIGRID_PREFIXES)
        or is_entry_point(name)
    ):
        return name
    raise UnknownEnvError(
        f"env.env_id={env_id!r} is not a known env; use one of {[VSI_ID, *CARD_IDS, SOKOBAN_ID]}, a minigrid id "
        f"such as 'MiniGrid-DoorKey-6x6-v0' (any id starting with {' or '.join(MINIGRID_PREFIXES)}), "
        "or your own env class as 'module.path:ClassName'"
    )


def is_vsi(env_id: str) -> bool:
    """Whether ``env_id`` is the VSI env (scenes, questions, benchmark scoring)."""
    return canonical_id(env_id) == VSI_ID


# The env overlay (configs/envs/<name>.yaml) of every tested id: its settings on top of a model preset.
OVERLAY_DIR = Path(__file__).resolve().parents[2] / "configs" / "envs"
OVERLAYS = {
    "NumberLine-v0": "numberline",
    "EZPoints-v0": "ezpoints",
    "Points24-v0": "points24",
    "Blackjack-v0": "blackjack",
    "MiniGrid-DoorKey-6x6-v0": "minigrid-doorkey",
    "MiniGrid-Empty-Random-6x6-v0": "minigrid-empty",
    "Sokoban-v0": "sokoban",
}


def overlay_path(env_id: str) -> Optional[Path]:
    """The overlay file of ``env_id`` (namespaces ignored), or None for an id without one (VSI-v0, an
    untested minigrid id: the preset alone)."""
    name = OVERLAYS.get(canonical_id(env_id))
    return None if name is None else OVERLAY_DIR / f"{name}.yaml"

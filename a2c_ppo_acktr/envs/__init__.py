"""Scenes, renderer, questions and the gymnasium env.

Importing this package registers the gymnasium ids of :data:`GYMNASIUM_IDS` (``VSI-v0``, entry point
:class:`a2c_ppo_acktr.envs.vsi_env.VSIEnv`; the gym-cards games ``gym_cards/*`` and ``Sokoban-v0``)
and does nothing else: it imports gymnasium only; an env's module (and open3d) is imported when the
env is made.

In an environment where vsi-ppo is installed, ``import gymnasium`` registers them too, without this
package being imported first (:mod:`a2c_ppo_acktr.gymnasium_plugin`: gymnasium >= 1.0 has no plugin
discovery, so the installation adds an import hook)::

    import gymnasium as gym
    env = gym.make("VSI-v0", image_size=64, max_turns=4)

Without the hook (``VSI_PPO_NO_GYMNASIUM_PLUGIN=1``, or the checkout on ``sys.path`` but not
installed), name the module before the id, ``gym.make("a2c_ppo_acktr.envs:VSI-v0")``: gymnasium
imports it, which registers the ids.
"""

from a2c_ppo_acktr.envs import cards, sokoban  # gymnasium-only imports; a game's module loads when it is made
from a2c_ppo_acktr.envs.base import register_entry_points

ENV_IDS = ("VSI-v0",)
_ENTRY_POINTS = {"VSI-v0": "a2c_ppo_acktr.envs.vsi_env:VSIEnv"}
GYMNASIUM_IDS = ENV_IDS + tuple(cards.ENV_IDS) + tuple(sokoban.ENV_IDS)  # every id register_envs() registers


def register_envs() -> None:
    """Register every id of :data:`GYMNASIUM_IDS` with gymnasium (idempotent). Training, labelling
    and evaluation build envs through :mod:`.registry` (``env.env_id``), which also takes the
    MiniGrid ids; these are the ids ``gymnasium.make`` knows."""
    register_entry_points(_ENTRY_POINTS, "another package registered a VSI id")
    cards.register()
    sokoban.register()


register_envs()

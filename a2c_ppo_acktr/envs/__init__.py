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
import dataclasses
from typing import Any, Optional, Sequence

import gymnasium as gym

from . import cards, sokoban  # gymnasium-only imports; a game's module loads when it is made

ENV_IDS = ("VSI-v0",)
_ENTRY_POINTS = {"VSI-v0": "a2c_ppo_acktr.envs.vsi_env:VSIEnv"}
GYMNASIUM_IDS = ENV_IDS + tuple(cards.ENV_IDS) + tuple(sokoban.ENV_IDS)  # every id register_envs() registers


def env_config(cfg: Any, overrides: dict[str, Any], render_mode: Optional[str], render_modes: Sequence[str]) -> Any:
    """The config an env runs with: ``cfg`` with ``overrides`` applied (``dataclasses.replace``, so
    the config validates the values), after checking ``render_mode`` is None or one of ``render_modes``.

    Raises:
        TypeError: An override names no field of ``cfg`` (the message lists the known fields).
        ValueError: An unsupported ``render_mode``.
    """
    if overrides:
        known = {f.name for f in dataclasses.fields(cfg)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown {type(cfg).__name__} fields {unknown}; known fields: {sorted(known)}")
        cfg = dataclasses.replace(cfg, **overrides)
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode={render_mode!r} is not supported; use None or {', '.join(repr(m) for m in render_modes)}")
    return cfg


def register_entry_points(entry_points: dict[str, str], conflict_hint: str) -> None:
    """Register ``{id: entry point}`` with gymnasium (idempotent).

    Raises:
        ValueError: An id is already registered with another entry point (``conflict_hint`` says
            which other package to keep out of the process).
    """
    for env_id, entry_point in entry_points.items():
        spec = gym.registry.get(env_id)
        if spec is None:
            gym.register(id=env_id, entry_point=entry_point)
        elif spec.entry_point != entry_point:
            raise ValueError(f"{env_id} is already registered with entry point {spec.entry_point!r}, not {entry_point!r}; {conflict_hint}")


def register_envs() -> None:
    """Register every id of :data:`GYMNASIUM_IDS` with gymnasium (idempotent). Training, labelling
    and evaluation build envs through :mod:`.registry` (``env.env_id``), which also takes the
    MiniGrid ids; these are the ids ``gymnasium.make`` knows."""
    register_entry_points(_ENTRY_POINTS, "another package registered a VSI id")
    cards.register()
    sokoban.register()


register_envs()

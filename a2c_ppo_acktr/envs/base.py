"""What every env module shares: a config with overrides applied, and registration with gymnasium.

The package ``__init__`` and the games import these from here (never from the package, whose
``__init__`` imports the games).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import gymnasium as gym


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
        raise ValueError(
            f"render_mode={render_mode!r} is not supported; use None or {', '.join(repr(m) for m in render_modes)}"
        )
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
            raise ValueError(
                f"{env_id} is already registered with entry point {spec.entry_point!r}, not {entry_point!r}; "
                f"{conflict_hint}"
            )

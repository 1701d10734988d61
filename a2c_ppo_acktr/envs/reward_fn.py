"""``env.reward_fn``: a user's function in place of an env's reward, on any env.

:class:`ShapedReward` stands in front of an env and changes one thing: each step's reward is
``fn(reply=text, reward=r, info=info, episode=env.episode_fields())``, where ``r`` is the env's own
reward. ``episode_reward`` sums the new rewards; everything else (the observation, ``terminated``,
``truncated``, ``info["score"]``, which evaluation reports, the oracle, the state) is the env's. A
result that is not a finite number stops the run with one line naming the function.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from a2c_ppo_acktr.common.errors import UserError


class RewardFunctionError(ValueError, UserError):
    """``env.reward_fn`` returned something that is not a finite number."""


class ShapedReward:
    """``env`` with its step rewards replaced by ``fn``'s (named ``name`` in errors)."""

    def __init__(self, env: Any, fn: Callable[..., Any], name: str) -> None:
        if not callable(fn):
            raise RewardFunctionError(f"env.reward_fn={name!r} names a {type(fn).__name__}, not a function")
        self.env, self.fn, self.name = env, fn, name
        self._episode_reward = 0.0

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in (
            "env",
            "fn",
            "name",
            "_episode_reward",
        ):  # copying and unpickling look these up first
            raise AttributeError(attr)
        return getattr(self.env, attr)

    @property
    def unwrapped(self) -> "ShapedReward":
        """The env the pipeline talks to: this one (its rewards are the shaped ones)."""
        return self

    @property
    def episode_reward(self) -> float:
        return self._episode_reward

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._episode_reward = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        value = self.fn(reply=action, reward=float(reward), info=info, episode=self.env.episode_fields())
        try:
            shaped = float(value)
        except (TypeError, ValueError):
            shaped = math.nan
        if not math.isfinite(shaped):
            raise RewardFunctionError(f"env.reward_fn={self.name!r} returned {value!r}; it must return a finite number")
        self._episode_reward += shaped
        return obs, shaped, terminated, truncated, info

    def get_state(self) -> dict:
        return {"env": self.env.get_state(), "episode_reward": self._episode_reward}

    def set_state(self, state: dict) -> None:
        self.env.set_state(state["env"])
        self._episode_reward = float(state["episode_reward"])

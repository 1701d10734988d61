"""N VSI envs stepped together in one process, with automatic reset.

The policy generates for all N envs in one batched call, so stepping the envs in-process is enough
(rendering is a few milliseconds); the envs share one scene/renderer cache. An env whose episode
ended is reset at once: its ``info`` then carries ``final_observation`` (the last observation of the
finished episode) and ``episode`` (``{"score", "reward", "turns", "question_type"}``; ``score`` is 0
when the episode was truncated without an answer), and the returned observation is the first of
the next episode. Env ``i`` is seeded with ``seed + i`` at the first reset and then continues its
own random stream, so a batch is deterministic given ``seed``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np

from ..arguments import EnvConfig
from .vsi_env import VSIEnv


class VSIBatchEnv:
    """``num_envs`` :class:`VSIEnv` instances with auto-reset.

    Args:
        cfg: The env config shared by all envs.
        num_envs: How many envs.
        seed: Env ``i`` is seeded with ``seed + i``.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        shared: OrderedDict = OrderedDict()
        self.envs = [VSIEnv(cfg) for _ in range(self.num_envs)]
        for env in self.envs:
            env._cache = shared  # one cache: each scene is built and indexed for ray casting once
        self.reset_infos: list[dict] = []
        self._started = False

    def reset(self, seed: Optional[int] = None) -> list[dict]:
        """Reset every env (env ``i`` with seed ``seed + i``; default: the constructor's seed).

        Returns:
            The N first observations; their infos are in ``self.reset_infos``.
        """
        base = self.seed if seed is None else int(seed)
        obs, self.reset_infos = [], []
        for i, env in enumerate(self.envs):
            o, info = env.reset(seed=base + i)
            obs.append(o)
            self.reset_infos.append(info)
        self._started = True
        return obs

    def step(self, texts: Sequence[str]) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Step every env with its text.

        Returns:
            ``(observations, rewards (N,) float32, terminated (N,) bool, truncated (N,) bool, infos)``.
        """
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if len(texts) != self.num_envs:
            raise ValueError(f"step() got {len(texts)} texts for {self.num_envs} envs")
        obs: list[dict] = []
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict] = []
        for i, (env, text) in enumerate(zip(self.envs, texts)):
            o, r, term, trunc, info = env.step(text)
            rewards[i], terminated[i], truncated[i] = r, term, trunc
            if term or trunc:
                info["final_observation"] = o
                info["episode"] = {
                    "score": float(info.get("score", 0.0)),
                    "reward": float(env.episode_reward),
                    "turns": int(env.turn),
                    "question_type": env.question.question_type,
                }
                o, reset_info = env.reset()
                info["reset_info"] = reset_info
            obs.append(o)
            infos.append(info)
        return obs, rewards, terminated, truncated, infos

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()

"""N envs of any registered id (:mod:`.registry`) stepped together in one process, with automatic reset.

The policy generates for all N envs in one batched call, so stepping the envs in-process is enough
(rendering is a few milliseconds); VSI envs share one scene/renderer cache. An env whose episode
ended is reset at once: its ``info`` then carries ``final_observation`` (the last observation of the
finished episode) and ``episode`` (``{"score", "reward", "turns", "question_type"}``; ``score`` is 0
when a VSI episode was truncated without an answer, a game's is 1 when won; ``question_type`` is the
env's ``task_type``), and the returned observation is the first of
the next episode. Env ``i`` is seeded with ``seed + i`` at the first reset and then continues its
own random stream, so a batch is deterministic given ``seed``.

Grouped rollouts (``group_size`` G > 1, for RLOO/GRPO): envs ``gG .. gG+G-1`` form group g. Each env
of a group plays the same sequence of episode *specs*: its k-th episode is reset with the seed
:func:`episode_seed` ``(seed, g, k)``, which fixes the scene, the question and the start pose (all of
a reset's randomness comes from the env's generator). The envs of a group sample their own responses,
so their k-th episodes differ only by what the policy did. Within a rollout they drift apart in time
(one answers at turn 1, another walks for 4 turns); :meth:`BatchEnv.resync`, called at the start of
every rollout, restarts every group on one fresh episode index, so siblings' episodes land in the
same rollout (without it the drift grows without bound and siblings are soon never compared: measured
0-38% of turns with a baseline after 40 iterations, 70-94% with it). Every step's info carries
``group_id`` = ``g * 2**32 + k`` of the episode the step belongs to (also with G = 1, where no two
episodes share one). The counters
(``episode_counts``) are plain attributes, so checkpoints save them and a resumed run keeps its groups.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.config.arguments import EnvConfig
from a2c_ppo_acktr.envs.registry import make_env
from a2c_ppo_acktr.envs.vsi_env import share_scene_cache


GROUP_ID_STRIDE = 2**32  # group_id = group * GROUP_ID_STRIDE + episode index within the group


def episode_seed(seed: int, group: int, episode: int) -> int:
    """The reset seed of group ``group``'s ``episode``-th episode (same for every env of the group)."""
    return int(np.random.SeedSequence([int(seed), int(group), int(episode)]).generate_state(1)[0])


class BatchEnv:
    """``num_envs`` envs of ``cfg.env_id`` with auto-reset.

    Args:
        cfg: The env config shared by all envs.
        num_envs: How many envs.
        seed: Env ``i`` is seeded with ``seed + i`` (``group_size`` 1), or every episode of group g
            with :func:`episode_seed` ``(seed, g, k)``.
        group_size: envs per group (``rollout.group_size``); must divide ``num_envs``.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0, group_size: int = 1) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        if group_size < 1 or num_envs % group_size != 0:
            raise ValueError(f"group_size={group_size} must be >= 1 and divide num_envs={num_envs}")
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.group_size = int(group_size)
        self.episode_counts = [0] * self.num_envs  # episodes started by each env (k of the current one + 1)
        self.envs = [make_env(cfg) for _ in range(self.num_envs)]
        share_scene_cache(self.envs)
        self.reset_infos: list[dict] = []
        self._started = False
        self._fresh = False  # every env is at the first turn of its group's common episode

    def reset(self, seed: Optional[int] = None) -> list[dict]:
        """Reset every env (env ``i`` with seed ``seed + i``; default: the constructor's seed).

        Returns:
            The N first observations; their infos are in ``self.reset_infos``.
        """
        if seed is not None:
            self.seed = int(seed)
        obs, self.reset_infos = [], []
        self.episode_counts = [0] * self.num_envs
        for i in range(self.num_envs):
            o, info = self._reset_env(i, first_seed=self.seed + i)
            obs.append(o)
            self.reset_infos.append(info)
        self._started = True
        self._fresh = True
        return obs

    def resync(self, observations: list[dict]) -> tuple[list[dict], bool]:
        """Restart every group on one common episode index (the next one none of its envs has
        started): the episodes in progress are cut (they end no earlier than the rollout that held
        them). A no-op without groups or right after a reset/resync.

        Returns:
            ``(observations, restarted)``: the observations to act on and whether episodes restarted.
        """
        if self.group_size == 1 or self._fresh:
            return observations, False
        obs, self.reset_infos = [], []
        for start in range(0, self.num_envs, self.group_size):
            members = range(start, start + self.group_size)
            base = max(self.episode_counts[i] for i in members)
            for i in members:
                self.episode_counts[i] = base
                o, info = self._reset_env(i)
                obs.append(o)
                self.reset_infos.append(info)
        self._fresh = True
        return obs, True

    def group_id(self, i: int) -> int:
        """The group id of env ``i``'s current episode."""
        return (i // self.group_size) * GROUP_ID_STRIDE + self.episode_counts[i] - 1

    def _reset_env(self, i: int, first_seed: Optional[int] = None) -> tuple[dict, dict]:
        """Start env ``i``'s next episode: grouped, from its group's spec seed; else from its own
        stream (seeded with ``first_seed`` at the first reset)."""
        env = self.envs[i]
        if self.group_size > 1:
            o, info = env.reset(seed=episode_seed(self.seed, i // self.group_size, self.episode_counts[i]))
        else:
            o, info = env.reset(seed=first_seed)
        self.episode_counts[i] += 1
        info["group_id"] = self.group_id(i)
        return o, info

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
        self._fresh = False
        for i, (env, text) in enumerate(zip(self.envs, texts)):
            o, r, term, trunc, info = env.step(text)
            rewards[i], terminated[i], truncated[i] = r, term, trunc
            info["group_id"] = self.group_id(i)  # the episode this step belongs to
            if term or trunc:
                info["final_observation"] = o
                info["episode"] = {
                    "score": float(info.get("score", 0.0)),
                    "reward": float(env.episode_reward),
                    "turns": int(env.turn),
                    "question_type": env.task_type,
                }
                o, reset_info = self._reset_env(i)
                info["reset_info"] = reset_info
            obs.append(o)
            infos.append(info)
        return obs, rewards, terminated, truncated, infos

    def get_state(self) -> dict[str, Any]:
        """Everything that makes the batch's future deterministic: its own counters and each env's
        :meth:`~a2c_ppo_acktr.envs.protocol.TextEnv.get_state` (generator, episode in progress). Picklable;
        an env attribute that cannot be pickled fails the checkpoint loudly."""
        return {
            "batch": {k: v for k, v in vars(self).items() if k not in ("envs", "cfg")},
            "envs": [env.unwrapped.get_state() for env in self.envs],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`get_state`.

        Raises:
            ValueError: The state holds a different number of envs.
        """
        if len(state["envs"]) != len(self.envs):
            raise ValueError(
                f"the saved state holds {len(state['envs'])} envs per process but rollout.num_envs={len(self.envs)}; "
                "resume with the same rollout.num_envs"
            )
        vars(self).update(state["batch"])
        for env, saved in zip(self.envs, state["envs"]):
            env.unwrapped.set_state(saved)

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


VSIBatchEnv = BatchEnv  # the earlier name, from when VSI was the only env; kept for code that imports it

"""Scenes, renderer, questions and the gymnasium env.

Importing this package registers the versioned gymnasium id ``VSI-v0`` (entry point
:class:`a2c_ppo_acktr.envs.vsi_env.VSIEnv`) and does nothing else; the env module itself (and open3d)
is imported only when an env is made.
"""
import gymnasium as gym

ENV_IDS = ("VSI-v0",)

if "VSI-v0" not in gym.registry:
    gym.register(id="VSI-v0", entry_point="a2c_ppo_acktr.envs.vsi_env:VSIEnv")

"""Policy-optimisation algorithms."""

from a2c_ppo_acktr.algo.ppo import PPO

__all__ = ["PPO"]

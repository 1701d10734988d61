"""Reinforcement learning around the PPO update (``algo/``): rollout storage, saved rollouts, a run's state on disk and
the training loop."""

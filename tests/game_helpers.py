"""What the game env tests share (imported by name: pytest puts ``tests/`` on ``sys.path``)."""
from __future__ import annotations

from a2c_ppo_acktr.envs.cards.common import format_reply


def act(word: str) -> str:
    """A reply that plays ``word`` with no thoughts."""
    return format_reply("", word)


def run_oracle(env, seed: int, max_steps: int = 100):
    """Play one episode with the env's oracle; returns (rewards, terminated, truncated, last info)."""
    env.reset(seed=seed)
    rewards = []
    for _ in range(max_steps):
        _, reward, terminated, truncated, info = env.step(env.oracle_reply())
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, truncated, info
    raise AssertionError(f"the oracle did not finish an episode in {max_steps} steps")

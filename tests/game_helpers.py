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


def trace(env, seed: int, reply, steps: int) -> list[tuple]:
    """``env`` played from ``reset(seed=seed)`` with ``reply(k)`` at step k for ``steps`` steps,
    reset after every end: rows ``(obs, reward, terminated, truncated, info)``, a reset's row with
    None for the step's three fields."""
    obs, info = env.reset(seed=seed)
    out = [(obs, None, None, None, info)]
    for k in range(steps):
        obs, reward, terminated, truncated, info = env.step(reply(k))
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            obs, info = env.reset()
            out.append((obs, None, None, None, info))
    return out


def plain(x):
    """``x`` with arrays as lists and a parsed action as its repr, so two runs' values compare with ==."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: repr(v) if k == "action" else plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def same_trace(a: list[tuple], b: list[tuple]) -> bool:
    """Whether two :func:`trace` results are equal: texts, images pixel for pixel, rewards, flags, infos."""
    return len(a) == len(b) and all(plain(ra) == plain(rb) for ra, rb in zip(a, b))

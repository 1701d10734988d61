"""Sokoban: check_env, seeded determinism, generated levels (solvable, as gym-sokoban builds them), the
oracle solving all of them by shortest plans, classic and shaped rewards on hand-worked levels."""

from __future__ import annotations

import warnings
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from a2c_ppo_acktr.envs import sokoban
from a2c_ppo_acktr.envs.cards.common import parse_reply
from a2c_ppo_acktr.envs.sokoban import env as sokoban_env
from a2c_ppo_acktr.envs.sokoban.env import SokobanEnv
from a2c_ppo_acktr.envs.sokoban.generation import Level, generate_level
from a2c_ppo_acktr.envs.sokoban.solver import ACTIONS, apply_move, solve_level
from a2c_ppo_acktr.common.prompts import Invalid
from game_helpers import act, same_trace, trace

sokoban.register()


def level_env(text: str, **overrides) -> SokobanEnv:
    level = Level.from_text(text)
    env = SokobanEnv(dim_room=(level.height, level.width), num_boxes=len(level.boxes), **overrides)
    env.reset(options={"level": level})
    return env


# ---------------------------------------------------------------------------------------------
# check_env, determinism
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", sokoban.ENV_IDS)
def test_check_env_is_clean(env_id):
    for render_mode in (None, "rgb_array"):
        env = gym.make(env_id, render_mode=render_mode, num_boxes=2).unwrapped
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=render_mode is None)
        assert [str(w.message) for w in caught] == []


def _trace(seed, steps=30, **overrides):
    words = ["up", "left", "bad reply", "down", "right", "right", "up"]
    env = gym.make("Sokoban-v0", num_boxes=2, max_turns=12, **overrides)
    return trace(env, seed, lambda k: act(words[k % len(words)]) if k % 7 != 2 else "bad reply", steps)


def test_seeded_determinism():
    assert same_trace(_trace(5), _trace(5))
    assert not same_trace(_trace(5, 1), _trace(6, 1))


def test_level_index_gives_the_same_level_whatever_the_env_seed():
    a, b = SokobanEnv(num_boxes=2), SokobanEnv(num_boxes=2)
    a.reset(seed=1, options={"level_index": 4})
    b.reset(seed=99, options={"level_index": 4})
    assert a.level == b.level
    b.reset(seed=99, options={"level_index": 5})
    assert a.level != b.level


# ---------------------------------------------------------------------------------------------
# Generated levels and the oracle
# ---------------------------------------------------------------------------------------------
def _bfs_length(level: Level) -> int:
    """Shortest solution length by plain breadth-first search over moves (independent of the A*)."""
    start = (level.player, level.boxes)
    seen, frontier, depth = {start}, deque([start]), {start: 0}
    while frontier:
        state = frontier.popleft()
        if state[1] == level.targets:
            return depth[state]
        for action in ACTIONS:
            p, b, _ = apply_move(level.floor, state[0], state[1], action)
            if (p, b) not in seen:
                seen.add((p, b))
                depth[(p, b)] = depth[state] + 1
                frontier.append((p, b))
    raise AssertionError("a generated level has no solution")


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_oracle_solves_every_generated_level_by_a_shortest_plan(num_boxes):
    env = SokobanEnv(dim_room=(6, 6), num_boxes=num_boxes)
    for seed in range(30):
        env.reset(seed=seed)
        level = env.level
        h, w = level.height, level.width
        border = {(r, c) for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)}
        assert not level.floor & border and len(level.boxes) == len(level.targets) == num_boxes
        assert level.boxes <= level.floor and level.targets <= level.floor and level.player in level.floor
        assert not level.boxes & level.targets and level.player not in level.targets and level.player not in level.boxes
        shortest = _bfs_length(level)
        assert len(solve_level(level)) == shortest
        turns, ret = 0, 0.0
        while True:
            _, reward, terminated, truncated, info = env.step(env.oracle_reply())
            turns, ret = turns + 1, ret + reward
            if terminated or truncated:
                break
        assert terminated and info["success"] and turns == shortest
        assert ret == pytest.approx(-0.1 * shortest + num_boxes * 1.0 + 10.0)  # each box lands once on the way


def test_generation_follows_gym_sokoban_and_is_seeded():
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a = generate_level(rng_a, 8, 8, 2, int(1.7 * 16))
    assert a == generate_level(rng_b, 8, 8, 2, int(1.7 * 16))
    # reverse play moved the boxes off their targets: the level needs pushes
    assert a.boxes.isdisjoint(a.targets) and len(solve_level(a)) > 0
    levels = [generate_level(np.random.default_rng(s), 10, 10, 3, 34, max_states=20_000) for s in range(3)]
    assert all(len(lv.boxes) == 3 and solve_level(lv) is not None for lv in levels)


# ---------------------------------------------------------------------------------------------
# Rewards, termination, truncation, invalid replies
# ---------------------------------------------------------------------------------------------
CORRIDOR = "######\n#@$ .#\n######"  # push right twice to solve


def test_classic_reward_hand_worked():
    env = level_env(CORRIDOR)
    _, r1, t1, _, i1 = env.step(act("right"))
    _, r2, t2, _, i2 = env.step(act("right"))
    assert (r1, t1) == (pytest.approx(-0.1), False) and i1["box_distance"] == 1
    assert (r2, t2) == (pytest.approx(-0.1 + 1 + 10), True) and i2["success"] and i2["boxes_on_target"] == 1

    env = level_env("#######\n#@* $.#\n#######")  # targets under the first box and at the end
    _, r1, *_ = env.step(act("right"))  # box pushed off its target
    _, r2, *_ = env.step(act("right"))  # box against box: blocked
    _, r3, *_ = env.step(act("up"))  # wall
    assert (r1, r2, r3) == (pytest.approx(-1.1), pytest.approx(-0.1), pytest.approx(-0.1))
    assert env.player == (1, 2) and env.boxes == frozenset({(1, 3), (1, 4)})


def test_turn_cap_truncates():
    env = level_env(CORRIDOR, max_turns=3)
    ends = [env.step(act("left"))[2:4] for _ in range(3)]
    assert ends == [(False, False), (False, False), (False, True)]


def test_shaped_reward_hand_worked():
    env = level_env(CORRIDOR, reward_mode="shaped")
    r1 = env.step(act("right"))[1]
    _, r2, _, _, info = env.step(act("right"))
    # distance 2 -> 1 -> 0: +1 each; the last turn adds mean(classic) = (-0.1 + 10.9) / 2 and the bonus 10
    assert r1 == pytest.approx(1.0) and r2 == pytest.approx(1.0 + 5.4 + 10.0)
    assert info["classic_reward"] == pytest.approx(10.9)

    env = level_env(CORRIDOR, reward_mode="shaped", max_turns=2, invalid_penalty=-0.5)
    r1 = env.step("no json")[1]
    _, r2, terminated, truncated, _ = env.step(act("left"))  # blocked, and the last turn: truncated
    assert r1 == -0.5 and (terminated, truncated) == (False, True)
    assert r2 == pytest.approx(0.0 + (-0.5 - 0.1) / 2)  # no distance change, average of classic, no bonus


def test_invalid_reply_costs_the_penalty_and_moves_nothing():
    env = level_env(CORRIDOR, invalid_penalty=-0.3)
    obs, reward, terminated, truncated, info = env.step('{"action": "north"}')
    assert reward == -0.3 and not (terminated or truncated) and info["turn"] == 1 and not info["valid"]
    assert isinstance(info["action"], Invalid) and "'north' is not an action" in obs["text"]
    assert env.player == (1, 1) and "Turns left: 119" in obs["text"]
    assert parse_reply('{"action": "Left"}', sokoban_env.VOCABULARY) == "left"


def test_config_errors_say_the_fix():
    with pytest.raises(ValueError, match="reward_mode='dense' is not one of"):
        SokobanEnv(reward_mode="dense")
    with pytest.raises(ValueError, match="use fewer boxes or a larger dim_room"):
        SokobanEnv(dim_room=(4, 4), num_boxes=3)
    assert SokobanEnv(dim_room=[7, 5]).cfg.dim_room == (7, 5)


# ---------------------------------------------------------------------------------------------
# What is drawn
# ---------------------------------------------------------------------------------------------
def test_image_draws_every_tile_kind_where_it_belongs():
    env = level_env("#######\n#@* $.#\n#  .$ #\n#######", tile_size=16)
    obs, _ = env.reset(options={"level": env.level})
    img = obs["images"][0]
    assert img.shape == (4 * 16, 7 * 16, 3)

    def tile(r, c):
        return img[r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16].reshape(-1, 3)

    def has(r, c, rgb):
        return bool((tile(r, c) == rgb).all(axis=1).any())

    assert has(0, 0, sokoban_env._WALL_RGB) and has(1, 1, sokoban_env._PLAYER_RGB)
    assert has(1, 2, sokoban_env._BOX_ON_TARGET_RGB) and has(1, 4, sokoban_env._BOX_RGB)
    assert has(1, 5, sokoban_env._TARGET_RGB) and has(2, 3, sokoban_env._TARGET_RGB)
    assert (tile(2, 1) == sokoban_env._FLOOR_RGB).all()
    obs, *_ = env.step(act("right"))  # player onto the target the box left
    img = obs["images"][0]
    assert has(1, 2, sokoban_env._PLAYER_RGB) and has(1, 2, sokoban_env._TARGET_RGB) and has(1, 3, sokoban_env._BOX_RGB)


def test_token_budget_truncates_the_episode_when_used_up():
    """max_episode_tokens: replies' words and punctuation add up; the turn reaching the budget ends
    the episode truncated (not terminated), and without a budget the same replies go on."""
    from a2c_ppo_acktr.envs.cards.common import count_tokens
    from a2c_ppo_acktr.envs.sokoban.env import SokobanEnv

    reply = '{"thoughts": "I look around the room first.", "action": "up"}'
    per_turn = count_tokens(reply)
    assert per_turn == 23  # 9 words; 2 braces, 8 quotes, 2 colons, a comma and a period
    env = SokobanEnv(max_episode_tokens=3 * per_turn, max_turns=50)
    env.reset(seed=0)
    ends = [env.step(reply)[2:4] for _ in range(3)]
    assert ends[:2] == [(False, False), (False, False)] and ends[2] == (False, True)
    assert env.tokens_used == 3 * per_turn
    free = SokobanEnv(max_turns=50)
    free.reset(seed=0)
    assert [free.step(reply)[3] for _ in range(3)] == [False, False, False]

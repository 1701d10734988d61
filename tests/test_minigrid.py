"""MiniGrid as a text-action env: check_env, seeded determinism, exact resume from a pickle, minigrid's
rewards and limits, invalid replies, what the image and the text show, and the BFS oracle's figures
(Empty-Random-6x6: every episode by a shortest plan; DoorKey-6x6: at least 95% of episodes)."""

from __future__ import annotations

import pickle
import warnings
from collections import deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("minigrid", reason="the MiniGrid env needs the minigrid package (pip install 'minigrid>=3')")

from a2c_ppo_acktr.envs.cards.common import parse_reply  # noqa: E402
from a2c_ppo_acktr.envs.minigrid_text import (  # noqa: E402
    PROMPT,
    TESTED_IDS,
    VIEWS,
    VOCABULARY,
    MiniGridConfig,
    MiniGridTextEnv,
    make_minigrid_text_env,
    oracle_reply,
)
from a2c_ppo_acktr.common.prompts import Invalid  # noqa: E402
from game_helpers import act, plain, run_oracle, same_trace, trace  # noqa: E402

EMPTY, DOORKEY = "MiniGrid-Empty-Random-6x6-v0", "MiniGrid-DoorKey-6x6-v0"


def place(env: MiniGridTextEnv, pos: tuple[int, int], direction: int) -> None:
    """Put the agent somewhere (a test set-up: the next step draws it)."""
    env.inner.agent_pos, env.inner.agent_dir = pos, direction


# ---------------------------------------------------------------------------------------------
# check_env, determinism, resume
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("minigrid_id", TESTED_IDS)
def test_check_env_is_clean(minigrid_id, view):
    for render_mode in (None, "rgb_array"):
        env = make_minigrid_text_env(minigrid_id, view=view, render_mode=render_mode, image_size=64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)  # no gymnasium id, so no spec for its render check
        assert [str(w.message) for w in caught] == []
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), obs["images"][0]) and obs["images"][0].shape == (64, 64, 3)


SCRIPT = [
    "move forward",
    "turn left",
    "bad reply",
    "move forward",
    "pick up",
    "turn right",
    "move forward",
    "toggle",
    "drop",
    "done",
]


def _trace(minigrid_id, seed, steps=30, **overrides):
    env = make_minigrid_text_env(minigrid_id, max_turns=12, image_size=64, **overrides)
    word = lambda k: SCRIPT[k % len(SCRIPT)]  # noqa: E731
    return trace(env, seed, lambda k: word(k) if word(k) == "bad reply" else act(word(k)), steps)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("minigrid_id", TESTED_IDS)
def test_seeded_determinism(minigrid_id, view):
    assert same_trace(_trace(minigrid_id, 7, view=view), _trace(minigrid_id, 7, view=view))
    assert not all(
        same_trace(_trace(minigrid_id, 7, 1, view=view), _trace(minigrid_id, s, 1, view=view)) for s in range(8, 12)
    ), "the seed changes nothing"


def test_the_seed_decides_the_layout():
    env = make_minigrid_text_env(EMPTY, image_size=64)
    starts = {(info["agent_pos"], info["agent_dir"]) for info in (env.reset(seed=s)[1] for s in range(20))}
    assert len(starts) >= 8  # Empty-Random: the start cell and direction vary (16 cells x 4 directions)
    env = make_minigrid_text_env(DOORKEY, image_size=64)
    layouts = {env.reset(seed=s)[1]["state_hash"] for s in range(20)}
    assert len(layouts) >= 10  # DoorKey: wall, door, key and agent placed at random
    # layout_seed fixes the layout whatever the env's seed
    a = env.reset(seed=1, options={"layout_seed": 5})
    b = env.reset(seed=99, options={"layout_seed": 5})
    assert a[1]["state_hash"] == b[1]["state_hash"] and np.array_equal(a[0]["images"][0], b[0]["images"][0])
    assert (
        env.layout_seed == 5 and len({env.reset(options={"layout_seed": k})[1]["state_hash"] for k in range(10)}) >= 5
    )
    with pytest.raises(ValueError, match="layout_seed"):
        env.reset(options={"layout_seed": -1})


@pytest.mark.parametrize("minigrid_id", TESTED_IDS)
def test_pickle_mid_episode_continues_identically(minigrid_id):
    env = make_minigrid_text_env(minigrid_id, image_size=64)
    env.reset(seed=3)
    for word in ("turn left", "move forward", "turn right"):
        env.step(act(word))
    clone = pickle.loads(pickle.dumps(env))
    # the training loop's resume: a fresh env takes the saved attributes (all but the config and spaces)
    fresh = make_minigrid_text_env(minigrid_id, image_size=64)
    saved = pickle.loads(
        pickle.dumps(
            {k: v for k, v in vars(env).items() if k not in ("cfg", "observation_space", "action_space", "spec")}
        )
    )
    vars(fresh).update(saved)

    def play(e):
        out = []
        for k in range(40):  # the oracle to the end of the episode, then a new one from the generator
            _, reward, terminated, truncated, info = e.step(e.oracle_reply() if k % 5 else "garbage")
            out.append((reward, terminated, truncated, plain(info)))
            if terminated or truncated:
                obs, info = e.reset()
                out.append((obs["text"], obs["images"][0].tobytes(), plain(info)))
        return out

    expected = play(env)
    assert any(isinstance(x[0], str) for x in expected), (
        "the episode did not end: the test checks nothing after a reset"
    )
    assert play(clone) == expected
    assert play(fresh) == expected


# ---------------------------------------------------------------------------------------------
# Rewards, limits, invalid replies
# ---------------------------------------------------------------------------------------------
def test_invalid_reply_costs_the_penalty_moves_nothing_and_uses_a_turn():
    env = make_minigrid_text_env(DOORKEY, invalid_penalty=-0.25, render_mode="rgb_array", image_size=64)
    obs0, info0 = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step('{"thoughts": "x", "action": "jump"}')
    assert reward == -0.25 and not terminated and not truncated
    assert info["valid"] is False and isinstance(info["action"], Invalid) and info["turn"] == 1
    assert (info["agent_pos"], info["agent_dir"], info["step_count"], info["state_hash"]) == (
        info0["agent_pos"],
        info0["agent_dir"],
        0,
        info0["state_hash"],
    )
    assert "invalid reply ('jump' is not an action" in obs["text"] and "Turns left: 359." in obs["text"]
    assert np.array_equal(obs["images"][0], obs0["images"][0])
    assert MiniGridConfig().invalid_penalty == -0.1


@pytest.mark.parametrize("invalid_at", [None, 0, 3])
def test_success_reward_is_minigrids_closed_form(invalid_at):
    env = make_minigrid_text_env(DOORKEY, image_size=64)
    env.reset(seed=11)
    max_steps, valid, ret = env.inner.max_steps, 0, 0.0
    assert max_steps == 360  # DoorKey: 10 * size**2
    for turn in range(100):
        reply = "not json" if turn == invalid_at else env.oracle_reply()
        valid += reply != "not json"
        _, reward, terminated, truncated, info = env.step(reply)
        ret += reward
        if terminated or truncated:
            break
    assert terminated and info["success"]
    # invalid replies do not step minigrid: its step_count, hence the reward, counts valid replies
    assert info["step_count"] == valid and info["turn"] == valid + (invalid_at is not None)
    assert reward == pytest.approx(1 - 0.9 * valid / max_steps)
    assert ret == pytest.approx(
        reward + (-0.1 if invalid_at is not None else 0.0)
    ) and env.episode_reward == pytest.approx(ret)


def test_turn_cap_truncates_and_defaults_to_minigrids_max_steps():
    env = make_minigrid_text_env(EMPTY, max_turns=3, image_size=64)
    env.reset(seed=0)
    ends = [env.step(act("turn left") if k != 1 else "nonsense")[2:4] for k in range(3)]
    assert ends == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(act("turn left"))

    for max_turns in (None, 1000):  # the default, and a cap above minigrid's: minigrid's max_steps (4 * 6**2)
        env = make_minigrid_text_env(EMPTY, max_turns=max_turns, image_size=64)
        obs, _ = env.reset(seed=0)
        assert "Turns left: 144." in obs["text"]
        for turn in range(1, 145):
            _, reward, terminated, truncated, info = env.step(act("turn left"))
            assert reward == 0.0 and not terminated and truncated == (turn == 144)
        assert info["turn"] == info["step_count"] == 144


def test_config_errors_say_the_fix():
    with pytest.raises(ValueError, match="must start with 'MiniGrid-' or 'BabyAI-'"):
        MiniGridTextEnv(minigrid_id="CartPole-v1")
    with pytest.raises(ValueError, match="is not registered.*MiniGrid-DoorKey-6x6-v0"):
        MiniGridTextEnv(minigrid_id="MiniGrid-DoorKey-7x7-v0")
    with pytest.raises(ValueError, match="view='top' is not one of"):
        MiniGridTextEnv(view="top")
    with pytest.raises(ValueError, match="image_size=32 is too small"):
        MiniGridTextEnv(image_size=32)
    with pytest.raises(ValueError, match="max_turns=0 must be >= 1"):
        MiniGridTextEnv(max_turns=0)
    with pytest.raises(TypeError, match="unknown MiniGridConfig fields"):
        MiniGridTextEnv(minigrid="MiniGrid-Empty-5x5-v0")
    env = make_minigrid_text_env("MiniGrid-Empty-5x5-v0", render_mode="rgb_array")
    assert (
        env.cfg.minigrid_id == "MiniGrid-Empty-5x5-v0"
        and env.render_mode == "rgb_array"
        and env.task_type_name == "minigrid"
    )


# ---------------------------------------------------------------------------------------------
# What the agent sees and reads
# ---------------------------------------------------------------------------------------------
def _green(tile: np.ndarray) -> bool:
    """The goal's green (drawn lighter where the agent sees it)."""
    px = tile.reshape(-1, 3).astype(int)
    return bool(((px[:, 1] > 200) & (px[:, 0] < 120) & (px[:, 2] < 120)).mean() > 0.5)


def test_agent_view_is_egocentric_and_full_view_is_the_grid():
    env = make_minigrid_text_env(EMPTY)  # 224 = 7 cells x 32 pixels
    env.reset(seed=0)
    place(env, (1, 1), 3)  # top-left corner, facing up; the goal is at (4, 4)
    obs, *_ = env.step(act("turn right"))  # facing right: the goal is 3 cells ahead and 3 to the right
    img = obs["images"][0]
    assert img.shape == (224, 224, 3)

    def cell(row, col):
        return img[row * 32 : (row + 1) * 32, col * 32 : (col + 1) * 32]

    # the agent at the bottom centre pointing up: forward is up, its right is the image's right
    assert _green(cell(6 - 3, 3 + 3)) and sum(_green(cell(r, c)) for r in range(7) for c in range(7)) == 1
    agent = cell(6, 3).reshape(-1, 3).astype(int)
    assert ((agent[:, 0] > 200) & (agent[:, 1] < 100)).any()  # the red triangle
    assert (cell(0, 0) == 146).all()  # beyond the grid's edge minigrid draws walls (seen: lighter grey)
    hidden = make_minigrid_text_env(DOORKEY).reset(seed=3)[0]["images"][
        0
    ]  # facing the room's north wall, 2 cells ahead
    black = (hidden == 0).all(axis=2)
    assert (
        black[: 4 * 32].mean() > 0.9 and black[4 * 32 :, 2 * 32 : 5 * 32].mean() < 0.05
    )  # behind it: black (but grid lines)

    env = make_minigrid_text_env(EMPTY, view="full", image_size=240)  # 6 cells x 40 pixels
    env.reset(seed=0)
    place(env, (1, 1), 3)
    img = env.step(act("turn right"))[0]["images"][0]
    full = lambda r, c: img[r * 40 + 4 : (r + 1) * 40 - 4, c * 40 + 4 : (c + 1) * 40 - 4]  # noqa: E731
    assert _green(full(4, 4)) and sum(_green(full(r, c)) for r in range(6) for c in range(6)) == 1
    assert (full(0, 0).reshape(-1, 3) == (100, 100, 100)).all()  # the wall, not highlighted
    overview = env.overview_image()
    assert overview.shape == img.shape and not np.array_equal(overview, img)  # the seen cells drawn lighter


def test_prompt_gives_mission_actions_and_carried_object_but_no_positions():
    env = make_minigrid_text_env(DOORKEY, image_size=64)
    obs, info = env.reset(seed=3)
    text = obs["text"]
    assert text.startswith(PROMPT) and "Mission: use the key to open the door and then get to the goal" in text
    assert all(f'"{word}"' in text for word in VOCABULARY) and "You carry: nothing." in text and "7 x 7 cells" in text
    assert str(info["agent_pos"]) not in text and "(4, 4)" not in text and "goal is at" not in text
    assert "Last turn: none yet" in text
    while env.inner.carrying is None:
        obs, *_ = env.step(env.oracle_reply())
    assert "You carry: the yellow key." in obs["text"] and "Last turn: you picked up the yellow key." in obs["text"]
    full = make_minigrid_text_env(DOORKEY, view="full", image_size=64).reset(seed=3)[0]["text"]
    assert "whole grid from above" in full and "7 x 7" not in full


def test_feedback_says_what_happened():
    env = make_minigrid_text_env(DOORKEY, image_size=64)

    def feedback(word):
        return env.step(act(word))[0]["text"].rsplit("Last turn: ", 1)[1]

    env.reset(seed=3)  # agent (1, 2) facing up, the key at (1, 1), the locked door at (2, 1), the wall x = 2
    assert (env.inner.grid.get(1, 1).type, env.inner.grid.get(2, 1).type) == ("key", "door")
    assert feedback("toggle") == "nothing happened: the yellow key cannot be toggled."
    assert feedback("drop") == "you carry nothing to drop."
    assert feedback("turn right") == "you turned right."
    assert feedback("move forward") == "you could not move forward: a wall is in the way."
    assert feedback("pick up") == "you could not pick up a wall: it cannot be carried."
    place(env, (1, 1), 0)  # beside the locked door without its key (standing where the key is does not matter here)
    env.inner.grid.set(1, 1, None)
    assert feedback("toggle") == "the yellow door is locked; you need the yellow key to open it."
    assert feedback("move forward") == "you could not move forward: the yellow door is locked."

    env.reset(seed=3)
    said = []
    while True:
        obs, reward, terminated, truncated, info = env.step(env.oracle_reply())
        said.append(obs["text"].rsplit("Last turn: ", 1)[1])
        if terminated or truncated:
            break
    assert said[0] == "you picked up the yellow key."
    assert "you unlocked the yellow door with the yellow key and opened it." in said
    assert said[-1] == "you moved forward onto the goal. The mission is complete."
    assert set(said) <= {
        "you picked up the yellow key.",
        "you unlocked the yellow door with the yellow key and opened it.",
        "you moved forward.",
        "you turned left.",
        "you turned right.",
        said[-1],
    }


# ---------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------
def _shortest_by_simulation(env: MiniGridTextEnv) -> int:
    """Fewest minigrid steps to the goal, by breadth-first search over copies of the inner env
    stepped by minigrid itself (independent of the oracle's planner); Empty needs turns and moves only."""
    start = pickle.dumps(env.inner)
    seen = {(tuple(int(v) for v in env.inner.agent_pos), env.inner.agent_dir)}
    frontier = deque([(start, 0)])
    while frontier:
        blob, depth = frontier.popleft()
        for action in (0, 1, 2):
            inner = pickle.loads(blob)
            _, reward, terminated, _, _ = inner.step(action)
            if terminated and reward > 0:
                return depth + 1
            key = (tuple(int(v) for v in inner.agent_pos), inner.agent_dir)
            if key not in seen:
                seen.add(key)
                frontier.append((pickle.dumps(inner), depth + 1))
    raise AssertionError("the goal cannot be reached")


def test_oracle_solves_every_empty_random_layout_by_a_shortest_plan():
    env = make_minigrid_text_env(EMPTY, image_size=64)
    for seed in range(50):
        env.reset(seed=seed)
        shortest = _shortest_by_simulation(env)
        rewards, terminated, _, info = run_oracle(env, seed, max_steps=200)
        assert terminated and info["success"] and len(rewards) == shortest, (seed, len(rewards), shortest)
        assert rewards[-1] == pytest.approx(1 - 0.9 * shortest / 144) and sum(rewards[:-1]) == 0.0


def test_oracle_solves_doorkey_6x6():
    env = make_minigrid_text_env(DOORKEY, image_size=64)
    episodes, solved, lengths = 50, 0, []
    for seed in range(episodes):
        rewards, terminated, _, info = run_oracle(env, seed, max_steps=200)
        solved += bool(terminated and info["success"])
        lengths.append(len(rewards))
    assert solved / episodes >= 0.95, f"the oracle solved {solved} of {episodes} DoorKey-6x6 layouts"
    assert max(lengths) <= 30  # a 4 x 4 room: key, door and goal are a few cells apart


def test_oracle_reply_is_a_pure_reply_and_says_when_it_cannot_plan():
    env = make_minigrid_text_env(DOORKEY, image_size=64)
    env.reset(seed=3)
    before = env._game_info()
    reply = env.oracle_reply()
    assert parse_reply(reply, VOCABULARY) == "pick up" and "yellow key" in reply
    assert env._game_info() == before and oracle_reply(env.inner) == reply  # planning changes nothing
    run_oracle(env, 3, max_steps=200)
    with pytest.raises(ValueError, match="on the goal"):
        env.oracle_reply()
    env = make_minigrid_text_env("MiniGrid-KeyCorridorS3R1-v0", image_size=64)  # "pick up the ball": no goal square
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="only missions that end on the goal square"):
        env.oracle_reply()


def test_lava_ends_the_episode_without_success_and_the_oracle_walks_around_it():
    env = make_minigrid_text_env("MiniGrid-LavaGapS6-v0", image_size=64)
    env.reset(seed=0)
    lava = [
        (x, y)
        for x in range(env.inner.width)
        for y in range(env.inner.height)
        if env.inner.grid.get(x, y) is not None and env.inner.grid.get(x, y).type == "lava"
    ]
    x, y = next((x, y) for x, y in lava if env.inner.grid.get(x - 1, y) is None)
    place(env, (x - 1, y), 0)  # facing the lava
    obs, reward, terminated, truncated, info = env.step(act("move forward"))
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert obs["text"].endswith("Last turn: you moved forward onto lava. The episode ended without success.")
    for seed in range(20):  # a lava wall with one gap: the shortest way often skirts the lava
        rewards, terminated, _, info = run_oracle(env, seed, max_steps=200)
        assert terminated and info["success"], seed

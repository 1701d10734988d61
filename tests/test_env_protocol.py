"""The env contract (envs/protocol.py) and the one episode runner (envs/pool.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import load_config
from a2c_ppo_acktr.common.env_ids import TESTED_IDS, VSI_ID
from a2c_ppo_acktr.envs import registry
from a2c_ppo_acktr.envs.pool import run_slots
from a2c_ppo_acktr.envs.protocol import OracleStyle, TextEnv
from a2c_ppo_acktr.labels.teachers import OracleTeacher


def _cfg(env_id: str):
    over = {"env.env_id": env_id, "env.max_turns": "6"}
    if env_id != VSI_ID:
        over["env.image_size"] = "64"
    return load_config(preset="debug", overrides=[f"{k}={v}" for k, v in over.items()]).env


@pytest.mark.parametrize("env_id", TESTED_IDS)
def test_every_env_implements_the_contract_and_restores_its_own_state(env_id):
    env = registry.make_env(_cfg(env_id))
    env.reset(seed=3)
    assert isinstance(env.unwrapped, TextEnv)  # its properties (task_type...) answer once an episode runs
    saved = pickle.loads(pickle.dumps(env.unwrapped.get_state()))
    replies = [env.unwrapped.chance_reply(np.random.default_rng(k), 0.3) for k in range(4)]

    def play(e):
        out = []
        for r in replies:
            obs, reward, terminated, truncated, _ = e.step(r)
            out.append((obs, reward, terminated, truncated))
            if terminated or truncated:
                break
        return out

    straight = play(env)
    twin = registry.make_env(_cfg(env_id))
    twin.reset(seed=99)  # another episode, then the saved one put back
    twin.unwrapped.set_state(saved)
    resumed = play(twin)
    assert len(straight) == len(resumed) >= 1
    for (o1, r1, t1, u1), (o2, r2, t2, u2) in zip(straight, resumed):
        assert (o1["text"], r1, t1, u1) == (o2["text"], r2, t2, u2)
        assert all(np.array_equal(a, b) for a, b in zip(o1["images"], o2["images"]))


@pytest.mark.parametrize("env_id", ["NumberLine-v0", VSI_ID])
def test_the_oracle_teacher_asks_the_env(env_id):
    env = registry.make_env(_cfg(env_id))
    env.reset(seed=1)
    teacher = OracleTeacher(max_moves=0, thoughts="brief")
    assert teacher.respond(env) == env.unwrapped.oracle_reply(OracleStyle(thoughts="brief", max_moves=0))
    assert env.unwrapped.parse(teacher.respond(env)).__class__.__name__ != "Invalid"


def test_oracle_style_is_validated():
    with pytest.raises(ValueError, match="is not one of"):
        OracleStyle(thoughts="long")
    with pytest.raises(ValueError, match="max_moves"):
        OracleStyle(max_moves=-1)


def test_run_slots_runs_every_job_in_order_skips_and_refills():
    """Jobs of lengths 3, 1, skip, 2, 1 on 2 slots: a slot takes the next job as soon as its
    episode ends, a skipped job takes no round, and each round answers every running slot at once."""
    lengths = {"a": 3, "b": 1, "c": None, "d": 2, "e": 1}
    rounds, ended = [], []

    def start(slot, job):
        return None if lengths[job] is None else {"job": job, "left": lengths[job]}

    def act(active, states):
        rounds.append([(k, s["job"]) for k, s in zip(active, states)])
        return [s["job"] for s in states]

    def step(slot, state, reply):
        assert reply == state["job"]
        state["left"] -= 1
        if state["left"] == 0:
            ended.append(state["job"])
        return state["left"] == 0

    run_slots(2, list(lengths), start, act, step)
    assert rounds == [[(0, "a"), (1, "b")], [(0, "a"), (1, "d")], [(0, "a"), (1, "d")], [(0, "e")]]
    assert ended == ["b", "a", "d", "e"]  # in round 3, slot 0 steps (and ends) before slot 1


def test_run_slots_refuses_a_wrong_number_of_replies():
    with pytest.raises(RuntimeError, match="1 replies for 2 running episodes"):
        run_slots(2, [0, 1], lambda k, j: j, lambda active, states: ["x"], lambda k, s, r: True)

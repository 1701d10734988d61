"""The gymnasium env: check_env clean, seeded determinism, rewards, penalties, truncation, batching."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import a2c_ppo_acktr.envs as envs_pkg
from a2c_ppo_acktr.config.arguments import EnvConfig
from a2c_ppo_acktr.envs.batch import VSIBatchEnv
from a2c_ppo_acktr.envs.questions import Question
from a2c_ppo_acktr.envs.vsi_env import VSIEnv
from a2c_ppo_acktr.common.prompts import Answer, Invalid, Move, format_response
from a2c_ppo_acktr.common.scoring import score_prediction
from helpers import write_arkit_scan

SMALL = dict(image_size=32, num_sweep_frames=4, image_history=2, num_scenes=2, max_turns=4)

SCRIPT = [
    format_response("turn", Move(45, 0.0)),
    format_response("walk", Move(-30, 1.0)),
    "not json at all",
    format_response("far", Move(180, 3.0)),
    '{"thoughts": "x", "action": {"rotation_angle_degrees": NaN, "forward_meters": 1}}',
    format_response("answer", Answer("B")),
    format_response("answer", Answer("2")),
]


def _frames_equal(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("env_id", envs_pkg.ENV_IDS)
def test_check_env_is_clean(env_id):
    env = gym.make(env_id, **SMALL).unwrapped
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    assert [str(w.message) for w in caught] == []
    rendered = gym.make(env_id, render_mode="rgb_array", **SMALL).unwrapped
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(rendered)
    assert [str(w.message) for w in caught] == []


def _run_script(env_id, seed, steps=20):
    env = gym.make(env_id, **SMALL)
    obs, info = env.reset(seed=seed)
    trace = [(obs, None, None, None, info)]
    for k in range(steps):
        obs, reward, term, trunc, info = env.step(SCRIPT[k % len(SCRIPT)])
        trace.append((obs, reward, term, trunc, info))
        if term or trunc:
            obs, info = env.reset()
            trace.append((obs, None, None, None, info))
    return trace


@pytest.mark.parametrize("env_id", envs_pkg.ENV_IDS)
def test_seeded_determinism(env_id):
    a, b = _run_script(env_id, seed=3), _run_script(env_id, seed=3)
    assert len(a) == len(b)
    for (oa, ra, ta, tra, ia), (ob, rb, tb, trb, ib) in zip(a, b):
        assert oa["text"] == ob["text"] and _frames_equal(oa["images"], ob["images"])
        assert (ra, ta, tra) == (rb, tb, trb)
        assert ia == ib
    c = _run_script(env_id, seed=4)
    assert any(x[0]["text"] != y[0]["text"] or not _frames_equal(x[0]["images"], y[0]["images"]) for x, y in zip(a, c))


def test_observation_layout_and_spaces():
    env = VSIEnv(EnvConfig(**SMALL))
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert len(obs["images"]) == SMALL["num_sweep_frames"] + 1  # sweep + current view
    assert np.array_equal(obs["images"][0], obs["images"][-1])  # the sweep starts at the current heading
    assert obs["images"][0].shape == (32, 32, 3) and obs["images"][0].dtype == np.uint8
    assert env.question.question in obs["text"] and "Turns left: 4" in obs["text"]
    for k in range(3):
        obs, *_ = env.step(format_response("t", Move(90, 0.0)))
    # Bounded: the sweep plus the last image_history views; the last image is the current view.
    assert len(obs["images"]) == SMALL["num_sweep_frames"] + SMALL["image_history"]
    assert np.array_equal(obs["images"][-1], env.renderer.render(env.pose).rgb)
    assert len(env.path) == 4 and env.turn == 3
    for key in ("question_type", "ground_truth", "action", "valid", "pose", "collided", "turn"):
        assert key in info


def test_invalid_text_penalty_and_feedback():
    env = VSIEnv(EnvConfig(**SMALL, invalid_penalty=-0.25))
    env.reset(seed=1)
    pose = env.pose
    for text in ["", "{", '{"action": {"answer": ""}}', "\x00\udcff garbage é", "{" * 5000]:
        obs, reward, term, trunc, info = env.step(text)
        assert reward == -0.25 and not term and info["valid"] is False and isinstance(info["action"], Invalid)
        assert "invalid output" in obs["text"] and info["action"].reason.split(";")[0][:20] in obs["text"]
        assert env.observation_space.contains(obs)  # echoed text is kept printable
        assert env.pose == pose
        if trunc:
            break
    assert trunc and env.turn == SMALL["max_turns"]


def test_truncation_at_max_turns():
    env = VSIEnv(EnvConfig(**SMALL, step_cost=-0.01, collision_penalty=0.0))
    env.reset(seed=2)
    for k in range(SMALL["max_turns"]):
        obs, reward, term, trunc, info = env.step(format_response("spin", Move(10, 0.0)))
        assert reward == pytest.approx(-0.01) and not term
        assert trunc == (k == SMALL["max_turns"] - 1)
    assert "score" not in info
    with pytest.raises(RuntimeError, match="reset"):
        env.step(format_response("spin", Move(10, 0.0)))


def test_collision_penalty_and_feedback():
    env = VSIEnv(EnvConfig(**{**SMALL, "collision_penalty": -0.5, "step_cost": 0.0, "max_turns": 10}))
    env.reset(seed=0)
    # Walk straight until something blocks: a room is at most 10 m wide and each step asks 3 m.
    for _ in range(6):
        obs, reward, term, trunc, info = env.step(format_response("go", Move(0, 3.0)))
        if info["collided"]:
            break
    assert info["collided"] and reward == -0.5 and "blocked" in obs["text"]


@pytest.mark.parametrize(
    "qtype", ["object_counting", "room_size_estimation", "object_rel_direction_easy", "route_planning"]
)
def test_answer_terminates_with_benchmark_score(qtype):
    env = VSIEnv(EnvConfig(**SMALL))
    env.reset(seed=5, options={"question_type": qtype})
    gt = env.question.ground_truth
    _, reward, term, trunc, info = env.step(format_response("sure", Answer(gt)))
    assert term and not trunc and reward == 1.0 and info["score"] == 1.0
    wrong = "Z" if env.question.options else str(float(gt) * 1.3)
    env.reset(seed=5, options={"question_type": qtype})
    _, reward, term, _, info = env.step(format_response("guess", Answer(wrong)))
    assert term and reward == pytest.approx(score_prediction(qtype, wrong, gt)) == info["score"]
    if env.question.options is None:
        assert 0.3 <= reward <= 0.5  # a 30% error passes 5 thresholds (6 with float rounding at t = 0.7 ... never more)
    else:
        assert reward == 0.0


def test_reset_options():
    env = VSIEnv(EnvConfig(**SMALL))
    env.reset(seed=0, options={"scene_index": 1, "question_type": "room_size_estimation"})
    assert env.scene.scene_id.endswith("1") and env.question.question_type == "room_size_estimation"
    q = Question("object_counting", "How many x(s) are in this room?", None, "7", [], {})
    obs, info = env.reset(seed=0, options={"scene_index": 0, "question": q})
    assert env.question is q and info["ground_truth"] == "7" and "How many x(s)" in obs["text"]
    with pytest.raises(ValueError, match="scene"):
        env.reset(seed=0, options={"question": q})
    with pytest.raises(TypeError, match="unknown EnvConfig fields"):
        VSIEnv(image_sise=32)


def test_batch_env_auto_reset_and_determinism():
    """Env i sends SCRIPT[(k + i) % 7] at step k: SCRIPT[5] and SCRIPT[6] answer (terminated), any
    other text on turn max_turns = 4 truncates. Which env ends when, and how, follows from the script
    alone (the list below, derived by hand); each finished episode reports its own turns, the sum of
    its step rewards, and the scorer's verdict on its answer (0 when truncated)."""
    cfg = EnvConfig(**SMALL)
    answers = {5: "B", 6: "2"}
    # (step, env, how, turns) of every episode that ends in 9 steps
    expected = [
        (3, 0, "truncated", 4),
        (3, 1, "truncated", 4),
        (3, 2, "terminated", 4),
        (4, 1, "terminated", 1),
        (4, 2, "terminated", 1),
        (5, 0, "terminated", 2),
        (5, 1, "terminated", 1),
        (6, 0, "terminated", 1),
        (8, 2, "truncated", 4),
    ]

    def run(seed):
        batch = VSIBatchEnv(cfg, num_envs=3, seed=seed)
        out = [[o["text"] for o in batch.reset()]]
        episodes, ended = [], []
        running = [0.0, 0.0, 0.0]  # each env's rewards since its episode began
        for k in range(9):
            picks = [(k + i) % len(SCRIPT) for i in range(3)]
            obs, rewards, term, trunc, infos = batch.step([SCRIPT[j] for j in picks])
            assert rewards.shape == (3,) and term.dtype == bool and trunc.dtype == bool
            for i in range(3):
                running[i] += float(rewards[i])
                if term[i] or trunc[i]:
                    ep = infos[i]["episode"]
                    assert set(ep) == {"score", "reward", "turns", "question_type"}
                    final = infos[i]["final_observation"]["text"]
                    assert ("Last turn: answered" in final) == bool(term[i])
                    assert "Turns left: 4" in obs[i]["text"]  # the returned observation starts a new episode
                    assert ep["reward"] == pytest.approx(running[i], abs=1e-5)
                    if term[i]:
                        verdict = score_prediction(ep["question_type"], answers[picks[i]], infos[i]["ground_truth"])
                        assert ep["score"] == pytest.approx(verdict)
                    else:
                        assert ep["score"] == 0.0
                    ended.append((k, i, "terminated" if term[i] else "truncated", ep["turns"]))
                    running[i] = 0.0
                    episodes.append(ep)
            out.append([o["text"] for o in obs] + rewards.tolist())
        return out, episodes, ended

    a, ep_a, ended = run(11)
    b, ep_b, _ = run(11)
    assert a == b and ep_a == ep_b
    assert ended == expected


# ------------------------------------------------------------------ real-scan sources (a fake ARKitScenes scan)
@pytest.fixture(scope="module")
def scan_root(tmp_path_factory):
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene

    root = tmp_path_factory.mktemp("arkit")
    write_arkit_scan(root, "41069025", make_procedural_scene(0))
    return root


def test_arkitscenes_source_generates_questions(scan_root):
    env = VSIEnv(EnvConfig(**{**SMALL, "scene_source": "arkitscenes", "data_root": str(scan_root)}))
    obs, info = env.reset(seed=0, options={"question_type": "object_counting"})
    assert info["scene_id"] == "41069025" and env.observation_space.contains(obs)
    _, reward, term, _, info = env.step(format_response("a", Answer(env.question.ground_truth)))
    assert term and reward == 1.0


def test_vsibench_source_uses_rows_and_names_missing_scenes(scan_root, tmp_path):
    import json

    row = {
        "id": 7,
        "dataset": "arkitscenes",
        "scene_name": "41069025",
        "question_type": "room_size_estimation",
        "question": "What is the size of this room (in square meters)?",
        "options": None,
        "ground_truth": "20.5",
    }
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    cfg = EnvConfig(**{**SMALL, "scene_source": "vsibench", "data_root": str(scan_root), "vsibench_path": str(rows)})
    env = VSIEnv(cfg)
    obs, info = env.reset(seed=0)
    assert row["question"] in obs["text"] and info["ground_truth"] == "20.5"
    _, reward, term, _, info = env.step(format_response("a", Answer("20.5")))
    assert term and reward == 1.0
    missing = {**row, "scene_name": "99999999"}
    rows.write_text(json.dumps(missing) + "\n")
    with pytest.raises(ValueError, match="99999999"):
        VSIEnv(cfg).reset(seed=0)


def test_envs_sharing_a_scene_cache_build_each_scene_once(monkeypatch):
    # Evaluation, labelling and the batch env give their envs one cache: a scene (a real scan takes
    # about a second to load) is built once per process, not once per env.
    from a2c_ppo_acktr.envs import procedural
    from a2c_ppo_acktr.envs.vsi_env import share_scene_cache

    builds = []
    real = procedural.make_procedural_scene
    monkeypatch.setattr(procedural, "make_procedural_scene", lambda *a, **k: builds.append(a) or real(*a, **k))
    a, b = VSIEnv(image_size=32, num_sweep_frames=2), VSIEnv(image_size=32, num_sweep_frames=2)
    share_scene_cache([a, b, object()])  # non-VSI envs are skipped
    a.reset(seed=0, options={"scene_index": 3})
    b.reset(seed=1, options={"scene_index": 3})
    assert len(builds) == 1 and a.scene is b.scene and a.renderer is b.renderer
    c = VSIEnv(image_size=32, num_sweep_frames=2)  # not sharing: builds its own
    c.reset(seed=0, options={"scene_index": 3})
    assert len(builds) == 2 and c.scene is not a.scene


def test_the_env_reward_reads_numbers_by_the_configured_scoring_rule():
    """env.scoring_rule reaches the reward: "seven chairs" for 7 scores 0 under the reference rule
    (its first word is no number) and 1 under lmms-eval 0.7's (the first number anywhere)."""
    q = Question("object_counting", "How many x(s) are in this room?", None, "7", [], {})
    rewards = {}
    for rule in ("thinking-in-space", "lmms-eval-0.7"):
        env = VSIEnv(EnvConfig(**SMALL, scoring_rule=rule))
        env.reset(seed=0, options={"scene_index": 0, "question": q})
        _, rewards[rule], term, _, info = env.step(format_response("count", Answer("seven chairs")))
        assert term and info["score"] == rewards[rule]
    assert rewards == {"thinking-in-space": 0.0, "lmms-eval-0.7": 1.0}

"""The training-set builder on small scans it writes in each dataset's layout (ScanNet, ARKitScenes,
ScanNet++): rows in the benchmark's format with exact ground truth, VSI-Bench test scenes refused,
the env replaying each row (``env.scene_source=parquet``), PPO and evaluation reading the same file,
and every command of docs/DATA.md parsing."""

from __future__ import annotations

import json
import logging
import re
import shlex
import zlib
from pathlib import Path

import numpy as np
import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, EnvConfig
from a2c_ppo_acktr.envs import make_dataset
from helpers import write_arkit_scan, write_scannet_scan, write_scannetpp_scan

REPO = Path(__file__).resolve().parent.parent
# The build's env: the debug preset's 32-px frames, with 4 sweep frames so that appearance order can be asked.
BUILD_ENV = ["--preset", "debug", "--env.num_sweep_frames", "4"]
PER_SCENE = 12
SEED = 3
SCENES = {  # (dataset, name) -> procedural room seed; rooms of 3-6 m keep loading quick
    ("scannet", "scene0001_00"): 0,
    ("scannet", "scene0002_00"): 1,  # a VSI-Bench test scene in the test parquet: refused
    ("scannet", "scene0002_01"): 4,  # another scan of that room: refused too
    ("arkitscenes", "41069025"): 2,
    ("scannetpp", "3db0a1c8f3"): 3,
}


def _dirs(data: Path) -> dict[str, Path]:
    return {
        "scannet": data / "scannet" / "scans",
        "arkitscenes": data / "arkitscenes" / "3dod" / "Training",
        "scannetpp": data / "scannetpp" / "data",
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """DATA/{scannet,arkitscenes,scannetpp} holding the scans of SCENES (and one broken ScanNet++ scan),
    a VSI-Bench test parquet naming scene0002_00, and a video root with one scan's video."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from a2c_ppo_acktr.envs.procedural import make_procedural_scene

    root = tmp_path_factory.mktemp("real")
    data = root / "DATA"
    dirs = _dirs(data)
    writers = {"scannet": write_scannet_scan, "arkitscenes": write_arkit_scan, "scannetpp": write_scannetpp_scan}
    for (dataset, name), seed in SCENES.items():
        dirs[dataset].mkdir(parents=True, exist_ok=True)
        writers[dataset](dirs[dataset], name, make_procedural_scene(seed, 3.0, 6.0))
    broken = write_scannetpp_scan(dirs["scannetpp"], "0badc0ffee", make_procedural_scene(9, 3.0, 4.0))
    (broken / "scans" / "segments_anno.json").write_text("{not json")
    test_rows = [
        {
            "id": 1,
            "dataset": "scannet",
            "scene_name": "scene0002_00",
            "question_type": "object_counting",
            "question": "How many chair(s) are in this room?",
            "options": None,
            "ground_truth": "2",
        }
    ]
    test_parquet = root / "vsibench" / "test.parquet"
    test_parquet.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(test_rows), test_parquet)
    videos = root / "videos"
    (videos / "arkitscenes").mkdir(parents=True)
    (videos / "arkitscenes" / "41069025.mp4").write_bytes(b"")  # its existence is what the builder checks
    return {"root": root, "data": data, "test_parquet": test_parquet, "videos": videos}


def _build_argv(data: dict, out: Path, *extra: str) -> list[str]:
    d = data["data"]
    return [
        "--scannet",
        str(d / "scannet"),
        "--arkitscenes",
        str(d / "arkitscenes"),
        "--scannetpp",
        str(d / "scannetpp"),
        "--out",
        str(out),
        "--exclude",
        str(data["test_parquet"]),
        "--questions-per-scene",
        str(PER_SCENE),
        "--seed",
        str(SEED),
        "--video-root",
        str(data["videos"]),
        "--no-progress",
        *BUILD_ENV,
        *extra,
    ]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def built(data):
    """One build through the command line, with its log lines."""
    out = data["root"] / "train_set"
    handler = _Lines()
    log = logging.getLogger("a2c_ppo_acktr.envs.make_dataset")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        assert make_dataset.main(_build_argv(data, out)) == 0
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return {
        "out": out,
        "parquet": out / make_dataset.ROWS_FILE,
        "lines": handler.lines,
        "manifest": json.loads((out / make_dataset.MANIFEST_FILE).read_text()),
    }


def _rows(path):
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

    return load_vsibench_rows(path)


def test_rows_are_in_the_benchmarks_format_for_every_layout(built, data):
    import pyarrow.parquet as pq

    from a2c_ppo_acktr.envs.vsibench import REQUIRED_FIELDS, TRAINING_FIELDS

    columns = pq.read_table(built["parquet"]).column_names
    assert set(REQUIRED_FIELDS) | {"options"} | set(TRAINING_FIELDS) | {"sweep", "video"} <= set(columns)
    rows = _rows(built["parquet"])
    assert [r["id"] for r in rows] == list(range(len(rows)))
    by_scene = {(r["dataset"], r["scene_name"]) for r in rows}
    assert by_scene == {("scannet", "scene0001_00"), ("arkitscenes", "41069025"), ("scannetpp", "3db0a1c8f3")}
    for key in by_scene:
        assert 6 <= sum((r["dataset"], r["scene_name"]) == key for r in rows) <= PER_SCENE
    assert len({r["question_type"] for r in rows}) >= 8
    assert {r["video"] for r in rows if r["dataset"] == "arkitscenes"} == {"arkitscenes/41069025.mp4"}
    assert {r["video"] for r in rows if r["dataset"] != "arkitscenes"} == {None}
    m = built["manifest"]
    assert m["data_root"] == str(data["data"].resolve()) and m["num_rows"] == len(rows) == sum(m["counts"].values())
    assert [s["scene_name"] for s in m["skipped"]] == ["0badc0ffee"] and "segments_anno.json" in m["skipped"][0][
        "reason"
    ]


def test_vsibench_test_scenes_and_their_rooms_are_refused_in_one_line_each(built, data):
    rows = _rows(built["parquet"])
    assert not any(r["scene_name"].startswith("scene0002") for r in rows)
    parquet = str(data["test_parquet"])
    assert built["manifest"]["refused"] == [
        {"dataset": "scannet", "scene_name": name, "test_scene": "scene0002_00", "parquet": parquet}
        for name in ("scene0002_00", "scene0002_01")
    ]
    refused = [line for line in built["lines"] if line.startswith("refused")]
    assert refused == [
        f"refused scannet scene scene0002_00: it is a VSI-Bench test scene (in {parquet})",
        f"refused scannet scene scene0002_01: it shows the room of VSI-Bench test scene scene0002_00 (in {parquet})",
    ]


def test_ground_truths_are_the_scans_geometry(built, data):
    """Each numerical answer recomputed from the loaded scan; each row's objects exist and are named."""
    from a2c_ppo_acktr.envs.questions import box_distance
    from a2c_ppo_acktr.envs.real_scans import find_scene

    scenes = {}
    checked = set()
    for r in _rows(built["parquet"]):
        key = (r["dataset"], r["scene_name"])
        if key not in scenes:
            scenes[key] = find_scene(data["data"], *key)
        s = scenes[key]
        objs = [s.object(i) for i in r["object_ids"]]
        assert all(o.label in r["question"] or o.label in " ".join(r["options"] or []) for o in objs[:1])
        qt, gt = r["question_type"], r["ground_truth"]
        if qt == "room_size_estimation":
            assert gt == f"{s.room_area:.1f}"
        elif qt == "object_counting":
            label = re.match(r"How many (.+)\(s\) are in this room\?", r["question"]).group(1)
            assert gt == str(s.label_counts()[label]) == str(len(objs))
        elif qt == "object_size_estimation":
            assert gt == str(int(round(objs[0].longest_side * 100)))
        elif qt == "object_abs_distance":
            assert gt == f"{box_distance(objs[0], objs[1]):.1f}"
        else:
            continue
        checked.add(qt)
        assert s.contains_xy(*r["start_pose"][:2])
    assert checked == {"room_size_estimation", "object_counting", "object_size_estimation", "object_abs_distance"}


def test_each_scans_questions_depend_on_the_seed_and_the_scan_only(built, data):
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.envs.real_scans import find_scene

    env = load_config(preset="debug", overrides=BUILD_ENV[2:]).env
    scene = find_scene(data["data"], "scannetpp", "3db0a1c8f3")

    def draw():
        rng = np.random.default_rng([SEED, zlib.crc32(b"scannetpp/3db0a1c8f3")])
        return make_dataset.scene_questions(scene, env, rng, PER_SCENE)[0]

    first = draw()
    assert first == draw()
    mine = [
        {k: v for k, v in r.items() if k not in ("id", "video")}
        for r in _rows(built["parquet"])
        if r["dataset"] == "scannetpp"
    ]
    assert [{**r, "start_pose": pytest.approx(r["start_pose"])} for r in first] == mine


def test_the_parquet_source_replays_each_row(built, data):
    """env.scene_source=parquet: each episode asks its row's question from the row's start pose; an
    appearance-order row's order is the one the env's own sweep shows; the oracle scores every row."""
    from a2c_ppo_acktr.common.scoring import score_prediction
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

    rows = _rows(built["parquet"])
    cfg = load_config(
        preset="debug",
        overrides=[
            *BUILD_ENV[2:],
            "--env.scene_source",
            "parquet",
            "--env.vsibench_path",
            str(built["parquet"]),
            "--env.data_root",
            str(data["data"]),
            "--env.max_turns",
            "3",
        ],
    ).env
    env = VSIEnv(cfg)
    appearance = [i for i, r in enumerate(rows) if r["question_type"] == "obj_appearance_order"]
    assert appearance, "no appearance-order row was built"
    for i in [0, 1, len(rows) - 1, *appearance[:2]]:
        row = rows[i]
        obs, info = env.reset(seed=i, options={"scene_index": i})
        assert (env.pose.x, env.pose.y, env.pose.yaw_deg) == pytest.approx(tuple(row["start_pose"]))
        assert row["question"] in obs["text"] and info["ground_truth"] == row["ground_truth"]
        assert env.question.object_ids == row["object_ids"]
        if row["question_type"] == "obj_appearance_order":
            first = dict(zip(env.appearance_order, env._appearance_frames))
            frames = [first[o] for o in row["object_ids"]]
            assert frames == sorted(frames) and len(set(frames)) == len(frames)
        done, score = False, None
        while not done:
            _, _, term, trunc, info = env.step(env.oracle_reply())
            done, score = term or trunc, info.get("score")
        assert score == 1.0 == score_prediction(row["question_type"], row["ground_truth"], row["ground_truth"])


def test_rows_the_env_cannot_replay_are_refused_in_one_line(built, data):
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv
    from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError

    base = {
        "image_size": 32,
        "data_root": str(data["data"]),
        "vsibench_path": str(built["parquet"]),
        "scene_source": "parquet",
    }
    # An appearance order read from a 4-frame sweep is not the order of an 8-frame one.
    env = VSIEnv(EnvConfig(**base, num_sweep_frames=8))
    with pytest.raises(
        VSIBenchRowError,
        match=r"obj_appearance_order\) was built for another sweep \(env.num_sweep_frames=4 there, 8 here\)",
    ):
        env.reset(seed=0)
    other_types = [t for t in EnvConfig().question_types if t != "obj_appearance_order"]
    VSIEnv(EnvConfig(**base, num_sweep_frames=8, question_types=other_types)).reset(seed=0)
    # The benchmark's own rows are no training set.
    env = VSIEnv(EnvConfig(**{**base, "vsibench_path": str(data["test_parquet"])}))
    with pytest.raises(
        VSIBenchRowError,
        match="test.parquet row 0 .* has no start_pose or object_ids: env.scene_source=parquet trains on a set",
    ):
        env.reset(seed=0)


def test_out_is_claimed_as_every_output_is(built, data, tmp_path):
    with pytest.raises(ConfigError, match="already holds output; choose another directory, or pass --overwrite"):
        make_dataset.main(_build_argv(data, built["out"]))
    out = tmp_path / "one"
    (out / "old").mkdir(parents=True)
    (out / "old" / "keep.txt").write_text("x")
    argv = [
        "--arkitscenes",
        str(_dirs(data["data"])["arkitscenes"]),
        "--out",
        str(out),
        "--questions-per-scene",
        "2",
        "--no-progress",
        "--overwrite",
        *BUILD_ENV,
    ]
    assert make_dataset.main(argv) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("one.old-")]
    assert len(aside) == 1 and (aside[0] / "old" / "keep.txt").read_text() == "x"
    assert len(_rows(out / make_dataset.ROWS_FILE)) == 2


def test_bad_inputs_are_one_line_errors(data, tmp_path):
    with pytest.raises(ConfigError, match="pass at least one of --scannet, --arkitscenes, --scannetpp"):
        make_dataset.main(["--out", str(tmp_path / "a")])
    with pytest.raises(FileNotFoundError, match="--scannetpp .*nowhere: not a directory"):
        make_dataset.main(["--scannetpp", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")])
    with pytest.raises(ConfigError, match="--questions-per-scene=0 must be >= 1"):
        make_dataset.main(
            [
                "--arkitscenes",
                str(data["data"] / "arkitscenes"),
                "--out",
                str(tmp_path / "a"),
                "--questions-per-scene",
                "0",
            ]
        )
    with pytest.raises(FileNotFoundError, match="no scannetpp scans .*mesh_aligned_0.05.ply.* found under"):
        make_dataset.main(["--scannetpp", str(data["data"] / "arkitscenes"), "--out", str(tmp_path / "a")])
    # Roots in unrelated places: training could not find every scan from one env.data_root.
    import shutil

    shutil.copytree(_dirs(data["data"])["scannet"] / "scene0001_00", tmp_path / "odd" / "place" / "scene0001_00")
    with pytest.raises(
        ConfigError,
        match="scannet scene scene0001_00 .*cannot be found from .*env.data_root; put the datasets side by side",
    ):
        make_dataset.main(
            [
                "--scannet",
                str(tmp_path / "odd"),
                "--arkitscenes",
                str(data["data"] / "arkitscenes"),
                "--out",
                str(tmp_path / "a"),
            ]
        )
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_ppo_trains_on_the_set_and_eval_reads_it(built, data, tmp_path):
    """One PPO iteration on the debug preset with env.scene_source=parquet, then eval_vsi.py on its
    checkpoint asks the same file's rows (the checkpoint's env names it)."""
    import eval_vsi
    import main_vsi
    from a2c_ppo_acktr.rl.train import run_training

    run = tmp_path / "run"
    cfg = main_vsi.parse_config(
        [
            "--preset",
            "debug",
            *BUILD_ENV[2:],
            "--env.scene_source",
            "parquet",
            "--env.vsibench_path",
            str(built["parquet"]),
            "--env.data_root",
            str(data["data"]),
            "--ppo.num_iterations",
            "1",
            "--log.output_dir",
            str(run),
            "--log.progress_bar",
            "false",
            "--log.tensorboard",
            "false",
            "--model.max_new_tokens",
            "16",
        ]
    )
    last = run_training(cfg)
    assert last is not None and (Path(last) / "policy").is_dir()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics and "losses/policy_loss" in metrics[-1]
    out = tmp_path / "eval"
    assert (
        eval_vsi.main(
            [
                "policy",
                "--checkpoint",
                str(last),
                "--limit",
                "3",
                "--eval.batch_size",
                "3",
                "--log.progress_bar",
                "false",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rep = json.loads((out / "report.json").read_text())
    assert rep["meta"]["question_set"] == "parquet" and rep["meta"]["num_skipped"] == 0
    assert sorted(r["episode_id"] for r in rep["records"]) == ["vsibench-0", "vsibench-1", "vsibench-2"]


# ------------------------------------------------------------------------------ docs/DATA.md
def _doc_commands(doc: Path) -> list[str]:
    """The command lines of the doc's ```bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _script_usage(script: Path) -> int:
    """How many operands a launcher's ``# Usage:  bash scripts/X.sh A B ...`` line names."""
    usage = re.search(r"^# Usage:\s+bash \S+ (.*)$", script.read_text(encoding="utf-8"), re.M)
    return len(usage.group(1).split()) if usage else 0


def test_every_command_in_data_md_parses():
    """Each command of docs/DATA.md runs its program's own parsing: the builder's flags, the config
    overrides of every python entry point, a launcher's operands and the overrides in its EXTRA_ARGS."""
    import eval_vsi
    import main_vsi
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.config.cli import check_flag_typos, parse_run_config

    doc = REPO / "docs" / "DATA.md"
    commands = _doc_commands(doc)
    assert len(commands) >= 8
    seen = set()
    for line in commands:
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        head = words[:3] if words[:2] == ["python", "-m"] else words[:2]
        argv = words[len(head) :]
        where = f"docs/DATA.md: {line}"
        if head == ["python", "-m", "a2c_ppo_acktr.envs.make_dataset"]:
            parser = make_dataset.build_parser()
            args, extra = parser.parse_known_args(argv)
            check_flag_typos(parser, extra)
            load_config(args.config, args.preset, extra)
            assert args.exclude, f"{where}: a build without --exclude would train on test scenes"
        elif head == ["python", "eval_vsi.py"]:
            parser = eval_vsi.build_parser()
            args, extra = parser.parse_known_args(eval_vsi.expand_mode(argv))
            check_flag_typos(parser, extra)
            assert args.out, where
        elif head == ["python", "main_vsi.py"]:
            main_vsi.parse_config(argv)
        elif head[0] == "python" and head[1] in ("vlm_traj_label.py", "vlm_traj_preprocess.py", "train_sft.py"):
            parse_run_config(argv, None)
        elif head[0] in ("bash", "sbatch"):
            script = REPO / next(w for w in words[1:] if w.endswith(".sh"))
            assert script.is_file(), where
            operands = words[words.index(script.relative_to(REPO).as_posix()) + 1 :]
            assert len(operands) == _script_usage(script), (
                f"{where}: {script.name} takes {_script_usage(script)} operands"
            )
            preset = env.get("PRESET", "qwen2.5-vl-3b")
            extra = shlex.split(env.get("EXTRA_ARGS", ""))
            if script.name == "run_vsi_qwen.sh":
                main_vsi.parse_config(["--preset", preset, *extra])
            elif script.name == "run_vsi_sft.sh":
                assert env.get("DATA_PATH"), f"{where}: run_vsi_sft.sh needs DATA_PATH"
                parse_run_config(["--preset", preset, *extra], None)
        else:
            pytest.fail(f"{where}: no parser known for this command; add one to this test")
        seen.add(" ".join(head))
    assert {"python -m a2c_ppo_acktr.envs.make_dataset", "python eval_vsi.py", "python vlm_traj_label.py"} <= seen

"""Bad-input harness: every input file kind a user hands the package, mutated the ways files go
wrong (truncated, bytes flipped, re-encoded as Latin-1/UTF-16, fields dropped), read by the loader
the entry scripts use. Each outcome must be a success or one of the errors the entry scripts print
as one line (:data:`a2c_ppo_acktr.config.cli.USER_ERRORS`); any other exception is a crash deep in a
stack, and the mutation that caused it is named. Model directories, adapters and checkpoints have
their own fault tests (tests/test_run_dir_safety.py), scans theirs (tests/test_real_scans.py).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from a2c_ppo_acktr.config.cli import USER_ERRORS, _environment_error

SEED = 20261122
MUTATIONS_PER_KIND = 40


def mutations(
    data: bytes, rng: random.Random, structured: Callable[[random.Random], bytes] | None = None
) -> list[tuple[str, bytes]]:
    """``(description, mutated bytes)``: truncations, byte flips, byte deletions, re-encodings and,
    when given, ``structured`` mutations (fields dropped or retyped by the kind itself)."""
    out = [
        ("empty", b""),
        ("latin-1", data.decode("utf-8").encode("latin-1", errors="replace") + "é".encode("latin-1")),
        ("utf-16", data.decode("utf-8").encode("utf-16")),
        ("nul bytes", data.replace(b" ", b"\x00", 3)),
    ]
    for k in range(MUTATIONS_PER_KIND):
        cut = rng.randrange(1, max(2, len(data)))
        pos = rng.randrange(len(data))
        kind = k % 4
        if kind == 0:
            out.append((f"truncated at {cut}", data[:cut]))
        elif kind == 1:
            out.append(
                (f"byte {pos} flipped", data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1 :])
            )
        elif kind == 2:
            out.append((f"byte {pos} deleted", data[:pos] + data[pos + 1 :]))
        elif structured is not None:
            out.append(("structured", structured(rng)))
        else:
            out.append((f"byte {pos} duplicated", data[:pos] + data[pos : pos + 1] + data[pos:]))
    return out


def check(load: Callable[[Path], object], path: Path, good: bytes, rng: random.Random, structured=None) -> int:
    """Load every mutation of ``good`` written to ``path``; returns how many were refused cleanly."""
    allowed = USER_ERRORS
    refused = 0
    for what, data in mutations(good, rng, structured):
        path.write_bytes(data)
        try:
            load(path)
        except Exception as e:  # noqa: BLE001 - the point: classify every exception
            if isinstance(e, allowed) or _environment_error(e):
                refused += 1
                continue
            pytest.fail(f"{path.name} {what}: {type(e).__name__}: {e} (not a one-line user error)")
    return refused


# ------------------------------------------------------------------------------------ kinds
def _drop_field(rows: list[dict], rng: random.Random, fields: list[str]) -> bytes:
    rows = json.loads(json.dumps(rows))
    row = rng.choice(rows)
    field = rng.choice(fields)
    if rng.random() < 0.5:
        row.pop(field, None)
    else:
        row[field] = rng.choice([None, 3, [], {}, "", "x"])
    return "\n".join(json.dumps(r) for r in rows).encode()


def test_config_yaml(tmp_path):
    from a2c_ppo_acktr.config.arguments import load_config

    good = (
        b"seed: 3\nenv:\n  max_turns: 2\n  image_size: 32\nppo:\n  lr: 1.0e-4\n  num_iterations: 2\nlog:\n  run_name: "
        b"x\n"
    )
    (tmp_path / "ok.yaml").write_bytes(good)
    assert load_config(preset="debug", config=str(tmp_path / "ok.yaml")).ppo.lr == 1e-4  # the unmutated file loads

    def structured(rng):
        return rng.choice(
            [
                b"ppo:\n  lr: nan\n",
                b"ppo:\n  lr: [1]\n",
                b"env:\n  max_turns: -1\n",
                b"- a\n- b\n",
                b"ppo: 3\n",
                b"ppo:\n  lr: 1\n  lr: 2\n",
                b"envv:\n  x: 1\n",
            ]
        )

    refused = check(
        lambda p: load_config(preset="debug", config=str(p)), tmp_path / "c.yaml", good, random.Random(SEED), structured
    )
    assert refused > 10


def test_score_file(tmp_path):
    from a2c_ppo_acktr import reports

    rows = [
        {"id": i, "question_type": t, "prediction": p, "ground_truth": g}
        for i, (t, p, g) in enumerate(
            [("object_counting", "3", "3"), ("room_size_estimation", "20.5", "21"), ("route_planning", "B.", "B")]
        )
    ]
    good = "\n".join(json.dumps(r) for r in rows).encode()
    refused = check(
        reports.score_file,
        tmp_path / "s.jsonl",
        good,
        random.Random(SEED + 1),
        lambda rng: _drop_field(rows, rng, ["question_type", "prediction", "ground_truth", "id"]),
    )
    assert refused >= 1


def test_vsibench_rows(tmp_path):
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

    rows = [
        {
            "id": 1,
            "dataset": "scannet",
            "scene_name": "scene0001_00",
            "question_type": "object_counting",
            "question": "How many chair(s) are in this room?",
            "options": None,
            "ground_truth": "2",
        },
        {
            "id": 2,
            "dataset": "arkitscenes",
            "scene_name": "41069042",
            "question_type": "route_planning",
            "question": "How do I get to the bin?",
            "options": ["A. left", "B. right"],
            "ground_truth": "A",
        },
    ]
    good = "\n".join(json.dumps(r) for r in rows).encode()
    (tmp_path / "ok.jsonl").write_bytes(good)
    assert len(load_vsibench_rows(tmp_path / "ok.jsonl")) == 2
    refused = check(
        load_vsibench_rows,
        tmp_path / "rows.jsonl",
        good,
        random.Random(SEED + 2),
        lambda rng: _drop_field(
            rows, rng, ["id", "dataset", "scene_name", "question_type", "question", "options", "ground_truth"]
        ),
    )
    assert refused > 10


def test_sft_dataset_rows(tmp_path):
    from PIL import Image

    from a2c_ppo_acktr.common.prompts import assistant_message, build_messages, format_response, Answer
    from SFT.data import SFTDataset

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    obs = {"images": [np.zeros((8, 8, 3), dtype=np.uint8)], "text": "How many chair(s) are in this room?"}
    rows = [
        {"messages": build_messages(obs) + [assistant_message(format_response("x", Answer("2")))], "images": ["a.png"]}
    ] * 2
    good = "\n".join(json.dumps(r) for r in rows).encode()
    (tmp_path / "ok.jsonl").write_bytes(good)
    assert len(SFTDataset(tmp_path / "ok.jsonl")) == 2
    refused = check(
        SFTDataset,
        tmp_path / "train.jsonl",
        good,
        random.Random(SEED + 3),
        lambda rng: _drop_field(rows, rng, ["messages", "images"]),
    )
    assert refused > 10


def test_label_trajectories_and_metrics_logs(tmp_path):
    from a2c_ppo_acktr.labels.labeling import read_episodes
    from a2c_ppo_acktr.run.logger import read_metrics

    eps = [{"episode_id": f"e{i}", "scene_id": "proc_000001", "score": 1.0, "turns": []} for i in range(3)]
    good = ("\n".join(json.dumps(e) for e in eps) + "\n").encode()
    check(read_episodes, tmp_path / "trajectories.jsonl", good, random.Random(SEED + 4))
    rows = [{"iteration": i, "rollout/episode_score_mean": 0.5} for i in range(1, 4)]
    check(
        read_metrics,
        tmp_path / "metrics.jsonl",
        ("\n".join(json.dumps(r) for r in rows) + "\n").encode(),
        random.Random(SEED + 5),
    )


def test_report_json(tmp_path):
    from a2c_ppo_acktr import reports

    good = json.dumps({"name": "x", "overall": 12.5, "table": [], "per_type": {}}).encode()
    refused = check(reports.load_report, tmp_path / "report.json", good, random.Random(SEED + 6))
    assert refused > 10


def test_ply_meshes(tmp_path):
    from a2c_ppo_acktr.envs.real_scans import read_ply_mesh

    verts = "\n".join(f"{x} {y} {z}" for x, y, z in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)])
    good = (
        "ply\nformat ascii 1.0\nelement vertex 4\nproperty float x\nproperty float y\nproperty float z\n"
        "element face 2\nproperty list uchar int vertex_indices\nend_header\n" + verts + "\n3 0 1 2\n3 0 1 3\n"
    ).encode()
    (tmp_path / "ok.ply").write_bytes(good)
    assert len(read_ply_mesh(tmp_path / "ok.ply")[1]) == 2
    refused = check(read_ply_mesh, tmp_path / "m.ply", good, random.Random(SEED + 7))
    assert refused > 10


def test_rank_state_files(tmp_path):
    from a2c_ppo_acktr.run.checkpoint import load_pickle, save_pickle

    import torch

    save_pickle(
        {"rng": {"torch": torch.ones(3, dtype=torch.uint8), "numpy": np.random.default_rng(0)}, "k": [1, 2.5, "x"]},
        tmp_path / "ok.pkl",
    )
    good = (tmp_path / "ok.pkl").read_bytes()
    # latin-1/utf-16 re-encodings of a binary file make no sense: decode bytes 1:1 instead
    allowed = USER_ERRORS
    rng = random.Random(SEED + 8)
    for k in range(MUTATIONS_PER_KIND * 2):
        pos = rng.randrange(len(good))
        data = good[:pos] if k % 2 else good[:pos] + bytes([good[pos] ^ (1 << rng.randrange(8))]) + good[pos + 1 :]
        (tmp_path / "r.pkl").write_bytes(data)
        try:
            load_pickle(tmp_path / "r.pkl")
        except Exception as e:  # noqa: BLE001
            assert isinstance(e, allowed), f"rank state byte {pos}: {type(e).__name__}: {e}"


# ------------------------------------------------------------------------ one line and exit 2, by entry script
def _one_line(capsys, prog: str, main: Callable[[], object]) -> str:
    """Run an entry script's ``main`` as its ``__main__`` does; the error must be one line, exit 2."""
    from a2c_ppo_acktr.config.cli import run_main

    capsys.readouterr()
    code = run_main(main, prog)
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def _labelled(tmp_path: Path, **changes) -> Path:
    """A one-episode label directory; ``changes`` edit the episode (``turn.*`` keys edit its turn)."""
    from PIL import Image

    lab = tmp_path / "lab"
    (lab / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(lab / "images" / "a.png")
    turn = {
        "images": ["images/a.png"],
        "observation_text": "How many chair(s)?",
        "teacher_output": '{"thoughts": "x", "action": "2"}',
        "teacher_error": None,
        "valid": True,
        "executed": "2",
    }
    ep = {"episode_id": "ep1", "scene_id": "s1", "question_type": "object_counting", "score": 1.0, "turns": [turn]}
    for key, value in changes.items():
        (turn if key.startswith("turn.") else ep)[key.removeprefix("turn.")] = value
    (lab / "trajectories.jsonl").write_text(json.dumps(ep) + "\n")
    return lab


@pytest.mark.parametrize(
    "change, message",
    [
        ({"turn.images": "images/a.png"}, "turns[0].images is str"),
        ({"turns": "none"}, "turns is str"),
        ({"score": "1.0"}, "score is str"),
        ({"scene_id": 7}, "scene_id is int"),
        ({"turn.teacher_output": {"action": 2}}, "turns[0].teacher_output is dict"),
        ({"turn.observation_text": None}, "turns[0].observation_text is NoneType"),
        ({"turn.images": ["../../etc/passwd"]}, "must stay inside the label directory"),
        ({"turn.images": ["/etc/passwd"]}, "must stay inside the label directory"),
    ],
)
def test_preprocessing_refuses_mistyped_label_fields_in_one_line(tmp_path, capsys, change, message):
    import vlm_traj_preprocess

    lab = _labelled(tmp_path, **change)
    line = _one_line(
        capsys,
        "vlm_traj_preprocess.py",
        lambda: vlm_traj_preprocess.main(
            ["--preset", "debug", "--label.out_dir", str(lab), "--label.dataset_dir", str(tmp_path / "data")]
        ),
    )
    assert message in line and not (tmp_path / "data").exists()


def test_a_corrupt_label_meta_is_one_line(tmp_path, capsys):
    import vlm_traj_label

    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "label_meta.json").write_bytes(b'{"env": {"image_s\xff')
    line = _one_line(
        capsys,
        "vlm_traj_label.py",
        lambda: vlm_traj_label.main(["--preset", "debug", "--label.out_dir", str(lab), "--label.num_episodes", "1"]),
    )
    assert "label_meta.json is damaged" in line


@pytest.mark.parametrize(
    "content, message",
    [
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ('{"question_type": "object_counting", "prediction": "3", "ground_truth": ' + "9" * 5000 + "}", "digits"),
    ],
)
def test_score_file_lines_nested_deep_or_with_huge_integers_are_malformed_lines(tmp_path, capsys, content, message):
    import eval_vsi

    (tmp_path / "p.jsonl").write_text(content + "\n")
    line = _one_line(
        capsys,
        "eval_vsi.py",
        lambda: eval_vsi.main(["--score-file", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o")]),
    )
    assert message in line


@pytest.mark.parametrize("data", [b"", b"not parquet at all"])
def test_an_empty_or_non_parquet_vsibench_file_is_one_line(tmp_path, capsys, data):
    import eval_vsi

    (tmp_path / "rows.parquet").write_bytes(data)
    line = _one_line(
        capsys,
        "eval_vsi.py",
        lambda: eval_vsi.main(
            [
                "--preset",
                "debug",
                "--dummy",
                "--vsibench",
                str(tmp_path / "rows.parquet"),
                "--data-root",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
            ]
        ),
    )
    assert "is not a readable parquet file" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "-1"], "seed=-1 must be in [0, 2147483647]"),
        (["--seed", str(2**70)], "must be in [0, 2147483647]"),
        (["--log.output_dir", "."], "is the current directory"),
        (["--log.output_dir", "x/.."], "is the current directory"),
        (["--log.output_dir", "afile"], "is a file"),
        (["--model.lora_target_modules", "no_such_module"], "LoRA could not be applied"),
    ],
)
def test_training_arguments_that_cannot_run_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    import main_vsi

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    base = [
        "--preset",
        "debug",
        "--ppo.num_iterations",
        "1",
        "--log.progress_bar",
        "false",
        "--log.tensorboard",
        "false",
    ]
    if "--log.output_dir" not in args:
        base += ["--log.output_dir", str(tmp_path / "run")]
    line = _one_line(capsys, "main_vsi.py", lambda: main_vsi.main(base + args))
    assert message in line
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "afile"
    ]  # no run (a released lock file at most)


def test_yaml_merge_keys_work_and_an_alias_bomb_is_one_short_line(tmp_path, capsys):
    import main_vsi

    from a2c_ppo_acktr.config.arguments import MAX_YAML_NODES, load_config
    from a2c_ppo_acktr.config.cli import MAX_ERROR_CHARS

    (tmp_path / "merge.yaml").write_text("ppo:\n  <<: {lr: 0.002, num_iterations: 3}\n  num_iterations: 4\n")
    cfg = load_config(preset="debug", config=str(tmp_path / "merge.yaml"))
    assert cfg.ppo.lr == 0.002 and cfg.ppo.num_iterations == 4  # merged, and the explicit key wins
    levels = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
    )
    (tmp_path / "bomb.yaml").write_text(levels + "log:\n  run_name: *i\n")  # 9**9 strings if expanded
    line = _one_line(
        capsys,
        "main_vsi.py",
        lambda: main_vsi.main(["--preset", "debug", "--config", str(tmp_path / "bomb.yaml"), "--print-config"]),
    )
    assert f"more than {MAX_YAML_NODES}: refused as an alias bomb" in line and len(line) < MAX_ERROR_CHARS + 200
    few = (
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, "
        "*b, *b, *b]\nlog:\n  run_name: *c\n"
    )
    (tmp_path / "few.yaml").write_text(few)  # under the limit, but a 729-item value in the message
    line = _one_line(
        capsys,
        "main_vsi.py",
        lambda: main_vsi.main(["--preset", "debug", "--config", str(tmp_path / "few.yaml"), "--print-config"]),
    )
    assert len(line) <= MAX_ERROR_CHARS + 100


def test_an_image_past_the_pixel_bound_is_refused_from_its_header(tmp_path, monkeypatch):
    """A PNG whose header claims more than MAX_IMAGE_PIXELS is reported (and refused by load_image)
    without being decoded; one at the bound still loads."""
    from PIL import Image

    import SFT.data as data

    monkeypatch.setattr(data, "MAX_IMAGE_PIXELS", 64 * 64)  # the bound's logic, on small files
    Image.new("L", (64, 65)).save(tmp_path / "big.png")
    Image.new("L", (64, 64)).save(tmp_path / "ok.png")
    decoded = []
    monkeypatch.setattr(Image.Image, "convert", lambda self, *a, **k: decoded.append(1) or self)
    assert (
        data._image_problem(tmp_path / "big.png") == "too large (64x65 pixels, more than 4096 (a decompression bomb?))"
    )
    with pytest.raises(ValueError, match="64x65 pixels, more than 4096"):
        data.load_image(tmp_path / "big.png")
    assert not decoded and data._image_problem(tmp_path / "ok.png") is None
    data.load_image(tmp_path / "ok.png")
    assert decoded == [1]

"""Real VSI-Bench rows: loading (parquet, JSON, JSONL), validation, and conversion to questions.

Row fields (docs/BENCHMARK.md): ``id``, ``dataset`` (``arkitscenes`` | ``scannet`` |
``scannetpp``), ``scene_name``, ``question_type``, ``question``, ``options`` (list of ``"A. ..."``
strings for multiple choice, null otherwise) and ``ground_truth`` (an option letter, or a number as a
string). Every row is checked on load so that a bad file fails at start with the row it is about.

Rows written by ``python -m a2c_ppo_acktr.envs.make_dataset`` (training sets built from real scans,
read with ``env.scene_source=parquet``) carry more fields, checked when present: ``start_pose``
(``[x, y, yaw_deg]``, the pose the question was generated from and the episode starts at),
``object_ids`` (the scan's objects the question is about, first = the main one), ``sweep`` (for
``obj_appearance_order``: the sweep settings its order was read with) and ``video``
(``<dataset>/<scene_name>.mp4`` when the scan's video was found, else null).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from a2c_ppo_acktr.common.jsonl import JsonlError, iter_jsonl
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.safe_paths import plain_name_problem
from a2c_ppo_acktr.common.scoring import MULTIPLE_CHOICE_TYPES, TASKS
from a2c_ppo_acktr.envs.questions import Question

DATASETS = ("arkitscenes", "scannet", "scannetpp")
REQUIRED_FIELDS = ("id", "dataset", "scene_name", "question_type", "question", "ground_truth")
# What a training row (env.scene_source=parquet) needs beyond the benchmark's fields.
TRAINING_FIELDS = ("start_pose", "object_ids")


class VSIBenchRowError(ValueError, UserError):
    """A VSI-Bench row is malformed; the message names the row and the field."""


def load_vsibench_rows(path: str | Path) -> list[dict]:
    """Read and validate VSI-Bench rows (the benchmark's, or a training set's: see the module docstring).

    Args:
        path: A ``.parquet`` file (needs pyarrow), a ``.json`` file holding a list of rows, or a
            ``.jsonl`` file with one row per line.

    Returns:
        The rows as dicts, validated and normalised (``options`` a list of str or None,
        ``ground_truth`` a str, ``id`` an int).

    Raises:
        FileNotFoundError: If the file does not exist.
        VSIBenchRowError: On an unknown extension or a malformed row (named by its position and id).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"VSI-Bench rows file {str(path)!r} does not exist; set env.vsibench_path to the benchmark's parquet/JSON "
            "file"
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # optional heavy import, only for parquet files

        import pyarrow as pa

        try:
            raw = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise VSIBenchRowError(
                f"{path} is not a readable parquet file ({str(e).splitlines()[0]}); pass the benchmark's test parquet"
            ) from None
        if not raw:
            raise VSIBenchRowError(f"{path} holds no rows; pass the benchmark's test parquet")
    elif suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise VSIBenchRowError(f"{path} is not a JSON file of rows ({str(e).splitlines()[0][:200]})") from None
        if isinstance(raw, dict) and isinstance(raw.get("rows"), list):
            raw = raw["rows"]
        if not isinstance(raw, list):
            raise VSIBenchRowError(
                f"{path}: a .json rows file must hold a list of row objects (or {{'rows': [...]}}), got "
                f"{type(raw).__name__}"
            )
    elif suffix == ".jsonl":
        try:
            raw = [row for _, row in iter_jsonl(path)]
        except JsonlError as e:
            raise VSIBenchRowError(str(e)) from e
    else:
        raise VSIBenchRowError(f"{path}: unknown rows format {suffix!r}; use .parquet, .json or .jsonl")
    return [validate_row(row, where=f"{path.name} row {i}") for i, row in enumerate(raw)]


def validate_row(row: Any, where: str = "row") -> dict:
    """Check one row and return a normalised copy (see :func:`load_vsibench_rows`)."""
    if not isinstance(row, dict):
        raise VSIBenchRowError(f"{where}: a row must be an object, got {type(row).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in row or row[k] is None]
    if missing:
        raise VSIBenchRowError(f"{where}: missing fields {missing}; a row needs {list(REQUIRED_FIELDS)}")
    out = dict(row)
    where = f"{where} (id {row['id']!r})"
    try:
        out["id"] = int(row["id"])
    except (TypeError, ValueError):
        raise VSIBenchRowError(f"{where}: id must be an integer, got {row['id']!r}") from None
    if not isinstance(row["dataset"], str) or row["dataset"] not in DATASETS:
        raise VSIBenchRowError(f"{where}: dataset {row['dataset']!r} is not one of {list(DATASETS)}")
    qtype = row["question_type"]
    if not isinstance(qtype, str) or qtype not in TASKS:
        raise VSIBenchRowError(f"{where}: question_type {qtype!r} is not one of {list(TASKS)}")
    for key in ("scene_name", "question"):
        if not isinstance(row[key], str) or not row[key].strip():
            raise VSIBenchRowError(f"{where}: {key} must be a non-empty string, got {row[key]!r}")
    # The name becomes a directory and a video file under the data roots: it must not be a path.
    problem = plain_name_problem(row["scene_name"])
    if problem:
        raise VSIBenchRowError(
            f"{where}: scene_name {row['scene_name'][:80]!r} {problem}; a scene is named like scene0011_00 or 41069025"
        )
    gt = str(row["ground_truth"]).strip()
    options = row.get("options")
    if qtype in MULTIPLE_CHOICE_TYPES:
        if not isinstance(options, (list, tuple)) or len(options) < 2:
            raise VSIBenchRowError(f"{where}: a {qtype} row needs a list of at least 2 options, got {options!r}")
        options = [str(o) for o in options]
        letters = [o.split(".", 1)[0].strip() for o in options]
        if gt not in letters:
            raise VSIBenchRowError(f"{where}: ground_truth {gt!r} is not one of the option letters {letters}")
    else:
        options = None
        try:
            value = float(gt)
        except ValueError:
            raise VSIBenchRowError(f"{where}: ground_truth {gt!r} of a {qtype} row must be a number") from None
        if not math.isfinite(value) or value <= 0:
            raise VSIBenchRowError(f"{where}: ground_truth {gt!r} must be a finite number > 0 (MRA divides by it)")
    out["options"] = options
    out["ground_truth"] = gt
    if row.get("start_pose") is not None:
        pose = row["start_pose"]
        try:
            values = [float(v) for v in pose]
        except (TypeError, ValueError):
            values = []
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise VSIBenchRowError(f"{where}: start_pose must be three finite numbers [x, y, yaw_deg], got {pose!r}")
        out["start_pose"] = values
    if row.get("object_ids") is not None:
        ids = row["object_ids"]
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            raise VSIBenchRowError(f"{where}: object_ids must be a list of object ids (integers >= 0), got {ids!r}")
        out["object_ids"] = [int(i) for i in ids]
    return out


def check_training_rows(rows: list[dict], path: str | Path) -> None:
    """Refuse rows that lack the fields of a training set (:data:`TRAINING_FIELDS`), such as the
    benchmark's own test rows given to ``env.scene_source=parquet`` by mistake."""
    for i, row in enumerate(rows):
        missing = [k for k in TRAINING_FIELDS if row.get(k) is None]
        if missing:
            raise VSIBenchRowError(
                f"{Path(path).name} row {i} (id {row.get('id')!r}) has no {' or '.join(missing)}: "
                "env.scene_source=parquet trains on a set "
                "written by python -m a2c_ppo_acktr.envs.make_dataset (the benchmark's rows are for "
                "env.scene_source=vsibench)"
            )


def question_from_row(row: dict) -> Question:
    """A :class:`Question` from a VSI-Bench row (validated first).

    ``object_ids`` is the row's (a training row's), else empty (the benchmark's rows do not name mesh
    objects); ``meta`` keeps the row's id, dataset and scene name, and its start pose when it has one.
    """
    row = validate_row(row)
    meta = {"id": row["id"], "dataset": row["dataset"], "scene_name": row["scene_name"], "source": "vsibench"}
    if row.get("start_pose") is not None:
        meta["start_pose"] = tuple(row["start_pose"])
    return Question(
        question_type=row["question_type"],
        question=row["question"].strip(),
        options=row["options"],
        ground_truth=row["ground_truth"],
        object_ids=list(row.get("object_ids") or []),
        meta=meta,
    )


def scene_for_row(row: dict, data_root: str | Path):
    """Load the scan a row is about from ``data_root`` (via ``real_scans.find_scene``).

    Raises:
        SceneLoadError: When the scene is not available locally, or its name or a link leads out of
            ``data_root``; the message names the row and the scene.
    """
    from a2c_ppo_acktr.envs.real_scans import SceneLoadError, find_scene  # real-scan loading only when used

    try:
        return find_scene(data_root, row["dataset"], row["scene_name"])
    except SceneLoadError as e:
        raise SceneLoadError(
            f"VSI-Bench row {row.get('id')!r} needs {row['dataset']} scene {row['scene_name'][:80]!r} from "
            f"{str(data_root)!r}: {e}"
        ) from e

"""Teacher labelling: run episodes with a teacher and record them for SFT (``vlm_traj_label.py``).

Output folder (``label.out_dir``)::

    trajectories.jsonl     one line per finished episode (appended, flushed and fsynced)
    images/<episode>/<sha1>.png   the observation images, each distinct frame stored once
    label_meta.json        env config, teacher and seed the file was made with (resume checks it)

An episode line holds ``episode_id`` (deterministic: ``ep<seed+index>``), ``index``, ``seed``,
``env_id``, ``system`` (the env's system prompt when it has its own, else None: VSI's), the env's
``episode_fields()`` (``scene_id``, ``dataset``, ``question``, ``question_type``, ``options``,
``ground_truth``, ``object_ids``; a game's deal is its ``question``), ``score`` (the benchmark
score, 0 without an answer; a game's: 1 when won), ``return``, ``terminated``,
``truncated``, ``teacher`` and ``turns``; each turn holds ``observation_text``, ``images`` (paths
relative to the folder), ``teacher_output``, ``teacher_error`` (None unless the teacher failed),
``action`` (repr of the parsed teacher output), ``valid``, ``explore`` (a random action was executed
instead), ``executed`` (the text sent to the env), ``reward``, ``collided`` and ``pose``.

Resuming: a rerun skips the episode ids already in the file, except episodes in which the teacher
failed (a turn with a ``teacher_error``: a server outage, a timeout): those are labelled again and
the new line is appended; readers keep the last line of an episode id (:func:`latest_episodes`). A
run killed mid-write leaves at most one torn last line, which is cut off with a warning; images are
content-addressed and rewritten identically, so nothing is duplicated. One labeller at a time
appends to a folder (its lock, :class:`a2c_ppo_acktr.run.rundir.RunLock`); a second one stops with one
line naming the first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig
from a2c_ppo_acktr.common import atomic
from a2c_ppo_acktr.common.jsonl import read_log
from a2c_ppo_acktr.common.prompts import Invalid
from a2c_ppo_acktr.envs.pool import run_slots
from a2c_ppo_acktr.labels.teachers import Teacher, TeacherReply, make_teacher

logger = logging.getLogger(__name__)

TRAJECTORIES = "trajectories.jsonl"
META = "label_meta.json"
IMAGES = "images"


def episode_id(seed: int, index: int) -> str:
    """Deterministic id of episode ``index`` of a labelling run seeded ``seed``."""
    return f"ep{seed + index:08d}"


# ---------------------------------------------------------------------------------------------
# Reading and appending
# ---------------------------------------------------------------------------------------------
def read_episodes(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """Episodes of a ``trajectories.jsonl`` (:func:`a2c_ppo_acktr.common.jsonl.read_log`).

    A torn last line (a run killed while writing) is ignored with a warning; with ``repair`` it is
    also cut from the file so appends start on a fresh line. A bad line elsewhere is corruption
    and raises.

    Args:
        path: The JSONL file (a missing file reads as empty).
        repair: Truncate a torn last line in place.

    Raises:
        ValueError: A line other than the last is not a JSON object.
    """
    return read_log(path, repair=repair, fix="the file is corrupt beyond a torn last line")


def teacher_failed(episode: dict) -> bool:
    """Whether a turn of ``episode`` holds a teacher failure (labelled again on resume)."""
    return any(t.get("teacher_error") for t in episode.get("turns", []))


def latest_episodes(episodes: list[dict]) -> tuple[list[dict], int]:
    """``(episodes, superseded)``: the last line of each episode id, in first-seen order, and how many
    earlier lines a relabelling replaced."""
    latest: dict[str, dict] = {}
    for ep in episodes:
        latest[ep["episode_id"]] = ep  # dict order stays that of the first line with this id
    return list(latest.values()), len(episodes) - len(latest)


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line and make it durable before returning (flush + fsync)."""
    line = json.dumps(record, ensure_ascii=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def save_image(out_dir: Path, ep_id: str, image: np.ndarray) -> str:
    """Write ``image`` as PNG under ``images/<ep_id>/`` named by its content hash; returns the relative path."""
    from PIL import Image

    arr = np.ascontiguousarray(image, dtype=np.uint8)
    digest = hashlib.sha1(arr.tobytes() + str(arr.shape).encode()).hexdigest()[:16]
    rel = f"{IMAGES}/{ep_id}/{digest}.png"
    target = out_dir / rel
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic.open_atomic(target, "wb") as f:
            Image.fromarray(arr).save(f, format="PNG")
    return rel


# ---------------------------------------------------------------------------------------------
# Episodes
# ---------------------------------------------------------------------------------------------
@dataclass
class _Running:
    """An episode in flight in one env slot."""

    index: int
    ep_id: str
    obs: dict
    rng: np.random.Generator
    turns: list = field(default_factory=list)
    ret: float = 0.0


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


def make_env(cfg: RunConfig) -> Any:
    """One environment of ``cfg.env.env_id`` (:func:`a2c_ppo_acktr.envs.registry.make_env`)."""
    from a2c_ppo_acktr.envs.registry import make_env as make_registered_env

    return make_registered_env(cfg.env)


def _run_meta(cfg: RunConfig, teacher: Teacher) -> dict:
    return {
        "env": dataclasses.asdict(cfg.env),
        "seed": cfg.label.seed,
        "epsilon": cfg.label.epsilon,
        "teacher": teacher.describe(),
    }


def _meta_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, e.g. ``["env.look (missing -> 'shaded')"]``; a key absent
    from an older meta (a config field added since) is listed, not filled with today's default,
    because the older run did not have that setting (e.g. the ``flat`` renderer before ``env.look``)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "missing"), new.get(k, "missing")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _meta_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(
                f"{prefix}{k} ({a!r} -> {b!r})"
                if not isinstance(a, (dict, list)) and not isinstance(b, (dict, list))
                else f"{prefix}{k}"
            )
    return out


def _check_meta(out_dir: Path, meta: dict) -> None:
    path = out_dir / META
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON
            raise ConfigError(
                f"{path} is damaged ({str(e).splitlines()[0][:200]}); it records the setup of the episodes in "
                f"{out_dir}: "
                "restore it, or label into a new label.out_dir"
            ) from None
        new = json.loads(json.dumps(meta))
        if old != new:
            raise ConfigError(
                f"{out_dir} was labelled with a different setup (differs in: {_meta_diff(old, new)}); resuming would "
                "mix episodes. "
                "Use a new label.out_dir, or rerun with the original settings"
            )
    else:
        atomic.write_json(meta, path)


def label_trajectories(
    cfg: RunConfig, teacher: Optional[Teacher] = None, envs: Optional[list] = None, progress: Optional[bool] = None
) -> dict:
    """Run ``cfg.label.num_episodes`` teacher episodes and append them to ``trajectories.jsonl``.

    Args:
        cfg: ``label`` (teacher, seed, epsilon, batch size, out_dir) and ``env``.
        teacher: A ready teacher (tests); None builds ``cfg.label.teacher``.
        envs: Ready envs, one per slot (tests); None builds ``cfg.label.batch_size`` of them.
        progress: Show a tqdm bar; None follows ``cfg.log.progress_bar``.

    Returns:
        Summary: ``written``, ``skipped`` (already done), ``mean_score`` and failure counts of
        the episodes written by this call.

    Raises:
        RunLockedError: another process is labelling into ``label.out_dir`` (its appends and this
            one's would interleave).
    """
    from a2c_ppo_acktr.envs.registry import game_config
    from a2c_ppo_acktr.run.rundir import check_output_path, directory_lock

    game_config(cfg.env)  # a bad env.game stops here, before a teacher's model loads
    with directory_lock(check_output_path(cfg.label.out_dir, option="label.out_dir")):
        return _label_trajectories(cfg, teacher, envs, progress)


def _label_trajectories(
    cfg: RunConfig, teacher: Optional[Teacher], envs: Optional[list], progress: Optional[bool]
) -> dict:
    """:func:`label_trajectories` inside the lock of ``label.out_dir``."""
    from tqdm.auto import tqdm

    lab = cfg.label
    out_dir = Path(lab.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher = teacher if teacher is not None else make_teacher(lab, cfg.model)
    _check_meta(out_dir, _run_meta(cfg, teacher))
    jsonl = out_dir / TRAJECTORIES
    latest, _ = latest_episodes(read_episodes(jsonl, repair=True))
    failed = [ep for ep in latest if teacher_failed(ep)]
    done = {ep["episode_id"] for ep in latest} - {ep["episode_id"] for ep in failed}
    if failed:
        logger.warning("%d episode(s) in %s had teacher failures: labelling them again", len(failed), jsonl)
    todo = [i for i in range(lab.num_episodes) if episode_id(lab.seed, i) not in done]
    skipped = lab.num_episodes - len(todo)
    if envs is None:
        from a2c_ppo_acktr.envs.vsi_env import share_scene_cache

        envs = [make_env(cfg) for _ in range(min(lab.batch_size, max(len(todo), 1)))]
        share_scene_cache(envs)
    max_turns = cfg.env.max_turns
    stats = {
        "written": 0,
        "skipped": skipped,
        "score_sum": 0.0,
        "failed_turns": 0,
        "invalid_turns": 0,
        "explore_turns": 0,
    }
    bar = tqdm(
        total=lab.num_episodes,
        initial=skipped,
        desc=f"label[{teacher.name}]",
        disable=not (cfg.log.progress_bar if progress is None else progress),
    )

    def begin(slot: int, index: int) -> _Running:
        obs, _ = envs[slot].reset(seed=lab.seed + index)
        return _Running(index, episode_id(lab.seed, index), obs, np.random.default_rng([lab.seed, index, 7]))

    def act(active: Sequence[int], runs: Sequence[_Running]) -> list[TeacherReply]:
        return teacher.generate([run.obs for run in runs], [envs[s] for s in active])

    def step(s: int, run: _Running, reply: TeacherReply) -> bool:
        env = envs[s]
        label_action = env.unwrapped.parse(reply.text)
        # Exploration executes a random action but keeps the teacher's label (DAgger-style states);
        # never on the last turn, where only an answer scores.
        explore = len(run.turns) < max_turns - 1 and bool(run.rng.random() < lab.epsilon)
        executed = env.unwrapped.random_reply(run.rng) if explore else reply.text
        images = [save_image(out_dir, run.ep_id, img) for img in run.obs["images"]]
        obs, reward, terminated, truncated, info = env.step(executed)
        run.turns.append(
            {
                "observation_text": run.obs["text"],
                "images": images,
                "teacher_output": reply.text,
                "teacher_error": reply.error,
                "teacher_attempts": reply.attempts,
                "action": repr(label_action),
                "valid": not isinstance(label_action, Invalid),
                "explore": explore,
                "executed": executed,
                "reward": float(reward),
                "collided": bool(info.get("collided", False)),
                "pose": _jsonable(info.get("pose")),
            }
        )
        stats["failed_turns"] += reply.error is not None
        stats["invalid_turns"] += isinstance(label_action, Invalid)
        stats["explore_turns"] += explore
        run.ret += float(reward)
        run.obs = obs
        if not (terminated or truncated):
            return False
        record = _episode_record(cfg, teacher, env, run, info, terminated, truncated)
        append_line(jsonl, record)
        stats["written"] += 1
        stats["score_sum"] += record["score"]
        bar.update(1)
        return True

    run_slots(len(envs), todo, begin, act, step)
    bar.close()
    written = stats.pop("written")
    score_sum = stats.pop("score_sum")
    return {
        "written": written,
        "mean_score": score_sum / written if written else float("nan"),
        **stats,
        "path": str(jsonl),
    }


def _episode_record(
    cfg: RunConfig, teacher: Teacher, env: Any, run: _Running, info: dict, terminated: bool, truncated: bool
) -> dict:
    fields = env.unwrapped.episode_fields()
    score = info.get("score")
    return {
        "episode_id": run.ep_id,
        "index": run.index,
        "seed": cfg.label.seed + run.index,
        "env_id": cfg.env.env_id,
        "system": run.obs.get("system"),  # the env's own system prompt (a game's), the same every turn; None: VSI's
        **_jsonable(fields),
        "score": float(score) if score is not None else 0.0,
        "return": run.ret,
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "num_turns": len(run.turns),
        "teacher": teacher.describe(),
        "turns": run.turns,
    }

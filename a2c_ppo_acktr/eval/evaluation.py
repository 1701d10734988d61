"""Running evaluation episodes with a policy, a teacher or a random baseline, batched.

An *agent* is anything with ``act(observations, envs) -> list[str]`` (one response text per
observation): :class:`PolicyAgent` wraps a :class:`~a2c_ppo_acktr.policy.model.VLMPolicy`, the oracle
teacher of :mod:`a2c_ppo_acktr.labels.teachers` already has that shape, and :class:`DummyAgent` writes
uniformly random legal actions (the chance baseline).

Question sets are fixed and seeded so that every run (base model, SFT, PPO, oracle, dummy) answers
the same questions:

* procedural: episode ``i`` asks type ``question_types[i % len(question_types)]`` in procedural
  scene ``i`` of an env whose ``scene_seed`` is ``eval.seed`` (scene seed ``eval.seed + i``, apart
  from the training scenes ``env.scene_seed + k``, ``k < env.num_scenes``), reset with seed
  ``eval.seed + i``;
* VSI-Bench: the rows of ``env.vsibench_path`` whose scans are found under ``env.data_root``; rows
  whose scene is not available locally are counted and listed as skipped, never silently dropped.
  The same for a training set of rows (``env.scene_source=parquet``).

:func:`run_episodes` keeps ``eval.batch_size`` envs busy: each agent call answers every active env
at once, and a finished env immediately starts the next question.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from a2c_ppo_acktr import reports
from a2c_ppo_acktr.config.arguments import ROW_SOURCES, EnvConfig, RunConfig
from a2c_ppo_acktr.common.prompts import Answer, Invalid, Move, response_spans
from a2c_ppo_acktr.reports import EpisodeRecord, PictureLayout, TurnRecord
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.scoring import DEFAULT_SCORING_RULE
from a2c_ppo_acktr.policy.vision_cache import vision_cache_of

logger = logging.getLogger(__name__)

# What the comparison and the learning curves write into --out, beside whatever the folder holds.
COMPARE_FILES = ("compare.md", "compare.png")
CURVES_FILE = "learning_curves.png"


class EvaluationError(RuntimeError, UserError):
    """Nothing could be evaluated (every question skipped); the message names the first reason."""


def _scans_hint(data_root: Optional[str]) -> str:
    """A pointer to ``DATA_ROOT/scans`` when the scans sit one level down (make_mini_vsibench's layout)."""
    if data_root and (Path(data_root) / "scans").is_dir():
        return f" (it holds scans/: did you mean --data-root {Path(data_root) / 'scans'}?)"
    return ""


class Agent(Protocol):
    """Maps a batch of observations (and their envs, for privileged agents) to response texts."""

    def act(self, observations: Sequence[dict], envs: Sequence[Any]) -> list[str]: ...


# -------------------------------------------------------------------------------------- agents
class PolicyAgent:
    """A :class:`~a2c_ppo_acktr.policy.model.VLMPolicy` as an eval agent (greedy by default).

    Args:
        policy: The policy (``act(observations, greedy=..., blind=...)`` returning ``texts``).
        greedy: Greedy decoding; otherwise sampling at ``temperature``.
        temperature: Sampling temperature when not greedy (``eval.temperature``); it replaces the
            temperature head's per-row value so that runs sample alike.
        blind: Withhold the images (``eval.blind``); the policy builds the prompt with
            ``prompts.build_messages(obs, blind=True)``.
        zero_images: The blind twin (``eval.zero_images``): every frame is replaced by zeros of
            its shape before the policy sees it, so prompts and tokens are the sighted run's.
    """

    def __init__(
        self, policy: Any, greedy: bool = True, temperature: float = 1.0, blind: bool = False, zero_images: bool = False
    ) -> None:
        if blind and zero_images:
            raise ValueError(
                "blind (no images in the prompt) and zero_images (black frames in the same prompt) exclude each other"
            )
        self.policy = policy
        self.greedy = greedy
        self.temperature = temperature
        self.blind = blind
        self.zero_images = zero_images

    def act(self, observations: Sequence[dict], envs: Sequence[Any]) -> list[str]:
        if self.zero_images:
            observations = [zeroed_images(o) for o in observations]
        if self.greedy:
            out = self.policy.act(list(observations), greedy=True, blind=self.blind)
        else:
            out = self.policy.act(list(observations), greedy=False, blind=self.blind, temperature=self.temperature)
        return list(out.texts)


def zeroed_images(observation: dict) -> dict:
    """``observation`` with every image replaced by zeros of the same shape and dtype (a new dict)."""
    return {**observation, "images": tuple(np.zeros_like(np.asarray(im)) for im in observation["images"])}


class DummyAgent:
    """Uniformly random legal actions: the chance reference row.

    Each turn it answers with probability ``answer_prob`` (always on the last turn, so every
    episode is answered and its score is the chance score), otherwise it makes a random move.
    Answers are a uniformly random option letter, or a uniformly random number from
    :data:`~a2c_ppo_acktr.envs.vsi_env.DUMMY_NUMBER_RANGES`. It reads only the question's type and options (never the
    answer).
    Each episode draws from its own stream, seeded by ``seed`` and the scene and question, so the
    answers do not depend on the batch size or on which env slot ran the episode.

    Args:
        seed: Base seed (``eval.seed``).
        answer_prob: Probability of answering on a turn that is not the last.
    """

    name = "dummy"

    def __init__(self, seed: int, answer_prob: float = 0.5) -> None:
        if not 0.0 < answer_prob <= 1.0:
            raise ValueError(f"answer_prob={answer_prob} must be in (0, 1]")
        self.seed = seed
        self.answer_prob = answer_prob
        self.rng = np.random.default_rng(seed)  # used by random_answer when no stream is given
        self._streams: dict[int, np.random.Generator] = {}

    def random_answer(
        self, question_type: str, options: Optional[Sequence[str]], rng: Optional[np.random.Generator] = None
    ) -> str:
        """A uniformly random legal answer for a question of this type
        (:func:`~a2c_ppo_acktr.envs.vsi_env.random_answer`)."""
        from a2c_ppo_acktr.envs.vsi_env import random_answer  # the env modules load only when an env is made

        return random_answer(question_type, options, self.rng if rng is None else rng)

    def _stream(self, env: Any) -> np.random.Generator:
        base = env.unwrapped
        if base.turn == 0 or id(env) not in self._streams:
            fields = base.episode_fields()
            key = zlib.crc32(f"{fields['scene_id']}|{fields['question_type']}|{fields['question']}".encode("utf-8"))
            self._streams[id(env)] = np.random.default_rng([self.seed, key])
        return self._streams[id(env)]

    def respond(self, env: Any) -> str:
        """The dummy's response for one env's current state (the env's chance reply; a game's: a random action
        token)."""
        return env.unwrapped.chance_reply(self._stream(env), self.answer_prob)

    def act(self, observations: Sequence[dict], envs: Sequence[Any]) -> list[str]:
        return [self.respond(env) for env in envs]


# ---------------------------------------------------------------------------------- question sets
@dataclass(frozen=True)
class EpisodeSpec:
    """One question of the evaluation set.

    Attributes:
        episode_id: Stable id used in reports (``proc-0007``, ``vsibench-1234``).
        seed: Seed passed to ``env.reset``.
        question_type: The type asked (procedural) or the row's type (VSI-Bench).
        scene_index: Procedural: index of the scene (seed ``env.scene_seed + index`` in the eval
            env, whose ``scene_seed`` is ``eval.seed``). VSI-Bench: index of the row in the env's
            row list (the file's rows of the configured types, in file order).
        scene_key: VSI-Bench: ``(dataset, scene_name)`` of the row's scan; None for procedural.
        game: A game of :mod:`~a2c_ppo_acktr.envs.registry` (not VSI): the env is reset with ``seed`` only.
    """

    episode_id: str
    seed: int
    question_type: str
    scene_index: int
    scene_key: Optional[tuple[str, str]] = None
    game: bool = False


def procedural_specs(cfg: RunConfig) -> list[EpisodeSpec]:
    """The fixed, seeded procedural question set: ``eval.num_episodes`` spread evenly over the types."""
    types = list(cfg.env.question_types)
    return [
        EpisodeSpec(
            episode_id=f"proc-{i:04d}", seed=cfg.eval.seed + i, question_type=types[i % len(types)], scene_index=i
        )
        for i in range(cfg.eval.num_episodes)
    ]


def game_specs(cfg: RunConfig) -> list[EpisodeSpec]:
    """The fixed, seeded episode set of a game env: ``eval.num_episodes`` deals, episode ``i`` reset
    with seed ``eval.seed + i`` (training envs are seeded from ``seed``; the default eval seed is
    far from them)."""
    from a2c_ppo_acktr.envs.registry import task_name

    task = task_name(cfg.env.env_id)
    return [
        EpisodeSpec(episode_id=f"{task}-{i:04d}", seed=cfg.eval.seed + i, question_type=task, scene_index=i, game=True)
        for i in range(cfg.eval.num_episodes)
    ]


def eval_specs(cfg: RunConfig, vsibench_limit: Optional[int] = None) -> list[EpisodeSpec]:
    """The evaluation set ``cfg`` asks for: a game's deals, the rows of ``env.vsibench_path``
    (``env.scene_source`` vsibench or parquet) or the procedural questions."""
    from a2c_ppo_acktr.envs.registry import is_vsi

    if not is_vsi(cfg.env.env_id):
        return game_specs(cfg)
    if cfg.env.scene_source in ROW_SOURCES:
        return vsibench_specs(cfg, vsibench_limit)
    return procedural_specs(cfg)


def vsibench_specs(cfg: RunConfig, limit: Optional[int] = None) -> list[EpisodeSpec]:
    """VSI-Bench rows of ``env.vsibench_path`` of the configured question types, grouped by scene.

    Args:
        cfg: Run config with ``env.vsibench_path`` set.
        limit: Keep the first ``limit`` rows (file order, after filtering by type), None for all.
    """
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

    if not cfg.env.vsibench_path or not cfg.env.data_root:
        raise ValueError(
            "VSI-Bench evaluation needs env.vsibench_path (--vsibench ROWS) and env.data_root (--data-root SCANS)"
        )
    # The same filtering as the env's own row list, so a spec's index names the same row there.
    rows = [r for r in load_vsibench_rows(cfg.env.vsibench_path) if r["question_type"] in cfg.env.question_types]
    indexed = list(enumerate(rows))[:limit]
    # Grouping by scene lets each env's scene cache load a scan once.
    indexed.sort(key=lambda ir: (str(ir[1]["dataset"]), str(ir[1]["scene_name"]), ir[0]))
    return [
        EpisodeSpec(
            episode_id=f"vsibench-{r['id']}",
            seed=cfg.eval.seed + i,
            question_type=r["question_type"],
            scene_index=i,
            scene_key=(str(r["dataset"]), str(r["scene_name"])),
        )
        for i, r in indexed
    ]


def eval_env_config(cfg: RunConfig) -> EnvConfig:
    """The env config of evaluation: procedural scenes seeded from ``eval.seed`` (held out from
    training, whose scenes are ``env.scene_seed + k`` for ``k < env.num_scenes``)."""
    from a2c_ppo_acktr.envs.registry import is_vsi

    if cfg.env.scene_source in ROW_SOURCES or not is_vsi(cfg.env.env_id):
        return cfg.env
    return dataclasses.replace(cfg.env, scene_source="procedural", scene_seed=cfg.eval.seed)


# A procedural scene may not support a question type (e.g. no object appears twice for counting);
# the spec then moves to scene index + k * _REDRAW_STRIDE, deterministically, at most this often.
_MAX_REDRAWS = 20
_REDRAW_STRIDE = 1_000_003


def _reset(env: Any, spec: EpisodeSpec, failed_scans: dict[tuple[str, str], str]) -> tuple[dict, Optional[str]]:
    """Reset ``env`` to pose ``spec``'s question. Returns ``(observation, skip reason or None)``."""
    if spec.game:
        obs, _ = env.reset(seed=spec.seed)
        return obs, None
    if spec.scene_key is not None:
        from a2c_ppo_acktr.envs.real_scans import SceneLoadError

        if spec.scene_key in failed_scans:
            return {}, failed_scans[spec.scene_key]
        try:
            obs, _ = env.reset(seed=spec.seed, options={"scene_index": spec.scene_index})
        except (SceneLoadError, FileNotFoundError) as e:
            failed_scans[spec.scene_key] = f"scan {spec.scene_key[0]}/{spec.scene_key[1]} not available: {e}"
            return {}, failed_scans[spec.scene_key]
        except Exception as e:  # noqa: BLE001 - one bad scan must not abort the evaluation: skipped, counted, reported
            failed_scans[spec.scene_key] = (
                f"scan {spec.scene_key[0]}/{spec.scene_key[1]} failed to load ({type(e).__name__}: {e})"
            )
            logger.warning("%s; its questions are skipped", failed_scans[spec.scene_key])
            return {}, failed_scans[spec.scene_key]
        return obs, None
    from a2c_ppo_acktr.envs.questions import QuestionUnavailable

    reasons = []
    for k in range(_MAX_REDRAWS):
        index = spec.scene_index + k * _REDRAW_STRIDE
        try:
            obs, _ = env.reset(seed=spec.seed, options={"scene_index": index, "question_type": spec.question_type})
            return obs, None
        except QuestionUnavailable as e:
            reasons.append(str(e))
    reason = (
        f"no procedural scene among {_MAX_REDRAWS} draws supports a {spec.question_type} question (last reason: "
        f"{reasons[-1]}); "
        "more sweep frames (env.num_sweep_frames) or other room sizes (env.procedural_min_room/max_room) may help"
    )
    logger.warning("%s skipped: %s", spec.episode_id, reason)
    return {}, reason


# -------------------------------------------------------------------------------------- episodes
@dataclass
class EvalResult:
    """What :func:`run_episodes` returns.

    Attributes:
        records: One per evaluated episode, in spec order.
        skipped: ``{"episode_id", "reason"}`` for specs that could not be posed.
        pictures: Trajectory pictures written.
        seconds: Wall time of the run.
    """

    records: list[EpisodeRecord]
    skipped: list[dict[str, str]] = field(default_factory=list)
    pictures: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def describe_action(action: Any) -> str:
    """A short caption of a parsed action."""
    if isinstance(action, Move):
        return f"move(rot={action.rotation_deg:g}, fwd={action.forward_m:g})"
    if isinstance(action, Answer):
        return f"answer({action.text})"
    if isinstance(action, Invalid):
        return f"invalid({action.reason})"
    return str(action)


def thoughts_of(text: str) -> str:
    """The thoughts the agent wrote, read from the response's thoughts span ("" when absent)."""
    span, _ = response_spans(text)
    if span is None:
        return ""
    return json.loads(text[span[0] : span[1]])


def _pose_of(env: Any) -> Optional[tuple[float, float, float]]:
    """The env's pose (VSI), or None for a game, which has none."""
    pose = getattr(env, "pose", None)
    return None if pose is None else _pose_tuple(pose)


def _pose_tuple(pose: Any) -> tuple[float, float, float]:
    if hasattr(pose, "yaw_deg"):
        return float(pose.x), float(pose.y), float(pose.yaw_deg)
    x, y, yaw = pose
    return float(x), float(y), float(yaw)


@dataclass
class _Slot:
    """An env busy with one spec."""

    index: int
    spec: EpisodeSpec
    obs: dict
    record: EpisodeRecord
    frames: Optional[list[np.ndarray]]


def make_eval_env(env_cfg: EnvConfig) -> Any:
    """One env of ``env_cfg.env_id`` for evaluation (the package's own class, no wrappers)."""
    from a2c_ppo_acktr.envs.registry import make_env

    return make_env(env_cfg)


def run_episodes(
    agent: Agent,
    specs: Sequence[EpisodeSpec],
    env_cfg: EnvConfig,
    batch_size: int,
    *,
    picture_dir: Optional[Path] = None,
    num_pictures: int = 0,
    layout: PictureLayout = PictureLayout(),
    progress: bool = True,
    make_env: Callable[[EnvConfig], Any] = make_eval_env,
) -> EvalResult:
    """Evaluate ``agent`` on every spec, ``batch_size`` envs stepped together.

    Args:
        agent: Maps observations (and envs) to response texts.
        specs: The question set (see :func:`procedural_specs`, :func:`vsibench_specs`).
        env_cfg: Env configuration (image size, turns, shaping...).
        batch_size: Envs stepped together (``eval.batch_size``).
        picture_dir: Where trajectory pictures go (``None``: no pictures).
        num_pictures: Pictures for the first ``num_pictures`` evaluated episodes (spec order, so
            they cover different question types).
        progress: Show a tqdm bar over episodes.
        make_env: Env factory (tests may inject one).

    Returns:
        The records in spec order, the skipped specs, the written pictures.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    failed_scans: dict[tuple[str, str], str] = {}
    from a2c_ppo_acktr.envs.pool import run_slots
    from a2c_ppo_acktr.envs.vsi_env import share_scene_cache

    envs = [make_env(env_cfg) for _ in range(min(batch_size, len(specs)))]
    share_scene_cache(envs)
    done: dict[int, EpisodeRecord] = {}
    result = EvalResult(records=[])
    pictured = 0
    bar = tqdm(total=len(specs), desc="eval", unit="ep", disable=not progress)

    def begin(k: int, job: tuple[int, EpisodeSpec]) -> Optional[_Slot]:
        nonlocal pictured
        index, spec = job
        obs, skip = _reset(envs[k], spec, failed_scans)
        if skip is not None:
            result.skipped.append({"episode_id": spec.episode_id, "reason": skip})
            bar.update(1)
            return None
        record = EpisodeRecord(episode_id=spec.episode_id, **envs[k].unwrapped.episode_fields())
        want_picture = picture_dir is not None and pictured < num_pictures
        pictured += int(want_picture)
        return _Slot(index=index, spec=spec, obs=obs, record=record, frames=[] if want_picture else None)

    def act(active: Sequence[int], slots: Sequence[_Slot]) -> list[str]:
        return agent.act([slot.obs for slot in slots], [envs[k] for k in active])

    def step(k: int, slot: _Slot, text: str) -> bool:
        if slot.frames is not None:
            slot.frames.append(np.asarray(slot.obs["images"][-1]))
        obs, reward, terminated, truncated, info = envs[k].step(text)
        rec = slot.record
        action = info.get("action")
        rec.turns += 1
        rec.reward += float(reward)
        rec.num_invalid += int(not info.get("valid", True))
        rec.steps.append(
            TurnRecord(
                turn=rec.turns,
                text=text,
                thoughts=thoughts_of(text),
                action=describe_action(action),
                valid=bool(info.get("valid", True)),
                reward=float(reward),
                pose=_pose_tuple(info["pose"]) if "pose" in info else _pose_of(envs[k].unwrapped),
            )
        )
        slot.obs = obs
        if isinstance(action, Answer) and terminated:
            rec.answer = action.text
        if (terminated or truncated) and "score" in info:  # VSI: the answer's score; a game: 1 when won
            rec.score = float(info["score"])
        if not (terminated or truncated):
            return False
        rec.truncated = bool(truncated and not terminated)
        done[slot.index] = rec
        if slot.frames is not None:
            result.pictures.append(_picture(envs[k], rec, slot.frames, picture_dir, layout))
        bar.update(1)
        return True

    # A policy agent's frozen vision tower encodes each distinct frame once over the evaluation.
    with vision_cache_of(getattr(agent, "policy", None)):
        run_slots(len(envs), list(enumerate(specs)), begin, act, step)
    bar.close()
    for env in envs:
        env.close()
    result.records = [done[i] for i in sorted(done)]
    result.seconds = time.perf_counter() - start
    return result


def _picture(env: Any, record: EpisodeRecord, frames: list[np.ndarray], out_dir: Path, layout: PictureLayout) -> Path:
    # The map's caption is VSI's (a game's overview is its board, which takes no caption; the
    # picture's header says won/lost for games, reports.picture_header).
    answer = record.answer if record.answer is not None else "none"
    caption = f"answer {answer} | truth {record.ground_truth} | score {record.score:.2f}"
    topdown = env.unwrapped.overview_image(caption=caption, highlight_ids=record.object_ids, size=layout.map_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    return reports.trajectory_picture(record, frames, topdown, out_dir / f"{record.episode_id}.png", layout)


# -------------------------------------------------------------------------------------- top level
def evaluate(
    cfg: RunConfig,
    agent: Agent,
    *,
    name: str,
    out_dir: str | Path,
    meta: Optional[dict[str, Any]] = None,
    vsibench_limit: Optional[int] = None,
) -> dict[str, Any]:
    """Evaluate ``agent`` on the configured question set and write the reports into ``out_dir``.

    Procedural questions unless ``env.scene_source`` is vsibench or parquet (then the rows of
    ``env.vsibench_path`` whose scans are under ``env.data_root``).

    Args:
        cfg: The run config (``env``, ``eval``, ``log.progress_bar``).
        agent: The agent to evaluate.
        name: Row name in tables.
        out_dir: Output directory (``report.json``, ``report.md``, ``tasks.png``, ``trajectories/``).
        meta: Extra description stored in the report (model path, adapter, checkpoint...).
        vsibench_limit: Evaluate only the first N VSI-Bench rows.

    Returns:
        The report dict.

    Raises:
        EvaluationError: If no episode could be evaluated (e.g. no scan of the VSI-Bench rows is found).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from a2c_ppo_acktr.envs.registry import is_vsi

    game = not is_vsi(cfg.env.env_id)
    rows = cfg.env.scene_source in ROW_SOURCES and not game
    specs = eval_specs(cfg, vsibench_limit)
    env_cfg = eval_env_config(cfg)
    result = run_episodes(
        agent,
        specs,
        env_cfg,
        cfg.eval.batch_size,
        picture_dir=out / "trajectories",
        num_pictures=cfg.eval.num_trajectory_pictures,
        progress=cfg.log.progress_bar,
    )
    if not result.records:
        raise EvaluationError(
            f"no episode could be evaluated: {len(result.skipped)} of {len(specs)} questions were skipped; check "
            "--data-root"
            f"{_scans_hint(cfg.env.data_root)} (the first reason: "
            f"{result.skipped[0]['reason'] if result.skipped else 'no questions'})"
        )
    full_meta = {
        "question_set": "game" if game else cfg.env.scene_source if rows else "procedural",
        "env_id": cfg.env.env_id,
        "num_questions": len(specs),
        "num_skipped": len(result.skipped),
        "skipped": result.skipped,
        "greedy": cfg.eval.greedy,
        "temperature": None if cfg.eval.greedy else cfg.eval.temperature,
        "blind": cfg.eval.blind,
        "zero_images": cfg.eval.zero_images,
        "scoring_rule": cfg.env.scoring_rule,
        "eval_seed": cfg.eval.seed,
        "seconds": round(result.seconds, 2),
        "trajectory_pictures": [str(p) for p in result.pictures],
        **(meta or {}),
    }
    report = reports.build_report(result.records, name=name, meta=full_meta)
    reports.write_report(report, out)
    cfg.save(out / "config.yaml")
    return report


# ------------------------------------------------------------------------------------------- CLI
def _checkpoint_run_data(checkpoint: str | Path) -> tuple[dict[str, Any], Optional[Path]]:
    """The resolved config (as a dict) of the run that wrote ``checkpoint``, and the file it came from.

    The config is looked for in the checkpoint directory (``main_vsi.py`` writes one into every
    checkpoint), then in the run directory two levels up (``<run>/checkpoints/checkpoint-N``), then
    one level up (``<run>/best``). ``({}, None)`` when none is found.
    """
    from a2c_ppo_acktr.config.arguments import load_yaml

    ckpt = Path(checkpoint)
    if not ckpt.is_dir():
        raise FileNotFoundError(
            f"checkpoint {str(ckpt)!r} is not a directory; pass a checkpoint-<N> directory written by main_vsi.py"
        )
    for candidate in (ckpt / "config.yaml", ckpt.parent.parent / "config.yaml", ckpt.parent / "config.yaml"):
        if candidate.is_file():
            return load_yaml(candidate), candidate
    return {}, None


def checkpoint_model_config(checkpoint: str | Path) -> dict[str, Any]:
    """The ``model`` section of the run that wrote ``checkpoint`` ({} when no config.yaml is found).

    The heads and the adapter only fit the model they were trained on, so an evaluation of a
    checkpoint starts from that run's model settings (command-line overrides still win). The
    checkpoint's own adapter replaces the SFT warm start the run began from (``sft_adapter`` dropped).
    """
    data, _ = _checkpoint_run_data(checkpoint)
    model = dict(data.get("model") or {})
    model.pop("sft_adapter", None)
    return model


def checkpoint_config(checkpoint: str | Path) -> RunConfig:
    """The run config of the training run that wrote ``checkpoint`` (its model, env, ... sections),
    ready for :func:`load_policy` and for making the env it was trained on.

    The SFT adapter the run warm-started from is dropped (the checkpoint holds its own adapter).

    Raises:
        FileNotFoundError: ``checkpoint`` is not a directory, or no ``config.yaml`` belongs to it.
    """
    data, path = _checkpoint_run_data(checkpoint)
    if path is None:
        raise FileNotFoundError(
            f"no config.yaml found for checkpoint {str(checkpoint)!r} (looked in it and in its run directory); "
            "build the config with arguments.load_config(preset=...) instead"
        )
    data = dict(data)
    data["model"] = checkpoint_model_config(checkpoint)
    return RunConfig.from_dict(data)


# The sections of a checkpoint's run that only its training reads; an evaluation takes them with its model.
_TRAINING_SECTIONS = ("ppo", "rollout")
# What eval_vsi.py's own flags set in the env section (named in the override warning).
_ENV_FLAGS = {"scene_source": "--vsibench", "vsibench_path": "--vsibench", "data_root": "--data-root"}


def resolve_config(args: Any, extra: Sequence[str]) -> RunConfig:
    """The run config of an evaluation, from lowest to highest precedence:

    * the defaults;
    * with ``--checkpoint``: the env section of the run that wrote it (an agent is evaluated on the
      env it was trained on: image size, turns, sweep frames...);
    * ``--preset``, then ``--config``;
    * with ``--checkpoint``: its model section (the adapter and heads only fit that model), and its
      training sections (``ppo``, ``rollout``): an evaluation reads neither, but a preset's would be
      checked against the checkpoint's model (``ppo.temperature_loss=entropy_target`` needs the
      temperature head that a run with a fixed temperature does not have) and refuse a valid checkpoint;
    * the flags (``--model-path``, ``--blind``, ``--vsibench``, ``--data-root``), then the
      ``--section.key`` overrides.

    Each env field that the preset, the config file, a flag or an override changes relative to the
    checkpoint's env is logged in one warning (``env.image_size: checkpoint 112 -> 224 (override)``).
    """
    from a2c_ppo_acktr.config.arguments import merge_dicts as merge_sections
    from a2c_ppo_acktr.config.arguments import load_yaml, parse_overrides, preset_path

    ckpt_env: dict[str, Any] = {}
    ckpt_model: dict[str, Any] = {}
    ckpt_training: dict[str, Any] = {}
    ckpt_source: Optional[Path] = None
    if getattr(args, "checkpoint", None):
        data, ckpt_source = _checkpoint_run_data(args.checkpoint)
        if ckpt_source is None:
            logger.warning(
                "checkpoint %s has no config.yaml (nor its run directory): evaluating on the env of the "
                "preset/config/defaults, "
                "which may not be the one it was trained on",
                args.checkpoint,
            )
        ckpt_env = dict(data.get("env") or {})
        ckpt_model = checkpoint_model_config(args.checkpoint) if ckpt_source is not None else {}
        ckpt_training = {k: dict(data[k]) for k in _TRAINING_SECTIONS if data.get(k)}
    preset_data: dict[str, Any] = {}
    if args.preset is not None:
        preset_data = load_yaml(preset_path(args.preset))
        preset_data.setdefault("preset", args.preset)
    config_data = load_yaml(args.config) if args.config is not None else {}
    flags: dict[str, Any] = {}
    if args.model_path:
        flags.setdefault("model", {})["model_path"] = args.model_path
    if args.blind:
        flags.setdefault("eval", {})["blind"] = True
    if args.zero_images:
        flags.setdefault("eval", {})["zero_images"] = True
    if getattr(args, "scoring_rule", None):
        flags.setdefault("env", {})["scoring_rule"] = args.scoring_rule
    if args.vsibench:
        flags.setdefault("env", {}).update(scene_source="vsibench", vsibench_path=args.vsibench)
    if args.data_root:
        flags.setdefault("env", {})["data_root"] = args.data_root
    over = parse_overrides(extra)

    merged: dict[str, Any] = {"env": ckpt_env} if ckpt_env else {}
    ckpt_layer = {**({"model": ckpt_model} if ckpt_model else {}), **ckpt_training}
    for layer in (preset_data, config_data, ckpt_layer, flags, over):
        merged = merge_sections(merged, layer)
    cfg = RunConfig.from_dict(merged)
    if ckpt_env:
        layers = [
            ("override", over),
            *[(flag, {"env": {k: v}}) for k, v in flags.get("env", {}).items() for flag in [_ENV_FLAGS[k]]],
            (f"--config {args.config}", config_data),
            (f"preset {args.preset}", preset_data),
        ]
        _warn_env_changes(args.checkpoint, ckpt_source, RunConfig.from_dict({"env": ckpt_env}).env, cfg.env, layers)
    from a2c_ppo_acktr.envs.registry import game_config

    game_config(cfg.env)  # a bad env.game stops here, before a model loads
    return cfg


def _warn_env_changes(
    checkpoint: Any, source: Optional[Path], trained: EnvConfig, now: EnvConfig, layers: Sequence[tuple[str, dict]]
) -> list[str]:
    """Log (and return) one line per env field that differs from the checkpoint's, naming the layer that set it."""
    from a2c_ppo_acktr.config.cli import format_value

    lines = []
    for f in dataclasses.fields(EnvConfig):
        old, new = getattr(trained, f.name), getattr(now, f.name)
        if old == new:
            continue
        by = next((name for name, layer in layers if f.name in (layer.get("env") or {})), "?")
        lines.append(f"env.{f.name}: checkpoint {format_value(old)} -> {format_value(new)} ({by})")
    if lines:
        logger.warning(
            "evaluating checkpoint %s on an env that differs from the one it was trained on (%s):\n  %s",
            checkpoint,
            source,
            "\n  ".join(lines),
        )
    else:
        logger.info("evaluating checkpoint %s on the env it was trained on (%s)", checkpoint, source)
    return lines


def load_policy(
    cfg: RunConfig, adapter: Optional[str] = None, checkpoint: Optional[str] = None, take_base: bool = False
) -> Any:
    """Build the policy of ``cfg.model`` and load an SFT adapter or a PPO checkpoint into it.

    Args:
        cfg: Run config (``model`` section).
        adapter: SFT LoRA adapter directory (``policy.load_adapter``). Its own rank, alpha and targets
            are used (:func:`~a2c_ppo_acktr.policy.loading.adopt_adapter_settings`; a config that said
            otherwise gets a warning), and with ``take_base`` its recorded base model too.
        checkpoint: PPO checkpoint directory (``<ckpt>/policy``: adapter and heads, through
            ``policy.load_pretrained``).
        take_base: no model path was given on the command line: load the adapter's base model.
    """
    from a2c_ppo_acktr.policy.loading import adopt_adapter_settings
    from a2c_ppo_acktr.policy.model import VLMPolicy

    if adapter:
        for note in adopt_adapter_settings(cfg.model, adapter, take_base=take_base):
            logger.warning(note)
    policy = VLMPolicy(cfg.model)
    if adapter:
        policy.load_adapter(adapter)
    if checkpoint:
        load_checkpoint_into(policy, checkpoint)
    policy.eval()
    return policy


def load_checkpoint_into(policy: Any, checkpoint: str | Path) -> None:
    """Load a main_vsi.py checkpoint's LoRA adapter and value/temperature heads into ``policy``."""
    from a2c_ppo_acktr.run.checkpoint import require_intact

    ckpt = Path(checkpoint)
    require_intact(ckpt, "evaluate an earlier checkpoint")  # a training checkpoint's files must match their checksums
    policy_dir = ckpt / "policy" if (ckpt / "policy").is_dir() else ckpt
    policy.load_pretrained(str(policy_dir))


def default_name(args: Any, model_path: str, suffix: str = "") -> str:
    """A report's row name: ``--name``, else what was evaluated (oracle, dummy, checkpoint or
    adapter directory name, model path) plus ``suffix`` (`` (blind)``, `` (video)``)."""
    if args.name:
        return args.name
    if args.dummy:
        base = "dummy"
    elif args.oracle:
        base = "oracle"
    elif args.checkpoint:
        base = Path(args.checkpoint).name
    elif args.adapter:
        base = f"sft:{Path(args.adapter).name}"
    else:
        base = Path(model_path).name or model_path
    return base + suffix


def run_cli(args: Any, extra: Sequence[str]) -> Optional[dict[str, Any]]:
    """Everything ``eval_vsi.py`` does, from its parsed arguments (see its docstring).

    Returns:
        The report written (None for ``--compare`` and metrics-only runs).
    """
    from a2c_ppo_acktr.run.rundir import RunLock, check_output_path

    # One command at a time writes into --out, for its whole run: a second one stops with one line
    # naming this one, and neither report is lost.
    with RunLock(check_output_path(args.out)):
        return _run_cli(args, extra)


def _run_cli(args: Any, extra: Sequence[str]) -> Optional[dict[str, Any]]:
    """:func:`run_cli` inside the lock of ``--out``."""
    from a2c_ppo_acktr.run.rundir import claim_report_dir

    evaluates = (
        args.model_path
        or args.adapter
        or args.checkpoint
        or args.oracle
        or args.dummy
        or args.config
        or args.preset
        or extra
    )
    writes_report = not args.compare and (bool(args.score_file) or bool(evaluates) or not args.metrics)
    # A report claims the whole directory; a comparison or learning curves only their own files.
    files = (
        None if writes_report else [*(COMPARE_FILES if args.compare else ()), *((CURVES_FILE,) if args.metrics else ())]
    )
    out = claim_report_dir(args.out, overwrite=args.overwrite, files=files)
    if args.metrics:
        path = reports.plot_learning_curves(args.metrics, out / CURVES_FILE, smoothing=args.smooth)
        print(f"learning curves: {path}")
    if args.compare:
        paths = reports.compare_reports(
            args.compare, out, names=args.names, paired=args.paired, best_constant=args.best_constant
        )
        print(paths["md"].read_text(encoding="utf-8"))
        print(f"comparison: {paths['md']} and {paths['png']}")
        return None
    if args.score_file:
        if extra:
            raise ValueError(f"--score-file takes no config overrides (got {list(extra)}): it only scores the file")
        report = reports.score_file(
            args.score_file, name=args.name, rule=getattr(args, "scoring_rule", None) or DEFAULT_SCORING_RULE
        )
        reports.write_report(report, out)
        _print_summary(report, out)
        if report["malformed"]["count"]:
            print(
                f"WARNING: {report['malformed']['count']} malformed line(s); see {out / 'report.md'}", file=sys.stderr
            )
        return report
    if args.metrics and not evaluates:
        return None
    cfg = resolve_config(args, extra)
    meta: dict[str, Any] = {"preset": cfg.preset, "config": args.config}
    if args.dummy:
        agent: Any = DummyAgent(seed=cfg.eval.seed)
        meta["agent"] = "dummy"
    elif args.oracle:
        from a2c_ppo_acktr.labels.teachers import make_teacher

        agent = make_teacher(dataclasses.replace(cfg.label, teacher="oracle"), cfg.model)
        meta.update(agent="oracle", **agent.describe())
    else:
        policy = load_policy(cfg, adapter=args.adapter, checkpoint=args.checkpoint, take_base=not args.model_path)
        agent = PolicyAgent(
            policy,
            greedy=cfg.eval.greedy,
            temperature=cfg.eval.temperature,
            blind=cfg.eval.blind,
            zero_images=cfg.eval.zero_images,
        )
        meta.update(
            agent="policy",
            model_path=cfg.model.model_path,
            adapter=args.adapter,
            checkpoint=args.checkpoint,
            dtype=cfg.model.dtype,
        )
    suffix = " (blind)" if cfg.eval.blind else " (zeroed images)" if cfg.eval.zero_images else ""
    report = evaluate(
        cfg,
        agent,
        name=default_name(args, cfg.model.model_path, suffix),
        out_dir=out,
        meta=meta,
        vsibench_limit=args.limit,
    )
    _print_summary(report, out)
    return report


def _print_summary(report: dict[str, Any], out: Path) -> None:
    print(reports.table_markdown([(report["name"], report)]))
    agent = reports.agent_metrics_markdown([(report["name"], report)])
    if agent:
        print(agent)
    print(f"reports: {out / 'report.json'}, {out / 'report.md'}")

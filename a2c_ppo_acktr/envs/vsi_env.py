"""The VSI environment: a multi-turn agent looks around a 3D room and answers a VSI-Bench question.

One episode:

1. ``reset`` picks a scene (procedural scene ``scene_seed + k``, a real scan, or the scan of a row
   of ``env.vsibench_path``), a question type (uniform over ``EnvConfig.question_types``), a free start
   pose, renders the initial 360-degree sweep (the "video" frames, turning left from the start
   heading), derives the objects' first-appearance order from it and generates the question. A row
   asks its own question; a training row (``scene_source=parquet``,
   :mod:`~a2c_ppo_acktr.envs.make_dataset`) also fixes the start pose its question was made from.
2. Each ``step(text)`` parses the model's text with :func:`a2c_ppo_acktr.common.prompts.parse_action`:

   * a move turns, then walks (blocked by walls and furniture: ``collision_penalty`` and feedback),
     and renders the new view; reward ``step_cost`` (+ ``collision_penalty``);
   * an answer ends the episode (``terminated``) with reward = the VSI-Bench score of the answer
     (accuracy or MRA, :func:`a2c_ppo_acktr.common.scoring.score_prediction`);
   * invalid text costs ``invalid_penalty``, uses the turn, and the next observation says why.

   After ``max_turns`` turns without an answer the episode is ``truncated``.

``EnvConfig.mode`` ``video_qa`` makes an episode one answer turn instead (the vsGRPO setting): ``reset``
renders ``num_sweep_frames`` frames along a walk-through of the room
(:func:`~a2c_ppo_acktr.envs.navigation.walkthrough_poses`, the mini benchmark's camera path; the
appearance order is the walk's), or, for a row with a video under ``video_root``, reads them from the
scan's own video (:mod:`~a2c_ppo_acktr.envs.video_frames`' reader, ``uniform`` sampling). The
observation is the video protocol's agent answer turn (the frames as views, in order; "this is your
last turn"). The one ``step`` terminates the episode with reward :func:`video_qa_reward`: the answer's
score plus ``format_reward`` for a reply that parses as an answer, 0 for a move, ``invalid_penalty``
for an unreadable reply.

Observations are ``{"images": (sweep frames..., last image_history views...), "text": str}``; the
images are a tuple (gymnasium's ``Sequence`` space holds tuples), the last image is the current view.
With ``EnvConfig.object_labels`` ``names`` or ``ids`` every observed image carries a label on each
visible object (:mod:`a2c_ppo_acktr.envs.labels`) and the text says so; the frames the env keeps
(``sweep_frames``, ``views``: questions, teachers, reports) stay unlabelled.
All randomness comes from ``self.np_random``; scenes and their renderers are cached per scene key.
"""

from __future__ import annotations

import string
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from a2c_ppo_acktr.config.arguments import ROW_SOURCES, SCAN_SOURCES, EnvConfig
from a2c_ppo_acktr.common.prompts import (
    Answer,
    Invalid,
    Move,
    feedback_text,
    format_response,
    observation_text,
    parse_action,
)
from a2c_ppo_acktr.common.scoring import is_multiple_choice, score_prediction
from a2c_ppo_acktr.envs.base import env_config
from a2c_ppo_acktr.envs.labels import draw_labels
from a2c_ppo_acktr.envs.navigation import sample_free_pose, try_move, walkthrough_poses
from a2c_ppo_acktr.envs.protocol import OracleStyle, attribute_state
from a2c_ppo_acktr.envs.questions import Question, QuestionUnavailable, appearance_from_frames, generate_question
from a2c_ppo_acktr.envs.renderer import Camera, Frame, Pose, Renderer
from a2c_ppo_acktr.envs.scene import Scene

MAX_TEXT_LENGTH = 16384  # observation text bound (questions + options + feedback stay far below)
MAX_ACTION_LENGTH = 4096  # action text bound for the declared space; step() accepts any string
_PRINTABLE = frozenset(string.printable)
_MAX_DRAWS = 50  # (scene, type) draws before reset gives up


def _printable(text: str) -> str:
    """Replace characters outside ``string.printable`` (e.g. echoed model output) with ``?``."""
    return "".join(c if c in _PRINTABLE else "?" for c in text)


def turn_text(
    question: Question,
    feedback: str,
    *,
    turns_left: int,
    num_sweep_frames: int,
    num_views: int,
    max_forward: float,
    object_labels: str = "none",
) -> str:
    """The user text of one VSI turn (:func:`~a2c_ppo_acktr.common.prompts.observation_text`, characters
    outside ``string.printable`` replaced): what the env shows every turn, and what the video
    protocol's agent prompt (``eval_vsi.py video --prompt agent``) shows for its one answer turn."""
    return _printable(
        observation_text(
            question.question,
            question.options,
            feedback,
            turns_left=turns_left,
            num_sweep_frames=num_sweep_frames,
            num_views=num_views,
            max_forward=max_forward,
            object_labels=object_labels,
        )
    )


def sweep_poses(start: Pose, num_frames: int) -> list[Pose]:
    """The poses of the initial sweep: ``num_frames`` headings turning left from ``start``, evenly over 360 degrees."""
    return [Pose(start.x, start.y, (start.yaw_deg + k * 360.0 / num_frames) % 360.0) for k in range(num_frames)]


def appearance_min_pixels(cfg: EnvConfig) -> int:
    """Pixels an object must cover in a sweep frame to count as seen (``appearance_min_fraction``)."""
    return max(1, int(round(cfg.appearance_min_fraction * cfg.image_size**2)))


# The settings that decide which objects a sweep from a given pose sees first: an appearance-order
# row is only true under the settings it was built with.
SWEEP_SETTINGS = ("image_size", "fov_deg", "eye_height", "num_sweep_frames", "appearance_min_fraction")


def sweep_settings(cfg: EnvConfig) -> dict[str, float]:
    """The :data:`SWEEP_SETTINGS` of ``cfg``."""
    return {k: getattr(cfg, k) for k in SWEEP_SETTINGS}


def check_row_sweep(row: dict, cfg: EnvConfig, where: str) -> None:
    """Refuse an ``obj_appearance_order`` row with a ``sweep`` made under other settings than ``cfg``'s."""
    from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError

    built = row.get("sweep")
    if row["question_type"] != "obj_appearance_order" or built is None:
        return
    now = sweep_settings(cfg)
    differ = [k for k in SWEEP_SETTINGS if k not in built or float(built[k]) != float(now[k])]
    if differ:
        detail = ", ".join(f"env.{k}={built.get(k)!r} there, {now[k]!r} here" for k in differ)
        raise VSIBenchRowError(
            f"{where} (obj_appearance_order) was built for another sweep ({detail}); rebuild the set with the training "
            "preset (make_dataset --preset ...) or leave obj_appearance_order out of env.question_types"
        )


# The dummy's "plausible number" per numerical type: uniform over these ranges, in the unit the
# question asks for (count, meters, centimeters, square meters). They bracket the sizes of
# procedural rooms and real VSI-Bench scenes; the dummy is a chance reference, not a tuned guesser.
DUMMY_NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "object_counting": (1, 6),  # integers
    "object_abs_distance": (0.5, 6.0),
    "object_size_estimation": (20.0, 250.0),
    "room_size_estimation": (8.0, 60.0),
}
# Rotations the chance agent may choose (degrees, positive = left).
CHANCE_ROTATIONS = (-90.0, -45.0, 45.0, 90.0, 180.0)


def random_answer(question_type: str, options: Optional[Sequence[str]], rng: np.random.Generator) -> str:
    """A uniformly random legal answer for a question of this type: a random option letter, or a
    number uniform over :data:`DUMMY_NUMBER_RANGES` (reads the type and options, never the answer)."""
    if is_multiple_choice(question_type):
        if not options:
            raise ValueError(f"a {question_type} question needs options to pick a random letter from")
        letters = [o.split(".", 1)[0].strip() for o in options]
        return str(letters[int(rng.integers(len(letters)))])
    low, high = DUMMY_NUMBER_RANGES[question_type]
    if question_type == "object_counting":
        return str(int(rng.integers(int(low), int(high) + 1)))
    return f"{rng.uniform(low, high):.2f}"


def video_qa_reward(parsed: Any, question: Question, cfg: EnvConfig) -> tuple[float, float]:
    """``(reward, score)`` of video_qa's one reply, already parsed (:func:`parse_action`).

    * an answer: score = the benchmark score of its text (:func:`score_prediction` under
      ``cfg.scoring_rule``: exact match of the option letter, MRA for numbers), reward = score +
      ``cfg.format_bonus`` (``env.format_reward``: the reply is well formed);
    * a move (well-formed JSON, but no answer): score 0, reward 0;
    * an unreadable reply (:class:`Invalid`): score 0, reward ``cfg.invalid_penalty``.
    """
    if isinstance(parsed, Answer):
        score = score_prediction(question.question_type, parsed.text, question.ground_truth, rule=cfg.scoring_rule)
        return score + cfg.format_bonus, score
    if isinstance(parsed, Move):
        return 0.0, 0.0
    return float(cfg.invalid_penalty), 0.0


def _square(frame: np.ndarray, size: int) -> np.ndarray:
    """A video frame (H, W, 3) uint8 resized to ``size`` x ``size`` (bilinear), the env's image shape."""
    from PIL import Image

    if frame.shape[:2] == (size, size):
        return np.ascontiguousarray(frame)
    return np.asarray(Image.fromarray(np.ascontiguousarray(frame)).resize((size, size), Image.BILINEAR))


# Attributes that are settings, spaces, caches or rebuilt objects, not the state (get_state).
_NOT_STATE = frozenset(
    {
        "cfg",
        "render_mode",
        "camera",
        "observation_space",
        "action_space",
        "_cache",
        "_rows",
        "_scan_names",
        "renderer",
        "spec",
    }
)


class VSIEnv(gym.Env):
    """Gymnasium env for VSI-Bench-style spatial questions (id ``VSI-v0``).

    Args:
        cfg: The env config; None uses the defaults.
        render_mode: None or ``"rgb_array"`` (``render()`` returns the current view).
        **overrides: Field overrides of ``cfg`` (e.g. ``image_size=64``), validated by EnvConfig.

    Privileged state (for teachers and reports): ``scene``, ``question``, ``pose``, ``path`` (poses
    visited, start included), ``turn`` (turns used), ``renderer``, ``sweep_frames``, ``cfg``. The
    frames are the renderer's, unlabelled; the observed images (labelled when ``cfg.object_labels``
    is not ``none``) are ``sweep_images`` and ``view_images``.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 2}

    def __init__(self, cfg: Optional[EnvConfig] = None, render_mode: Optional[str] = None, **overrides: Any) -> None:
        cfg = env_config(cfg if cfg is not None else EnvConfig(), overrides, render_mode, self.metadata["render_modes"])
        self.cfg = cfg
        self.render_mode = render_mode
        self.camera = Camera.from_env_config(cfg)
        size = cfg.image_size
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Sequence(spaces.Box(0, 255, (size, size, 3), np.uint8), stack=False),
                "text": spaces.Text(MAX_TEXT_LENGTH, charset=string.printable),
            }
        )
        self.action_space = spaces.Text(MAX_ACTION_LENGTH, charset=string.printable)
        self._cache: OrderedDict[Any, tuple[Scene, Renderer]] = OrderedDict()
        self._rows: Optional[list[dict]] = None
        self._scan_names: Optional[list[str]] = None
        self.scene: Optional[Scene] = None
        self.renderer: Optional[Renderer] = None
        self.question: Optional[Question] = None
        self.pose: Optional[Pose] = None
        self.path: list[Pose] = []
        self.turn = 0
        self.sweep_frames: list[Frame] = []
        self.views: list[Frame] = []
        self.sweep_images: list[np.ndarray] = []  # what the agent sees of sweep_frames (labelled or not)
        self.view_images: list[np.ndarray] = []  # what the agent sees of views, in step with it
        self._min_pixels = appearance_min_pixels(cfg)
        self.appearance_order: list[int] = []
        self.walk_poses: list[Pose] = []  # video_qa: the poses of the rendered walk-through's frames
        self._frames_source = "render"  # video_qa: "render" or "video" (the scan's own video)
        self._feedback = ""
        self._done = True
        self._episode_reward = 0.0

    # ------------------------------------------------------------------ scenes
    def _cached(self, key: Any, build) -> tuple[Scene, Renderer]:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        scene = build()
        entry = (scene, Renderer.for_env(scene, self.cfg))
        self._cache[key] = entry
        while len(self._cache) > self.cfg.scene_cache_size:
            self._cache.popitem(last=False)
        return entry

    def _procedural(self, index: int) -> tuple[Scene, Renderer]:
        from a2c_ppo_acktr.envs.procedural import make_procedural_scene  # imported on use: keeps `import envs` light

        seed = self.cfg.scene_seed + index
        return self._cached(
            ("procedural", seed),
            lambda: make_procedural_scene(seed, self.cfg.procedural_min_room, self.cfg.procedural_max_room),
        )

    def _scan(self, dataset: str, name: str) -> tuple[Scene, Renderer]:
        from a2c_ppo_acktr.envs.real_scans import find_scene

        return self._cached((dataset, name), lambda: find_scene(self.cfg.data_root, dataset, name))

    def _file_rows(self) -> list[dict]:
        if self._rows is None:
            from a2c_ppo_acktr.envs.vsibench import check_training_rows, load_vsibench_rows

            path = self.cfg.vsibench_path
            rows = [r for r in load_vsibench_rows(path) if r["question_type"] in self.cfg.question_types]
            if not rows:
                raise ValueError(f"{path!r} has no rows of the types in env.question_types={self.cfg.question_types}")
            if self.cfg.scene_source == "parquet":
                check_training_rows(rows, path)
            for row in rows:
                check_row_sweep(row, self.cfg, f"{Path(path).name} row id {row['id']}")
                if (
                    self.cfg.mode == "video_qa"
                    and row.get("sweep") is not None
                    and row["question_type"] == "obj_appearance_order"
                ):
                    from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError

                    raise VSIBenchRowError(
                        f"{Path(path).name} row id {row['id']} (obj_appearance_order) was built for the interactive "
                        "start sweep, "
                        "not a walk-through: leave obj_appearance_order out of env.question_types with "
                        "env.mode=video_qa"
                    )
            self._rows = rows
        return self._rows

    def _draw_scene(self, options: dict) -> tuple[Any, Scene, Renderer]:
        """(scene key, scene, renderer) from options or a fresh draw."""
        if "scene" in options:
            scene = options["scene"]
            if not isinstance(scene, Scene):
                raise TypeError(f"options['scene'] must be a Scene, got {type(scene).__name__}")
            # Keyed by identity: the cache entry holds the scene, so its id() cannot be reused by
            # another object while the entry exists; an edited scene needs a new Scene object.
            return ("given", scene.scene_id), *self._cached(("given", id(scene)), lambda: scene)
        src = self.cfg.scene_source
        if src == "procedural":
            index = (
                int(options["scene_index"])
                if "scene_index" in options
                else int(self.np_random.integers(self.cfg.num_scenes))
            )
            return ("procedural", index), *self._procedural(index)
        if src in SCAN_SOURCES:
            if self._scan_names is None:
                from a2c_ppo_acktr.envs.real_scans import find_scan_names

                self._scan_names = find_scan_names(self.cfg.data_root, src)
            index = (
                int(options["scene_index"])
                if "scene_index" in options
                else int(self.np_random.integers(len(self._scan_names)))
            )
            name = self._scan_names[index % len(self._scan_names)]
            return (src, name), *self._scan(src, name)
        raise AssertionError(f"unhandled scene_source {src!r}")  # row sources are handled by reset

    # ------------------------------------------------------------------ episode
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        """Start an episode.

        Args:
            seed: Reseeds ``self.np_random`` (the only randomness source).
            options: Optional ``scene`` (a Scene), ``scene_index``, ``question_type`` and
                ``question`` (a Question; needs ``scene`` or ``scene_index`` naming its scene unless
                the source reads rows). ``scene_index`` k means procedural scene ``scene_seed + k``
                (any k >= 0, not limited to ``num_scenes``: held-out scenes), scan k (modulo the
                number of scans found) or row k (modulo the number of rows). When a scene
                is forced, other types are drawn if ``question_type`` is unavailable in it; when
                both are forced, :class:`QuestionUnavailable` propagates.

        Returns:
            ``(observation, info)``.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        self._frames_source = "render"
        if self.cfg.scene_source in ROW_SOURCES and "scene" not in options:
            self._reset_row(options)
        else:
            self._reset_generated(options)
        self.path = [self.pose]
        self.turn = 0
        self._done = False
        self._episode_reward = 0.0
        self._feedback = feedback_text(None)
        return self._observation(), self._info(action=None, valid=True, collided=False)

    def _start(
        self, scene: Scene, renderer: Renderer, pose: Optional[Pose] = None, video: Optional[np.ndarray] = None
    ) -> None:
        """Start pose (``pose``, else a free one drawn), sweep and appearance order in ``scene``.

        In ``video_qa`` mode the "sweep" is the walk-through: ``num_sweep_frames`` frames rendered
        along :func:`~a2c_ppo_acktr.envs.navigation.walkthrough_poses` from the start pose (the
        appearance order is that of the walk, as in the mini benchmark's videos), or ``video``, the
        frames of the scan's own video (then no frames are rendered and ``sweep_frames`` is empty)."""
        self.scene, self.renderer = scene, renderer
        video_qa = self.cfg.mode == "video_qa"
        if video is not None:
            self.pose = pose if pose is not None else sample_free_pose(scene, self.np_random, self.cfg.agent_radius)
            self.walk_poses = []
            self.sweep_frames = []
            self.appearance_order, self._appearance_frames = [], []
            self.sweep_images = list(video)
            self.views, self.view_images = [], []
            return
        if video_qa:
            self.walk_poses = walkthrough_poses(
                scene, self.np_random, self.cfg.num_sweep_frames, self.cfg.agent_radius, start=pose
            )
            self.pose = self.walk_poses[0]
            poses = self.walk_poses
        else:
            self.pose = pose if pose is not None else sample_free_pose(scene, self.np_random, self.cfg.agent_radius)
            poses = sweep_poses(self.pose, self.cfg.num_sweep_frames)
        self.sweep_frames = renderer.render_many(poses)
        self.appearance_order, self._appearance_frames = appearance_from_frames(
            [f.object_ids for f in self.sweep_frames], self._min_pixels
        )
        self.sweep_images = [self._image(f) for f in self.sweep_frames]
        if video_qa:  # one answer turn over the frames: no current view
            self.views, self.view_images = [], []
            return
        # The sweep starts at the start heading, so its first frame is also the current view.
        self.views = [self.sweep_frames[0]]
        self.view_images = [self.sweep_images[0]]

    def _image(self, frame: Frame) -> np.ndarray:
        """The image the agent sees of ``frame``: labelled per ``cfg.object_labels`` (a new array),
        or the frame's own ``rgb`` (copied by ``_observation``). An object gets a label where it
        counts as seen for the appearance order (``appearance_min_fraction``)."""
        if self.cfg.object_labels == "none":
            return frame.rgb
        return draw_labels(frame, self.scene, self.cfg.object_labels, self._min_pixels, self.renderer)

    def _reset_generated(self, options: dict) -> None:
        types = list(self.cfg.question_types)
        last_error: Optional[Exception] = None
        for _ in range(_MAX_DRAWS):
            key, scene, renderer = self._draw_scene(options)
            self._start(scene, renderer)
            if "question" in options:
                if "scene" not in options and "scene_index" not in options:
                    raise ValueError(
                        "options['question'] needs options['scene'] or options['scene_index'] naming its scene"
                    )
                self.question = options["question"]
                return
            qtype = options.get("question_type") or types[int(self.np_random.integers(len(types)))]
            try:
                self.question = generate_question(
                    scene,
                    qtype,
                    self.np_random,
                    start_pose=self.pose,
                    appearance_order=self.appearance_order,
                    appearance_frames=self._appearance_frames,
                )
                return
            except QuestionUnavailable as e:
                last_error = e
                if "scene" in options or "scene_index" in options:
                    if "question_type" in options:
                        raise  # nothing left to redraw
        raise RuntimeError(
            f"no question could be generated in {_MAX_DRAWS} draws of scenes and types {types}; last reason: "
            f"{last_error}. "
            "Widen env.question_types or use larger/more varied scenes"
        )

    def _reset_row(self, options: dict) -> None:
        rows = self._file_rows()
        index = int(options["scene_index"]) if "scene_index" in options else int(self.np_random.integers(len(rows)))
        row = rows[index % len(rows)]
        from a2c_ppo_acktr.envs.vsibench import question_from_row, scene_for_row

        scene, renderer = self._cached(
            (row["dataset"], row["scene_name"]), lambda: scene_for_row(row, self.cfg.data_root)
        )
        start = Pose(*row["start_pose"]) if row.get("start_pose") is not None else None
        self._start(scene, renderer, start, video=self._row_video(row))
        self.question = options.get("question") or question_from_row(row)

    def _row_video(self, row: dict) -> Optional[np.ndarray]:
        """video_qa with ``env.video_root``: ``num_sweep_frames`` frames of the row's scan video
        (``<video_root>/<dataset>/<scene_name>.mp4``, the video protocol's reader and its ``uniform``
        linspace sampling), resized to ``image_size`` squares; None when there is no such file (the
        walk-through is rendered instead) or no video_root."""
        if self.cfg.mode != "video_qa" or self.cfg.video_root is None:
            return None
        from a2c_ppo_acktr.envs import video_frames

        path = video_frames.video_file(
            self.cfg.video_root, row["dataset"], row["scene_name"], where=f"row id {row.get('id')}"
        )
        if not path.is_file():
            self._frames_source = "render"
            return None
        self._frames_source = "video"
        clip = video_frames.read_clip(path, "uniform", self.cfg.num_sweep_frames)
        return np.stack([_square(f, self.cfg.image_size) for f in clip.frames])

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        """Apply the model's text for one turn (see the module docstring)."""
        if self._done:
            raise RuntimeError("step() called on a finished episode (or before reset()); call reset() first")
        parsed = parse_action(action, max_forward=self.cfg.max_forward)
        if self.cfg.mode == "video_qa":
            return self._answer_turn(parsed)
        self.turn += 1
        reward = 0.0
        terminated = False
        collided = False
        score: Optional[float] = None
        if isinstance(parsed, Answer):
            score = score_prediction(
                self.question.question_type, parsed.text, self.question.ground_truth, rule=self.cfg.scoring_rule
            )
            reward = score
            terminated = True
            self._feedback = feedback_text(parsed)
        elif isinstance(parsed, Move):
            start = self.pose
            self.pose, collided = try_move(
                self.scene, self.pose, parsed.rotation_deg, parsed.forward_m, self.cfg.agent_radius
            )
            walked = float(np.hypot(self.pose.x - start.x, self.pose.y - start.y))
            self.path.append(self.pose)
            self.views.append(self.renderer.render(self.pose))
            self.view_images.append(self._image(self.views[-1]))
            keep = max(self.cfg.image_history, 1)
            self.views, self.view_images = self.views[-keep:], self.view_images[-keep:]
            reward = self.cfg.step_cost + (self.cfg.collision_penalty if collided else 0.0)
            self._feedback = feedback_text(parsed, collided=collided, walked_m=walked)
        else:
            reward = self.cfg.invalid_penalty
            self._feedback = feedback_text(parsed)
        truncated = not terminated and self.turn >= self.cfg.max_turns
        self._done = terminated or truncated
        self._episode_reward += reward
        info = self._info(action=parsed, valid=not isinstance(parsed, Invalid), collided=collided)
        info["time_limit_announced"] = truncated  # every prompt shows the turns left (TextEnv)
        if score is not None:
            info["score"] = score
        return self._observation(), float(reward), terminated, truncated, info

    def _answer_turn(self, parsed: Any) -> tuple[dict, float, bool, bool, dict]:
        """video_qa's one turn: the reward is :func:`video_qa_reward` of the parsed reply, and the
        episode terminates whatever the reply was."""
        self.turn += 1
        reward, score = video_qa_reward(parsed, self.question, self.cfg)
        self._feedback = feedback_text(parsed)
        self._done = True
        self._episode_reward += reward
        info = self._info(action=parsed, valid=not isinstance(parsed, Invalid), collided=False)
        info["time_limit_announced"] = False
        info["format_ok"] = isinstance(parsed, Answer)
        info["frames_source"] = self._frames_source
        if isinstance(parsed, Answer):
            info["score"] = score
        return self._observation(), float(reward), True, False, info

    # ------------------------------------------------------------------ observation
    def _observation(self) -> dict:
        views = self.view_images[-self.cfg.image_history :] if self.cfg.image_history > 0 else []
        # Fresh arrays every call: callers keep observations, and the sweep is reused every turn.
        images = tuple(im.copy() for im in self.sweep_images) + tuple(im.copy() for im in views)
        if self.cfg.mode == "video_qa":
            # The answer turn of the video protocol's agent prompt (eval_vsi.py video --prompt agent):
            # the frames as the agent's views in order, the last turn.
            text = turn_text(
                self.question,
                self._feedback,
                turns_left=1,
                num_sweep_frames=0,
                num_views=len(images),
                max_forward=self.cfg.max_forward,
                object_labels=self.cfg.object_labels,
            )
            return {"images": images, "text": text}
        text = turn_text(
            self.question,
            self._feedback,
            turns_left=max(self.cfg.max_turns - self.turn, 0),
            num_sweep_frames=len(self.sweep_frames),
            num_views=len(views),
            max_forward=self.cfg.max_forward,
            object_labels=self.cfg.object_labels,
        )
        return {"images": images, "text": text}

    def _info(self, action: Any, valid: bool, collided: bool) -> dict:
        return {
            "question_type": self.question.question_type,
            "ground_truth": self.question.ground_truth,
            "action": action,
            "valid": valid,
            "pose": self.pose,
            "collided": collided,
            "turn": self.turn,
            "scene_id": self.scene.scene_id,
        }

    @property
    def episode_reward(self) -> float:
        """Sum of rewards so far this episode."""
        return self._episode_reward

    # ------------------------------------------------------------------ what the pipeline asks (envs/registry.py)
    @property
    def task_type(self) -> str:
        """The report category of the current episode: its question type."""
        return self.question.question_type

    def parse(self, text: Any) -> Any:
        """The :class:`Move`/:class:`Answer` ``text`` asks for, or an :class:`Invalid` (never raises)."""
        return parse_action(text, max_forward=self.cfg.max_forward)

    def random_reply(self, rng: np.random.Generator) -> str:
        """A random move (labelling's exploration): a turn in [-180, 180] degrees, then up to 1 m."""
        rotation = float(round(rng.uniform(-180.0, 180.0)))
        forward = float(round(rng.uniform(0.0, min(1.0, self.cfg.max_forward)), 2))
        return format_response("Exploring to see more of the room.", Move(rotation_deg=rotation, forward_m=forward))

    def chance_reply(self, rng: np.random.Generator, answer_prob: float = 0.5) -> str:
        """The chance agent's reply: a random legal answer (:func:`random_answer`) with probability
        ``answer_prob``, always on the last turn; else a random turn of :data:`CHANCE_ROTATIONS` and a
        walk of up to ``cfg.max_forward`` m."""
        last_turn = self.turn >= self.cfg.max_turns - 1
        if last_turn or rng.random() < answer_prob:
            return format_response(
                "A random guess.", Answer(random_answer(self.question.question_type, self.question.options, rng))
            )
        rotation = float(CHANCE_ROTATIONS[int(rng.integers(len(CHANCE_ROTATIONS)))])
        forward = round(float(rng.uniform(0.0, self.cfg.max_forward)), 2)
        return format_response("A random move.", Move(rotation_deg=rotation, forward_m=forward))

    def oracle_reply(self, style: OracleStyle = OracleStyle()) -> str:
        """The oracle's reply (:func:`a2c_ppo_acktr.envs.oracle.vsi_reply`): face the question's first
        object, then answer with the ground truth."""
        from a2c_ppo_acktr.envs.oracle import vsi_reply

        return vsi_reply(self, style)

    def get_state(self) -> dict:
        """The episode in progress (scene, question, pose, path, turn, frames) and the generator: the
        env's attributes but its settings, spaces, caches and renderer (rebuilt by :meth:`set_state`)."""
        return attribute_state(self, _NOT_STATE)

    def set_state(self, state: dict) -> None:
        """Inverse of :meth:`get_state`; the renderer is rebuilt from the restored scene."""
        vars(self).update(state)
        self.renderer = Renderer.for_env(self.scene, self.cfg) if self.scene is not None else None

    def episode_fields(self) -> dict:
        """What a report or a labelled episode records about the current question."""
        q = self.question
        return {
            "scene_id": str(self.scene.scene_id),
            "dataset": str(getattr(self.scene, "dataset", None)),
            "question_type": q.question_type,
            "question": q.question,
            "options": list(q.options) if q.options else None,
            "ground_truth": str(q.ground_truth),
            "object_ids": [int(i) for i in q.object_ids],
        }

    def overview_image(self, *, caption: str = "", highlight_ids: Sequence[int] = (), size: int = 512) -> np.ndarray:
        """The top-down map of the scene with the path walked so far and the question's objects."""
        from a2c_ppo_acktr.envs.topdown import render_topdown

        return render_topdown(
            self.scene, path=list(self.path), highlight_ids=list(highlight_ids), caption=caption, size=size
        )

    def render(self) -> Optional[np.ndarray]:
        """The current view (H, W, 3) uint8 as the agent sees it (labelled per ``cfg.object_labels``)
        in ``rgb_array`` mode; None otherwise."""
        if self.render_mode != "rgb_array" or not self.view_images:
            return None
        return self.view_images[-1].copy()


def share_scene_cache(envs: Sequence[Any]) -> None:
    """Give VSI envs of one process one scene cache, so each scene (a real scan takes about a second
    to load) is built and indexed for ray casting once, not once per env. Envs that are not
    :class:`VSIEnv` (test doubles) are left alone. Scenes and renderers are read-only once built."""
    from a2c_ppo_acktr.envs.reward_fn import ShapedReward

    shared: OrderedDict = OrderedDict()
    for env in envs:
        env = getattr(env, "unwrapped", env)
        env = env.env if isinstance(env, ShapedReward) else env  # env.reward_fn's: the VSI env behind it
        if isinstance(env, VSIEnv):
            env._cache = shared

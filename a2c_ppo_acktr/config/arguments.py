"""Run configuration: one dataclass per component, nested into :class:`RunConfig`.

Values come from, in order of precedence: command-line overrides (``--ppo.lr 1e-5`` or
``ppo.lr=1e-5``), a YAML preset (``--config configs/debug.yaml`` or ``--preset debug``), the
dataclass defaults. Every value that changes results is a field here; the resolved config is written
next to every run's outputs (``config.yaml``) and logged.

Validation runs in ``__post_init__`` of each component and in :meth:`RunConfig.validate` for
cross-component rules; every message names the key, the value, what is allowed and how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from a2c_ppo_acktr.common import atomic
from a2c_ppo_acktr.common.choices import (
    ADV_NORMS,
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    OLD_LOG_PROBS,
    RATIO_LEVELS,
    REFERENCES,
    ROLLOUT_ENGINES,
    TEACHERS,
    THOUGHT_STYLES,
)
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.redaction import key_env_problem, redact_written
from a2c_ppo_acktr.common.scoring import TASKS as SCORING_TASKS
from a2c_ppo_acktr.common.vllm_compat import temperature_problem

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

# The raw VSI-Bench question types, in the benchmark's table order (the scorer defines them).
QUESTION_TYPES = tuple(SCORING_TASKS)


class ConfigError(ValueError, UserError):
    """A configuration value or combination is invalid; the message says how to fix it."""


# Seeds stay far below 2**32 (numpy's limit) after the per-rank, per-scene and per-episode offsets.
MAX_SEED = 2**31 - 1
# What ppo.tis_cap=null becomes with rollout.engine=vllm: verl's default cap for truncated importance sampling.
VLLM_TIS_CAP = 2.0

# Bounds from memory, for counts that validation would otherwise accept and a process cannot hold (a
# mistyped count fills the machine minutes later). A process's envs get HOST_MEMORY_BUDGET: each env
# keeps about ENV_BASE_BYTES for its scene and ray caster, and FRAME_BYTES_PER_PIXEL for every pixel of
# every frame of its observation (RGB, depth and object ids of the sweep, and the observation's copies:
# 36 B/px measured on 64 px frames).
HOST_MEMORY_BUDGET = 32 * 2**30
ENV_BASE_BYTES = 2**20
FRAME_BYTES_PER_PIXEL = 40
# Every prompt of an episode holds its whole sweep; qwen-vl-utils reads at most 768 frames of a video
# (its FPS_MAX_FRAMES), and no model here is given more at once.
MAX_SWEEP_FRAMES = 768
# Evaluation builds its question set up front and keeps a record per episode (question, reply, score,
# about 1-2 KiB) for its report: a million episodes stay within ~2 GiB (VSI-Bench has 5,130 questions).
MAX_EVAL_EPISODES = 1_000_000


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
    _check(value in allowed, f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _check_key_env(name: str, value: str) -> None:
    """A ``*_key_env`` setting names the environment variable holding a key. A key passed in its
    place is refused before the config is written anywhere, and the message does not repeat it."""
    problem = key_env_problem(value)
    _check(
        problem is None,
        f"{name} {problem}; pass the NAME of the environment variable that holds the key "
        f"(export MY_API_KEY=... in the shell, then --{name} MY_API_KEY), never the key itself",
    )


# Scene sources that generate questions in real scans, and those that read rows of questions from a file.
SCAN_SOURCES = ("scannet", "arkitscenes", "scannetpp")
ROW_SOURCES = ("vsibench", "parquet")
# env.mode: the agent moves and answers (interactive), or answers once over a walk-through's frames (video_qa).
ENV_MODES = ("interactive", "video_qa")
# What env.format_reward=null becomes in video_qa: a small bonus for a well-formed answer (vsGRPO's format
# reward, scaled down so that the score, in [0, 1], dominates).
VIDEO_QA_FORMAT_REWARD = 0.1


@dataclass
class EnvConfig:
    """The environment (``a2c_ppo_acktr/envs``): ``env_id`` picks it (``envs/registry.py``). The
    fields below ``game`` are VSI's; image_size, max_turns and invalid_penalty apply to every env."""

    # VSI-v0 | NumberLine-v0 | EZPoints-v0 | Points24-v0 | Blackjack-v0 | Sokoban-v0 | MiniGrid-<...> (any minigrid id)
    # | module.path:ClassName (your own env class, envs/registry.py)
    env_id: str = "VSI-v0"
    game: dict[str, Any] = field(
        default_factory=dict
    )  # settings of a game env's own config, e.g. {max_position: 7} or {dim_room: [7, 7], num_boxes: 2}
    # module.path:function: every step's reward becomes fn(reply=, reward=, info=, episode=) (envs/reward_fn.py);
    # the score evaluation reports stays the env's. null = the env's reward.
    reward_fn: Optional[str] = None
    # procedural | scannet | arkitscenes | scannetpp (questions generated in the scans) | vsibench (the
    # benchmark's rows) | parquet (a training set of rows written by python -m a2c_ppo_acktr.envs.make_dataset)
    scene_source: str = "procedural"
    data_root: Optional[str] = (
        None  # directory with the real scans (scannet/arkitscenes/scannetpp, and those the rows name)
    )
    vsibench_path: Optional[str] = None  # parquet/JSON of rows (scene_source=vsibench or parquet)
    num_scenes: int = 64  # procedural scenes drawn from (scene k has seed env.scene_seed + k)
    question_types: list[str] = field(default_factory=lambda: list(QUESTION_TYPES))
    image_size: int = 224  # rendered frames are image_size x image_size
    fov_deg: float = 90.0  # horizontal field of view of the pinhole camera
    eye_height: float = 1.5  # camera height above the floor, meters
    num_sweep_frames: int = (
        8  # frames of the initial 360-degree sweep ("video" frames); mode video_qa: of the walk-through
    )
    image_history: int = 2  # most recent per-turn views kept in the observation besides the sweep
    max_turns: int = 10  # turns per episode before truncation
    agent_radius: float = 0.2  # meters; movement is blocked when the disk would hit walls/objects
    max_forward: float = 3.0  # meters; largest forward step a move may ask for
    step_cost: float = 0.0  # reward added to every move (use a negative value to penalise turns)
    invalid_penalty: float = -0.1  # reward for text that does not parse as an action
    collision_penalty: float = -0.05  # reward added when a move is blocked
    procedural_min_room: float = 3.0  # meters, smallest side of procedural rooms
    procedural_max_room: float = 10.0  # meters, largest side of procedural rooms
    # procedural scene k (k < num_scenes) is built from seed scene_seed + k; use another value for held-out scenes
    scene_seed: int = 0
    appearance_min_fraction: float = (
        0.002  # an object counts as seen in a sweep frame when it covers this fraction of the pixels
    )
    scene_cache_size: int = 64  # scenes (with their ray-casting structures) kept per env; real scans are large
    look: str = "shaded"  # shaded (per-pixel light, materials, textures) | flat (one color per triangle)
    shadows: bool = (
        False  # shaded look: hard shadows from the ceiling lamp (a second ray per pixel, about half the frame rate)
    )
    # none | names | ids: draw each visible object's category name or object id on the observed frames (set-of-marks)
    object_labels: str = "none"
    # How a numerical answer is read (reward and reports): thinking-in-space (the reference: first word,
    # float) | lmms-eval-0.7 (the first number anywhere, digits or English words); docs/EVAL.md
    scoring_rule: str = "thinking-in-space"
    # interactive: the agent may move before it answers (max_turns turns). video_qa: one answer turn over
    # num_sweep_frames frames of a walk-through of the room (a turn in place, then a walk:
    # envs/navigation.walkthrough_poses), rendered, or read from the scan's own video under video_root;
    # reward = the answer's score + format_reward (docs/TRAINING.md, "Single-turn video QA").
    mode: str = "interactive"
    # video_qa: reward added to a reply that parses as an answer in the reply format; a reply that does not
    # parse gets invalid_penalty, a move 0. null = 0.1 in video_qa (EnvConfig.format_bonus); interactive takes
    # none (null or 0).
    format_reward: Optional[float] = None
    # video_qa with rows (scene_source vsibench/parquet): the benchmark's video layout,
    # <video_root>/<dataset>/<scene_name>.mp4 (read with PyAV, num_sweep_frames frames by linspace, resized to
    # image_size); a row whose video is absent gets a rendered walk-through of its scan. null = always render.
    video_root: Optional[str] = None

    def __post_init__(self) -> None:
        from a2c_ppo_acktr.common.env_ids import UnknownEnvError, canonical_id

        try:
            canonical_id(self.env_id)
        except UnknownEnvError as e:
            raise ConfigError(str(e)) from None
        _check(isinstance(self.game, dict), f"env.game must be a mapping of a game's settings, got {self.game!r}")
        from a2c_ppo_acktr.common.entry_points import is_entry_point

        _check(
            self.reward_fn is None or is_entry_point(str(self.reward_fn)),
            f"env.reward_fn={self.reward_fn!r} must name a function as 'module.path:function' (or be null)",
        )
        _choice("env.scene_source", self.scene_source, ["procedural", *SCAN_SOURCES, *ROW_SOURCES])
        for q in self.question_types:
            _check(
                q in QUESTION_TYPES, f"env.question_types contains unknown type {q!r}; known: {list(QUESTION_TYPES)}"
            )
        _check(
            len(self.question_types) > 0, f"env.question_types is empty; list at least one of {list(QUESTION_TYPES)}"
        )
        _check(16 <= self.image_size <= 2048, f"env.image_size={self.image_size} must be in [16, 2048]")
        _check(10.0 <= self.fov_deg <= 170.0, f"env.fov_deg={self.fov_deg} must be in [10, 170] degrees")
        _check(self.max_turns >= 1, f"env.max_turns={self.max_turns} must be >= 1")
        _check(
            1 <= self.num_sweep_frames <= MAX_SWEEP_FRAMES,
            f"env.num_sweep_frames={self.num_sweep_frames} must be in [1, {MAX_SWEEP_FRAMES}] (every prompt of an "
            "episode holds the whole sweep)",
        )
        _check(
            0 <= self.image_history <= MAX_SWEEP_FRAMES,
            f"env.image_history={self.image_history} must be in [0, {MAX_SWEEP_FRAMES}]",
        )
        _check(
            self.memory_bytes() <= HOST_MEMORY_BUDGET,
            f"env.num_sweep_frames={self.num_sweep_frames} + env.image_history={self.image_history} frames of "
            f"{self.image_size}x{self.image_size} "
            f"need about {self.memory_bytes() / 2**30:.1f} GiB per env ({FRAME_BYTES_PER_PIXEL} bytes per pixel), more "
            "than the "
            f"{HOST_MEMORY_BUDGET // 2**30} GiB a process's envs may use; use fewer frames or a smaller env.image_size",
        )
        _check(self.num_scenes >= 1, f"env.num_scenes={self.num_scenes} must be >= 1")
        _check(
            0 < self.appearance_min_fraction < 1,
            f"env.appearance_min_fraction={self.appearance_min_fraction} must be in (0, 1)",
        )
        _choice("env.look", self.look, ["shaded", "flat"])
        _choice("env.object_labels", self.object_labels, ["none", "names", "ids"])
        from a2c_ppo_acktr.common.scoring import SCORING_RULES

        _choice("env.scoring_rule", self.scoring_rule, list(SCORING_RULES))
        _check(self.scene_cache_size >= 1, f"env.scene_cache_size={self.scene_cache_size} must be >= 1")
        _check(0 < self.agent_radius < 1.0, f"env.agent_radius={self.agent_radius} must be in (0, 1) meters")
        _check(0 < self.max_forward <= 10.0, f"env.max_forward={self.max_forward} must be in (0, 10] meters")
        _check(
            0 < self.eye_height <= 3.0,
            f"env.eye_height={self.eye_height} must be in (0, 3] meters (a person's eye is ~1.5)",
        )
        _check(
            0 < self.procedural_min_room <= self.procedural_max_room,
            f"env.procedural_min_room={self.procedural_min_room} must be > 0 and <= "
            f"env.procedural_max_room={self.procedural_max_room}",
        )
        self._check_mode()
        if self.scene_source in SCAN_SOURCES:
            _check(
                self.data_root is not None,
                f"env.scene_source={self.scene_source!r} needs env.data_root (directory of scans)",
            )
        if self.scene_source in ROW_SOURCES:
            _check(
                self.vsibench_path is not None and self.data_root is not None,
                f"env.scene_source={self.scene_source!r} needs env.vsibench_path (parquet/JSON rows) and env.data_root "
                "(scans)",
            )

    def _check_mode(self) -> None:
        """``mode`` and the settings it needs."""
        _choice("env.mode", self.mode, list(ENV_MODES))
        if self.mode == "interactive":
            _check(
                not self.format_reward,
                f"env.format_reward={self.format_reward} applies to env.mode=video_qa only; "
                "leave it null (or 0) in interactive mode",
            )
            _check(
                self.video_root is None,
                "env.video_root (scan videos) is read by env.mode=video_qa only; set env.mode=video_qa or leave it "
                "null",
            )
            return
        from a2c_ppo_acktr.common.env_ids import canonical_id

        _check(
            canonical_id(self.env_id) == "VSI-v0",
            f"env.mode=video_qa is a mode of VSI-v0; env.env_id={self.env_id!r} has its own turns: leave "
            "env.mode=interactive",
        )
        _check(
            self.max_turns == 1, f"env.mode=video_qa has one answer turn: set env.max_turns=1 (got {self.max_turns})"
        )
        _check(
            self.image_history == 0,
            "env.mode=video_qa shows only the walk-through's frames (no per-turn views): set env.image_history=0 (got "
            f"{self.image_history})",
        )
        _check(
            self.object_labels == "none",
            f"env.object_labels={self.object_labels!r} is not supported with env.mode=video_qa (a scan's video has no "
            "object ids): use none",
        )
        _check(
            self.format_reward is None or (math.isfinite(self.format_reward) and 0.0 <= self.format_reward <= 1.0),
            f"env.format_reward={self.format_reward} must be in [0, 1] (a small bonus next to a score in [0, 1])",
        )
        if self.video_root is not None:
            _check(
                self.scene_source in ROW_SOURCES,
                "env.video_root holds videos named by rows (<dataset>/<scene_name>.mp4): it needs env.scene_source "
                "vsibench or parquet, "
                f"not {self.scene_source!r}",
            )

    @property
    def format_bonus(self) -> float:
        """The reward a well-formed answer adds: ``format_reward``, null being
        :data:`VIDEO_QA_FORMAT_REWARD` in video_qa and 0 in interactive mode."""
        if self.format_reward is not None:
            return float(self.format_reward)
        return VIDEO_QA_FORMAT_REWARD if self.mode == "video_qa" else 0.0

    def memory_bytes(self) -> int:
        """Host memory one env holds, by the estimate above :data:`HOST_MEMORY_BUDGET`: its scene, and
        its observation's frames (the sweep, the history and the current view)."""
        frames = self.num_sweep_frames + self.image_history + 1
        return ENV_BASE_BYTES + frames * self.image_size**2 * FRAME_BYTES_PER_PIXEL


# The alternative to append (with "|") to model.lora_target_modules for LoRA on the language model's
# input embeddings: what lets the tiny model tell the prompt's words apart (docs/TRAINING.md,
# "Text-conditional answers and LoRA on the embeddings"); a real checkpoint's embeddings need no adapter.
EMBEDDING_LORA_TARGET = r".*language_model\.embed_tokens"


@dataclass
class ModelConfig:
    """The policy VLM, its LoRA adapter and its heads (``a2c_ppo_acktr/policy/model.py``)."""

    model_path: str = "tiny:qwen2_5_vl"  # HF hub id, local directory, or tiny:<family> for the offline tiny model
    sft_adapter: Optional[str] = (
        None  # LoRA adapter directory from train_sft.py to warm-start PPO (main_vsi.py --sft-adapter)
    )
    dtype: str = "float32"  # float32 | bfloat16 | float16
    # sdpa | eager | flash_attention_2 | auto (at load: flash_attention_2 on CUDA in bf16/fp16 when flash_attn
    # imports, else sdpa; flash attention also serves Qwen2.5-VL's windowed vision tower in one varlen
    # call per layer instead of one small sdpa call per window)
    attn_implementation: str = "sdpa"
    device: str = "auto"  # auto | cpu | cuda
    gradient_checkpointing: bool = False
    min_pixels: Optional[int] = None  # processor image budget; None keeps the model's own
    max_pixels: Optional[int] = None
    use_lora: bool = True
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    # Regex on module names: language model only (Qwen2.5-VL's vision MLP also has gate/up/down_proj).
    lora_target_modules: str = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    train_vision: str = "none"  # none | projector | tower
    value_head_hidden: int = 1024
    temp_head_hidden: int = 256  # width of the temperature predictor's hidden layer
    use_temp_predictor: bool = True
    temperature: float = 1.0  # initial (or fixed, with the predictor off) sampling temperature
    min_temperature: float = 0.5
    max_temperature: float = 1.5
    max_new_tokens: int = 96
    # Sampling filters of the rollout (after the temperature), applied by the same function when
    # sampling and when the update scores the sampled tokens: the trained distribution is the
    # sampled one. 0 / 1.0 = off. Greedy evaluation ignores them.
    top_k: int = 0
    top_p: float = 1.0
    thought_prob_coef: float = 0.5  # lambda in log pi = lambda * log p(thought) + log p(action)
    # Where act() takes log-probs/values from: "generate" (generate's own processed logits and first
    # step, no extra forward) or "recompute" (a no-grad training forward after generate: bit-identical
    # to the update's computation in the same layout, one more forward per step). "auto": "generate"
    # when the update recomputes its old log-probs itself (ppo.old_log_probs=update: act's are then
    # only monitored) or in float32; "recompute" for bfloat16/float16 with ppo.old_log_probs=rollout,
    # where generate's cached decoding puts ~20% of turns more than 1e-2 off ratio 1 on the first PPO
    # minibatch, against ~4% (docs/TRAINING.md, "The first ratio"). A run's saved config.yaml holds
    # the mode used (RunConfig.validate resolves it).
    rollout_log_probs: str = "auto"
    # Rows of one act() batch with the same prompt (a group's siblings, rollout.group_size > 1) are
    # processed and prefilled once, and generate continues every row from that shared KV cache;
    # false prefills every row (docs/TRAINING.md, "One prefill per distinct prompt").
    shared_prefill: bool = True
    # With a frozen vision tower (train_vision=none, no adapter on it), each image's tower output in
    # the rollout is kept with its turn and the update forwards it instead of running the tower again
    # on every minibatch of every epoch (docs/TRAINING.md, "The frozen vision tower and flash attention").
    reuse_vision_outputs: bool = True
    # With reuse_vision_outputs, a rollout keeps the tower's output of up to this many distinct images
    # (least recently used out) and runs the tower only on images it has not encoded: an episode's
    # sweep frames once per rollout, not at every turn. Memory: this many images x visual tokens per
    # image x hidden size, in the model's dtype, on its device (256 Qwen2.5-VL-7B frames at 448 px:
    # ~0.5 GB); 0 runs the tower on every image of every step.
    vision_cache_images: int = 256
    # Response positions per logit chunk of the training forward (each chunk is one lm_head call and a
    # chunk x vocabulary float32 working set); null = 2**23 / vocabulary (55 at Qwen's 152k). A small
    # value forces several chunks, which the GPU smoke test uses to exercise ZeRO-3's equal call counts.
    logits_chunk_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        _choice("model.dtype", self.dtype, ["float32", "bfloat16", "float16"])
        _choice("model.attn_implementation", self.attn_implementation, ["sdpa", "eager", "flash_attention_2", "auto"])
        _choice("model.device", self.device, ["auto", "cpu", "cuda"])
        _choice("model.train_vision", self.train_vision, ["none", "projector", "tower"])
        _choice("model.rollout_log_probs", self.rollout_log_probs, ["auto", "generate", "recompute"])
        _check(
            self.logits_chunk_tokens is None or self.logits_chunk_tokens >= 1,
            f"model.logits_chunk_tokens={self.logits_chunk_tokens} must be >= 1 (or null for the default)",
        )
        _check(
            self.vision_cache_images >= 0,
            f"model.vision_cache_images={self.vision_cache_images} must be >= 0 (0 = off)",
        )
        _check(self.lora_r >= 1, f"model.lora_r={self.lora_r} must be >= 1")
        _check(self.lora_alpha > 0, f"model.lora_alpha={self.lora_alpha} must be > 0")
        _check(0 <= self.lora_dropout < 1, f"model.lora_dropout={self.lora_dropout} must be in [0, 1)")
        _check(
            self.temperature > 0,
            f"model.temperature={self.temperature} must be > 0 (use a small value such as 0.01 for near-greedy)",
        )
        _check(
            0 < self.min_temperature <= self.temperature <= self.max_temperature,
            f"temperatures must satisfy 0 < model.min_temperature ({self.min_temperature}) <= model.temperature "
            f"({self.temperature}) <= model.max_temperature ({self.max_temperature})",
        )
        if self.use_temp_predictor:
            # The predictor is a scaled sigmoid initialised at `temperature`: it must lie strictly inside.
            _check(
                self.min_temperature < self.temperature < self.max_temperature,
                "model.use_temp_predictor needs model.min_temperature < model.temperature < model.max_temperature "
                f"(got {self.min_temperature}, {self.temperature}, {self.max_temperature}); widen the range or "
                "set use_temp_predictor=false for a fixed temperature",
            )
        _check(
            0.0 <= self.thought_prob_coef <= 1.0, f"model.thought_prob_coef={self.thought_prob_coef} must be in [0, 1]"
        )
        _check(self.max_new_tokens >= 1, f"model.max_new_tokens={self.max_new_tokens} must be >= 1")
        _check(self.top_k >= 0, f"model.top_k={self.top_k} must be >= 0 (0 = off)")
        _check(0.0 < self.top_p <= 1.0, f"model.top_p={self.top_p} must be in (0, 1] (1 = off)")
        _check(self.value_head_hidden >= 1, f"model.value_head_hidden={self.value_head_hidden} must be >= 1")
        for name in ("min_pixels", "max_pixels"):
            value = getattr(self, name)
            _check(
                value is None or value >= 1,
                f"model.{name}={value} must be >= 1 pixel (or null for the model's own budget)",
            )
        if self.min_pixels is not None and self.max_pixels is not None:
            _check(
                self.min_pixels <= self.max_pixels,
                f"model.min_pixels={self.min_pixels} must be <= model.max_pixels={self.max_pixels}",
            )
        try:
            re.compile(self.lora_target_modules)
        except re.error as e:
            raise ConfigError(
                f"model.lora_target_modules={self.lora_target_modules!r} is not a valid regular expression: {e}"
            ) from e
        _check(self.temp_head_hidden >= 1, f"model.temp_head_hidden={self.temp_head_hidden} must be >= 1")
        if self.attn_implementation == "flash_attention_2":
            _check(
                self.dtype != "float32",
                "model.attn_implementation=flash_attention_2 needs model.dtype bfloat16 or float16",
            )

    @property
    def recompute_rollout_log_probs(self) -> bool:
        """Whether ``act`` re-scores its replies with a training forward (``rollout_log_probs``; an
        unresolved ``auto`` outside a run, e.g. in evaluation, follows the dtype)."""
        if self.rollout_log_probs == "auto":
            return self.dtype != "float32"
        return self.rollout_log_probs == "recompute"


@dataclass
class RolloutConfig:
    """Experience collection."""

    num_envs: int = 4  # envs stepped together; one batched generate per step
    num_steps: int = 8  # turns collected per env per iteration
    # Envs per group: the envs of a group play every episode on the same scene, question and start
    # pose (rloo/grpo compare them, counting only episodes begun >= env.max_turns steps before the
    # rollout's end, so they need num_steps >= env.max_turns; ppo.adv_norm=group normalises within
    # them). 1 = no groups.
    group_size: int = 1
    # What samples the replies (a2c_ppo_acktr/policy/rollout_engine.py): hf = in-process generate; vllm = a
    # vLLM OpenAI-compatible server at engine_url (comma-separated: one node's servers, split among its
    # processes by local rank), started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; one
    # adapter is loaded into every server by name each iteration and the policy recomputes the log-probs.
    engine: str = "hf"
    engine_url: Optional[str] = None
    engine_timeout_s: float = 600.0  # total deadline of one request
    engine_retries: int = 3  # tries per request before the run stops with a resumable checkpoint
    engine_max_concurrency: int = 64  # requests in flight per process

    def __post_init__(self) -> None:
        _choice("rollout.engine", self.engine, ROLLOUT_ENGINES)
        _check(self.engine_timeout_s > 0, f"rollout.engine_timeout_s={self.engine_timeout_s} must be > 0")
        _check(self.engine_retries >= 1, f"rollout.engine_retries={self.engine_retries} must be >= 1")
        _check(
            self.engine_max_concurrency >= 1,
            f"rollout.engine_max_concurrency={self.engine_max_concurrency} must be >= 1",
        )
        _check(
            1 <= self.num_envs <= HOST_MEMORY_BUDGET // ENV_BASE_BYTES,
            f"rollout.num_envs={self.num_envs} must be in [1, {HOST_MEMORY_BUDGET // ENV_BASE_BYTES}] per process "
            "(each env keeps its "
            f"scene, about {ENV_BASE_BYTES // 2**20} MiB, and its frames: {HOST_MEMORY_BUDGET // 2**30} GiB for a "
            "process's envs); "
            "more processes run more envs",
        )
        _check(self.num_steps >= 1, f"rollout.num_steps={self.num_steps} must be >= 1")
        _check(
            self.group_size >= 1 and self.num_envs % self.group_size == 0,
            f"rollout.group_size={self.group_size} must be >= 1 and divide rollout.num_envs={self.num_envs} "
            f"(e.g. one of {_divisors(self.num_envs)})",
        )

    @property
    def batch_size(self) -> int:
        """Turns per iteration (derived, not a flag)."""
        return self.num_envs * self.num_steps


@dataclass
class PPOConfig:
    """The PPO update (``a2c_ppo_acktr/algo/ppo.py``) and the optimisation schedule."""

    num_iterations: int = 10
    ppo_epochs: int = 2
    mini_batch_size: int = 8  # turns per minibatch (per process)
    grad_accum_steps: int = 1
    lr: float = 1e-5
    head_lr: Optional[float] = None  # value/temperature heads; None = lr
    lr_schedule: str = "cosine"  # cosine | constant
    warmup_iterations: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    adam_eps: float = 1e-7
    clip_coef: float = 0.2
    clip_vloss: bool = True
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    # token: mean per-token entropy of the response (each token's distribution at its temperature);
    # sequence: the response's entropy, sum over its tokens weighted like its log-prob
    # (thought_prob_coef on thought tokens), the entropy that matches a whole-response log-prob.
    entropy_bonus: str = "token"
    # Where the update's old log-probs (and the value clip's centre) come from. update: a no-grad
    # forward of the policy over the rollout in the first epoch's own minibatch layout, just before the
    # update (verl's recomputed old_log_prob): the first minibatch's ratio is exactly 1 in any dtype and
    # at any depth, for one more no-grad forward per minibatch. rollout: act's own log-probs
    # (model.rollout_log_probs), which agree with the update only up to the low-precision rounding of
    # another batch layout (docs/TRAINING.md, "The first ratio").
    old_log_probs: str = "update"
    # The importance ratio and its clip (docs/TRAINING.md, "Policy losses"). token: one ratio per
    # generated token, clipped per token (PPO as verl, TRL and OpenRLHF apply it to LLMs); sequence:
    # RL4VLM's ratio of the whole reply, exp(sum_t w_t (log p_t - log p_old_t)), w_t =
    # model.thought_prob_coef on thought tokens; sequence_mean: GSPO's length-normalised sequence ratio,
    # the exp of the w-weighted mean of the token log-ratios.
    ratio_level: str = "token"
    # How per-token losses become one number (ratio_level=token only; the sequence levels average
    # their per-reply losses): token-mean (every token of the minibatch counts once), seq-mean-token-sum,
    # seq-mean-token-mean, seq-mean-token-sum-norm (Dr. GRPO: each reply's token sum over the constant
    # model.max_new_tokens). null = token-mean at the token level.
    loss_agg: Optional[str] = None
    # Decoupled clip range [1 - clip_low, 1 + clip_high] (DAPO's clip-higher: 0.2 and 0.28); null =
    # clip_coef on that side.
    clip_low: Optional[float] = None
    clip_high: Optional[float] = None
    # Dual clip (Ye et al. 2020): for a negative advantage the loss is capped at -A * clip_ratio_c, so one
    # sample whose ratio has run far above 1 cannot dominate the update; null = off, else > 1 (verl: 3).
    clip_ratio_c: Optional[float] = None
    # DAPO's dynamic sampling (Yu et al. 2025), for the grouped estimators (rloo, grpo): a group whose
    # episodes all have the same return has every advantage 0 and teaches nothing. Its turns are
    # dropped and more rollouts are collected (at most dynamic_sampling_max_rounds in all) until the
    # update's batch holds rollout.num_envs * num_steps turns of groups that differ; if the rounds run
    # out first, the rest of the batch is filled with turns that take no advantage.
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 4
    # DAPO's overlong filtering: a reply cut by model.max_new_tokens (no end-of-sequence token) takes no
    # policy gradient (its tokens leave the policy loss), since its reward judges a reply that was never
    # finished.
    mask_truncated_replies: bool = False
    kl_coef: float = 0.0  # KL to the reference (ppo.reference); 0 disables
    # full: exact per-token KL(pi || ref) over the vocabulary; k1/k2/k3: Schulman's sample estimators
    # on the sampled tokens (k1 = log pi/ref, k2 = (log pi/ref)^2 / 2, k3 = ref/pi - 1 - log ref/pi).
    kl_estimator: str = "full"
    # loss: kl_coef * mean per-token KL in the loss; reward: kl_coef * the response's summed per-token
    # KL subtracted from each turn's reward before the advantages (one reference pass per rollout).
    kl_penalty: str = "loss"
    kl_adaptive: bool = False
    kl_target: float = 0.05  # target KL of the adaptive controller
    # The reference policy of the KL (and of losses/kl_ref). start: the policy the run starts from (a
    # warm start's SFT adapter, kept as a frozen copy of the adapter; without a warm start the
    # adapter-disabled model, no copy), RLHF's usual reference: a KL to it keeps what SFT taught. base:
    # the adapter disabled, no copy (after a warm start, the model before SFT). ema: an exponential
    # moving average of the trainable weights, started from the starting weights and updated after
    # every PPO update (ema <- ema_decay * ema + (1 - ema_decay) * weights): it trails the policy
    # instead of pinning it; ema_decay 1 is the same as start.
    reference: str = "start"
    ema_decay: float = 0.95
    # Perception-aware token weighting (VPPO, Huang et al. 2025): after each rollout a no-grad pass
    # measures every generated token's visual dependency, the KL between the policy's next-token
    # distribution given the real images and given masked ones (perception_mask: zero = the
    # processor's mean image, noise = standard normal pixels). The rollout's top perception_top_frac
    # most dependent tokens get their log-prob weight multiplied by perception_top_weight, the others
    # by perception_rest_weight (1 and 0 = VPPO's gradient filtering); each response's advantage is
    # scaled into [perception_adv_min, 1] by its mean dependency (min-max over the rollout).
    perception_weighting: bool = False
    perception_top_frac: float = 0.4
    perception_top_weight: float = 2.0
    perception_rest_weight: float = 1.0
    perception_adv_min: float = 0.9
    perception_mask: str = "zero"
    target_kl: Optional[float] = None  # early-stop the epoch loop above this approx KL
    # Truncated importance sampling (verl's TIS) for a rollout engine whose sampler is not the policy's
    # numerics (rollout.engine=vllm): each turn's policy-gradient term is weighted by
    # min(exp(logp_policy_old - logp_engine), tis_cap), the weight detached. null = the engine's
    # default: 2.0 with rollout.engine=vllm (verl's default cap), off with hf; 0 = off. Turns the
    # engine did not score weigh 1.
    tis_cap: Optional[float] = None
    max_grad_norm: float = 0.5
    # Advantage normalisation before the update: batch (over the rollout), group (within each
    # rollout.group_size group), none. Divided by max(std, adv_std_floor): when every reward is equal
    # the advantages are value noise and stay near zero instead of being blown up to unit std.
    adv_norm: str = "batch"
    adv_std_floor: float = 0.1  # one MRA step (scores move in steps of 0.1 on numeric questions)
    norm_adv: Optional[bool] = None  # deprecated: true = adv_norm batch, false = none (old configs)
    # What trains the temperature head: policy_gradient (it is part of the log-prob: the clipped
    # surrogate drives it, measured to collapse to model.min_temperature), or entropy_target (kept
    # off the policy-gradient path; a SAC-style loss temp_coef * log T * (H - target_entropy) moves
    # each row's temperature toward the per-token entropy target_entropy).
    temperature_loss: str = "policy_gradient"
    target_entropy: float = 0.3  # nats per token (temperature_loss=entropy_target)
    temp_coef: float = 1.0
    gamma: float = 0.99
    gae_lambda: float = 0.95
    advantage_estimator: str = "gae"

    def __post_init__(self) -> None:
        _check(self.num_iterations >= 1, f"ppo.num_iterations={self.num_iterations} must be >= 1")
        _check(self.ppo_epochs >= 1, f"ppo.ppo_epochs={self.ppo_epochs} must be >= 1")
        _check(self.mini_batch_size >= 1, f"ppo.mini_batch_size={self.mini_batch_size} must be >= 1")
        _check(self.grad_accum_steps >= 1, f"ppo.grad_accum_steps={self.grad_accum_steps} must be >= 1")
        _check(self.lr > 0, f"ppo.lr={self.lr} must be > 0")
        _check(self.head_lr is None or self.head_lr > 0, f"ppo.head_lr={self.head_lr} must be > 0 (or null for ppo.lr)")
        _check(self.warmup_iterations >= 0, f"ppo.warmup_iterations={self.warmup_iterations} must be >= 0")
        _check(self.weight_decay >= 0, f"ppo.weight_decay={self.weight_decay} must be >= 0")
        _check(self.adam_eps > 0, f"ppo.adam_eps={self.adam_eps} must be > 0 (e.g. 1e-8)")
        _check(
            self.target_kl is None or self.target_kl > 0,
            f"ppo.target_kl={self.target_kl} must be > 0 (or null: no early stop)",
        )
        _choice("ppo.lr_schedule", self.lr_schedule, ["cosine", "constant"])
        _check(0 <= self.min_lr_ratio <= 1, f"ppo.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        _check(self.clip_coef > 0, f"ppo.clip_coef={self.clip_coef} must be > 0")
        _check(
            self.tis_cap is None or self.tis_cap == 0 or self.tis_cap >= 1.0,
            f"ppo.tis_cap={self.tis_cap} must be >= 1 (a cap on the importance weight), 0 (off) or null (the engine's "
            "default)",
        )
        _check(
            self.vf_coef >= 0 and self.ent_coef >= 0 and self.kl_coef >= 0,
            "ppo.vf_coef, ppo.ent_coef and ppo.kl_coef must be >= 0",
        )
        _check(self.max_grad_norm > 0, f"ppo.max_grad_norm={self.max_grad_norm} must be > 0")
        _check(0 <= self.gamma <= 1, f"ppo.gamma={self.gamma} must be in [0, 1]")
        _check(0 <= self.gae_lambda <= 1, f"ppo.gae_lambda={self.gae_lambda} must be in [0, 1]")
        _choice("ppo.advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATORS)
        if self.norm_adv is not None:  # an old config: map it, then forget it (saved configs hold adv_norm)
            self.adv_norm = "batch" if self.norm_adv else "none"
            self.norm_adv = None
        _choice("ppo.adv_norm", self.adv_norm, ADV_NORMS)
        _check(self.adv_std_floor >= 0, f"ppo.adv_std_floor={self.adv_std_floor} must be >= 0")
        _choice("ppo.entropy_bonus", self.entropy_bonus, ["token", "sequence"])
        _choice("ppo.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("ppo.kl_penalty", self.kl_penalty, ["loss", "reward"])
        _choice("ppo.temperature_loss", self.temperature_loss, ["policy_gradient", "entropy_target"])
        _check(self.target_entropy >= 0, f"ppo.target_entropy={self.target_entropy} must be >= 0 (nats per token)")
        _check(self.temp_coef >= 0, f"ppo.temp_coef={self.temp_coef} must be >= 0")
        _choice("ppo.reference", self.reference, REFERENCES)
        _choice("ppo.old_log_probs", self.old_log_probs, OLD_LOG_PROBS)
        _choice("ppo.ratio_level", self.ratio_level, RATIO_LEVELS)
        if self.ratio_level == "token":
            self.loss_agg = "token-mean" if self.loss_agg is None else self.loss_agg
            _choice("ppo.loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        else:
            _check(
                self.loss_agg is None,
                f"ppo.loss_agg={self.loss_agg!r} aggregates per-token losses, but ppo.ratio_level={self.ratio_level!r} "
                "has one "
                "loss per reply (averaged over the replies): leave ppo.loss_agg null, or use ppo.ratio_level=token",
            )
        for side in ("clip_low", "clip_high"):
            value = getattr(self, side)
            _check(value is None or value > 0, f"ppo.{side}={value} must be > 0 (or null for ppo.clip_coef)")
        _check(
            self.dynamic_sampling_max_rounds >= 1,
            f"ppo.dynamic_sampling_max_rounds={self.dynamic_sampling_max_rounds} must be >= 1 (rollouts collected per "
            "update at most)",
        )
        _check(
            self.clip_low is None or self.clip_low < 1,
            f"ppo.clip_low={self.clip_low} must be < 1 (the ratio's floor is 1 - clip_low > 0)",
        )
        _check(
            self.clip_ratio_c is None or self.clip_ratio_c > 1,
            f"ppo.clip_ratio_c={self.clip_ratio_c} must be > 1 (the dual clip's cap on a negative advantage's ratio; "
            "verl uses 3) or null",
        )

        _check(
            0.0 <= self.ema_decay <= 1.0,
            f"ppo.ema_decay={self.ema_decay} must be in [0, 1] (0 = the reference is the last update's weights, 1 = "
            "the starting weights)",
        )
        _check(
            0.0 < self.perception_top_frac <= 1.0,
            f"ppo.perception_top_frac={self.perception_top_frac} must be in (0, 1]",
        )
        _check(
            self.perception_top_weight >= 0
            and self.perception_rest_weight >= 0
            and self.perception_top_weight + self.perception_rest_weight > 0,
            f"ppo.perception_top_weight={self.perception_top_weight} and "
            f"ppo.perception_rest_weight={self.perception_rest_weight} "
            "must be >= 0 and not both 0",
        )
        _check(
            0.0 <= self.perception_adv_min <= 1.0,
            f"ppo.perception_adv_min={self.perception_adv_min} must be in [0, 1] (1 = no advantage scaling)",
        )
        _choice("ppo.perception_mask", self.perception_mask, ["zero", "noise"])
        if self.kl_penalty == "reward":
            _check(not self.kl_adaptive, "ppo.kl_adaptive works with ppo.kl_penalty=loss only")
        if self.kl_adaptive:
            _check(self.kl_coef > 0, "ppo.kl_adaptive needs an initial ppo.kl_coef > 0")
            _check(self.kl_target > 0, f"ppo.kl_target={self.kl_target} must be > 0")

    @property
    def clip_range(self) -> tuple[float, float]:
        """``(clip_low, clip_high)``: the ratio is clipped to ``[1 - low, 1 + high]``."""
        low = self.clip_coef if self.clip_low is None else self.clip_low
        return low, self.clip_coef if self.clip_high is None else self.clip_high


@dataclass
class SFTConfig:
    """Supervised warm start (``train_sft.py``)."""

    data_path: Optional[str] = None  # preprocessed SFT dataset (JSONL of chat samples)
    output_dir: str = "outputs/sft"
    num_epochs: float = 3.0
    lr: float = 2e-4
    per_device_batch_size: int = 4
    grad_accum_steps: int = 1
    max_length: int = 4096
    group_by_modality: bool = True
    save_steps: int = 200
    strict_images: bool = False  # fail on a missing/unreadable image instead of skipping the sample
    max_steps: int = -1  # > 0 overrides num_epochs (short smoke runs)
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    # Clip the global gradient norm at this value. SFT's own: PPO's ppo.max_grad_norm (0.01 in the GPU
    # presets, after RL4VLM) would throttle a supervised cross-entropy update to almost nothing.
    max_grad_norm: float = 1.0
    logging_steps: int = 10
    save_total_limit: int = 2  # adapter-only checkpoints kept under output_dir/checkpoint-*
    resume: Optional[str] = None  # None | auto (latest checkpoint in output_dir) | path to a checkpoint-* directory
    # A fresh start (no sft.resume) in an output_dir that already holds an SFT run (adapter/,
    # checkpoint-*, config.yaml) is refused; overwrite=true moves it aside to OUTPUT_DIR.old-<time>.
    overwrite: bool = False

    def __post_init__(self) -> None:
        _check(
            self.max_steps == -1 or self.max_steps >= 1,
            f"sft.max_steps={self.max_steps} must be -1 (use num_epochs) or >= 1",
        )
        _check(0 <= self.warmup_ratio < 1, f"sft.warmup_ratio={self.warmup_ratio} must be in [0, 1)")
        _check(self.weight_decay >= 0, f"sft.weight_decay={self.weight_decay} must be >= 0")
        _check(
            self.max_grad_norm > 0,
            f"sft.max_grad_norm={self.max_grad_norm} must be > 0; use 1.0 (the usual value for supervised "
            "fine-tuning) or a large value such as 1e9 to clip practically never",
        )
        _check(self.logging_steps >= 1, f"sft.logging_steps={self.logging_steps} must be >= 1")
        _check(self.save_total_limit >= 1, f"sft.save_total_limit={self.save_total_limit} must be >= 1")
        _check(self.num_epochs > 0, f"sft.num_epochs={self.num_epochs} must be > 0")
        _check(self.lr > 0, f"sft.lr={self.lr} must be > 0")
        _check(self.per_device_batch_size >= 1, f"sft.per_device_batch_size={self.per_device_batch_size} must be >= 1")
        _check(self.grad_accum_steps >= 1, f"sft.grad_accum_steps={self.grad_accum_steps} must be >= 1")
        _check(self.max_length >= 64, f"sft.max_length={self.max_length} must be >= 64")


@dataclass
class LabelConfig:
    """Teacher labelling (``vlm_traj_label.py``) and SFT dataset building (``vlm_traj_preprocess.py``)."""

    teacher: str = "oracle"  # oracle | hf | openai (a2c_ppo_acktr/labels/teachers.py registry)
    out_dir: str = "outputs/labels"  # trajectories.jsonl + images/ are written here
    num_episodes: int = 100
    seed: int = 0  # episode i is reset with seed + i (deterministic episode ids)
    batch_size: int = 4  # episodes stepped together (one batched teacher call per turn)
    epsilon: float = (
        0.0  # probability that a turn executes a random move instead of the teacher's (still labelled by the teacher)
    )
    oracle_max_moves: int = 1  # oracle turns toward its target at most this many times before answering
    oracle_face_tolerance_deg: float = (
        20.0  # oracle stops turning once the target is within this angle of the view axis
    )
    # oracle thoughts: "full" = a reason with the scene's names and numbers; "brief" = one fixed sentence per
    # question type (no names or numbers), for tiny models that cannot learn to copy them (configs/cpu-demo.yaml)
    oracle_thoughts: str = "full"
    # hf teacher: any local HF VLM through loading.load_vlm
    model_path: Optional[str] = None  # None = model.model_path
    max_new_tokens: int = 256
    # hf teacher out of memory: false stops labelling with an error that says what to change; true first
    # retries the batch in halves (down to one observation), and keeps later batches at the size that fit
    oom_retry_smaller: bool = False
    # openai teacher: OpenAI-compatible chat-completions server
    base_url: str = "http://127.0.0.1:8000/v1"
    model: Optional[str] = None  # served model name (required for teacher=openai)
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key (never logged or written)
    timeout_s: float = 60.0
    max_concurrency: int = 8
    retries: int = 3  # extra attempts after the first on timeouts, connection errors, 429 and 5xx
    backoff_s: float = 1.0  # first retry delay; doubles every retry
    request_temperature: float = 0.0
    # preprocessing (labelled trajectories -> SFT dataset)
    dataset_dir: str = "outputs/sft_data"  # train.jsonl / val.jsonl are written here
    min_score: float = 0.0  # keep episodes whose benchmark score is >= this
    per_turn: bool = (
        True  # one sample per teacher turn; false = one sample per episode (its final turn, all turns as context)
    )
    history_turns: int = 0  # earlier turns (user + assistant) kept as context; 0 = exactly the RL prompt
    val_fraction: float = 0.1  # fraction of scenes held out for validation (split by scene, never by turn)

    def __post_init__(self) -> None:
        _choice("label.teacher", self.teacher, TEACHERS)
        _check(self.num_episodes >= 1, f"label.num_episodes={self.num_episodes} must be >= 1")
        _check(self.batch_size >= 1, f"label.batch_size={self.batch_size} must be >= 1")
        _check(0.0 <= self.epsilon <= 1.0, f"label.epsilon={self.epsilon} must be in [0, 1]")
        _check(self.oracle_max_moves >= 0, f"label.oracle_max_moves={self.oracle_max_moves} must be >= 0")
        _choice("label.oracle_thoughts", self.oracle_thoughts, THOUGHT_STYLES)
        _check(
            0 < self.oracle_face_tolerance_deg <= 180,
            f"label.oracle_face_tolerance_deg={self.oracle_face_tolerance_deg} must be in (0, 180]",
        )
        _check(self.max_new_tokens >= 1, f"label.max_new_tokens={self.max_new_tokens} must be >= 1")
        _check(self.timeout_s > 0, f"label.timeout_s={self.timeout_s} must be > 0 seconds")
        _check(self.max_concurrency >= 1, f"label.max_concurrency={self.max_concurrency} must be >= 1")
        _check(self.retries >= 0, f"label.retries={self.retries} must be >= 0")
        _check(self.backoff_s >= 0, f"label.backoff_s={self.backoff_s} must be >= 0")
        _check(self.request_temperature >= 0, f"label.request_temperature={self.request_temperature} must be >= 0")
        _check_key_env("label.api_key_env", self.api_key_env)
        if self.teacher == "openai":
            _check(
                bool(self.model),
                "label.teacher=openai needs label.model (the served model name, e.g. Qwen/Qwen2.5-VL-72B-Instruct)",
            )
        _check(0.0 <= self.min_score <= 1.0, f"label.min_score={self.min_score} must be in [0, 1]")
        _check(self.history_turns >= 0, f"label.history_turns={self.history_turns} must be >= 0")
        _check(0.0 <= self.val_fraction < 1.0, f"label.val_fraction={self.val_fraction} must be in [0, 1)")


@dataclass
class EvalConfig:
    """Evaluation (``eval_vsi.py``)."""

    num_episodes: int = 50  # procedural questions evaluated (fixed, seeded set)
    seed: int = 12345  # eval question set seed, kept apart from training seeds
    greedy: bool = True
    temperature: float = 1.0  # used when greedy is false
    batch_size: int = 8  # episodes stepped together
    blind: bool = False  # withhold images: exposes answers guessed from text alone
    # The blind twin of a trained policy: every frame replaced by zeros of its shape, so the prompt's
    # tokens (image placeholders included) are exactly the sighted run's and only the pixels differ.
    zero_images: bool = False
    num_trajectory_pictures: int = 4

    def __post_init__(self) -> None:
        _check(
            1 <= self.num_episodes <= MAX_EVAL_EPISODES,
            f"eval.num_episodes={self.num_episodes} must be in [1, {MAX_EVAL_EPISODES}] (the question set and a record "
            "per episode are "
            "kept in memory for the report); split a larger evaluation into runs with different eval.seed",
        )
        _check(
            not (self.blind and self.zero_images),
            "eval.blind and eval.zero_images are two different blind baselines (no images in the prompt vs. the same "
            "prompt with black frames); set one",
        )
        _check(self.temperature > 0, f"eval.temperature={self.temperature} must be > 0")
        _check(self.batch_size >= 1, f"eval.batch_size={self.batch_size} must be >= 1")


@dataclass
class LogConfig:
    """Outputs, logging and checkpoints."""

    output_dir: str = "outputs/run"
    run_name: Optional[str] = None
    wandb_mode: str = "disabled"  # online | offline | disabled
    wandb_project: str = "vsi-ppo"
    tensorboard: bool = True
    save_interval: int = 5  # checkpoint every K iterations (and always at the end)
    keep_checkpoints: int = 2
    # Every N iterations (0 = never) write the rollout, turn by turn, to output_dir/rollouts/ as gzipped
    # JSONL (prompt text with image digests, reply, action, reward, value, advantage, return); the newest
    # keep_rollouts iterations are kept. Read them with python -m a2c_ppo_acktr.rl.saved_rollouts show FILE.
    save_rollouts_every: int = 0
    keep_rollouts: int = 10
    resume: Optional[str] = None  # None | auto | path to a checkpoint directory
    # A fresh start (no log.resume) in an output_dir that already holds a run (checkpoints or
    # metrics.jsonl) is refused; overwrite=true moves that run aside to OUTPUT_DIR.old-<time> first
    # (nothing is deleted).
    overwrite: bool = False
    progress_bar: bool = True
    # Stop this invocation after N iterations of its own, counted from where it starts or resumes (the
    # schedule still spans ppo.num_iterations): a time-limited job repeats the same command with
    # --resume auto. None runs to ppo.num_iterations.
    stop_after_iterations: Optional[int] = None
    # With ppo.kl_coef = 0 the KL to the reference is only a monitor (losses/kl_ref): measured (one
    # reference forward, on the first minibatch) every K updates, the first included; NaN in between.
    # With ppo.kl_coef > 0 it is in the loss and measured on every minibatch whatever K.
    kl_ref_interval: int = 10
    # Validation: every val_interval iterations (0 = never) the policy answers val_episodes fixed,
    # seeded questions greedily, in procedural scenes seeded from val_seed (held out from the training
    # scenes env.scene_seed + k and from the eval set eval.seed + i); val/* metrics are logged and the
    # best-scoring policy is kept in output_dir/best (policy/ + val.json), replaced atomically.
    val_interval: int = 0
    val_episodes: int = 20
    val_seed: int = 900_000

    def __post_init__(self) -> None:
        _check(self.output_dir.strip() != "", "log.output_dir is empty; name the run's directory (e.g. outputs/run)")
        _check(self.val_interval >= 0, f"log.val_interval={self.val_interval} must be >= 0 (0 = no validation)")
        _check(self.val_episodes >= 1, f"log.val_episodes={self.val_episodes} must be >= 1")
        _check(
            self.kl_ref_interval >= 1,
            f"log.kl_ref_interval={self.kl_ref_interval} must be >= 1 (1 measures losses/kl_ref on every update)",
        )
        _check(
            self.stop_after_iterations is None or self.stop_after_iterations >= 1,
            f"log.stop_after_iterations={self.stop_after_iterations} must be >= 1 (or null to run all iterations)",
        )
        _choice("log.wandb_mode", self.wandb_mode, ["online", "offline", "disabled"])
        _check(self.save_interval >= 1, f"log.save_interval={self.save_interval} must be >= 1")
        _check(self.keep_checkpoints >= 1, f"log.keep_checkpoints={self.keep_checkpoints} must be >= 1")
        _check(
            self.save_rollouts_every >= 0,
            f"log.save_rollouts_every={self.save_rollouts_every} must be >= 0 (0 = never)",
        )
        _check(self.keep_rollouts >= 1, f"log.keep_rollouts={self.keep_rollouts} must be >= 1")


@dataclass
class DistConfig:
    """Distributed execution (accelerate / DeepSpeed)."""

    zero_stage: int = 0  # 0 = no DeepSpeed; 2 = ZeRO-2 (3 supported with LoRA only, see validate)
    deepspeed_config: Optional[str] = None  # path to a DeepSpeed JSON (scripts/ds_config.json)

    def __post_init__(self) -> None:
        _choice("dist.zero_stage", self.zero_stage, [0, 1, 2, 3])
        _check(
            self.zero_stage > 0 or self.deepspeed_config is None,
            f"dist.deepspeed_config={self.deepspeed_config!r} is set but dist.zero_stage=0 (DeepSpeed off); "
            "set dist.zero_stage to the stage in that JSON (e.g. 2) or drop dist.deepspeed_config",
        )


@dataclass
class RunConfig:
    """Everything one run needs. ``preset`` names the YAML it came from (informational)."""

    seed: int = 1
    preset: Optional[str] = None
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    label: LabelConfig = field(default_factory=LabelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Cross-component rules; each message says the fix."""
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if dataclasses.is_dataclass(value):  # every *_key_env field, those added later included
                for f in dataclasses.fields(value):
                    if f.name.endswith("_key_env"):
                        _check_key_env(f"{section.name}.{f.name}", getattr(value, f.name))
        for name, value in (
            ("seed", self.seed),
            ("env.scene_seed", self.env.scene_seed),
            ("label.seed", self.label.seed),
            ("eval.seed", self.eval.seed),
            ("log.val_seed", self.log.val_seed),
        ):
            _check(
                0 <= value <= MAX_SEED,
                f"{name}={value} must be in [0, {MAX_SEED}] (seeds add offsets per rank, scene and episode)",
            )
        if self.rollout.engine != "hf":
            _check(
                bool(self.rollout.engine_url),
                f"rollout.engine={self.rollout.engine} needs rollout.engine_url (the server's http://host:port)",
            )
            _check(
                self.model.use_lora and self.model.train_vision == "none",
                f"rollout.engine={self.rollout.engine} loads the policy into the server as a LoRA adapter: it needs "
                "model.use_lora=true "
                "and model.train_vision=none (fully trained modules do not travel as an adapter)",
            )
            _check(
                self.dist.zero_stage < 3,
                f"rollout.engine={self.rollout.engine} saves the whole adapter every iteration; use dist.zero_stage=2",
            )
            problem = temperature_problem(self.model.min_temperature, self.model.max_temperature)
            _check(problem is None, str(problem))
            if self.ppo.tis_cap is None:
                self.ppo.tis_cap = VLLM_TIS_CAP
        _check(
            not self.ppo.tis_cap or self.rollout.engine != "hf",
            "ppo.tis_cap corrects for a rollout engine's own sampler; with rollout.engine=hf the policy samples "
            "itself: leave it null",
        )
        need = self.rollout.num_envs * self.env.memory_bytes()
        _check(
            need <= HOST_MEMORY_BUDGET,
            f"rollout.num_envs={self.rollout.num_envs} envs of "
            f"{self.env.num_sweep_frames + self.env.image_history + 1} frames at "
            f"{self.env.image_size}x{self.env.image_size} need about {need / 2**30:.1f} GiB of host memory per process "
            f"({FRAME_BYTES_PER_PIXEL} bytes per pixel of a frame), "
            f"more than {HOST_MEMORY_BUDGET // 2**30} GiB; use fewer envs (more processes), fewer frames or a smaller "
            "env.image_size",
        )
        bs = self.rollout.batch_size
        mb = self.ppo.mini_batch_size
        _check(
            bs % mb == 0,
            f"rollout batch num_envs*num_steps = {self.rollout.num_envs}*{self.rollout.num_steps} = {bs} "
            f"is not divisible by ppo.mini_batch_size={mb}; pick a mini_batch_size that divides {bs} "
            f"(e.g. {_divisors(bs)})",
        )
        if self.dist.zero_stage == 3:
            _check(
                self.model.use_lora and self.model.train_vision != "tower",
                "dist.zero_stage=3 is supported only with LoRA (model.use_lora=true) and without "
                "model.train_vision=tower (partitioned generation of a fully trained tower is not supported); use "
                "zero_stage=2",
            )
            _check(
                not self.model.gradient_checkpointing or self.model.use_lora,
                "dist.zero_stage=3 with gradient checkpointing needs LoRA",
            )
        if self.ppo.advantage_estimator in ("rloo", "grpo"):
            _check(
                self.rollout.group_size >= 2,
                f"ppo.advantage_estimator={self.ppo.advantage_estimator!r} compares episodes of the same question: set "
                f"rollout.group_size >= 2 (envs per group; it must divide rollout.num_envs={self.rollout.num_envs})",
            )
            _check(
                self.rollout.num_steps >= self.env.max_turns,
                f"ppo.advantage_estimator={self.ppo.advantage_estimator!r} compares whole episodes, and only those "
                "bound to end "
                "inside the rollout (begun at least env.max_turns steps before its end; any other choice favours "
                "short "
                f"episodes): rollout.num_steps={self.rollout.num_steps} must be >= env.max_turns={self.env.max_turns}, "
                f"ideally a few times it",
            )
        if self.ppo.adv_norm == "group":
            _check(
                self.rollout.group_size >= 2,
                "ppo.adv_norm=group normalises within groups of envs: set rollout.group_size >= 2, or use "
                "ppo.adv_norm=batch",
            )
        if self.ppo.temperature_loss == "entropy_target":
            _check(
                self.model.use_temp_predictor,
                "ppo.temperature_loss=entropy_target trains the temperature head: set model.use_temp_predictor=true",
            )
        if self.ppo.reference == "ema":
            _check(self.model.use_lora, "ppo.reference=ema averages the LoRA adapter: set model.use_lora=true")
        if self.reference_copies_weights:
            _check(
                self.dist.zero_stage < 3,
                f"ppo.reference={self.ppo.reference} keeps a full copy of the trainable weights on every process "
                "(here: of the warm "
                "start's adapter); with dist.zero_stage=3 they are partitioned: use ppo.reference=base or "
                "dist.zero_stage=2",
            )
        if self.ppo.dynamic_sampling:
            _check(
                self.ppo.advantage_estimator in ("rloo", "grpo"),
                f"ppo.dynamic_sampling drops groups whose episodes all score alike; ppo.advantage_estimator="
                f"{self.ppo.advantage_estimator!r} has no groups: use rloo or grpo (with rollout.group_size >= 2), or "
                "turn it off",
            )
        if self.model.rollout_log_probs == "auto":  # resolved here, so the saved config.yaml holds the mode used
            update = self.ppo.old_log_probs == "update"
            self.model.rollout_log_probs = "generate" if update or self.model.dtype == "float32" else "recompute"

        if self.log.val_interval > 0 and self.env.scene_source == "procedural":
            train = range(self.env.scene_seed, self.env.scene_seed + self.env.num_scenes)
            val = range(self.log.val_seed, self.log.val_seed + self.log.val_episodes)
            test = range(self.eval.seed, self.eval.seed + self.eval.num_episodes)
            _check(
                not _overlap(val, train) and not _overlap(val, test),
                f"validation scenes {self.log.val_seed}..{val.stop - 1} (log.val_seed, log.val_episodes) overlap the "
                "training "
                f"scenes {train.start}..{train.stop - 1} or the eval scenes {test.start}..{test.stop - 1}; choose "
                "another log.val_seed",
            )
        if self.ppo.kl_coef > 0:
            _check(
                self.model.use_lora,
                "a KL to the reference (ppo.kl_coef > 0) needs LoRA (model.use_lora=true): the reference is the "
                "adapter-disabled model",
            )

    @property
    def reference_copies_weights(self) -> bool:
        """Whether the KL's reference is a copy of the trainable weights (``ema``, or ``start`` after a
        warm start); ``start`` without a warm start and ``base`` disable the adapter instead."""
        return self.model.use_lora and (
            self.ppo.reference == "ema" or (self.ppo.reference == "start" and self.model.sft_adapter is not None)
        )

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """The config as it may be written or logged (``config.yaml``, checkpoints, tensorboard,
        wandb, resume records): every URL's ``user:password@`` part and credential-like query values
        are ``***`` (:func:`~a2c_ppo_acktr.common.redaction.redact_url`); the running objects read the
        fields themselves, with their credentials."""
        return redact_written(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | os.PathLike) -> None:
        """Write the resolved config as YAML (atomic: temp file then rename), credentials redacted (:meth:`to_dict`)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, self.to_yaml())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return _build(cls, data, prefix="")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "RunConfig":
        return cls.from_dict(load_yaml(path))


def _overlap(a: range, b: range) -> bool:
    return max(a.start, b.start) < min(a.stop, b.stop)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {str(path)!r} does not exist; presets live in {CONFIG_DIR} ({', '.join(list_presets())})"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8"
        ) from e
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


# A config is hundreds of values; YAML aliases (*name) can make a few hundred bytes expand to billions
# (an alias bomb) once the value is copied or printed. The expanded size is counted before any value
# is built.
MAX_YAML_NODES = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml's SafeLoader refusing a key repeated in one mapping (plain YAML silently keeps the last)
    and a document that expands to more than :data:`MAX_YAML_NODES` values; merge keys
    (``<<: *base``) work as in YAML."""

    def get_single_data(self):  # noqa: ANN201 - yaml's signature
        node = self.get_single_node()
        if node is None:
            return None
        expanded = _expanded_size(node, {})
        if expanded > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"it expands to {expanded} values through its aliases (*name), more than {MAX_YAML_NODES}: refused as "
                "an alias bomb",
                node.start_mark,
            )
        return self.construct_document(node)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values ``node`` stands for once every alias is expanded (each shared node counted once per use)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = min(size, 10 * MAX_YAML_NODES)  # saturate: the count itself must stay cheap
    return memo[id(node)]


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": merged by construct_mapping; its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found the key {key!r} twice (keep one)",
                key_node.start_mark,
            )
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def list_presets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    p = CONFIG_DIR / f"{name}.yaml"
    if not p.is_file():
        raise ConfigError(f"unknown preset {name!r}; known presets: {list_presets()}")
    return p


def _unknown_key(key: str, known: Sequence[str], prefix: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {prefix + close[0]!r}?" if close else ""
    return ConfigError(f"unknown config key {prefix + key!r}.{hint} Known keys here: {sorted(known)}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(key, list(fields), prefix)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value or {}, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"bad config section {prefix!r}: {e}") from e


# Numbers YAML 1.1 reads but nobody means on a command line: 0x10 (16), 0o7, 0b1, 1_0 (10).
_NON_DECIMAL = re.compile(r"\s*[-+]?(0[xXoObB][0-9a-fA-F_]*|[0-9.]*_[0-9._eE+-]*)\s*")


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check/convert ``value`` to type ``tp``; strings (from the CLI) are parsed as YAML scalars."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.strip().lower() in ("none", "null", "~") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _coerce(value, a, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is dict:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value) if value.strip() else {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{name} must be a mapping such as {{key: value}}, got {value!r} ({e})") from None
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(
                f"{name} must be a mapping such as {{key: value}}, got {value!r} ({type(value).__name__})"
            )
        # Values set one by one on the command line (--env.game.max_position 7) arrive as strings.
        return {str(k): (yaml.safe_load(v) if isinstance(v, str) else v) for k, v in value.items()}
    if origin is list:
        (item_tp,) = args
        if isinstance(value, str):
            parsed = (
                yaml.safe_load(value)
                if value.strip().startswith("[")
                else [v.strip() for v in value.split(",") if v.strip()]
            )
            value = parsed
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list, got {value!r} ({type(value).__name__})")
        return [_coerce(v, item_tp, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and tp is not str:
        if tp in (int, float) and _NON_DECIMAL.fullmatch(value):
            raise ConfigError(f"{name}={value!r}: write a plain decimal number (no 0x/0o/0b prefixes or _ separators)")
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            pass
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads "1e-5" (no dot) as a string; Python's float() reads it as users mean it.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r} ({type(value).__name__})")
        return value
    return value


def _set_dotted(data: dict[str, Any], dotted: str, value: str) -> None:
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(tokens: Sequence[str]) -> dict[str, Any]:
    """Turn ``["--ppo.lr", "1e-5", "env.max_turns=4", "--model.use_lora=false"]`` into a nested dict.

    Values stay strings; :func:`_coerce` parses them against the field's type.
    """
    out: dict[str, Any] = {}
    i = 0
    tokens = list(tokens)
    while i < len(tokens):
        tok = tokens[i]
        key = tok[2:] if tok.startswith("--") else tok
        if "=" in key:
            k, v = key.split("=", 1)
            i += 1
        else:
            if not tok.startswith("--"):
                raise ConfigError(f"cannot read override {tok!r}; write section.key=value or --section.key value")
            if i + 1 >= len(tokens):
                raise ConfigError(f"override {tok!r} has no value; write {tok} VALUE")
            k, v = key, tokens[i + 1]
            i += 2
        _set_dotted(out, k.replace("-", "_"), v)
    return out


def merge_dicts(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``, nested dicts (config sections) merged key by key."""
    out = dict(base)
    for k, v in over.items():
        if v is None and isinstance(out.get(k), dict):
            continue  # an empty section (``ppo:``) adds nothing; it does not reset the preset's section
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_dicts(out[k], v)
        else:
            out[k] = v
    return out


def load_config(
    config: Optional[str] = None,
    preset: Optional[str] = None,
    overrides: Sequence[str] | dict[str, Any] = (),
) -> RunConfig:
    """Resolve a :class:`RunConfig` from an optional YAML file or preset name plus overrides."""
    data: dict[str, Any] = {}
    if preset is not None:
        data = load_yaml(preset_path(preset))
        data.setdefault("preset", preset)
    if config is not None:
        data = merge_dicts(data, load_yaml(config))
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    return RunConfig.from_dict(merge_dicts(data, over))


def add_config_args(parser) -> None:
    """Add ``--config``/``--preset`` to an argparse parser; other ``--section.key`` are overrides."""
    parser.add_argument(
        "--config", default=None, help="YAML config file (sections env/model/rollout/ppo/sft/eval/log/dist)"
    )
    parser.add_argument("--preset", default=None, help=f"preset name under configs/ ({', '.join(list_presets())})")


def config_from_args(args, extra: Sequence[str]) -> RunConfig:
    """Build the run config from parsed ``--config``/``--preset`` and the remaining override tokens."""
    return load_config(config=args.config, preset=args.preset, overrides=extra)

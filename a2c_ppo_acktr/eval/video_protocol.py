"""The benchmark's own protocol on its videos: ``eval_vsi.py --protocol video``.

VSI-Bench numbers are compared under the reference protocol (docs/BENCHMARK.md, "The
reference protocol on videos"): each row's scan has a walk-through video ``<dataset>/<scene_name>.mp4``;
the model sees N frames sampled over the whole video, then the reference prompt
(:func:`~a2c_ppo_acktr.common.prompts.benchmark_prompt`), and answers in one greedy generation of at most 16
new tokens; the answer is scored by :mod:`~a2c_ppo_acktr.common.scoring`. The interactive setting
(``--protocol interactive``, the default) instead re-renders the scan and lets the agent move.

Frames: which and how many, per model family (the reference evaluation's choice)
------------------------------------------------------------------------------
* N = 32 for every family here. lmms-eval's Qwen wrappers default to ``max_num_frames=32``
  (EvolvingLMMs-Lab/lmms-eval ``lmms_eval/models/simple/qwen2_vl.py``, ``qwen2_5_vl.py``,
  ``qwen3_vl.py``), and VSI-Bench's own evaluation script runs its open models with ``num_frames=32``
  (vision-x-nyu/thinking-in-space ``evaluate_all_in_one.sh``: LLaVA-OneVision, LLaVA-NeXT-Video,
  LongVA, VILA ``..._32f``; InternVL2 8 and GPT-4o 16 are the exceptions).
* ``uniform``: ``np.linspace(0, total_frames - 1, N, dtype=int)`` over all frames of the video, the
  ``load_video`` of thinking-in-space's model wrappers (``lmms_eval/models/llava_onevision.py``,
  ``llava_vid.py``; decord's ``len(vr)`` frames). Used for LLaVA.
* ``qwen_2fps``: lmms-eval's Qwen2-VL / Qwen2.5-VL wrappers hand the video file to qwen-vl-utils'
  ``process_vision_info``, which reads it at 2 frames per second (``smart_nframes``: ``total / fps * 2``
  frames, at least 4, at most 768, rounded down to even; ``torch.linspace(0, total - 1, n).round()``),
  and then keep ``np.linspace(0, n - 1, N, dtype=int)`` of those n frames. On a video longer than N/2
  seconds this is uniform over the whole video to within half a second.
* ``qwen3_2fps``: the same in lmms-eval's Qwen3-VL wrapper, which also drops repeated indices
  (``np.unique``) when the video has fewer than N frames at 2 fps.

Video reading on this machine
-----------------------------
qwen-vl-utils 0.0.14 reads files with torchcodec, decord or ``torchvision.io.read_video``; torchcodec
and decord are not installed and torchvision 0.29 no longer has ``read_video``, so its file readers
cannot work here. Videos are decoded with PyAV instead (frames counted from the container's packets,
as decord counts its index), and qwen-vl-utils does the rest for Qwen models: ``smart_nframes`` for
the 2-fps read and ``smart_resize`` with the pixel budget ``fetch_video`` applies to a video it read
itself (bicubic, antialiased, as there). Its path for a list of frames is not used: in 0.0.14 it
first rounds each frame to multiples of twice the patch factor (a 480x640 video becomes 448x672,
a 3:2 frame, instead of the 476x644 its file readers give). The per-frame pixel budget is the
model processor's video budget (``model.min_pixels``/``model.max_pixels`` override it); lmms-eval's
wrappers pass their own (Qwen2.5-VL: 256*28*28 to 1605632, capped by qwen-vl-utils at 768*28*28),
which gives the same sizes for the benchmark's videos (all at least 640x480).

The processor then gets the resized frames as one video with ``video_metadata`` (source fps, the
frame indices, the frame count) and neither samples nor resizes again; the metadata sets Qwen2.5-VL's
temporal spacing and Qwen3-VL's timestamps from the frames actually shown, as lmms-eval's Qwen3-VL
wrapper does (its Qwen2.5-VL wrapper passes none, leaving the processor's default frame rate).
LLaVA has no video input: its frames go in as images, one placeholder each.

Generation follows lmms-eval: ``generate`` with ``do_sample=False``, one beam, ``max_new_tokens=16``
on top of the checkpoint's own ``generation_config`` (so a ``repetition_penalty`` it ships, 1.05 for
Qwen2.5-VL-Instruct, applies there as here; the report's ``meta.generation`` records it), batched with
left padding. Predictions are the decoded text without special tokens, scored as stored.

The agent's own prompt (``--prompt agent``; ``reference`` is the default): the same N frames become
the observation of one answer turn in this project's format, the turn the env shows (the question,
the frames as the agent's views, "this is your last turn"), rendered by the policy as in training;
the JSON reply is read by the training parser and its answer scored by the same scorer and rule
(:class:`AgentAnswerer`). A move or an unreadable reply scores 0; records keep the raw ``reply``.
Trained agents answer the reference prompt in JSON and score 0 there; this prompt measures what
they know of the same frames.

Outputs (``--out``): ``records.jsonl`` (one line per question: ``id``, ``question_type``,
``prediction``, ``ground_truth``, ``score``, plus ``dataset``, ``scene_name``, ``frame_indices``),
which ``eval_vsi.py --score-file`` scores to the same numbers, and the usual ``report.json``,
``report.md``, ``tasks.png`` (``reports.build_report``; ``mode`` is ``video``). Report records are
named ``vsibench-<id>`` like the interactive protocol's, so the two reports of the same rows pair in
``eval_vsi.py --compare --paired``.
"""

from __future__ import annotations

import argparse
import logging
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import prompts, scoring
from a2c_ppo_acktr import reports
from a2c_ppo_acktr.envs.video_frames import (  # noqa: F401 - the protocol's public names
    VideoError,
    VideoReaderMissing,
    FrameSample,
    uniform_frames,
    qwen_2fps_frames,
    qwen3_2fps_frames,
    FRAME_SAMPLERS,
    sample_frames,
    video_file,
    probe_video,
    decode_frames,
    VideoClip,
    read_clip,
)
from a2c_ppo_acktr.common.jsonl import write_jsonl

logger = logging.getLogger(__name__)

# The reference decodes at most 16 new tokens (lmms-eval's vsibench task, generation_kwargs).
MAX_NEW_TOKENS = 16

# Per family (``loading.SUPPORTED_FAMILIES`` values): frames shown and how they are chosen (module docstring).
REFERENCE_NUM_FRAMES: dict[str, int] = {"qwen2_vl": 32, "qwen2_5_vl": 32, "qwen3_vl": 32, "llava": 32, "llava_next": 32}
REFERENCE_FRAME_SAMPLING: dict[str, str] = {
    "qwen2_vl": "qwen_2fps",
    "qwen2_5_vl": "qwen_2fps",
    "qwen3_vl": "qwen3_2fps",
    "llava": "uniform",
    "llava_next": "uniform",
}
# Without a model (--oracle, --dummy) the frames are still decoded, with thinking-in-space's rule.
DEFAULT_NUM_FRAMES = 32
DEFAULT_FRAME_SAMPLING = "uniform"
# Families whose processor takes the frames as one video (the others get them as images).
VIDEO_INPUT_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})
IMAGE_INPUT_FAMILIES = frozenset({"llava", "llava_next"})


# ``--prompt``: what the model is asked, and how its reply is read (the report's ``meta.prompt``).
PROMPTS: dict[str, str] = {
    "reference": "prompts.benchmark_prompt (VSI-Bench reference pre/post prompts); the reply is the prediction",
    "agent": "the agent's answer turn (vsi_env.turn_text, prompts.build_messages); "
    "the reply read by prompts.parse_action",
}


def qwen_resize(
    frames: np.ndarray, *, min_pixels: int, max_pixels: int, patch_size: int, merge_size: int, read_frames: int
):
    """Resize frames as qwen-vl-utils' ``fetch_video`` does for a video it read itself.

    Args:
        frames: ``(N, H, W, 3)`` uint8.
        min_pixels, max_pixels: Per-frame pixel budget (the processor's video budget).
        patch_size, merge_size: The vision tower's patch size and spatial merge (sides become
            multiples of their product).
        read_frames: Frames the reference reader decoded (:attr:`FrameSample.read_frames`): the
            budget caps the pixels of one frame at ``MODEL_SEQ_LEN * factor^2 * 0.9 / read_frames * 2``.

    Returns:
        ``(N, 3, h, w)`` float32 tensor of values in [0, 255], as qwen-vl-utils returns it.
    """
    import torch
    from qwen_vl_utils import vision_process as qv
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    factor = patch_size * merge_size
    # fetch_video's budget (qwen_vl_utils/vision_process.py 0.0.14): the caller's min, and the
    # caller's max capped by VIDEO_MAX_TOKEN_NUM tokens and by the sequence length shared by all frames.
    total_pixels = qv.MODEL_SEQ_LEN * factor * factor * 0.9
    cap = max(
        min(qv.VIDEO_MAX_TOKEN_NUM * factor * factor, total_pixels / read_frames * qv.FRAME_FACTOR),
        int(min_pixels * 1.05),
    )
    height, width = frames.shape[1:3]
    h, w = qv.smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=min(max_pixels, cap))
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    return TF.resize(video, [h, w], interpolation=InterpolationMode.BICUBIC, antialias=True).float()


# ------------------------------------------------------------------------------------------ answerers
@dataclass
class VideoQuestion:
    """One row to answer: the validated row, its prompt text and its video file."""

    row: dict
    prompt: str
    video: Path


class ModelAnswerer:
    """A VLM (a loaded :class:`~a2c_ppo_acktr.policy.model.VLMPolicy`: base model, SFT adapter or PPO
    checkpoint) answering under the reference protocol, one batched greedy ``generate`` per batch.

    Args:
        policy: The policy; its ``model`` (adapter active), ``processor`` (left padding) and ``family``.
        max_new_tokens: New tokens per answer (the reference's 16).
    """

    def __init__(self, policy: Any, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        if policy.family not in VIDEO_INPUT_FAMILIES | IMAGE_INPUT_FAMILIES:
            raise ValueError(
                f"the video protocol supports the families {sorted(VIDEO_INPUT_FAMILIES | IMAGE_INPUT_FAMILIES)}, got "
                f"{policy.family!r} (LLaVA-OneVision's video input is not wired here); use --protocol interactive"
            )
        self.policy = policy
        self.family = policy.family
        self.processor = policy.processor
        if self.processor.tokenizer.padding_side != "left":
            raise ValueError(
                "batched generation needs the tokenizer to pad on the left (load it with loading.load_processor)"
            )
        self.generation_config = self._generation_config(max_new_tokens)
        self.timings = {"encode_s": 0.0, "generate_s": 0.0}
        video_proc = getattr(self.processor, "video_processor", None)
        if self.family in VIDEO_INPUT_FAMILIES:
            size = dict(video_proc.size)
            self.pixel_budget = (int(size["shortest_edge"]), int(size["longest_edge"]))
            self.patch = (int(video_proc.patch_size), int(video_proc.merge_size))
        else:
            self.pixel_budget, self.patch = None, None

    def _generation_config(self, max_new_tokens: int) -> Any:
        import copy

        base = getattr(self.policy, "shipped_generation_config", None)  # the checkpoint's, set aside at load
        if base is None:
            base = getattr(self.policy.model, "generation_config", None)
        gen = copy.deepcopy(base) if base is not None else None
        if gen is None:
            from transformers import GenerationConfig

            gen = GenerationConfig()
        # lmms-eval's generate call: greedy, one beam, 16 tokens, the rest from the checkpoint's config.
        gen.update(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=list(self.policy.eos_ids),
            pad_token_id=self.policy.pad_id,
        )
        return gen

    def describe(self) -> dict[str, Any]:
        """What the report's ``meta.generation`` records."""
        g = self.generation_config
        return {
            "do_sample": g.do_sample,
            "num_beams": g.num_beams,
            "max_new_tokens": g.max_new_tokens,
            "repetition_penalty": g.repetition_penalty,
            "eos_token_id": g.eos_token_id,
            "video_input": "video" if self.family in VIDEO_INPUT_FAMILIES else "images",
            "pixel_budget": list(self.pixel_budget) if self.pixel_budget else None,
        }

    def prepare(self, clip: VideoClip) -> Any:
        """What the processor is given for ``clip`` (Qwen: frames resized by qwen-vl-utils' rule)."""
        if self.family not in VIDEO_INPUT_FAMILIES:
            return list(clip.frames)
        lo, hi = self.pixel_budget
        return qwen_resize(
            clip.frames,
            min_pixels=lo,
            max_pixels=hi,
            patch_size=self.patch[0],
            merge_size=self.patch[1],
            read_frames=clip.sample.read_frames,
        )

    def encode(self, questions: Sequence[VideoQuestion], clips: Sequence[VideoClip]) -> dict:
        """The processor's left-padded batch (CPU tensors)."""
        video = self.family in VIDEO_INPUT_FAMILIES
        texts = [
            prompts.render_prompt(
                self.processor, prompts.benchmark_messages(q.prompt, num_images=0 if video else len(c.frames))
            )
            for q, c in zip(questions, clips)
        ]
        if video:
            metadata = [
                {"fps": c.video_fps, "frames_indices": c.sample.indices.tolist(), "total_num_frames": c.total_frames}
                for c in clips
            ]
            return dict(
                self.processor(
                    text=texts,
                    videos=[c.visual for c in clips],
                    video_metadata=metadata,
                    do_sample_frames=False,
                    do_resize=False,
                    padding=True,
                    return_tensors="pt",
                )
            )
        images = [img for c in clips for img in c.visual]
        return dict(self.processor(text=texts, images=images, padding=True, return_tensors="pt"))

    def answer(self, questions: Sequence[VideoQuestion], clips: Sequence[VideoClip]) -> list[str]:
        import torch

        t0 = time.perf_counter()
        enc = self.encode(questions, clips)
        enc = {k: v.to(self.policy.device) for k, v in enc.items()}
        t1 = time.perf_counter()
        with torch.no_grad():
            out = self.policy.model.generate(**enc, generation_config=self.generation_config)
        new = out[:, enc["input_ids"].shape[1] :].cpu()
        texts = self.processor.tokenizer.batch_decode(new.tolist(), skip_special_tokens=True)
        t2 = time.perf_counter()
        self.timings["encode_s"] += t1 - t0
        self.timings["generate_s"] += t2 - t1
        return texts


class AgentAnswerer:
    """A policy answering in this project's own format (``eval_vsi.py video --prompt agent``): the
    video's N frames are the observation of one VSI answer turn, built as the env builds every turn
    (:func:`~a2c_ppo_acktr.envs.vsi_env.turn_text`: the question, no moves yet, the last turn, the
    frames named as the agent's views in order, the last one current) and rendered by the policy
    itself (``VLMPolicy.act``: :func:`~a2c_ppo_acktr.common.prompts.build_messages`, the agent's system
    prompt, the frames as images under the policy's own pixel budget). Decoding is greedy, up to
    ``model.max_new_tokens`` (a JSON reply does not fit the reference's 16 tokens). The reply is read
    by :func:`~a2c_ppo_acktr.common.prompts.parse_action`, as in training: an answer's text is the
    prediction; a move or an unreadable reply answers nothing (prediction ``""``, which scores 0).

    Args:
        policy: The loaded policy (base model, SFT adapter or PPO checkpoint).
        max_forward: The env's ``max_forward`` (the parser's bound on a move, as in the env).
    """

    def __init__(self, policy: Any, max_forward: float) -> None:
        self.policy = policy
        self.family = policy.family
        self.max_forward = max_forward
        self.timings = {"generate_s": 0.0}  # VLMPolicy.act: processor, generate and decoding together
        self.replies = {"answer": 0, "move": 0, "invalid": 0}

    def describe(self) -> dict[str, Any]:
        """What the report's ``meta.generation`` records."""
        return {
            "do_sample": False,
            "num_beams": 1,
            "max_new_tokens": int(self.policy.cfg.max_new_tokens),
            "video_input": "images",
            "decoding": "VLMPolicy.act(greedy=True)",
        }

    def prepare(self, clip: VideoClip) -> Any:
        """The frames as the turn's images (the processor resizes them as it does in training)."""
        return tuple(np.ascontiguousarray(f) for f in clip.frames)

    def observation(self, question: VideoQuestion, clip: VideoClip) -> dict:
        """The env observation of the answer turn on ``clip`` (``{"images", "text"}``)."""
        from a2c_ppo_acktr.envs.vsi_env import turn_text
        from a2c_ppo_acktr.envs.vsibench import question_from_row

        text = turn_text(
            question_from_row(question.row),
            prompts.feedback_text(None),
            turns_left=1,
            num_sweep_frames=0,
            num_views=len(clip.visual),
            max_forward=self.max_forward,
        )
        return {"images": clip.visual, "text": text}

    def answer(self, questions: Sequence[VideoQuestion], clips: Sequence[VideoClip]) -> list[str]:
        from a2c_ppo_acktr.policy.loading import ContextLengthError

        t0 = time.perf_counter()
        try:
            out = self.policy.act([self.observation(q, c) for q, c in zip(questions, clips)], greedy=True)
        except ContextLengthError as e:  # the frames here are --num-frames, not the env's sweep
            raise ContextLengthError(
                f"{e}; with --prompt agent the images are the video's frames: lower --num-frames"
            ) from None
        self.timings["generate_s"] += time.perf_counter() - t0
        return list(out.texts)

    def read_reply(self, text: str) -> tuple[str, dict[str, Any]]:
        """``(prediction, fields for the record)`` of one reply: the answer's text, or ``""`` with why not."""
        action = prompts.parse_action(text, max_forward=self.max_forward)
        if isinstance(action, prompts.Answer):
            self.replies["answer"] += 1
            return action.text, {"reply": text, "reply_kind": "answer"}
        if isinstance(action, prompts.Move):
            self.replies["move"] += 1
            return "", {"reply": text, "reply_kind": "move"}
        self.replies["invalid"] += 1
        return "", {"reply": text, "reply_kind": "invalid", "invalid_reason": action.reason}


class OracleAnswerer:
    """Answers with the row's ground truth (checks videos, records and scoring end to end: 100 overall)."""

    timings: dict[str, float] = {}

    def prepare(self, clip: VideoClip) -> Any:
        return None

    def describe(self) -> dict[str, Any]:
        return {"answers": "ground truth"}

    def answer(self, questions: Sequence[VideoQuestion], clips: Sequence[VideoClip]) -> list[str]:
        return [q.row["ground_truth"] for q in questions]


class DummyAnswerer:
    """Uniformly random legal answers (the chance row), one stream per row id (batch-independent)."""

    timings: dict[str, float] = {}

    def __init__(self, seed: int) -> None:
        from a2c_ppo_acktr.eval.evaluation import DummyAgent

        self.seed = seed
        self.agent = DummyAgent(seed=seed)

    def prepare(self, clip: VideoClip) -> Any:
        return None

    def describe(self) -> dict[str, Any]:
        return {"answers": "uniformly random legal answers", "seed": self.seed}

    def answer(self, questions: Sequence[VideoQuestion], clips: Sequence[VideoClip]) -> list[str]:
        out = []
        for q in questions:
            rng = np.random.default_rng([self.seed, zlib.crc32(str(q.row["id"]).encode("utf-8"))])
            out.append(self.agent.random_answer(q.row["question_type"], q.row["options"], rng))
        return out


# ------------------------------------------------------------------------------------------ the run
@dataclass
class VideoProtocolConfig:
    """How the video protocol runs (``eval_vsi.py --protocol video`` flags).

    Attributes:
        video_root: Directory laid out as the benchmark ships its videos (``<dataset>/<scene>.mp4``).
        num_frames: Frames shown per question (N).
        frame_sampling: A :data:`FRAME_SAMPLERS` name.
        batch_size: Questions per ``generate`` call.
        progress: Show a progress bar.
        scoring_rule: How numerical answers are read (:data:`a2c_ppo_acktr.common.scoring.SCORING_RULES`).
    """

    video_root: str
    num_frames: int = DEFAULT_NUM_FRAMES
    frame_sampling: str = DEFAULT_FRAME_SAMPLING
    batch_size: int = 8
    progress: bool = False
    scoring_rule: str = "thinking-in-space"

    def __post_init__(self) -> None:
        from a2c_ppo_acktr.config.arguments import ConfigError

        if self.num_frames < 1:
            raise ConfigError(f"--num-frames={self.num_frames} must be >= 1 (the reference shows 32)")
        if self.frame_sampling not in FRAME_SAMPLERS:
            raise ConfigError(f"--frame-sampling={self.frame_sampling!r} is not one of {sorted(FRAME_SAMPLERS)}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size={self.batch_size} must be >= 1")


@dataclass
class VideoRunResult:
    """Per-question records (row order) and the run's timings."""

    records: list[dict]
    timings: dict[str, float] = field(default_factory=dict)


def video_questions(rows: Sequence[dict], video_root: str | Path) -> list[VideoQuestion]:
    """The rows as questions with their prompt and video file.

    Raises:
        FileNotFoundError: ``video_root`` is not a directory, or a row's video is missing (the message
            names the path and how many are missing).
        PathOutsideRoot: A row's names or a link lead out of ``video_root`` (the message names the row).
    """
    if not Path(video_root).is_dir():
        raise FileNotFoundError(
            f"--video-root {str(video_root)!r} is not a directory; point it at the benchmark's videos "
            "(<dataset>/<scene_name>.mp4, e.g. arkitscenes/41069025.mp4)"
        )
    questions = [
        VideoQuestion(
            row=r,
            prompt=prompts.benchmark_prompt(r["question_type"], r["question"], r["options"]),
            video=video_file(video_root, r["dataset"], r["scene_name"], where=f"VSI-Bench row {r['id']}"),
        )
        for r in rows
    ]
    missing = sorted({str(q.video) for q in questions if not q.video.is_file()})
    if missing:
        first = next(q for q in questions if str(q.video) == missing[0])
        raise FileNotFoundError(
            f"video {missing[0]!r} of VSI-Bench row {first.row['id']} does not exist ({len(missing)} of "
            f"{len({q.video for q in questions})} videos missing); --video-root must hold <dataset>/<scene_name>.mp4 "
            "as the benchmark ships"
        )
    return questions


def run_video_protocol(questions: Sequence[VideoQuestion], answerer: Any, cfg: VideoProtocolConfig) -> VideoRunResult:
    """Answer every question under the reference protocol and score it.

    Questions are taken grouped by video, so each video is decoded once for all its questions
    (the rows' order is kept in the result). Decoding (probe, decode, resize) is timed apart from
    the answerer's own work (``encode_s``: processor; ``generate_s``: ``generate`` and decoding text).

    Returns:
        Records ``{id, question_type, prediction, ground_truth, score, dataset, scene_name,
        frame_indices}`` in the order of ``questions`` (with an answerer that reads its replies,
        :meth:`AgentAnswerer.read_reply`, also the raw ``reply`` and what it was), and ``timings``.
    """
    from tqdm.auto import tqdm

    order = sorted(range(len(questions)), key=lambda i: (str(questions[i].video), i))
    # An answerer with its own reply format reads each reply into the prediction the scorer gets.
    read_reply = getattr(answerer, "read_reply", None)
    records: dict[int, dict] = {}
    clips: dict[Path, VideoClip] = {}
    decode_s = 0.0
    start = time.perf_counter()
    bar = tqdm(total=len(questions), desc="video protocol", unit="q", disable=not cfg.progress)
    for b in range(0, len(order), cfg.batch_size):
        batch = [questions[i] for i in order[b : b + cfg.batch_size]]
        t0 = time.perf_counter()
        # Grouped by video: only the previous batch's last video can be asked again.
        clips = {q.video: clips.get(q.video) for q in batch}
        for path, clip in clips.items():
            if clip is None:
                clip = clips[path] = read_clip(path, cfg.frame_sampling, cfg.num_frames)
                clip.visual = answerer.prepare(clip)
        batch_clips = [clips[q.video] for q in batch]
        decode_s += time.perf_counter() - t0
        answers = answerer.answer(batch, batch_clips)
        if len(answers) != len(batch):
            raise RuntimeError(f"the answerer returned {len(answers)} answers for {len(batch)} questions")
        for i, q, clip, text in zip(order[b : b + cfg.batch_size], batch, batch_clips, answers):
            row = q.row
            prediction, reply = (text, {}) if read_reply is None else read_reply(text)
            records[i] = {
                "id": row["id"],
                "question_type": row["question_type"],
                "prediction": prediction,
                "ground_truth": row["ground_truth"],
                "score": scoring.score_prediction(
                    row["question_type"], prediction, row["ground_truth"], rule=cfg.scoring_rule
                ),
                "dataset": row["dataset"],
                "scene_name": row["scene_name"],
                "frame_indices": clip.sample.indices.tolist(),
                **reply,
            }
        bar.update(len(batch))
    bar.close()
    timings = {"total_s": time.perf_counter() - start, "decode_s": decode_s, **getattr(answerer, "timings", {})}
    timings["questions"] = len(questions)
    timings["videos"] = len({q.video for q in questions})
    return VideoRunResult(records=[records[i] for i in range(len(questions))], timings=timings)


def write_records(records: Sequence[dict], path: str | Path) -> Path:
    """``records.jsonl``: one JSON object per line (``eval_vsi.py --score-file`` reads it)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_jsonl(records, path)


def build_video_report(
    records: Sequence[dict], rows: Sequence[dict], *, name: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """The report of a video-protocol run (``reports.build_report``; ``mode`` ``video``, no agent metrics).

    Each question becomes a one-turn episode named like the interactive protocol's
    (``evaluation.vsibench_specs``: ``vsibench-<id>``) with the same question fields (the scan's
    scene id is its ``scene_name``; the question stripped, as ``vsibench.question_from_row`` does),
    so the two reports of the same rows pair question by question.
    """
    by_id = {r["id"]: r for r in rows}
    episodes = []
    for rec in records:
        row = by_id[rec["id"]]
        episodes.append(
            reports.EpisodeRecord(
                episode_id=f"vsibench-{row['id']}",
                scene_id=str(row["scene_name"]),
                dataset=str(row["dataset"]),
                question_type=row["question_type"],
                question=row["question"].strip(),
                options=list(row["options"]) if row["options"] else None,
                ground_truth=row["ground_truth"],
                answer=rec["prediction"],
                score=float(rec["score"]),
                turns=1,
                reward=float(rec["score"]),
            )
        )
    report = reports.build_report(episodes, name=name, meta=meta)
    report["mode"] = "video"
    report.pop("agent")  # turns, invalid outputs and rewards are the interactive agent's; one answer here
    return report


# ------------------------------------------------------------------------------------------ the CLI


def resolve_config(args: Any, extra: Sequence[str]) -> Any:
    """The run config of a video-protocol evaluation: ``evaluation.resolve_config`` without the env's
    VSI-Bench fields (``--vsibench``/``--data-root`` configure the interactive protocol's scans; here
    the rows are read directly and only the model, eval and env.question_types sections apply)."""
    from a2c_ppo_acktr.eval import evaluation

    return evaluation.resolve_config(
        argparse.Namespace(**{**vars(args), "vsibench": None, "data_root": None}), list(extra)
    )


def run_cli(args: Any, extra: Sequence[str]) -> dict[str, Any]:
    """``eval_vsi.py --protocol video``: answer the ``--vsibench`` rows from their videos under
    ``--video-root`` and write ``records.jsonl`` and the reports into ``--out``.

    The model comes from the package's loader (``evaluation.load_policy``: ``--model-path``,
    ``--adapter``, ``--checkpoint`` with its run's model settings); ``--oracle`` and ``--dummy``
    answer without one. Every video is checked to exist before a model is loaded.
    """
    from a2c_ppo_acktr.run.rundir import RunLock, check_output_path

    # One command at a time writes into --out, for its whole run (as evaluation.run_cli).
    with RunLock(check_output_path(args.out)):
        return _run_cli(args, extra)


def trained_frames(cfg: Any) -> int:
    """Images per turn an agent of run config ``cfg`` was trained on: its sweep (``video_qa``: its
    walk-through) and, in the interactive mode, its last ``image_history`` views."""
    views = 0 if cfg.env.mode == "video_qa" else cfg.env.image_history
    return int(cfg.env.num_sweep_frames + views)


def _warn_unlike_training(num_frames: int, cfg: Any) -> None:
    """One line when ``--prompt agent`` shows another number of frames than the run config's agent
    saw per turn (the quickstart's tiny agents, trained on 5, write no readable reply at 32)."""
    seen = trained_frames(cfg)
    if num_frames != seen:
        logger.warning(
            "--prompt agent shows %d frames per question; this config's agent saw %d per turn in training "
            "(env.num_sweep_frames + env.image_history): pass --num-frames %d to show it as many",
            num_frames,
            seen,
            seen,
        )


def _run_cli(args: Any, extra: Sequence[str]) -> dict[str, Any]:
    """:func:`run_cli` inside the lock of ``--out``."""
    from a2c_ppo_acktr.eval import evaluation
    from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows
    from a2c_ppo_acktr.run.rundir import claim_report_dir

    out = claim_report_dir(args.out, overwrite=args.overwrite)
    cfg = resolve_config(args, extra)
    rows = [r for r in load_vsibench_rows(args.vsibench) if r["question_type"] in cfg.env.question_types][: args.limit]
    if not rows:
        raise ValueError(f"{args.vsibench!r} has no rows of the types in env.question_types={cfg.env.question_types}")
    questions = video_questions(rows, args.video_root)  # fails on a missing video before any model loads
    prompt = getattr(args, "prompt", None) or "reference"
    if prompt not in PROMPTS:
        raise ValueError(f"--prompt {prompt!r} is not one of {', '.join(PROMPTS)}")
    family: Optional[str] = None
    if args.oracle:
        answerer: Any = OracleAnswerer()
        agent_meta: dict[str, Any] = {"agent": "oracle"}
    elif args.dummy:
        answerer = DummyAnswerer(seed=cfg.eval.seed)
        agent_meta = {"agent": "dummy"}
    else:
        policy = evaluation.load_policy(
            cfg, adapter=args.adapter, checkpoint=args.checkpoint, take_base=not args.model_path
        )
        family = policy.family
        answerer = (
            AgentAnswerer(policy, max_forward=cfg.env.max_forward) if prompt == "agent" else ModelAnswerer(policy)
        )
        agent_meta = {
            "agent": "policy",
            "model_path": cfg.model.model_path,
            "adapter": args.adapter,
            "checkpoint": args.checkpoint,
            "dtype": cfg.model.dtype,
            "family": family,
        }
    pcfg = VideoProtocolConfig(
        video_root=args.video_root,
        num_frames=args.num_frames or REFERENCE_NUM_FRAMES.get(family, DEFAULT_NUM_FRAMES),
        frame_sampling=args.frame_sampling or REFERENCE_FRAME_SAMPLING.get(family, DEFAULT_FRAME_SAMPLING),
        batch_size=args.batch_size or cfg.eval.batch_size,
        progress=cfg.log.progress_bar,
        scoring_rule=cfg.env.scoring_rule,
    )
    if prompt == "agent" and not (args.oracle or args.dummy):
        _warn_unlike_training(pcfg.num_frames, cfg)
    result = run_video_protocol(questions, answerer, pcfg)
    out.mkdir(parents=True, exist_ok=True)
    records_path = write_records(result.records, out / "records.jsonl")
    meta = {
        "protocol": "video",
        "question_set": "vsibench",
        "vsibench_path": str(args.vsibench),
        "video_root": str(pcfg.video_root),
        "num_questions": len(rows),
        "num_frames": pcfg.num_frames,
        "frame_sampling": pcfg.frame_sampling,
        "scoring_rule": pcfg.scoring_rule,
        "batch_size": pcfg.batch_size,
        "greedy": True,
        "max_new_tokens": answerer.describe().get("max_new_tokens", MAX_NEW_TOKENS),
        "prompt": PROMPTS[prompt],
        "prompt_kind": prompt,
        "generation": answerer.describe(),
        "video_backend": _video_backend(),
        "records": str(records_path),
        "timings": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.timings.items()},
        "preset": cfg.preset,
        "config": args.config,
        **agent_meta,
    }
    if isinstance(answerer, AgentAnswerer):
        meta["replies"] = dict(answerer.replies)  # answers, moves and unreadable replies (the last two score 0)
    suffix = " (video, agent prompt)" if prompt == "agent" else " (video)"
    report = build_video_report(
        result.records, rows, name=evaluation.default_name(args, str(args.model_path or family), suffix), meta=meta
    )
    reports.write_report(report, out)
    cfg.save(out / "config.yaml")
    print(reports.table_markdown([(report["name"], report)]))
    t = result.timings
    print(
        f"{t['questions']} questions, {t['videos']} videos in {t['total_s']:.1f} s (decoding {t['decode_s']:.1f} s"
        + (f", processor {t['encode_s']:.1f} s" if "encode_s" in t else "")
        + (f", generate {t['generate_s']:.1f} s" if "generate_s" in t else "")
        + ")"
    )
    print(f"records: {records_path}; reports: {out / 'report.json'}, {out / 'report.md'}")
    return report


def _video_backend() -> str:
    import importlib.metadata as md

    return f"PyAV {md.version('av')} decode; qwen-vl-utils {md.version('qwen-vl-utils')} frame count (2 fps) and resize"

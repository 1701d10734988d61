"""The tiny models' build: random weights, a real tokenizer, a real processor, cached and locked.

Tests and the CPU demo need a VLM that loads through exactly the same code as Qwen2-VL,
Qwen2.5-VL, Qwen3-VL and LLaVA checkpoints (``AutoModelForImageTextToText`` + ``AutoProcessor``)
but builds in seconds without a hub. This module makes one per family (:data:`FAMILIES`):

- the family's own config class at tiny sizes, weights random but deterministic in ``seed``;
- a byte-level BPE tokenizer trained offline (``tokenizers``) on this project's prompt and
  answer vocabulary, so a tiny model can write the JSON action format in few tokens, carrying
  the Qwen special tokens at the end of the vocabulary (as the real checkpoints do) and a Qwen
  chat template (LLaVA: plus ``<image>``, which its template uses as the image placeholder);
- the family's processor with a very small pixel budget (the other families: a 224x224 frame
  becomes 4 image tokens; LLaVA's CLIP processor crops every frame to 28x28, also 4 tokens), so a
  forward pass takes milliseconds;
- for the default family (``qwen2_5_vl``) a model that sees: every frame is 16 visual tokens,
  white maps to 0 in the processor's normalisation, and after the reply-format pretraining the
  whole model is trained on questions about this project's own renders
  (:mod:`a2c_ppo_acktr.tiny.vision`), so its visual tokens carry what the frame shows.

``tiny_model_dir(family, seed)`` builds once into a cache directory whose name carries a hash
of everything that defines the model, so editing the corpus or sizes invalidates old builds. The
seed defaults to ``$VSI_TINY_SEED`` (else 0): ``tiny:<family>`` and the tests use it, so a suite
run with another seed checks that no test depends on one build's weights (another CPU's rounding
changes them too).
The command line (``python -m a2c_ppo_acktr.tiny``, ``vsi-tiny``) is :mod:`a2c_ppo_acktr.tiny.cli`; the builds
that ship with the package are :mod:`a2c_ppo_acktr.tiny.shipped`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.tiny.training import next_token_training, text_rows

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# CLIP vision tower + MLP projector + Llama text model; llava_next (LLaVA-1.6, RL4VLM's model class)
# adds the anyres split of each image into a base view and tiles.
LLAVA_FAMILIES = ("llava", "llava_next")
FAMILIES = QWEN_FAMILIES + LLAVA_FAMILIES

# Bump when the build procedure changes in a way the spec hash below does not capture.
TINY_VERSION = "3"

# Names the weight seed of the builds that ``tiny:<family>`` and the tests use (default_seed).
SEED_ENV = "VSI_TINY_SEED"


class TinySeedError(ValueError, UserError):
    """``$VSI_TINY_SEED`` holds something other than a seed; the message says what it accepts."""


# Qwen2/2.5/3-VL special tokens in the order the real tokenizers list them (ids follow the base
# vocabulary, as in the real checkpoints, so code never assumes special ids are small or large).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# The Qwen2 pre-tokenizer split: contractions, words, single digits, punctuation runs, spaces.
# Single digits matter here: numeric answers ("3.5", "120") are spelled digit by digit.
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Qwen2-VL chat template (system/user/assistant turns, images and videos as vision
# placeholders that the processor expands). Content may be a string or a list of parts.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% "
    "endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Sizes of one tiny family. Part of the cache key: any change makes a new directory."""

    family: str
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    mrope_section: tuple[int, ...] = (2, 3, 3)  # sums to head_dim / 2 = 8
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    # Pixel budget of the processor: factor = patch * merge; a 224x224 frame is resized to
    # 2x2 merged patches = 4 image tokens.
    min_pixels: int = 28 * 28
    max_pixels: int = 56 * 56
    vocab_size_target: int = 2048  # BPE vocabulary cap before special tokens (min_frequency=2 stops earlier)
    vocab_multiple: int = 64  # embedding rows rounded up, like the real checkpoints (151936 > len(tokenizer))
    max_position_embeddings: int = 32768  # RoPE positions; also the tokenizer model_max_length
    # "Pretraining": a few seconds of full-parameter language modelling on assistant replies in the
    # action format (:func:`pretrain_reply_format`), so the tiny model starts like a real chat VLM
    # that can write JSON but knows nothing of the task. 0 steps keeps the purely random weights.
    pretrain_steps: int = 300
    pretrain_batch_size: int = 16
    pretrain_lr: float = 3e-3
    # The processor's pixel normalisation. None: the family's default (CLIP's mean and std), which
    # maps a white background to a large constant, so the part of a visual token that differs
    # between two game frames is a few percent of it; (1, 1, 1) / (0.5, 0.5, 0.5) maps white to 0.
    image_mean: Optional[tuple[float, float, float]] = None
    image_std: Optional[tuple[float, float, float]] = None
    # Vision pre-training (:mod:`a2c_ppo_acktr.tiny.vision`): full-parameter next-token training on
    # questions about this project's renders whose answers the generators know (0 steps: none; the
    # tower then stays a random projection). Frames are drawn at ``vision_image_size`` pixels.
    vision_pretrain_steps: int = 0
    vision_pretrain_tasks: tuple[str, ...] = ()
    vision_pretrain_batch_size: int = 16
    vision_pretrain_lr: float = 3e-4
    vision_pretrain_scenes: int = 0  # procedural training scenes for the room tasks
    vision_text_per_batch: int = 4  # reply-format documents replayed in every batch (keeps the JSON grammar)
    vision_image_size: int = 64
    # A build on top of another: the vision stage above starts from the weights of the build named here
    # (same family and seed; its reply-format and vision pre-training already done) instead of fresh ones.
    vision_base: Optional[str] = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# Builds beside the families' defaults: a family's spec with another vision pre-training, under
# its own name (``tiny:<name>``; a cache directory of its own). The default build is untouched.
VISION_VARIANTS: dict[str, tuple[str, dict]] = {
    # Reads EZPoints' cards (held-out suits) at 1.000 with 2000 steps at lr 1e-3; 1000 steps gave
    # 0.908 and the default lr 3e-4 0.575 (bench/README.md, "A second image-only game").
    "qwen2_5_vl-ezpoints": (
        "qwen2_5_vl",
        {"vision_pretrain_steps": 2000, "vision_pretrain_lr": 1e-3, "vision_pretrain_tasks": ("ezpoints_cards",)},
    ),
    # Reads a procedural room's floor area from the 4 frames of its sweep (VSI-Bench's room-size
    # question), on top of the default build (which reads NumberLine frames; this stage erases that):
    # 1500 steps on 1000 rooms (docs/RESULTS.md, "The embedded model sees"). The reading appears
    # suddenly after a long plateau on one constant answer: a 900-step schedule stayed on the constant
    # (its rate decays before the break), and so did lr 1e-3 and batches of 8. From fresh weights the
    # same reading took 2500 steps on 2000 rooms.
    "qwen2_5_vl-rooms": (
        "qwen2_5_vl",
        {
            "vision_base": "qwen2_5_vl",
            "vision_pretrain_steps": 1500,
            "vision_pretrain_lr": 3e-4,
            "vision_pretrain_tasks": ("room_size",),
            "vision_pretrain_scenes": 1000,
        },
    ),
}
BUILDS = FAMILIES + tuple(VISION_VARIANTS)


def tiny_spec(family: str) -> TinySpec:
    """The tiny sizes of ``family`` (a family of :data:`FAMILIES` or a build of :data:`VISION_VARIANTS`).

    Raises:
        ValueError: ``family`` is not one of :data:`BUILDS`.
    """
    _check_family(family)
    if family in VISION_VARIANTS:
        base, overrides = VISION_VARIANTS[family]
        return dataclasses.replace(tiny_spec(base), **overrides)
    if family in LLAVA_FAMILIES:
        return TinySpec(family=family)  # text and vision widths as the Qwen ones; see LLAVA_IMAGE_SIZE
    if family == "qwen2_vl":
        return TinySpec(family=family, vision_depth=1)
    if family == "qwen2_5_vl":
        # The embedded default sees: 16 visual tokens per frame (112 x 112 pixels, 4 x 4 merged
        # patches), white mapped to 0, and a vision tower pre-trained on the project's renders.
        return TinySpec(
            family=family,
            min_pixels=112 * 112,
            max_pixels=112 * 112,
            image_mean=(1.0, 1.0, 1.0),
            image_std=(0.5, 0.5, 0.5),
            vision_pretrain_steps=1000,
            vision_pretrain_tasks=("numberline",),
        )
    # Qwen3-VL: 16-pixel patches (factor 32) and interleaved M-RoPE, whose H and W sections
    # index every third frequency, hence the T-heavy split like the real [24, 20, 20] / 64.
    return TinySpec(family=family, patch_size=16, mrope_section=(4, 2, 2), min_pixels=32 * 32, max_pixels=64 * 64)


def _check_family(family: str) -> None:
    if family not in BUILDS:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {list(BUILDS)}")


# --------------------------------------------------------------------------- tokenizer corpus
_OBJECTS = (
    "chair",
    "table",
    "sofa",
    "bed",
    "desk",
    "lamp",
    "tv",
    "monitor",
    "cabinet",
    "shelf",
    "bookshelf",
    "toilet",
    "sink",
    "bathtub",
    "refrigerator",
    "stove",
    "microwave",
    "oven",
    "dishwasher",
    "door",
    "window",
    "plant",
    "trash can",
    "trash bin",
    "pillow",
    "stool",
    "nightstand",
    "dresser",
    "wardrobe",
    "washer",
    "dryer",
    "fireplace",
    "piano",
    "whiteboard",
    "radiator",
    "backpack",
    "box",
    "bag",
    "mirror",
    "picture",
    "counter",
    "kitchen cabinet",
    "coffee table",
    "armchair",
    "ottoman",
    "computer tower",
    "keyboard",
    "laptop",
    "printer",
    "heater",
    "fan",
    "curtain",
    "rug",
    "towel",
    "clock",
    "vase",
    "bottle",
    "cup",
    "ceiling light",
    "blanket",
    "basket",
    "suitcase",
    "tv stand",
)
_DIRECTIONS = ("left", "right", "back", "front", "front-left", "front-right", "back-left", "back-right")
_QUESTIONS = (
    "How many {o}(s) are in this room?",
    "Measuring from the closest point of each object, what is the distance between the {o} and the {p} (in meters)?",
    "What is the length of the longest dimension (length, width, or height) of the {o}, measured in centimeters?",
    "What is the size of this room (in square meters)? If multiple rooms are shown, estimate the size of the combined "
    "space.",
    "Measuring from the closest point of each object, which of these objects ({o}, {p}, {q}, {r}) is the closest to "
    "the {s}?",
    "If I am standing by the {o} and facing the {p}, is the {q} to my left or right?",
    "If I am standing by the {o} and facing the {p}, is the {q} to my left, right, or back?",
    "If I am standing by the {o} and facing the {p}, is the {q} to my front-left, front-right, back-left, or "
    "back-right?",
    "You are a robot beginning at the {o} facing the {p}. You want to navigate to the {q}. "
    "You will perform the following actions (Note: for each [please fill in], choose either 'turn back,' "
    "'turn left,' or 'turn right.'): 1. Go forward until the {p} 2. [please fill in] 3. Go forward until the {q}. "
    "You have reached the final destination.",
    "What will be the first-time appearance order of the following categories in the video: {o}, {p}, {q}, {r}?",
)
_INSTRUCTIONS = (
    "You are an embodied agent in an indoor scene. You see frames of a video of the room and the views "
    "from your current position. Each turn you either move to look around or give your final answer. "
    'Reply with exactly one JSON object with the keys "thoughts" and "action". To move, the action is '
    '{{"rotation_angle_degrees": R, "forward_meters": F}}: first turn R degrees counter-clockwise '
    '(negative turns clockwise), then walk F meters forward. To answer, the action is {{"answer": "..."}}.',
    "These are frames of a video.",
    "Please answer the question using a single word or phrase.",
    "Answer with the option's letter from the given choices directly.",
    "Options:",
    "Question:",
    "Turns left: {n}. Your last output was not valid JSON; write one JSON object.",
    "Turns left: {n}. Your move was blocked by an obstacle.",
    "Turns left: {n}. You turned {r} degrees and walked {f} meters.",
    "This is your last turn: you must answer now.",
    "The sweep of the room, then your current view.",
    "I should look around to find the {o}. The {o} is to my {d}. I can see the {o} and the {p}. "
    "I have seen enough of the room to answer. I count {n} {o}s. The {o} is about {f} meters away.",
)
_THOUGHTS = (
    "I need to look around the room first.",
    "I can see the {o} on the {d}; let me turn toward it.",
    "The {o} is closer to the {p} than the {q}.",
    "I counted {n} {o}s in the frames.",
    "The room is about {f} meters by {g} meters.",
    "The {o} is roughly {c} centimeters long.",
    "Turning {r} degrees and walking {f} meters will show me the {o}.",
)

# The role lines of the chat template, so "system", "user" and "assistant" are single tokens.
_CHAT_LINES = ("system\nYou are a helpful assistant.", "user\n", "assistant\n", "Picture 1: ", "Video 1: ") * 4


def _numbers(rng) -> tuple[str, str, str, str, str]:
    n = str(int(rng.integers(0, 12)))
    r = str(int(rng.choice([-180, -135, -90, -60, -45, -30, 0, 30, 45, 60, 90, 135, 180])))
    f = f"{rng.uniform(0, 3):.1f}"
    g = f"{rng.uniform(2, 10):.1f}"
    c = str(int(rng.integers(10, 300)))
    return n, r, f, g, c


def tokenizer_corpus(seed: int = 0, num_samples: int = 1500) -> list[str]:
    """Deterministic training text for the tiny tokenizer: this project's prompt and answer format.

    The canonical JSON is written with ``json.dumps`` and its default separators (``", "`` and
    ``": "``), as ``prompts.format_response`` writes it; merges learned from it make
    ``{"thoughts": "`` and ``"action": {"answer": "`` a handful of tokens.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    lines: list[str] = []
    for i in range(num_samples):
        o, p, q, r_, s = (str(x) for x in rng.choice(_OBJECTS, size=5, replace=False))
        d = str(rng.choice(_DIRECTIONS))
        n, r, f, g, c = _numbers(rng)
        fill = dict(o=o, p=p, q=q, r=r_, s=s, d=d, n=n, f=f, g=g, c=c)
        question = _QUESTIONS[i % len(_QUESTIONS)].format(**fill)
        lines.append(question)
        lines.append(_INSTRUCTIONS[i % len(_INSTRUCTIONS)].format(**{**fill, "r": r}))
        thoughts = _THOUGHTS[i % len(_THOUGHTS)].format(**{**fill, "r": r})
        if i % 4 == 0:
            letters = ["A", "B", "C", "D"]
            opts = [f"{letters[k]}. {x}" for k, x in enumerate([o, p, q, r_])]
            lines.append("Options:\n" + "\n".join(opts))
            action = {"answer": str(rng.choice(letters))}
        elif i % 4 == 1:
            action = {"answer": str(rng.choice([n, f, g, c]))}
        else:
            action = {"rotation_angle_degrees": int(r), "forward_meters": float(f)}
        lines.append(json.dumps({"thoughts": thoughts, "action": action}))
    return lines


def _project_strings(seed: int = 0, num_samples: int = 200) -> list[str]:
    """Text written by the project's format module (:mod:`a2c_ppo_acktr.common.prompts`) when it exists.

    The system prompt and observation texts appear in every real prompt, so learning their words
    keeps tiny prompts short. The module is optional at build time (it is imported lazily), and
    its text is part of :func:`spec_hash`, so editing it rebuilds the tiny models.
    """
    import numpy as np

    try:
        from a2c_ppo_acktr.common import prompts  # noqa: PLC0415 - optional, see docstring
    except ImportError:
        return []
    rng = np.random.default_rng(seed + 1)
    # Repeated so every word of the system prompt passes the BPE min_frequency.
    lines = [prompts.SYSTEM_PROMPT] * 4
    letters = ["A", "B", "C", "D"]
    for i in range(num_samples):
        o, p, q, r_ = (str(x) for x in rng.choice(_OBJECTS, size=4, replace=False))
        n, r, f, g, c = _numbers(rng)
        fill = dict(o=o, p=p, q=q, r=r_, s=o, d=str(rng.choice(_DIRECTIONS)), n=n, f=f, g=g, c=c)
        question = _QUESTIONS[i % len(_QUESTIONS)].format(**fill)
        options = [f"{letters[k]}. {x}" for k, x in enumerate([o, p, q, r_])] if i % 2 else None
        move = prompts.Move(rotation_deg=float(r), forward_m=float(f))
        answer = prompts.Answer(letters[i % 4] if options else n)
        feedback = prompts.feedback_text(None if i % 3 == 0 else move, collided=i % 5 == 0, walked_m=float(f) / 2)
        lines.append(
            prompts.observation_text(
                question, options, feedback, turns_left=1 + i % 10, num_sweep_frames=8, num_views=i % 3
            )
        )
        thoughts = _THOUGHTS[i % len(_THOUGHTS)].format(**{**fill, "r": r})
        lines.append(prompts.format_response(thoughts, answer if i % 2 else move))
    return lines


@functools.lru_cache(maxsize=4)
def training_corpus(seed: int = 0) -> tuple[str, ...]:
    """Everything the tiny tokenizer is trained on (cached: it is also hashed for the cache key)."""
    return tuple(tokenizer_corpus(seed)) + tuple(_project_strings(seed)) + _CHAT_LINES


def build_tokenizer(spec: TinySpec, corpus: Sequence[str]):
    """Train the byte-level BPE tokenizer and wrap it for ``transformers``.

    Returns:
        A ``PreTrainedTokenizerFast`` with the Qwen special tokens, ``eos_token=<|im_end|>``,
        ``pad_token=<|endoftext|>`` and the Qwen chat template.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets exact, which the thought/action split relies on.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size_target,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    if spec.family in LLAVA_FAMILIES:
        add_llava_tokens(hf_tok)
    return hf_tok


# --------------------------------------------------------------------------- model config
def _token_ids(tokenizer) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    for t, i in ids.items():
        if i is None or i == tokenizer.unk_token_id:
            raise RuntimeError(f"tiny tokenizer lacks special token {t!r}; the build is broken")
    return ids


def _text_sizes(spec: TinySpec, vocab_size: int, ids: dict[str, int]) -> dict:
    """The text model's sizes and special-token ids, shared by every family's text config."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def build_config(spec: TinySpec, tokenizer):
    """The family's ``PretrainedConfig`` at tiny sizes with the tokenizer's special-token ids."""
    ids = _token_ids(tokenizer)
    vocab = -(-len(tokenizer) // spec.vocab_multiple) * spec.vocab_multiple
    if spec.family in LLAVA_FAMILIES:
        return build_llava_config(spec, tokenizer, vocab)
    if sum(spec.mrope_section) * 2 != spec.head_dim:
        raise ValueError(f"mrope_section {spec.mrope_section} must sum to head_dim/2 = {spec.head_dim // 2}")
    text = _text_sizes(spec, vocab, ids)
    common = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    vision_common = dict(
        depth=spec.vision_depth,
        num_heads=spec.vision_num_heads,
        patch_size=spec.patch_size,
        spatial_merge_size=spec.merge_size,
        temporal_patch_size=spec.temporal_patch_size,
    )
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(spec.mrope_section)}
    if spec.family == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision = dict(
            vision_common,
            embed_dim=spec.vision_hidden_size,
            mlp_ratio=spec.vision_intermediate_size // spec.vision_hidden_size,
            hidden_size=spec.hidden_size,  # the merger's output width = text hidden size
        )
        return Qwen2VLConfig(text_config=dict(text, rope_parameters=rope), vision_config=vision, **common)
    if spec.family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision = dict(
            vision_common,
            hidden_size=spec.vision_hidden_size,
            intermediate_size=spec.vision_intermediate_size,
            out_hidden_size=spec.hidden_size,
            window_size=spec.patch_size * spec.merge_size * 2,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )
        return Qwen2_5_VLConfig(text_config=dict(text, rope_parameters=rope), vision_config=vision, **common)
    from transformers import Qwen3VLConfig

    vision = dict(
        vision_common,
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        out_hidden_size=spec.hidden_size,
        num_position_embeddings=64,  # an 8x8 grid, bilinearly interpolated to the image grid
        deepstack_visual_indexes=[0],
    )
    text3 = dict(text, head_dim=spec.head_dim, rope_parameters=dict(rope, rope_theta=5000000.0, mrope_interleaved=True))
    text3.pop("bos_token_id")
    text3.pop("eos_token_id")
    return Qwen3VLConfig(text_config=text3, vision_config=vision, **common)


def reply_documents(tokenizer, corpus: Sequence[str]) -> list[list[int]]:
    """Token ids of every action-format reply in ``corpus`` as an assistant turn of the chat template."""
    replies = [line for line in corpus if line.startswith('{"thoughts"')]
    if not replies:
        raise RuntimeError(
            "the tiny tokenizer corpus holds no action-format replies to pretrain on; the build is broken"
        )
    return [tokenizer(f"<|im_start|>assistant\n{r}<|im_end|>\n")["input_ids"] for r in replies]


def pretrain_reply_format(model, tokenizer, spec: TinySpec, corpus: Sequence[str], seed: int) -> list[float]:
    """Teach the randomly initialised ``model`` the reply grammar by next-token prediction.

    Random weights leave a tiny model's logits within about +-1 and its attention blind to where it
    is in a reply, so LoRA fine-tuning cannot teach it the JSON action format in a CPU demo's budget
    (no valid reply after SFT on it). ``spec.pretrain_steps`` AdamW steps of
    full-parameter language modelling on the corpus's replies (random objects, numbers and moves,
    never this project's environments) fix that in a few seconds, like the instruction tuning of a
    real checkpoint. Runs on one CPU thread so the same seed gives identical weights everywhere.

    Returns:
        The loss of every step (the build records the first and last).
    """
    if spec.pretrain_steps <= 0:
        return []
    docs = reply_documents(tokenizer, corpus)
    pad = tokenizer.pad_token_id

    def batch(rng) -> dict:
        picked = [docs[i] for i in rng.choice(len(docs), size=min(spec.pretrain_batch_size, len(docs)), replace=False)]
        ids, mask = text_rows(picked, pad)
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return next_token_training(model, batch, spec.pretrain_steps, spec.pretrain_lr, seed)


def pretrain_vision_stage(model, processor, tokenizer, spec: TinySpec, seed: int, samples=None) -> dict:
    """Run the vision pre-training ``spec`` asks for (:mod:`a2c_ppo_acktr.tiny.vision`); its build record.

    Args:
        samples: The training samples, rendered beforehand (:func:`load_rendered_samples`); default:
            rendered here.

    Returns:
        ``{}`` when ``spec.vision_pretrain_steps`` is 0, else the tasks, sample count, steps and the
        mean loss of the first and the last 20 steps (for ``tiny_build.json``).
    """
    if spec.vision_pretrain_steps <= 0:
        return {}
    from a2c_ppo_acktr.tiny.vision import pretrain_vision, training_samples

    if samples is None:
        samples = training_samples(spec.vision_image_size, spec.vision_pretrain_scenes, spec.vision_pretrain_tasks)
    losses = pretrain_vision(
        model,
        processor,
        samples,
        steps=spec.vision_pretrain_steps,
        batch_size=spec.vision_pretrain_batch_size,
        lr=spec.vision_pretrain_lr,
        seed=seed,
        text_docs=reply_documents(tokenizer, training_corpus()),
        text_per_batch=spec.vision_text_per_batch,
    )
    window = min(20, len(losses))
    return {
        "vision_pretrain": {
            "tasks": list(spec.vision_pretrain_tasks),
            "samples": len(samples),
            "steps": spec.vision_pretrain_steps,
            "loss_first_last": [round(sum(losses[:window]) / window, 4), round(sum(losses[-window:]) / window, 4)],
        }
    }


class TinySamplesError(ValueError, UserError):
    """A file of rendered samples that is not what this build's vision pre-training draws; the message says why."""


def samples_meta(family: str) -> dict:
    """What defines the training samples of ``family``'s vision pre-training: their tasks, scene count,
    frame size and the code that draws them (the build's seed does not enter: the samples are the same
    for every seed)."""
    spec = tiny_spec(family)
    return {
        "tasks": list(spec.vision_pretrain_tasks),
        "scenes": spec.vision_pretrain_scenes,
        "image_size": spec.vision_image_size,
        "sources": [code_digest(p) for p in _vision_sources(family)],
    }


def render_samples(family: str, path: str | os.PathLike) -> Path:
    """Render the training samples of ``family``'s vision pre-training into ``path`` (one ``.npz``,
    written atomically), for a build that runs later or elsewhere (``--samples``): the quickstart renders
    the rooms build's 1000 rooms on the core the default build leaves idle.

    Raises:
        TinySamplesError: ``family`` has no vision pre-training, or ``path`` exists (it is not replaced).
    """
    from a2c_ppo_acktr.tiny.vision import save_samples, training_samples

    spec = tiny_spec(family)
    if spec.vision_pretrain_steps <= 0:
        raise TinySamplesError(f"the tiny build {family} has no vision pre-training: it has no samples to render")
    if os.path.lexists(path):
        raise TinySamplesError(f"{path} exists; render into a new path (nothing is replaced)")
    samples = training_samples(spec.vision_image_size, spec.vision_pretrain_scenes, spec.vision_pretrain_tasks)
    return save_samples(path, samples, samples_meta(family))


def load_rendered_samples(family: str, path: str | os.PathLike) -> list:
    """The samples :func:`render_samples` wrote to ``path`` for ``family``.

    Raises:
        TinySamplesError: ``path`` is unreadable, or was rendered for other tasks, scenes, frame size or code.
    """
    from a2c_ppo_acktr.tiny.vision import load_samples

    try:
        samples, meta = load_samples(path)
    except ValueError as err:
        raise TinySamplesError(
            f"{err}; render it with python -m a2c_ppo_acktr.tiny --family {family} --render-samples {path}"
        ) from None
    want = samples_meta(family)
    if meta != want:
        differ = sorted(k for k in set(want) | set(meta) if meta.get(k) != want.get(k))
        raise TinySamplesError(
            f"{path} holds samples rendered for another vision pre-training than {family}'s (they differ in "
            f"{differ}); render them again with python -m a2c_ppo_acktr.tiny --family {family} --render-samples "
            f"{path}"
        )
    return samples


def build_processor(spec: TinySpec, tokenizer):
    """The family's processor with the tiny pixel budget."""
    if spec.family in LLAVA_FAMILIES:
        return build_llava_processor(tokenizer, spec.family)
    from transformers import Qwen2VLImageProcessor

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    pix = dict(patch_size=spec.patch_size, merge_size=spec.merge_size, temporal_patch_size=spec.temporal_patch_size)
    if spec.family == "qwen3_vl":
        from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

        norm = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        image = Qwen2VLImageProcessor(size=size, **pix, **norm)
        video = Qwen3VLVideoProcessor(size=size, **pix, **norm)
        return Qwen3VLProcessor(
            image_processor=image, tokenizer=tokenizer, video_processor=video, chat_template=CHAT_TEMPLATE
        )
    from transformers import Qwen2VLVideoProcessor

    norm = {} if spec.image_mean is None else dict(image_mean=list(spec.image_mean), image_std=list(spec.image_std))
    image = Qwen2VLImageProcessor(size=size, **pix, **norm)
    video = Qwen2VLVideoProcessor(size=size, **pix, **norm)
    if spec.family == "qwen2_vl":
        from transformers import Qwen2VLProcessor as proc_cls
    else:
        from transformers import Qwen2_5_VLProcessor as proc_cls
    return proc_cls(image_processor=image, tokenizer=tokenizer, video_processor=video, chat_template=CHAT_TEMPLATE)


# --------------------------------------------------------------------------- LLaVA
# A 28x28 crop is 2x2 CLIP patches of 14 pixels: 4 image tokens per frame after the "default"
# feature selection drops the CLS token (the Qwen tiny models also give 4 tokens per frame).
LLAVA_IMAGE_SIZE = 28
LLAVA_IMAGE_TOKEN = "<image>"
_QWEN_IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN_VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


def llava_chat_template() -> str:
    """The Qwen chat template with LLaVA's ``<image>`` placeholder (expanded by ``LlavaProcessor``).

    Turns, roles and the generation prompt are the Qwen ones, so ``prompts.render_prompt``, the SFT
    collator and the reply-format pretraining treat both families alike. LLaVA takes no videos.
    """
    for placeholder in (_QWEN_IMAGE_PLACEHOLDER, _QWEN_VIDEO_PLACEHOLDER):
        if CHAT_TEMPLATE.count(placeholder) != 1:
            raise RuntimeError(f"CHAT_TEMPLATE no longer holds {placeholder!r} once; update llava_chat_template")
    return CHAT_TEMPLATE.replace(_QWEN_IMAGE_PLACEHOLDER, LLAVA_IMAGE_TOKEN).replace(
        _QWEN_VIDEO_PLACEHOLDER, "{{ raise_exception('the tiny LLaVA model takes images, not videos') }}"
    )


def add_llava_tokens(tokenizer) -> None:
    """Add ``<image>`` after the Qwen special tokens (as llava-hf checkpoints append it) and switch
    to the LLaVA chat template, in place."""
    tokenizer.add_tokens([LLAVA_IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = llava_chat_template()


# LLaVA-1.6's anyres grid for the tiny llava_next: a frame is resized to the best-fitting resolution,
# cut into LLAVA_IMAGE_SIZE tiles and shown with a base view (a square frame: 4 tiles + the base).
LLAVA_NEXT_PINPOINTS = [
    [LLAVA_IMAGE_SIZE, 2 * LLAVA_IMAGE_SIZE],
    [2 * LLAVA_IMAGE_SIZE, LLAVA_IMAGE_SIZE],
    [2 * LLAVA_IMAGE_SIZE, 2 * LLAVA_IMAGE_SIZE],
]


def build_llava_config(spec: TinySpec, tokenizer, vocab_size: int):
    """``LlavaConfig`` (``LlavaNextConfig`` for llava_next): a tiny CLIP vision tower, the 2-layer MLP
    projector, a tiny Llama text model."""
    from transformers import LlavaConfig, LlavaNextConfig

    ids = _token_ids(tokenizer)
    image_id = tokenizer.convert_tokens_to_ids(LLAVA_IMAGE_TOKEN)
    if image_id is None or image_id == tokenizer.unk_token_id:
        raise RuntimeError(f"tiny LLaVA tokenizer lacks {LLAVA_IMAGE_TOKEN!r}; the build is broken")
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_hidden_layers=spec.vision_depth,
        num_attention_heads=spec.vision_num_heads,
        image_size=LLAVA_IMAGE_SIZE,
        patch_size=spec.patch_size,
        projection_dim=spec.vision_hidden_size,
    )
    text = dict(model_type="llama", **_text_sizes(spec, vocab_size, ids), tie_word_embeddings=False)
    kwargs = dict(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        image_seq_length=(LLAVA_IMAGE_SIZE // spec.patch_size) ** 2,
        vision_feature_select_strategy="default",
        # The last layer (real LLaVA takes the second to last): every tower weight is on the path.
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    if spec.family == "llava_next":
        return LlavaNextConfig(**kwargs, image_grid_pinpoints=LLAVA_NEXT_PINPOINTS)
    return LlavaConfig(**kwargs)


def build_llava_processor(tokenizer, family: str = "llava"):
    """``LlavaProcessor`` with a (torchvision-backed) CLIP image processor that resizes and
    centre-crops every frame to ``LLAVA_IMAGE_SIZE`` pixels; for llava_next, ``LlavaNextProcessor``
    with the anyres image processor on :data:`LLAVA_NEXT_PINPOINTS`."""
    from transformers import CLIPImageProcessor, LlavaNextImageProcessor, LlavaNextProcessor, LlavaProcessor

    spec = tiny_spec(family)
    crop = {"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE}
    if family == "llava_next":
        return LlavaNextProcessor(
            image_processor=LlavaNextImageProcessor(
                size={"shortest_edge": LLAVA_IMAGE_SIZE}, crop_size=crop, image_grid_pinpoints=LLAVA_NEXT_PINPOINTS
            ),
            tokenizer=tokenizer,
            patch_size=spec.patch_size,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            image_token=LLAVA_IMAGE_TOKEN,
            chat_template=llava_chat_template(),
        )
    image = CLIPImageProcessor(size={"shortest_edge": LLAVA_IMAGE_SIZE}, crop_size=crop)
    return LlavaProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        patch_size=spec.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, which "default" then drops
        image_token=LLAVA_IMAGE_TOKEN,
        chat_template=llava_chat_template(),
    )


# --------------------------------------------------------------------------- build + cache
def spec_hash(family: str, seed: int, versions: Optional[dict] = None) -> str:
    """Hash of everything that defines a tiny build.

    Covers the sizes, seed, tokenizer corpus, chat template, the code of this module and of the
    modules that draw the vision pre-training's samples (:func:`code_digest`: an edit of the code
    invalidates old builds, an edit of a comment, a docstring or the layout does not) and the
    ``transformers`` and ``tokenizers`` versions that write the files (``versions``: these two as
    another environment had them, default the installed ones; see :func:`build_versions`).
    """
    versions = build_versions() if versions is None else versions
    return _spec_hash(family, seed, versions["transformers"], versions["tokenizers"])


@functools.lru_cache(maxsize=32)
def _spec_hash(family: str, seed: int, transformers: str, tokenizers: str) -> str:
    spec = asdict(tiny_spec(family))
    base = spec.pop("vision_base")
    if base:  # a build on top of another is defined by everything that defines that one, too
        spec["vision_base"] = {"build": base, "spec_hash": _spec_hash(base, seed, transformers, tokenizers)}
    payload = json.dumps(
        {
            "version": TINY_VERSION,
            "spec": spec,
            "seed": seed,
            "corpus": training_corpus(),
            "template": CHAT_TEMPLATE,
            "special": SPECIAL_TOKENS,
            "source": code_digest(Path(__file__)),
            # The vision pre-training's samples come from these modules: editing them changes the weights.
            "vision_sources": [code_digest(p) for p in _vision_sources(family)],
            "transformers": transformers,
            "tokenizers": tokenizers,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:10]


def build_versions() -> dict:
    """The installed versions of the two libraries that write a tiny build's files (part of its spec hash)."""
    from importlib.metadata import version

    return {"transformers": version("transformers"), "tokenizers": version("tokenizers")}


def code_digest(path: str | os.PathLike) -> str:
    """sha256 of a Python module's code: its syntax tree without docstrings, comments or layout."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode("utf-8")).hexdigest()


# The modules that draw each vision pre-training task's frames, beyond tiny/vision.py itself.
_TASK_SOURCES: dict[str, tuple[str, ...]] = {
    "numberline": ("envs/cards/numberline.py", "envs/cards/drawing.py"),
    "ezpoints_cards": (
        "envs/cards/ezpoints.py",
        "envs/cards/formula.py",
        "envs/cards/common.py",
        "envs/cards/drawing.py",
    ),
    "room_size": (
        "envs/procedural.py",
        "envs/scene.py",
        "envs/renderer.py",
        "envs/navigation.py",
        "envs/furniture.py",
        "envs/materials.py",
        "envs/questions.py",
        "common/scoring.py",
        "config/arguments.py",
    ),
    "minigrid_facing": ("envs/minigrid_text.py",),
    "minigrid_action": ("envs/minigrid_text.py",),
}


def _vision_sources(family: str = "qwen2_5_vl") -> list[Path]:
    """The modules that draw and word ``family``'s vision pre-training samples (its tasks' drawing
    modules included, so editing one rebuilds the builds that use it and no other)."""
    here, package = Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]
    tasks = tiny_spec(family).vision_pretrain_tasks if family in BUILDS else ()
    extra = [rel for task in tasks for rel in _TASK_SOURCES.get(task, ())]
    defaults = ["envs/cards/numberline.py", "envs/cards/drawing.py"]  # the default build's, listed for every build
    return [here / "vision.py", here / "training.py", *[package / rel for rel in dict.fromkeys(defaults + extra)]]


def build_tiny_model(
    family: str,
    out_dir: str | os.PathLike,
    seed: int = 0,
    base_dir: Optional[str | os.PathLike] = None,
    samples_path: Optional[str | os.PathLike] = None,
) -> Path:
    """Build the tiny ``family`` model, tokenizer and processor into ``out_dir`` (created).

    Weights come from the family's own initialisation under ``torch.manual_seed(seed)``, so the
    same ``(family, seed)`` gives identical files. A build on top of another (``vision_base`` in its
    spec) starts from that build's weights instead: ``base_dir`` when given (checked to be that build,
    same seed), else the cache's (:func:`tiny_model_dir`, built first if absent). ``samples_path``: the
    vision pre-training's samples rendered beforehand (:func:`render_samples`; the same weights as
    rendering them here).

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        TinyBaseError: ``base_dir`` is not the build this one starts from.
        TinySamplesError: ``samples_path`` holds other samples than this build draws.
    """
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    spec = tiny_spec(family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokenizer = build_tokenizer(spec, training_corpus())
    config = build_config(spec, tokenizer)
    processor = build_processor(spec, tokenizer)
    samples = load_rendered_samples(family, samples_path) if samples_path is not None else None
    base = None
    if spec.vision_base:
        base = Path(base_dir) if base_dir is not None else tiny_model_dir(spec.vision_base, seed=seed)
        check_base_build(base, spec.vision_base, seed)
    # fork_rng: building must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if base is None:
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
            losses = pretrain_reply_format(model, tokenizer, spec, training_corpus(), seed)
        else:  # the base did the reply-format pre-training (and its own vision stage)
            model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
            losses = []
        vision = pretrain_vision_stage(model, processor, tokenizer, spec, seed, samples)
    ids = _token_ids(tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    # The tokenizer is saved by the processor; saving it again at top level keeps AutoTokenizer happy too.
    tokenizer.save_pretrained(out)
    info = {
        "family": spec.family,
        "build": family,
        "seed": seed,
        "spec_hash": spec_hash(family, seed),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "tokenizer_size": len(tokenizer),
        "pretrain_steps": spec.pretrain_steps,
        "pretrain_loss_first_last": [round(losses[0], 4), round(losses[-1], 4)] if losses else None,
        **({"base": {"build": spec.vision_base, "spec_hash": spec_hash(spec.vision_base, seed)}} if base else {}),
        **vision,
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    missing = [name for name in ("config.json", "model.safetensors") if not (out / name).is_file()]
    if missing:
        raise RuntimeError(f"building the tiny {family} model into {out} wrote no {missing}; the build is incomplete")
    (out / "tiny_build.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return out


class TinyBaseError(ValueError, UserError):
    """The directory given as a build's base is not the build it starts from; the message says what it is."""


def check_base_build(path: Path, family: str, seed: int) -> None:
    """Check that ``path`` holds the tiny build ``family`` of ``seed`` as this code builds it.

    Raises:
        TinyBaseError: No ``tiny_build.json`` there, or it records another build, seed or spec hash.
    """
    expected = spec_hash(family, seed)
    try:
        info = json.loads((path / "tiny_build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TinyBaseError(
            f"{path} is not a tiny build (no readable tiny_build.json: {err}); build it with python -m "
            f"a2c_ppo_acktr.tiny --family {family} --seed {seed} --out {path}"
        ) from None
    got = (info.get("build", info.get("family")), info.get("seed"), info.get("spec_hash"))
    if got != (family, seed, expected):
        raise TinyBaseError(
            f"{path} holds the tiny build {got[0]!r} of seed {got[1]} (spec hash {got[2]}); this build starts from "
            f"{family!r} of seed {seed} as this code builds it (spec hash {expected}): rebuild it with python -m "
            f"a2c_ppo_acktr.tiny --family {family} --seed {seed} --out DIR, or leave the base out to use the cache's"
        )


def default_seed() -> int:
    """The weight seed of the default tiny builds: ``$VSI_TINY_SEED``, else 0.

    The weights are not a contract: a build is byte-identical only on CPUs that round alike, so
    code and tests must hold for a build from any seed, and another seed is how to check that here.

    Raises:
        TinySeedError: ``$VSI_TINY_SEED`` is set but not an integer from 0 to 2**32 - 1.
    """
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= 2**32:
        raise TinySeedError(
            f"{SEED_ENV}={raw!r} is not a tiny-build seed: set it to an integer from 0 to 4294967295 (0 is the "
            "default), or unset it"
        )
    return int(raw)


def default_cache_dir() -> Path:
    """``$VSI_CACHE/tiny`` when set, else ``~/.cache/vsi_ppo/tiny``."""
    root = os.environ.get("VSI_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "vsi_ppo") / "tiny"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _build_in_clean_process(family: str, out: Path, seed: int, base: Optional[Path] = None) -> None:
    """Build here, or in a child process when this one is a torch.distributed rank.

    transformers' ``save_pretrained`` silently writes nothing on a rank other than 0 of an initialised
    process group, and under ``torchrun`` whichever rank takes the lock first builds the cache; the
    child has no process group, so it always writes the whole model.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        build_tiny_model(family, out, seed=seed, base_dir=base)
        return
    launcher_vars = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher_vars}
    cmd = [sys.executable, "-m", "a2c_ppo_acktr.tiny", "--family", family, "--out", str(out), "--seed", str(seed)]
    if base is not None:
        cmd += ["--base", str(base)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(
            f"building the tiny {family} model in a child process failed ({' '.join(cmd)}):\n{res.stderr[-3000:]}"
        )


def tiny_model_dir(family: str, cache_dir: Optional[str | os.PathLike] = None, *, seed: Optional[int] = None) -> Path:
    """The cached tiny ``family`` model directory, built on first use.

    The build runs in a temporary sibling directory renamed into place under a file lock, so
    concurrent processes either build once or wait and reuse it, and no reader ever sees a
    half-written directory.

    Args:
        family: one of :data:`BUILDS` (a family, or a build with another vision pre-training).
        cache_dir: where builds live; default :func:`default_cache_dir`.
        seed: weight-initialisation seed (keyword-only); default :func:`default_seed`.

    Raises:
        ValueError: an unknown ``family``.
        TinySeedError: ``seed`` is omitted and ``$VSI_TINY_SEED`` is not a seed.
    """
    _check_family(family)
    seed = default_seed() if seed is None else seed
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"{family}-seed{seed}-v{TINY_VERSION}-{spec_hash(family, seed)}"
    if (final / "tiny_build.json").is_file():
        return final
    base_build = tiny_spec(family).vision_base
    base = tiny_model_dir(base_build, root, seed=seed) if base_build else None  # before this build's lock
    with _file_lock(root / f".{final.name}.lock"):
        if (final / "tiny_build.json").is_file():  # another process finished while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            _build_in_clean_process(family, tmp, seed, base)
            if final.exists():  # a stale partial directory from a killed build without the marker
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final

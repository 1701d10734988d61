"""The single home of the agent's prompt and answer format.

Every prompt the project builds (PPO rollouts, SFT samples, evaluation, teachers) goes through
:func:`build_messages` and :func:`render_prompt`, and every model output is read by
:func:`parse_action`, so an SFT sample and an RL prompt tokenize identically. The one other prompt,
the benchmark's own single-turn prompt on its videos (``eval_vsi.py --protocol video``), lives here
too: :func:`benchmark_prompt` and :func:`benchmark_messages`.

The agent writes ONE JSON object per turn::

    {"thoughts": "...", "action": {"rotation_angle_degrees": 30, "forward_meters": 1.5}}
    {"thoughts": "...", "action": {"answer": "B"}}

A move turns first (positive degrees = to the left, counter-clockwise seen from above), then walks
straight ahead. An answer ends the episode: an option letter for multiple choice, a number (as a
string) otherwise, in the unit the question asks for.
"""

from __future__ import annotations

import collections
import json
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence, Union

from a2c_ppo_acktr.common.scoring import is_multiple_choice

MAX_ROTATION_DEG = 180.0  # a turn in [-180, 180] reaches every heading
DEFAULT_MAX_FORWARD = 3.0  # meters; the env passes its own EnvConfig.max_forward
MOVE_KEYS = ("rotation_angle_degrees", "forward_meters")
ANSWER_KEY = "answer"


@dataclass(frozen=True)
class Move:
    """Turn by ``rotation_deg`` (positive = left), then walk ``forward_m`` meters straight ahead."""

    rotation_deg: float
    forward_m: float


@dataclass(frozen=True)
class Answer:
    """Answer the question and end the episode; ``text`` is scored by :mod:`a2c_ppo_acktr.common.scoring`."""

    text: str


@dataclass(frozen=True)
class Invalid:
    """Output that is not a legal action; ``reason`` says what was wrong (shown to the agent)."""

    reason: str


Action = Union[Move, Answer, Invalid]

SYSTEM_PROMPT = (
    "You are an agent standing in an indoor room. Answer the spatial question about the room. "
    "You see frames of a 360-degree sweep taken where you started, then your most recent views; "
    "the last image is what you see now. You may move to look around before answering.\n"
    "Each turn, reply with ONE JSON object and nothing else, either a move:\n"
    '{"thoughts": "<short reasoning>", "action": {"rotation_angle_degrees": <number>, "forward_meters": <number>}}\n'
    "(turn first, positive = left, negative = right, then walk straight ahead; walls and furniture block you)\n"
    "or your final answer, which ends the episode:\n"
    '{"thoughts": "<short reasoning>", "action": {"answer": "<answer>"}}\n'
    'The answer is an option letter such as "B" for multiple-choice questions, otherwise a number '
    'such as "3.2" in the unit the question asks for.'
)


# What the observation text adds when the env draws object labels on its images (EnvConfig.object_labels;
# "none" adds nothing, so the text is then exactly the unlabelled one).
LABEL_SENTENCES = {
    "none": None,
    "names": "Each visible object is marked with its category name.",
    "ids": "Each visible object is marked with a numeric id that stays the same across frames.",
}


# ---------------------------------------------------------------------------------------------
# Observation text and messages
# ---------------------------------------------------------------------------------------------
def observation_text(
    question: str,
    options: Sequence[str] | None,
    feedback: str,
    turns_left: int,
    num_sweep_frames: int = 0,
    num_views: int = 0,
    max_forward: float = DEFAULT_MAX_FORWARD,
    object_labels: str = "none",
) -> str:
    """The user text of one turn.

    Args:
        question: The question text.
        options: Multiple-choice options such as ``"A. left"``, or None for a numerical question.
        feedback: What happened last turn (see :func:`feedback_text`).
        turns_left: Turns remaining including this one; at 1 the agent should answer.
        num_sweep_frames: How many of the images are the initial sweep (they come first).
        num_views: How many images after the sweep are per-turn views (the last is the current view).
        max_forward: Largest ``forward_meters`` a move may use.
        object_labels: The env's ``object_labels`` (``none``, ``names`` or ``ids``); with labels on,
            a sentence after the images line says how objects are marked (:data:`LABEL_SENTENCES`).

    Returns:
        The text; it names which images are which so the model can tell sweep from current view.

    Raises:
        ValueError: If ``object_labels`` is not a known mode.
    """
    if object_labels not in LABEL_SENTENCES:
        raise ValueError(f"object_labels={object_labels!r} is not one of {list(LABEL_SENTENCES)}")
    lines = [f"Question: {question}"]
    if options:
        lines.append("Options:")
        lines.extend(options)
        lines.append("Answer with the option's letter.")
    else:
        lines.append("Answer with a single number.")
    lines.append(_images_line(num_sweep_frames, num_views))
    if LABEL_SENTENCES[object_labels]:
        lines.append(LABEL_SENTENCES[object_labels])
    lines.append(f"Last turn: {feedback}")
    if turns_left <= 1:
        lines.append("This is your last turn: answer now.")
    else:
        lines.append(
            f"Turns left: {turns_left}. Moves: rotation_angle_degrees in [-180, 180], forward_meters in [0, "
            f"{max_forward:g}]."
        )
    return "\n".join(lines)


def _images_line(num_sweep_frames: int, num_views: int) -> str:
    if num_sweep_frames == 0 and num_views == 0:
        return "Images: none."
    parts = []
    if num_sweep_frames:
        if num_sweep_frames == 1:
            parts.append("image 1 is the start view")
        else:
            step = 360.0 / num_sweep_frames
            parts.append(
                f"images 1-{num_sweep_frames} are the start sweep, each turned {step:g} degrees left of the previous"
            )
    if num_views:
        first = num_sweep_frames + 1
        last = num_sweep_frames + num_views
        parts.append(
            f"image {last} is your current view"
            if num_views == 1
            else f"images {first}-{last} are your latest views, image {last} is the current one"
        )
    return "Images: " + "; ".join(parts) + "."


def feedback_text(action: Action | None, *, collided: bool = False, walked_m: float = 0.0) -> str:
    """Describe the outcome of the last action for the next observation.

    Args:
        action: The parsed last action, or None on the first turn.
        collided: Whether a move was blocked before walking its full distance.
        walked_m: Meters actually walked by a move.

    Returns:
        One sentence.
    """
    if action is None:
        return "none yet (this is the start)."
    if isinstance(action, Invalid):
        return f"invalid output ({action.reason}); the turn was used. Reply with one JSON object as instructed."
    if isinstance(action, Answer):
        return f"answered {action.text!r}."
    turn = action.rotation_deg
    turned = "did not turn" if turn == 0 else f"turned {abs(turn):g} degrees {'left' if turn > 0 else 'right'}"
    if collided:
        return f"{turned}, walked {walked_m:.2f} of {action.forward_m:g} m and was blocked by an obstacle."
    return f"{turned} and walked {walked_m:.2f} m."


def build_messages(observation: dict, blind: bool = False) -> list[dict]:
    """Chat messages (HF format) for one observation.

    Args:
        observation: ``{"images": [uint8 HxWx3, ...], "text": str}`` from the env, optionally with
            ``"system"`` (see :func:`system_prompt`).
        blind: Withhold the images (a text-only baseline); the text then says so.

    Returns:
        ``[system, user]``; the user content is one ``{"type": "image"}`` per image, then the text.
        The images themselves are passed to the processor separately, in the same order.
    """
    text = observation["text"]
    if blind:
        for sentence in filter(None, LABEL_SENTENCES.values()):  # the marks are on images not shown
            text = text.replace(sentence + "\n", "")
        content: list[dict[str, Any]] = [{"type": "text", "text": "(No images are shown in this evaluation.)\n" + text}]
    else:
        content = [{"type": "image"} for _ in observation["images"]]
        content.append({"type": "text", "text": text})
    return [
        {"role": "system", "content": [{"type": "text", "text": system_prompt(observation)}]},
        {"role": "user", "content": content},
    ]


# Data URLs of recent frames, by content: an episode shows the same frames turn after turn (the
# history, the sweep), and a PNG encode costs far more than hashing the pixels. Bounded by count.
PNG_CACHE_SIZE = 128
_png_cache: "collections.OrderedDict[tuple, str]" = collections.OrderedDict()
_png_lock = threading.Lock()  # the teacher encodes from its request threads


def png_data_url(image: Any) -> str:
    """A uint8 HxWx3 image as a ``data:image/png;base64,...`` URL (lossless); an image with the same
    pixels as one of the last :data:`PNG_CACHE_SIZE` gets the URL made for it then."""
    import numpy as np

    from a2c_ppo_acktr.common.sameness import image_key

    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected a uint8 HxWx3 image, got dtype {arr.dtype} shape {arr.shape}")
    arr = np.ascontiguousarray(arr)
    key = image_key(arr)
    with _png_lock:
        url = _png_cache.get(key)
        if url is not None:
            _png_cache.move_to_end(key)
            return url
    url = _encode_png(arr)  # outside the lock: other threads' frames encode meanwhile
    with _png_lock:
        _png_cache[key] = url
        while len(_png_cache) > PNG_CACHE_SIZE:
            _png_cache.popitem(last=False)
    return url


def _encode_png(arr: Any) -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def openai_messages(observation: dict, blind: bool = False) -> list[dict]:
    """The policy's messages (:func:`build_messages`) in OpenAI chat format, for a server that applies
    the chat template itself (a teacher, a rollout engine): images inline as data URLs, in order;
    the system prompt as text (some servers reject list content in system messages)."""
    images = iter(observation["images"])
    out: list[dict] = []
    for msg in build_messages(observation, blind=blind):
        parts = [
            {"type": "image_url", "image_url": {"url": png_data_url(next(images))}}
            if part["type"] == "image"
            else {"type": "text", "text": part["text"]}
            for part in msg["content"]
        ]
        if msg["role"] == "system":
            out.append({"role": "system", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": msg["role"], "content": parts})
    return out


def system_prompt(observation: dict) -> str:
    """The system message of an observation: its env's own (``observation["system"]``, the games of
    :mod:`a2c_ppo_acktr.envs.registry`) or, when it has none, the VSI agent's :data:`SYSTEM_PROMPT`."""
    return observation.get("system") or SYSTEM_PROMPT


def assistant_message(response: str) -> dict:
    """The assistant turn holding ``response`` (for SFT samples built on :func:`build_messages`)."""
    return {"role": "assistant", "content": [{"type": "text", "text": response}]}


def render_prompt(processor: Any, messages: list[dict]) -> str:
    """The prompt string: the processor's chat template with the generation prompt appended."""
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------------------------------------
# The benchmark's own prompt (the reference protocol on videos, a2c_ppo_acktr/eval/video_protocol.py)
# ---------------------------------------------------------------------------------------------
# VSI-Bench's reference evaluation (docs/BENCHMARK.md, "The reference prompts"); the code it follows is
# vsibench_doc_to_text in lmms_eval/tasks/vsibench/utils.py of
# vision-x-nyu/thinking-in-space (the same task ships in EvolvingLMMs-Lab/lmms-eval). The system
# prompt is the system_prompt default of lmms-eval's Qwen2/2.5/3-VL wrappers. The agent's multi-turn
# format above never uses these; a model answers them with a bare word, read by scoring.extract_answer.
BENCHMARK_SYSTEM_PROMPT = "You are a helpful assistant."
BENCHMARK_PRE_PROMPT = "These are frames of a video."
BENCHMARK_NUMERICAL_POST_PROMPT = "Please answer the question using a single word or phrase."
BENCHMARK_MC_POST_PROMPT = "Answer with the option's letter from the given choices directly."


def benchmark_prompt(question_type: str, question: str, options: Sequence[str] | None) -> str:
    """The reference evaluation's user text for one VSI-Bench row.

    Numerical: ``pre \\n question \\n post``; multiple choice: ``pre \\n question \\n Options: \\n
    one option per line \\n post``. The question is used as stored (the reference does not strip it).

    Raises:
        ValueError: On an unknown question type, or a multiple-choice type without options.
    """
    if not is_multiple_choice(question_type):
        return "\n".join([BENCHMARK_PRE_PROMPT, question, BENCHMARK_NUMERICAL_POST_PROMPT])
    if not options:
        raise ValueError(f"a {question_type} question needs its options for the benchmark prompt, got {options!r}")
    return "\n".join([BENCHMARK_PRE_PROMPT, question, "Options:\n" + "\n".join(options), BENCHMARK_MC_POST_PROMPT])


def benchmark_messages(text: str, num_images: int = 0) -> list[dict]:
    """Chat messages of the reference protocol: the system prompt, then the visual input and ``text``.

    Args:
        text: :func:`benchmark_prompt`'s text.
        num_images: 0: one ``{"type": "video"}`` placeholder (the frames go to the processor as one
            video, as the reference's Qwen wrappers do); N > 0: N ``{"type": "image"}`` placeholders
            (models without video input see the frames as images).
    """
    visual: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)] if num_images else [{"type": "video"}]
    return [
        {"role": "system", "content": [{"type": "text", "text": BENCHMARK_SYSTEM_PROMPT}]},
        {"role": "user", "content": [*visual, {"type": "text", "text": text}]},
    ]


# ---------------------------------------------------------------------------------------------
# Response format
# ---------------------------------------------------------------------------------------------
def _json_number(x: float) -> int | float:
    # Integral values print as ints ("30", not "30.0"): shorter, and what models write naturally.
    # Other floats use repr, which round-trips exactly.
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 1e15 else x


def format_response(thoughts: str, action: Move | Answer) -> str:
    """The canonical text of one agent response (used by the oracle, teachers and SFT).

    Args:
        thoughts: Free-text reasoning.
        action: A :class:`Move` or :class:`Answer`.

    Returns:
        ``json.dumps`` of ``{"thoughts": ..., "action": {...}}`` with ``ensure_ascii=False`` and
        the default separators, keys in that order; :func:`parse_action` reads it back exactly.

    Raises:
        TypeError: If ``action`` is not a Move or Answer or ``thoughts`` is not a string.
        ValueError: If a move holds a non-finite number.
    """
    if not isinstance(thoughts, str):
        raise TypeError(f"thoughts must be a string, got {type(thoughts).__name__}")
    if isinstance(action, Move):
        if not (math.isfinite(action.rotation_deg) and math.isfinite(action.forward_m)):
            raise ValueError(f"cannot format a move with non-finite values: {action}")
        act: dict[str, Any] = {
            MOVE_KEYS[0]: _json_number(action.rotation_deg),
            MOVE_KEYS[1]: _json_number(action.forward_m),
        }
    elif isinstance(action, Answer):
        act = {ANSWER_KEY: action.text}
    else:
        raise TypeError(f"format_response needs a Move or Answer, got {action!r}")
    return json.dumps({"thoughts": thoughts, "action": act}, ensure_ascii=False)


# strict=False: a raw newline or tab inside the thoughts string (common in model output) is accepted;
# format_response itself always escapes them.
class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


# Nested objects with a key given twice are refused (json's default keeps the last silently).
_DECODER = json.JSONDecoder(strict=False, object_pairs_hook=_unique_pairs)
_WS = " \t\n\r"


@dataclass
class _Scan:
    """Top-level members of the first JSON object in a text, with the spans of their values."""

    members: dict[str, tuple[Any, int, int]]  # key -> (value, start, end)
    error: str | None  # None when the whole object was read


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def _scan_object(text: str) -> _Scan | None:
    """The reply's JSON object: the first ``{`` outside ``<think>...</think>`` blocks that opens a
    complete object with an ``action`` member; when none does, the first ``{`` outside them (whose
    error then explains the reply). A brace in free text before the object (``I think {the sofa}``)
    or in a reasoning block does not hide the object after it. Returns None when there is no ``{``.
    """
    thinking = [m.span() for m in _THINK.finditer(text)]
    starts = [i for i, c in enumerate(text) if c == "{" and not any(a <= i < b for a, b in thinking)]
    if not starts:
        return None
    first = None
    for start in starts:
        scan = _scan_object_at(text, start)
        if scan.error is None and "action" in scan.members:
            return scan
        first = first or scan
    return first


def _scan_object_at(text: str, start: int) -> _Scan:
    """Read the ``{...}`` opening at ``text[start]`` member by member, keeping each complete member.

    Stops at the first error (truncated or malformed JSON, a key given twice) and reports it, so a
    response cut off by the token limit still yields the spans of the members it completed.
    """
    members: dict[str, tuple[Any, int, int]] = {}
    i = _skip_ws(text, start + 1)
    if i < len(text) and text[i] == "}":
        return _Scan(members, None)
    while True:
        if i >= len(text):
            return _Scan(members, "the JSON object is truncated")
        if text[i] != '"':
            return _Scan(members, f"expected a quoted key at character {i}")
        try:
            key, i = json.decoder.scanstring(text, i + 1, False)
        except ValueError as e:
            return _Scan(members, f"bad key: {e.msg if hasattr(e, 'msg') else e}")
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            return _Scan(members, f"expected ':' after key {key!r}")
        i = _skip_ws(text, i + 1)
        if key in members:
            return _Scan(members, f"the key {key!r} appears twice; reply with one {key!r}")
        try:
            value, end = _DECODER.raw_decode(text, i)
        except _DuplicateKey as e:
            return _Scan(members, f"the value of {key!r} has the key {e.key!r} twice")
        except RecursionError:
            return _Scan(members, f"the value of {key!r} is nested too deeply")
        except ValueError as e:  # JSONDecodeError, or an integer with too many digits
            return _Scan(members, f"the value of {key!r} is not valid JSON ({getattr(e, 'msg', str(e))})")
        members[key] = (value, i, end)
        i = _skip_ws(text, end)
        if i >= len(text):
            return _Scan(members, "the JSON object is truncated")
        if text[i] == "}":
            return _Scan(members, None)
        if text[i] != ",":
            return _Scan(members, f"expected ',' or '}}' after the value of {key!r}")
        i = _skip_ws(text, i + 1)


def response_spans(text: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Character spans of the thoughts value and of the action value in a response.

    The spans cover the JSON value text as written (the thoughts string literal with its quotes,
    the action object with its braces), so ``json.loads(text[s:e])`` gives the value back. They
    refer to the first JSON object in ``text`` (the one :func:`parse_action` reads). A part is None
    when it is absent, not complete (truncated output) or of the wrong JSON type (thoughts not a
    string, action not an object).

    Args:
        text: The decoded model output.

    Returns:
        ``(thoughts_span, action_span)``, each ``(start, end)`` or None.
    """
    if not isinstance(text, str):
        return None, None
    scan = _scan_object(text)
    if scan is None:
        return None, None
    thoughts = scan.members.get("thoughts")
    action = scan.members.get("action")
    t_span = (thoughts[1], thoughts[2]) if thoughts is not None and isinstance(thoughts[0], str) else None
    a_span = (action[1], action[2]) if action is not None and isinstance(action[0], dict) else None
    return t_span, a_span


def _number(name: str, value: Any, low: float, high: float) -> float | str:
    """The value as a float in [low, high], or a reason string."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} must be a number, got {type(value).__name__} {_short(value)}"
    try:
        x = float(value)
    except OverflowError:
        return f"{name} is too large"
    if not math.isfinite(x):
        return f"{name} must be finite, got {x}"
    # A value a rounding away from a bound (3.0000001 for 3) is the bound: models print floats.
    tol = _BOUND_TOLERANCE * max(1.0, abs(high - low))
    if low - tol <= x < low:
        x = low
    elif high < x <= high + tol:
        x = high
    if not low <= x <= high:
        return f"{name}={x:.10g} is outside [{low:g}, {high:g}]"
    return x


_BOUND_TOLERANCE = 1e-6  # relative to the range's width (at least 1)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_action(text: str, max_forward: float = DEFAULT_MAX_FORWARD) -> Action:
    """Read the agent's action from its output; never raises.

    Leading and trailing text (for example a code fence) around the JSON object is ignored.
    The object must hold an ``action`` object (and may hold a ``thoughts`` string) and no other
    keys; the action is either exactly the two move keys or exactly ``answer``.

    Decided cases (tested in ``tests/test_prompts.py``):

    * the object read is the first complete one with an ``action``, outside ``<think>...</think>``
      blocks: a brace in the reasoning or preamble (``I think {the sofa} ...``) does not make a
      valid reply invalid; text after it, a second object included, is ignored;
    * a key given twice (two ``action`` members, or ``answer`` twice inside one) is invalid: a move
      followed by an answer is not silently read as either;
    * full-width braces get a reason that says so;
    * a number a rounding away from a bound (``forward_meters`` 3.0000001 with a 3 m limit) is the
      bound; further out it is invalid, the reason printing it in full.

    Args:
        text: The decoded model output (any string).
        max_forward: Largest allowed ``forward_meters`` (the env's ``max_forward``).

    Returns:
        A :class:`Move` (values as floats), an :class:`Answer` (text stripped; a number is turned
        into its JSON text) or an :class:`Invalid` whose reason says what was wrong.
    """
    try:
        return _parse_action(text, max_forward)
    except Exception as e:  # noqa: BLE001 - the contract is "never raises": a bug here must not crash rollouts
        return Invalid(f"could not read the output ({type(e).__name__}: {e})")


def reply_action_value(text: Any) -> Any:
    """The ``action`` member's value of a reply in the one format ``{"thoughts": str, "action": ...}``,
    or :class:`Invalid` saying why the reply is not in it. Every env's parser starts here and then
    reads the value with its own action vocabulary (VSI moves/answers, gym-cards tokens, Sokoban words).
    """
    if not isinstance(text, str):
        return Invalid(f"the output must be a string, got {type(text).__name__}")
    if not text.strip():
        return Invalid("the output is empty; reply with one JSON object")
    scan = _scan_object(text)
    fullwidth = "\uff5b" in text or "\uff5d" in text
    if (scan is None or scan.error is not None or "action" not in scan.members) and fullwidth:
        return Invalid("full-width braces \uff5b \uff5d are not JSON; write the object with ASCII { and }")
    if scan is None:
        return Invalid("no JSON object found; reply with one JSON object")
    if scan.error is not None:
        return Invalid(f"the JSON object is malformed: {scan.error}")
    extra = sorted(k for k in scan.members if k not in ("thoughts", "action"))
    if extra:
        return Invalid(f"unexpected keys {extra}; use only 'thoughts' and 'action'")
    if "thoughts" in scan.members and not isinstance(scan.members["thoughts"][0], str):
        return Invalid("'thoughts' must be a string")
    if "action" not in scan.members:
        return Invalid("the object has no 'action'")
    return scan.members["action"][0]


def _parse_action(text: str, max_forward: float) -> Action:
    action = reply_action_value(text)
    if isinstance(action, Invalid):
        return action
    if not isinstance(action, dict):
        return Invalid(f"'action' must be an object, got {type(action).__name__}")
    keys = set(action)
    if ANSWER_KEY in keys:
        if keys != {ANSWER_KEY}:
            return Invalid(f"an answer action holds only 'answer'; got keys {sorted(keys)}")
        return _parse_answer(action[ANSWER_KEY])
    if keys != set(MOVE_KEYS):
        missing = [k for k in MOVE_KEYS if k not in keys]
        extra_keys = sorted(keys - set(MOVE_KEYS))
        detail = ", ".join(
            p for p in (f"missing {missing}" if missing else "", f"unexpected {extra_keys}" if extra_keys else "") if p
        )
        return Invalid(f"a move needs exactly {list(MOVE_KEYS)} ({detail}); an answer needs 'answer'")
    rotation = _number(MOVE_KEYS[0], action[MOVE_KEYS[0]], -MAX_ROTATION_DEG, MAX_ROTATION_DEG)
    if isinstance(rotation, str):
        return Invalid(rotation)
    forward = _number(MOVE_KEYS[1], action[MOVE_KEYS[1]], 0.0, max_forward)
    if isinstance(forward, str):
        return Invalid(forward)
    return Move(rotation_deg=rotation, forward_m=forward)


def _parse_answer(value: Any) -> Action:
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return Invalid(f'\'answer\' must be a string such as "B" or "3.2", got {_short(value)}')
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return Invalid(f"'answer' must be finite, got {value}")
        value = json.dumps(value)
    value = value.strip()
    if not value:
        return Invalid("'answer' is empty")
    return Answer(value)

"""The prompt/answer format: parse_action never raises and reads canonical responses back exactly."""

import json
import string

import numpy as np
import pytest

from a2c_ppo_acktr.common.prompts import (
    SYSTEM_PROMPT,
    Answer,
    Invalid,
    Move,
    assistant_message,
    build_messages,
    feedback_text,
    format_response,
    observation_text,
    parse_action,
    render_prompt,
    response_spans,
)

RNG_SEED = 1234
ALPHABET = string.printable + '{}[]":,{}""é中😀\u2028\\'


def _random_thoughts(rng) -> str:
    n = int(rng.integers(0, 30))
    return "".join(ALPHABET[i] for i in rng.integers(0, len(ALPHABET), n))


def _random_valid(rng):
    thoughts = _random_thoughts(rng)
    if rng.random() < 0.5:
        rot = float(np.round(rng.uniform(-180, 180), int(rng.integers(0, 4))))
        fwd = float(np.round(rng.uniform(0, 3), int(rng.integers(0, 4))))
        action = Move(rot, fwd)
    else:
        choice = rng.integers(0, 3)
        if choice == 0:
            text = "ABCD"[int(rng.integers(0, 4))]
        elif choice == 1:
            text = repr(float(np.round(rng.uniform(0, 100), 2)))
        else:
            text = _random_thoughts(rng).strip() or "x"
        action = Answer(text)
    return thoughts, action


def test_round_trip_of_canonical_responses():
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(3000):
        thoughts, action = _random_valid(rng)
        text = format_response(thoughts, action)
        assert parse_action(text) == action, text
        # Code fences and junk around the object do not matter.
        assert parse_action(f"```json\n{text}\n```") == action
        assert parse_action(f"Sure! {text} Done.") == action
        t_span, a_span = response_spans(text)
        assert json.loads(text[t_span[0] : t_span[1]]) == thoughts
        act_obj = json.loads(text[a_span[0] : a_span[1]])
        assert act_obj == json.loads(text)["action"]


def test_canonical_format_is_compact_and_ordered():
    assert format_response("look left", Move(30.0, 1.5)) == (
        '{"thoughts": "look left", "action": {"rotation_angle_degrees": 30, "forward_meters": 1.5}}'
    )
    assert format_response("é", Answer("B")) == '{"thoughts": "é", "action": {"answer": "B"}}'
    with pytest.raises(TypeError):
        format_response("x", Invalid("bad"))
    with pytest.raises(ValueError):
        format_response("x", Move(float("nan"), 1.0))


def _assert_action(result):
    assert isinstance(result, (Move, Answer, Invalid))
    if isinstance(result, Move):
        assert -180 <= result.rotation_deg <= 180 and 0 <= result.forward_m <= 3
    if isinstance(result, Answer):
        assert result.text and result.text == result.text.strip()
    if isinstance(result, Invalid):
        assert result.reason


def test_parse_action_never_raises_on_generated_strings():
    rng = np.random.default_rng(RNG_SEED + 1)
    valid = [format_response(*_random_valid(rng)) for _ in range(200)]
    count = 0
    # Random printable/unicode strings.
    for _ in range(3000):
        n = int(rng.integers(0, 80))
        s = "".join(ALPHABET[i] for i in rng.integers(0, len(ALPHABET), n))
        _assert_action(parse_action(s))
        count += 1
    # Every prefix of valid responses (truncated generations) is Invalid, except the full text.
    for text in valid[:60]:
        for k in range(len(text)):
            result = parse_action(text[:k])
            assert isinstance(result, Invalid), (text[:k], result)
            count += 1
    # Random byte-level corruption of valid responses.
    for _ in range(2000):
        text = list(valid[int(rng.integers(0, len(valid)))])
        for _ in range(int(rng.integers(1, 4))):
            text[int(rng.integers(0, len(text)))] = ALPHABET[int(rng.integers(0, len(ALPHABET)))]
        _assert_action(parse_action("".join(text)))
        count += 1
    assert count >= 10_000


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("move left", "no JSON object"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": NaN, "forward_meters": 1}}', "finite"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": Infinity, "forward_meters": 1}}', "finite"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 1e999, "forward_meters": 1}}', "finite"),
        (
            '{"thoughts": "a", "action": {"rotation_angle_degrees": ' + "9" * 400 + ', "forward_meters": 1}}',
            "too large",
        ),
        (
            '{"thoughts": "a", "action": {"rotation_angle_degrees": ' + "9" * 5000 + ', "forward_meters": 1}}',
            "not valid JSON",
        ),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 181, "forward_meters": 1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": -180.5, "forward_meters": 1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 0, "forward_meters": -0.1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 0, "forward_meters": 3.01}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": "30", "forward_meters": 1}}', "must be a number"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": true, "forward_meters": 1}}', "must be a number"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 30}}', "missing"),
        (
            '{"thoughts": "a", "action": {"rotation_angle_degrees": 30, "forward_meters": 1, "answer": "B"}}',
            "only 'answer'",
        ),
        ('{"thoughts": "a", "action": {"answer": ""}}', "empty"),
        ('{"thoughts": "a", "action": {"answer": "  "}}', "empty"),
        ('{"thoughts": "a", "action": {"answer": null}}', "must be a string"),
        ('{"thoughts": "a", "action": {"answer": ["B"]}}', "must be a string"),
        ('{"thoughts": "a", "action": {"answer": NaN}}', "finite"),
        ('{"thoughts": "a", "action": "B"}', "must be an object"),
        ('{"thoughts": "a", "action": [1, 2]}', "must be an object"),
        ('{"thoughts": "a"}', "no 'action'"),
        ('{"thoughts": 3, "action": {"answer": "B"}}', "'thoughts' must be a string"),
        ('{"thoughts": "a", "action": {"answer": "B"}, "extra": 1}', "unexpected keys"),
        ('{"thoughts": "a", "action": {"answer": "B"}', "truncated"),
        ('{"thoughts": "a", "action": {"answer": "B"', "malformed"),
        ('{"thoughts": "a", "action": ' + "[" * 100000 + "]" * 100000 + "}", "malformed"),
        ('{"thoughts": "a" "action": {"answer": "B"}}', "expected ','"),
        ("{'thoughts': 'a', 'action': {'answer': 'B'}}", "quoted key"),
        ('{"action": {}}', "a move needs exactly"),
    ],
)
def test_invalid_outputs_have_reasons(text, fragment):
    result = parse_action(text)
    assert isinstance(result, Invalid), result
    assert fragment in result.reason, result.reason


def test_lenient_but_exact_cases():
    assert parse_action('{"action": {"answer": "B"}}') == Answer("B")  # thoughts are optional
    assert parse_action('{"thoughts": "", "action": {"answer": 3.2}}') == Answer("3.2")
    assert parse_action('{"thoughts": "", "action": {"answer": 4}}') == Answer("4")
    assert parse_action('{"thoughts": "", "action": {"answer": " B "}}') == Answer("B")
    assert parse_action('{"thoughts":"x","action":{"rotation_angle_degrees":-180,"forward_meters":0}}') == Move(
        -180.0, 0.0
    )
    assert parse_action(
        '{"thoughts": "x", "action": {"rotation_angle_degrees": 0, "forward_meters": 5}}', max_forward=5.0
    ) == Move(0.0, 5.0)
    # Trailing text after the first object is ignored, even another object.
    assert parse_action('{"action": {"answer": "A"}} {"action": {"answer": "B"}}') == Answer("A")
    assert isinstance(parse_action(None), Invalid)  # type: ignore[arg-type]
    # A raw newline inside the thoughts string is tolerated (models write them); spans still cover it.
    text = '{"thoughts": "line one\nline two", "action": {"answer": "C"}}'
    assert "\n" in text and parse_action(text) == Answer("C")
    t, a = response_spans(text)
    assert text[t[0] : t[1]] == '"line one\nline two"' and text[a[0] : a[1]] == '{"answer": "C"}'


def test_response_spans_hand_made():
    text = 'ok {"thoughts": "go {left}", "action": {"answer": "B"}} tail'
    t, a = response_spans(text)
    assert text[t[0] : t[1]] == '"go {left}"'
    assert text[a[0] : a[1]] == '{"answer": "B"}'
    # Action first, escapes and unicode inside the thoughts, extra whitespace.
    text = '{ "action" :{"rotation_angle_degrees":10,"forward_meters":1} ,\n "thoughts" : "a \\"q\\" é" }'
    t, a = response_spans(text)
    assert text[t[0] : t[1]] == '"a \\"q\\" é"'
    assert text[a[0] : a[1]] == '{"rotation_angle_degrees":10,"forward_meters":1}'
    # Truncated after the thoughts: the thoughts span survives, the action is None.
    text = '{"thoughts": "look", "action": {"rotation_angle'
    t, a = response_spans(text)
    assert text[t[0] : t[1]] == '"look"' and a is None
    # Unterminated thoughts, no object, wrong types.
    assert response_spans('{"thoughts": "loo') == (None, None)
    assert response_spans("no json here") == (None, None)
    assert response_spans('{"thoughts": 5, "action": "B"}') == (None, None)
    assert response_spans('{"action": {"answer": "B"}}')[0] is None


def test_observation_text_and_messages():
    text = observation_text(
        "How many chair(s) are in this room?", None, feedback_text(None), turns_left=5, num_sweep_frames=8, num_views=2
    )
    assert "How many chair(s)" in text and "images 1-8" in text and "images 9-10" in text and "Turns left: 5" in text
    mc = observation_text("Q?", ["A. left", "B. right"], "x", turns_left=1, num_sweep_frames=4, num_views=1)
    assert "A. left\nB. right" in mc and "last turn" in mc and "image 5 is your current view" in mc
    obs = {"images": [np.zeros((4, 4, 3), np.uint8)] * 3, "text": text}
    msgs = build_messages(obs)
    assert msgs[0]["role"] == "system" and msgs[0]["content"][0]["text"] == SYSTEM_PROMPT
    assert [c["type"] for c in msgs[1]["content"]] == ["image"] * 3 + ["text"]
    blind = build_messages(obs, blind=True)
    assert [c["type"] for c in blind[1]["content"]] == ["text"] and text in blind[1]["content"][0]["text"]


def test_feedback_text():
    assert "invalid output (bad thing)" in feedback_text(Invalid("bad thing"))
    assert feedback_text(Move(30, 1.0), walked_m=1.0) == "turned 30 degrees left and walked 1.00 m."
    msg = feedback_text(Move(-45, 2.0), collided=True, walked_m=0.5)
    assert "45 degrees right" in msg and "blocked" in msg and "0.50 of 2 m" in msg


def test_render_prompt_uses_generation_prompt():
    class FakeProcessor:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return f"{len(messages)} messages"

    assert render_prompt(FakeProcessor(), [{"role": "user", "content": []}]) == "1 messages"


# ------------------------------------------------------------------------------------------------
# Exact texts. The observation, the feedback and the reasons of Invalid outputs are model input:
# RL prompts, SFT samples and evaluation must produce the same bytes, so these pin them verbatim
# (written out by hand from the format the docstrings describe, not generated by the code).
# ------------------------------------------------------------------------------------------------
def test_observation_text_verbatim():
    numeric = observation_text(
        "How many chairs?", None, feedback_text(None), turns_left=5, num_sweep_frames=8, num_views=2
    )
    assert numeric == (
        "Question: How many chairs?\n"
        "Answer with a single number.\n"
        "Images: images 1-8 are the start sweep, each turned 45 degrees left of the previous; "
        "images 9-10 are your latest views, image 10 is the current one.\n"
        "Last turn: none yet (this is the start).\n"
        "Turns left: 5. Moves: rotation_angle_degrees in [-180, 180], forward_meters in [0, 3]."
    )
    mc = observation_text("Q?", ["A. left", "B. right"], "x", turns_left=1, num_sweep_frames=1, num_views=1)
    assert mc == (
        "Question: Q?\nOptions:\nA. left\nB. right\nAnswer with the option's letter.\n"
        "Images: image 1 is the start view; image 2 is your current view.\n"
        "Last turn: x\nThis is your last turn: answer now."
    )
    # Two turns left is not the last turn; the env's own max_forward is shown; no options (an
    # empty list included) means a numerical question; defaults: no images, 3 m.
    two = observation_text("Q?", [], "x", turns_left=2, max_forward=2.5)
    assert two == (
        "Question: Q?\nAnswer with a single number.\nImages: none.\nLast turn: x\n"
        "Turns left: 2. Moves: rotation_angle_degrees in [-180, 180], forward_meters in [0, 2.5]."
    )
    assert observation_text("Q?", None, "x", turns_left=0).endswith(
        "Images: none.\nLast turn: x\nThis is your last turn: answer now."
    )
    assert observation_text("Q?", None, "x", turns_left=3).endswith("forward_meters in [0, 3].")


@pytest.mark.parametrize(
    "sweep, views, line",
    [
        (0, 0, "Images: none."),
        (1, 0, "Images: image 1 is the start view."),
        (3, 0, "Images: images 1-3 are the start sweep, each turned 120 degrees left of the previous."),
        (7, 0, "Images: images 1-7 are the start sweep, each turned 51.4286 degrees left of the previous."),
        (0, 1, "Images: image 1 is your current view."),
        (0, 3, "Images: images 1-3 are your latest views, image 3 is the current one."),
        (
            2,
            1,
            "Images: images 1-2 are the start sweep, each turned 180 degrees left of the previous; image 3 is your "
            "current view.",
        ),
        (
            4,
            2,
            "Images: images 1-4 are the start sweep, each turned 90 degrees left of the previous; images 5-6 are your "
            "latest views, image 6 is the current one.",
        ),
    ],
)
def test_images_line_names_every_image(sweep, views, line):
    """The image numbering must match the order the env passes images in: sweep first, then views."""
    text = observation_text("Q?", None, "x", turns_left=2, num_sweep_frames=sweep, num_views=views)
    assert text.splitlines()[2] == line


def test_feedback_text_verbatim():
    assert feedback_text(None) == "none yet (this is the start)."
    assert (
        feedback_text(Invalid("bad"))
        == "invalid output (bad); the turn was used. Reply with one JSON object as instructed."
    )
    assert feedback_text(Answer("B")) == "answered 'B'."
    assert feedback_text(Move(0, 1.5), walked_m=1.5) == "did not turn and walked 1.50 m."
    assert feedback_text(Move(10, 1.0)) == "turned 10 degrees left and walked 0.00 m."  # default: walked nothing
    # Small turns are turns, and any positive one is to the left.
    assert feedback_text(Move(1, 1.0), walked_m=1.0) == "turned 1 degrees left and walked 1.00 m."
    assert feedback_text(Move(0.5, 1.0), walked_m=1.0) == "turned 0.5 degrees left and walked 1.00 m."
    assert feedback_text(Move(-45.5, 2.0), collided=True, walked_m=0.5) == (
        "turned 45.5 degrees right, walked 0.50 of 2 m and was blocked by an obstacle."
    )


def test_messages_verbatim():
    """The chat structure the processors' templates expect: one image entry per image, text last;
    blind mode says that no images are shown. The assistant turn of an SFT sample wraps the text."""
    obs = {"images": [np.zeros((2, 2, 3), np.uint8)] * 2, "text": "T"}
    system = {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}
    assert build_messages(obs) == [
        system,
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "T"}]},
    ]
    assert build_messages({"images": [], "text": "T"}) == [
        system,
        {"role": "user", "content": [{"type": "text", "text": "T"}]},
    ]
    assert build_messages(obs, blind=True) == [
        system,
        {"role": "user", "content": [{"type": "text", "text": "(No images are shown in this evaluation.)\nT"}]},
    ]
    assert assistant_message('{"a": 1}') == {"role": "assistant", "content": [{"type": "text", "text": '{"a": 1}'}]}


def test_format_response_numbers_and_errors():
    """Integral values print as ints below 1e15 in magnitude only (larger ones keep float notation,
    which round-trips), negative ones included; errors say what was wrong."""

    def rot(x):
        return json.loads(format_response("", Move(x, 0.0)))["action"]["rotation_angle_degrees"]

    assert (
        format_response("", Move(-30.0, 0.0))
        == '{"thoughts": "", "action": {"rotation_angle_degrees": -30, "forward_meters": 0}}'
    )
    assert [type(rot(x)) for x in (999_999_999_999_999.0, 1e15, -1e16)] == [int, float, float]
    assert '"rotation_angle_degrees": 1000000000000000.0,' in format_response("", Move(1e15, 0.0))
    with pytest.raises(TypeError) as err:
        format_response(3, Answer("B"))
    assert str(err.value) == "thoughts must be a string, got int"
    with pytest.raises(ValueError) as err:
        format_response("x", Move(1.0, float("inf")))
    assert str(err.value) == "cannot format a move with non-finite values: Move(rotation_deg=1.0, forward_m=inf)"
    with pytest.raises(TypeError) as err:
        format_response("x", Invalid("bad"))
    assert str(err.value) == "format_response needs a Move or Answer, got Invalid(reason='bad')"


_MALFORMED = "the JSON object is malformed: "
_MOVE_NEEDS = "a move needs exactly ['rotation_angle_degrees', 'forward_meters'] ({}); an answer needs 'answer'"


@pytest.mark.parametrize(
    "text, reason",
    [
        (None, "the output must be a string, got NoneType"),
        (42, "the output must be a string, got int"),
        (" \n", "the output is empty; reply with one JSON object"),
        ("move left", "no JSON object found; reply with one JSON object"),
        ("{", _MALFORMED + "the JSON object is truncated"),
        ("{}", "the object has no 'action'"),
        ("{ }", "the object has no 'action'"),
        (" {  x", _MALFORMED + "expected a quoted key at character 4"),
        ('{"a', _MALFORMED + "bad key: Unterminated string starting at"),
        ('{"\\q": 1}', _MALFORMED + "bad key: Invalid \\escape"),
        ('{"a"', _MALFORMED + "expected ':' after key 'a'"),
        ('{"a" 1}', _MALFORMED + "expected ':' after key 'a'"),
        ('{"a": tru}', _MALFORMED + "the value of 'a' is not valid JSON (Expecting value)"),
        ('{"a": 1', _MALFORMED + "the JSON object is truncated"),
        ('{"a": 1, ', _MALFORMED + "the JSON object is truncated"),
        ('{"a": 1 x', _MALFORMED + "expected ',' or '}' after the value of 'a'"),
        ('{"action": ' + "[" * 100000, _MALFORMED + "the value of 'action' is nested too deeply"),
        # A raw tab inside a key is read leniently, like one inside the thoughts (strict=False).
        ('{"action": {"answer": "B"}, "no\tte": 1}', "unexpected keys ['no\\tte']; use only 'thoughts' and 'action'"),
        ('{"z": 1, "action": {"answer": "B"}, "b": 2}', "unexpected keys ['b', 'z']; use only 'thoughts' and 'action'"),
        ('{"thoughts": ["a"], "action": {"answer": "B"}}', "'thoughts' must be a string"),
        ('{"action": "B"}', "'action' must be an object, got str"),
        (
            '{"action": {"answer": "B", "forward_meters": 1}}',
            "an answer action holds only 'answer'; got keys ['answer', 'forward_meters']",
        ),
        ('{"action": {}}', _MOVE_NEEDS.format("missing ['rotation_angle_degrees', 'forward_meters']")),
        ('{"action": {"forward_meters": 1}}', _MOVE_NEEDS.format("missing ['rotation_angle_degrees']")),
        (
            '{"action": {"rotation_angle_degrees": 1, "forward_meters": 1, "speed": 2}}',
            _MOVE_NEEDS.format("unexpected ['speed']"),
        ),
        (
            '{"action": {"turn": 1, "forward_meters": 1}}',
            _MOVE_NEEDS.format("missing ['rotation_angle_degrees'], unexpected ['turn']"),
        ),
        (
            '{"action": {"rotation_angle_degrees": "30", "forward_meters": 1}}',
            "rotation_angle_degrees must be a number, got str '30'",
        ),
        (
            '{"action": {"rotation_angle_degrees": 30, "forward_meters": null}}',
            "forward_meters must be a number, got NoneType None",
        ),
        (
            '{"action": {"rotation_angle_degrees": 181, "forward_meters": 1}}',
            "rotation_angle_degrees=181 is outside [-180, 180]",
        ),
        ('{"action": {"rotation_angle_degrees": 0, "forward_meters": 3.5}}', "forward_meters=3.5 is outside [0, 3]"),
        (
            '{"action": {"rotation_angle_degrees": NaN, "forward_meters": 1}}',
            "rotation_angle_degrees must be finite, got nan",
        ),
        (
            '{"action": {"rotation_angle_degrees": 0, "forward_meters": ' + "9" * 400 + "}}",
            "forward_meters is too large",
        ),
        ('{"action": {"answer": true}}', '\'answer\' must be a string such as "B" or "3.2", got True'),
        ('{"action": {"answer": {"a": 1}}}', "'answer' must be a string such as \"B\" or \"3.2\", got {'a': 1}"),
        ('{"action": {"answer": -Infinity}}', "'answer' must be finite, got -inf"),
        ('{"action": {"answer": " "}}', "'answer' is empty"),
    ],
)
def test_invalid_reasons_verbatim(text, reason):
    """The reason is shown to the agent next turn (:func:`feedback_text`): it must say exactly what
    was wrong."""
    assert parse_action(text) == Invalid(reason)


def test_too_many_digits_reason_quotes_pythons_message():
    """An integer longer than Python's int-string limit raises a plain ValueError (no ``msg``): the
    reason quotes its text, whatever this Python version says. The scan reads top-level members, so
    the reason names ``action``, the member whose value failed."""
    digits = "9" * 5000
    with pytest.raises(ValueError) as err:
        int(digits)
    text = '{"action": {"rotation_angle_degrees": ' + digits + ', "forward_meters": 1}}'
    assert parse_action(text) == Invalid(f"{_MALFORMED}the value of 'action' is not valid JSON ({err.value})")


@pytest.mark.parametrize("length, shown", [(40, None), (41, 37)])
def test_long_values_are_cut_to_forty_characters(length, shown):
    """A wrong-typed value is quoted in the reason up to 40 characters of its repr, longer ones cut
    to 37 plus "..." (a model can emit megabytes of junk; the feedback must stay short)."""
    value = "x" * (length - 2)  # repr adds the two quotes
    text = json.dumps({"action": {"rotation_angle_degrees": value, "forward_meters": 1}})
    r = repr(value)
    want = r if shown is None else r[:shown] + "..."
    assert parse_action(text) == Invalid(f"rotation_angle_degrees must be a number, got str {want}")
    assert parse_action(json.dumps({"action": {"answer": [value]}})).reason.endswith(f"got {repr([value])[:37]}...")


def test_parse_action_turns_an_internal_error_into_a_reason(monkeypatch):
    """The "never raises" contract holds even if the parser itself has a bug."""
    import a2c_ppo_acktr.common.prompts as prompts_mod

    def broken(text, max_forward):
        raise KeyError("boom")

    monkeypatch.setattr(prompts_mod, "_parse_action", broken)
    assert parse_action("{}") == Invalid("could not read the output (KeyError: 'boom')")


@pytest.mark.parametrize(
    "tail",
    [
        "",
        ", ",
        ", x",
        ', "action"',
        ', "action" 1',
        ', "\\q": 1',
        ', "action": tru',
        ', "action": ' + "[" * 100000,
        " x",
    ],
)
def test_spans_of_complete_members_survive_any_later_error(tail):
    """A response cut off or garbled after its thoughts keeps its thought span (its tokens still get
    the thought weight), whatever error stopped the scan."""
    text = '{"thoughts": "look left"' + tail
    t, a = response_spans(text)
    assert text[t[0] : t[1]] == '"look left"' and a is None


def test_empty_object_and_duplicate_keys():
    assert response_spans("{}") == (None, None) and response_spans("{") == (None, None)
    # A key given twice is invalid (a move then an answer must not become either); the span is the first's.
    text = '{"action": {"answer": "A"}, "action": {"answer": "B"}}'
    result = parse_action(text)
    assert isinstance(result, Invalid) and "'action' appears twice" in result.reason
    _, a = response_spans(text)
    assert text[a[0] : a[1]] == '{"answer": "A"}'
    nested = parse_action('{"action": {"answer": "A", "answer": "B"}}')
    assert isinstance(nested, Invalid) and "has the key 'answer' twice" in nested.reason


def test_decided_cases_braces_in_reasoning_second_objects_fullwidth_and_bounds():
    ans = '{"thoughts": "t", "action": {"answer": "C"}}'
    assert parse_action("I think {the sofa} is left. " + ans) == Answer("C")
    assert parse_action('<think>maybe {"action": {"answer": "A"}}</think>' + ans) == Answer("C")
    t, a = response_spans("I think {the sofa}. " + ans)
    assert ("I think {the sofa}. " + ans)[a[0] : a[1]] == '{"answer": "C"}'
    # doubled braces (a template escape the model copied): the stray outer brace is preamble
    assert parse_action('{{"thoughts": "a", "action": {"answer": "B"}}}') == Answer("B")
    move = '{"thoughts": "t", "action": {"rotation_angle_degrees": 10, "forward_meters": 1}}'
    assert parse_action(move + " " + ans) == Move(10.0, 1.0)  # the first complete object wins
    full = parse_action('\uff5b"thoughts": "t", "action": {"answer": "A"}\uff5d')
    assert isinstance(full, Invalid) and "full-width braces" in full.reason
    near = '{"thoughts": "t", "action": {"rotation_angle_degrees": 0, "forward_meters": %s}}'
    assert parse_action(near % "3.0000001", max_forward=3.0) == Move(0.0, 3.0)
    assert parse_action(near % "-0.0000001", max_forward=3.0) == Move(0.0, 0.0)
    far = parse_action(near % "3.001", max_forward=3.0)
    assert isinstance(far, Invalid) and "forward_meters=3.001 is outside [0, 3]" in far.reason


def test_png_data_urls_round_trip_and_encode_a_repeated_frame_once(monkeypatch):
    """A frame's data URL decodes to its pixels; the same pixels (another array, same content) reuse the
    encoding; other pixels get their own; the cache keeps only the most recent PNG_CACHE_SIZE frames."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    from a2c_ppo_acktr.common import prompts

    monkeypatch.setattr(prompts, "_png_cache", type(prompts._png_cache)())
    monkeypatch.setattr(prompts, "PNG_CACHE_SIZE", 3)
    encoded = []
    real = prompts._encode_png
    monkeypatch.setattr(prompts, "_encode_png", lambda arr: encoded.append(arr.copy()) or real(arr))
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(5)]
    url = prompts.png_data_url(frames[0])
    back = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
    assert np.array_equal(back, frames[0])
    assert prompts.png_data_url(frames[0].copy()) == url and len(encoded) == 1
    assert prompts.png_data_url(frames[0][:, ::-1]) != url and len(encoded) == 2  # a view with other pixels
    for f in frames[1:4]:
        prompts.png_data_url(f)
    assert len(encoded) == 5 and len(prompts._png_cache) == 3
    prompts.png_data_url(frames[0])  # pushed out by the three after it: encoded again
    assert len(encoded) == 6
    with pytest.raises(ValueError, match="uint8 HxWx3"):
        prompts.png_data_url(frames[0].astype(np.float32))


def test_png_data_urls_from_many_threads_are_each_frames_own():
    """The teacher encodes frames from its request threads: every thread gets its own frame's URL."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from a2c_ppo_acktr.common import prompts

    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (4, 4, 3), dtype=np.uint8) for _ in range(prompts.PNG_CACHE_SIZE + 40)]
    want = [prompts._encode_png(f) for f in frames]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(prompts.png_data_url, frames * 3))
    assert got == want * 3 and len(prompts._png_cache) <= prompts.PNG_CACHE_SIZE

"""The prompt/answer format: parse_action never raises and reads canonical responses back exactly."""
import json
import string

import numpy as np
import pytest

from a2c_ppo_acktr.prompts import (
    SYSTEM_PROMPT,
    Answer,
    Invalid,
    Move,
    build_messages,
    feedback_text,
    format_response,
    observation_text,
    parse_action,
    render_prompt,
    response_spans,
)

RNG_SEED = 1234
ALPHABET = string.printable + "{}[]\":,{}\"\"é中😀\u2028\\"


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
        assert json.loads(text[t_span[0]:t_span[1]]) == thoughts
        act_obj = json.loads(text[a_span[0]:a_span[1]])
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
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": ' + "9" * 400 + ', "forward_meters": 1}}', "too large"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": ' + "9" * 5000 + ', "forward_meters": 1}}', "not valid JSON"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 181, "forward_meters": 1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": -180.5, "forward_meters": 1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 0, "forward_meters": -0.1}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 0, "forward_meters": 3.01}}', "outside"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": "30", "forward_meters": 1}}', "must be a number"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": true, "forward_meters": 1}}', "must be a number"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 30}}', "missing"),
        ('{"thoughts": "a", "action": {"rotation_angle_degrees": 30, "forward_meters": 1, "answer": "B"}}', "only 'answer'"),
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
        ('{{"thoughts": "a", "action": {"answer": "B"}}}', "malformed"),
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
    assert parse_action('{"thoughts":"x","action":{"rotation_angle_degrees":-180,"forward_meters":0}}') == Move(-180.0, 0.0)
    assert parse_action('{"thoughts": "x", "action": {"rotation_angle_degrees": 0, "forward_meters": 5}}', max_forward=5.0) == Move(0.0, 5.0)
    # Trailing text after the first object is ignored, even another object.
    assert parse_action('{"action": {"answer": "A"}} {"action": {"answer": "B"}}') == Answer("A")
    assert isinstance(parse_action(None), Invalid)  # type: ignore[arg-type]
    # A raw newline inside the thoughts string is tolerated (models write them); spans still cover it.
    text = '{"thoughts": "line one\nline two", "action": {"answer": "C"}}'
    assert "\n" in text and parse_action(text) == Answer("C")
    t, a = response_spans(text)
    assert text[t[0]:t[1]] == '"line one\nline two"' and text[a[0]:a[1]] == '{"answer": "C"}'


def test_response_spans_hand_made():
    text = 'ok {"thoughts": "go {left}", "action": {"answer": "B"}} tail'
    t, a = response_spans(text)
    assert text[t[0]:t[1]] == '"go {left}"'
    assert text[a[0]:a[1]] == '{"answer": "B"}'
    # Action first, escapes and unicode inside the thoughts, extra whitespace.
    text = '{ "action" :{"rotation_angle_degrees":10,"forward_meters":1} ,\n "thoughts" : "a \\"q\\" é" }'
    t, a = response_spans(text)
    assert text[t[0]:t[1]] == '"a \\"q\\" é"'
    assert text[a[0]:a[1]] == '{"rotation_angle_degrees":10,"forward_meters":1}'
    # Truncated after the thoughts: the thoughts span survives, the action is None.
    text = '{"thoughts": "look", "action": {"rotation_angle'
    t, a = response_spans(text)
    assert text[t[0]:t[1]] == '"look"' and a is None
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

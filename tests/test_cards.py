"""The gym-cards games: check_env, seeded determinism, the reply parser, rewards against hand-worked
cases, and the oracle teachers' figures (NumberLine 100%, blackjack basic strategy near its exact
value, the formula solvers complete)."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from fractions import Fraction
from functools import lru_cache

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from a2c_ppo_acktr.envs import cards
from a2c_ppo_acktr.envs.cards.blackjack import BlackjackEnv, basic_strategy, hand_total, settle, usable_ace
from a2c_ppo_acktr.envs.cards.common import format_reply, parse_reply
from a2c_ppo_acktr.envs.cards.ezpoints import EZPointsEnv
from a2c_ppo_acktr.envs.cards.formula import BLANK, evaluate, is_solvable, solutions
from a2c_ppo_acktr.envs.cards.numberline import NumberLineEnv
from a2c_ppo_acktr.envs.cards.points24 import Points24Env
from a2c_ppo_acktr.common.prompts import Invalid
from game_helpers import act, run_oracle, same_trace, trace

cards.register()


# ---------------------------------------------------------------------------------------------
# Every id: check_env and seeded determinism
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", cards.ENV_IDS)
def test_check_env_is_clean(env_id):
    for render_mode in (None, "rgb_array"):
        env = gym.make(env_id, render_mode=render_mode).unwrapped
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=render_mode is None)
        assert [str(w.message) for w in caught] == []


def test_registration_is_idempotent_and_makes_without_warnings():
    cards.register()
    for env_id in cards.ENV_IDS:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. a bare "Blackjack-v0" would be "out of date"
            env = gym.make(env_id)
        assert env.unwrapped.spec.id == env_id


SCRIPT = [
    act("+"),
    "garbage",
    act("-"),
    act("hit"),
    act("stand"),
    act("10"),
    act("*"),
    act("2"),
    act("="),
    act("("),
    '{"action": 3}',
]


def _trace(env_id, seed, steps=24):
    return trace(gym.make(env_id), seed, lambda k: SCRIPT[k % len(SCRIPT)], steps)


@pytest.mark.parametrize("env_id", cards.ENV_IDS)
def test_seeded_determinism(env_id):
    assert same_trace(_trace(env_id, 7), _trace(env_id, 7))
    assert not all(same_trace(_trace(env_id, 7, 2), _trace(env_id, s, 2)) for s in range(8, 12)), (
        "the seed changes nothing"
    )


# ---------------------------------------------------------------------------------------------
# The reply format
# ---------------------------------------------------------------------------------------------
VOCAB = ("1", "10", "+", "stand", "hit")


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"thoughts": "t", "action": "hit"}', "hit"),
        ('{"action": " Hit "}', "hit"),
        ('{"action": 10}', "10"),
        ('{"action": 10.0}', "10"),
        ('```json\n{"thoughts": "a {brace}", "action": "+"}\n```', "+"),
        ('<think>{"action": "stand"}</think> {"thoughts": "x", "action": "1"}', "1"),
        ('I think {maybe} then {"action": "stand"} and {"action": "hit"}', "stand"),
    ],
)
def test_parse_reply_reads_the_token(text, expected):
    assert parse_reply(text, VOCAB) == expected


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("hit", "no JSON object"),
        ('{"action": "hit"', "truncated"),
        ('{"action": "hit", "action": "stand"}', "twice"),
        ('{"thoughts": "t", "action": "hit", "cards": [1]}', "unexpected keys"),
        ('{"thoughts": 3, "action": "hit"}', "'thoughts' must be a string"),
        ('{"thoughts": "t"}', "no 'action'"),
        ('{"action": "double"}', "is not an action"),
        ('{"action": "hit or stand"}', "is not an action"),
        ('{"action": ["hit"]}', "as a string"),
        ('{"action": true}', "as a string"),
        ('{"action": 1.5}', "must be one of"),
        ('\uff5b"action": "hit"\uff5d', "full-width"),
    ],
)
def test_parse_reply_gives_a_reason(text, reason):
    parsed = parse_reply(text, VOCAB)
    assert isinstance(parsed, Invalid) and reason in parsed.reason, parsed


def test_parse_reply_never_raises():
    rng = np.random.default_rng(0)
    alphabet = list('{}[]":,\\ actionhit0123456789-+.eE\n\uff5b')
    for _ in range(2000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        assert isinstance(parse_reply(text, VOCAB), (str, Invalid))
    for weird in (None, 3, b'{"action": "hit"}', ["hit"], "{" * 5000 + "}" * 5000):
        assert isinstance(parse_reply(weird, VOCAB), Invalid)


def test_format_reply_round_trips():
    for token in VOCAB:
        text = format_reply('say "hi"\n', token)
        assert parse_reply(text, VOCAB) == token and json.loads(text) == {"thoughts": 'say "hi"\n', "action": token}


@pytest.mark.parametrize("env_id", cards.ENV_IDS)
def test_invalid_reply_costs_the_penalty_uses_the_turn_and_says_why(env_id):
    env = gym.make(env_id, invalid_penalty=-0.25, render_mode="rgb_array").unwrapped
    env.reset(seed=3)
    before = (None, env.render())
    obs, reward, terminated, truncated, info = env.step('{"thoughts": "x", "action": "fold"}')
    assert reward == -0.25 and not terminated and not truncated
    assert info["valid"] is False and isinstance(info["action"], Invalid) and info["turn"] == 1
    assert "invalid reply ('fold' is not an action" in obs["text"]
    assert np.array_equal(obs["images"][0], before[1]), "an invalid reply changed the game"


def test_invalid_replies_end_in_truncation_at_max_turns():
    env = BlackjackEnv(max_turns=3)
    env.reset(seed=0)
    results = [env.step("nothing")[2:4] for _ in range(3)]
    assert results == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(act("hit"))


def test_config_errors_say_the_fix():
    with pytest.raises(TypeError, match="unknown NumberLineConfig fields"):
        NumberLineEnv(max_pos=3)
    with pytest.raises(ValueError, match="max_position=1 must be >= 2"):
        NumberLineEnv(max_position=1)
    with pytest.raises(ValueError, match="image_size=32 is too small"):
        BlackjackEnv(image_size=32)


# ---------------------------------------------------------------------------------------------
# NumberLine
# ---------------------------------------------------------------------------------------------
def test_numberline_rewards_hand_worked():
    env = NumberLineEnv()
    env.reset(options={"start": 2, "target": 4})
    steps = [env.step(act(t))[1:4] for t in ("-", "+", "+", "+")]
    # wrong way: -1; back to 2: distance shrank, 0; 3: 0; 4: reached, +1 and terminated
    assert steps == [(-1.0, False, False), (0.0, False, False), (0.0, False, False), (1.0, True, False)]
    env.reset(options={"start": 0, "target": 3})
    assert env.step(act("-"))[1] == -1.0 and env.position == 0  # blocked at the end of the line: -1


def test_numberline_truncates_after_twice_max_position_turns():
    env = NumberLineEnv(max_position=3)
    env.reset(options={"start": 0, "target": 3})
    ends = [env.step(act("-"))[2:4] for _ in range(6)]
    assert ends[:5] == [(False, False)] * 5 and ends[5] == (False, True)


def test_numberline_deals_like_the_original():
    env = NumberLineEnv()
    pairs = set()
    for seed in range(300):
        _, info = env.reset(seed=seed)
        assert info["current"] != info["target"] and 0 <= info["current"] <= 5 and 0 <= info["target"] <= 5
        pairs.add((info["current"], info["target"]))
    assert len(pairs) == 30  # every ordered pair of different numbers occurs


def test_numberline_oracle_always_succeeds_by_the_shortest_path():
    env = NumberLineEnv()
    for seed in range(200):
        env.reset(seed=seed)
        distance = abs(env.start - env.target)
        rewards, terminated, _, info = run_oracle(env, seed)
        assert terminated and info["success"] and len(rewards) == distance and sum(rewards) == 1.0


def test_numberline_draws_both_numbers():
    env = NumberLineEnv()
    a = env.reset(options={"start": 1, "target": 4})[0]["images"][0]
    b = env.reset(options={"start": 2, "target": 4})[0]["images"][0]
    c = env.reset(options={"start": 1, "target": 3})[0]["images"][0]
    assert a.shape == (300, 300, 3) and (a < 128).any()
    rows_differ = lambda x, y: np.flatnonzero((x != y).any(axis=(1, 2)))  # noqa: E731
    assert rows_differ(a, b).min() > 150 and rows_differ(a, c).max() < 150  # "Current" below, "Target" above


# ---------------------------------------------------------------------------------------------
# Blackjack
# ---------------------------------------------------------------------------------------------
def test_blackjack_settlement_hand_worked():
    assert settle([10, 9], [10, 7]) == 1.0
    assert settle([10, 7], [10, 7]) == 0.0
    assert settle([10, 6], [10, 7]) == -1.0
    assert settle([10, 6], [10, 5, 10]) == 1.0  # dealer bust
    assert settle([1, 10], [10, 5, 6]) == 0.0  # a natural is a plain 21 by default
    assert settle([1, 10], [10, 7], natural=True) == 1.5
    assert settle([1, 10], [10, 5, 6], sab=True) == 1.0
    assert (
        hand_total([1, 6]) == 17 and usable_ace([1, 6]) and hand_total([1, 6, 10]) == 17 and not usable_ace([1, 6, 10])
    )


def test_blackjack_hit_busts_or_continues_and_stand_settles():
    env = BlackjackEnv()
    for seed in range(200):
        env.reset(seed=seed)
        _, reward, terminated, _, _ = env.step(act("hit"))
        bust = hand_total(env.player_values) > 21
        assert (reward, terminated) == ((-1.0, True) if bust else (0.0, False))
        if not terminated:
            _, reward, terminated, _, info = env.step(act("stand"))
            assert terminated and hand_total(env.dealer_values) >= 17
            assert reward == settle(env.player_values, env.dealer_values) and info["success"] == (reward > 0)


def test_blackjack_dealer_stands_on_soft_17_and_draws_on_16():
    env = BlackjackEnv()
    env.reset(options={"player": [(10, "K", "S"), (9, "9", "H")], "dealer": [(1, "A", "D"), (6, "6", "C")]})
    assert env.step(act("stand"))[1] == 1.0 and len(env.dealer) == 2  # soft 17: no draw; 19 beats 17
    env.reset(seed=1, options={"player": [(10, "K", "S"), (9, "9", "H")], "dealer": [(10, "Q", "D"), (6, "6", "C")]})
    env.step(act("stand"))
    assert len(env.dealer) >= 3


P_CARD = {v: Fraction(4 if v == 10 else 1, 13) for v in range(1, 11)}


def _value(hard: int, ace: bool) -> int:
    return hard + 10 if ace and hard + 10 <= 21 else hard


@lru_cache(maxsize=None)
def _dealer_final(hard: int, ace: bool) -> dict:
    """Dealer's final total distribution (22 = bust), drawing to 17 and standing on soft 17."""
    v = _value(hard, ace)
    if v > 21:
        return {22: Fraction(1)}
    if v >= 17:
        return {v: Fraction(1)}
    out: dict = {}
    for c, p in P_CARD.items():
        for k, q in _dealer_final(hard + c, ace or c == 1).items():
            out[k] = out.get(k, 0) + p * q
    return out


def _dealer_from_up(up: int) -> dict:
    out: dict = {}
    for c, p in P_CARD.items():
        for k, q in _dealer_final(up + c, up == 1 or c == 1).items():
            out[k] = out.get(k, 0) + p * q
    return out


@lru_cache(maxsize=None)
def _optimal(hard: int, ace: bool, up: int) -> tuple[Fraction, str]:
    """Exact optimal expected return and action of a hit/stand player (independent of the env code)."""
    v = _value(hard, ace)
    if v > 21:
        return Fraction(-1), "bust"
    stand = sum((q if (k == 22 or v > k) else -q if v < k else 0) for k, q in _dealer_from_up(up).items())
    hit = sum(p * _optimal(hard + c, ace or c == 1, up)[0] for c, p in P_CARD.items())
    return (stand, "stand") if stand >= hit else (hit, "hit")


def _outcome_probabilities() -> tuple[float, float, float]:
    """Exact (win, draw, loss) probabilities of the optimal player from the deal."""

    @lru_cache(maxsize=None)
    def wdl(hard, ace, up):
        v = _value(hard, ace)
        if v > 21:
            return (Fraction(0), Fraction(0), Fraction(1))
        if _optimal(hard, ace, up)[1] == "stand":
            d = _dealer_from_up(up)
            return (
                sum(q for k, q in d.items() if k == 22 or v > k),
                sum(q for k, q in d.items() if k == v),
                sum(q for k, q in d.items() if k != 22 and v < k),
            )
        parts = [tuple(p * x for x in wdl(hard + c, ace or c == 1, up)) for c, p in P_CARD.items()]
        return tuple(sum(col) for col in zip(*parts))

    total = [Fraction(0)] * 3
    for (up, pu), (c1, p1), (c2, p2) in itertools.product(P_CARD.items(), repeat=3):
        for i, x in enumerate(wdl(c1 + c2, c1 == 1 or c2 == 1, up)):
            total[i] += pu * p1 * p2 * x
    return tuple(float(x) for x in total)


def test_blackjack_basic_strategy_is_the_optimal_hit_stand_policy_of_these_rules():
    checked = 0
    for up in range(1, 11):
        for hard in range(2, 22):
            for ace in (False, True):
                v = _value(hard, ace)
                if v > 21 or (hard == 2 and not ace):
                    continue
                soft = ace and hard + 10 <= 21
                assert basic_strategy(v, soft, up) == _optimal(hard, ace, up)[1], (v, soft, up)
                checked += 1
    assert checked > 250


def test_blackjack_oracle_win_rate_matches_the_exact_value():
    win, draw, loss = _outcome_probabilities()
    # exact for these rules (infinite deck, dealer stands on soft 17, natural pays 1, hit/stand only)
    assert (round(win, 4), round(draw, 4), round(loss, 4)) == (0.4295, 0.0945, 0.4760)
    env = BlackjackEnv(image_size=64)
    hands, wins, total = 6000, 0, 0.0
    for seed in range(hands):
        rewards, terminated, _, info = run_oracle(env, seed)
        assert terminated
        wins += info["success"]
        total += sum(rewards)
    sd = math.sqrt(win * (1 - win) / hands)
    assert abs(wins / hands - win) < 4 * sd, (wins / hands, win, 4 * sd)  # 4 sd: 0.026 at 6000 hands
    assert abs(total / hands - (win - loss)) < 4 * math.sqrt(0.9 / hands)  # return variance < 0.9


def test_blackjack_draws_dealer_face_up_and_one_more_card_per_hit():
    env = BlackjackEnv()
    obs, _ = env.reset(options={"player": [(2, "2", "H"), (3, "3", "S")], "dealer": [(1, "A", "D"), (10, "K", "C")]})
    before = obs["images"][0]
    obs, *_ = env.step(act("hit"))
    after = obs["images"][0]
    changed = np.flatnonzero((before != after).any(axis=(0, 2)))
    assert changed.min() >= 5 + 2 * 74 and np.array_equal(
        before[:130], after[:130]
    )  # third player card, dealer untouched


# ---------------------------------------------------------------------------------------------
# Formulas: evaluation, EZPoints, Points24
# ---------------------------------------------------------------------------------------------
def test_evaluate_is_exact_arithmetic():
    assert evaluate(["8", "/", "(", "3", "-", "8", "/", "3", ")"]).value == 24  # Python's eval gives 23.99999999999999
    assert evaluate(["(", "3", "+", "5", ")", "*", "3"]).value == 24
    assert evaluate(["2", BLANK, "*", "6"]).value == 12
    for units, reason in [
        (["2", "4"], "cannot follow"),
        (["2", "*", "*", "3"], "where a number"),
        (["-", "2"], "where a number"),
        (["(", "2"], "not closed"),
        (["1", "/", "(", "2", "-", "2", ")"], "divides by zero"),
        ([], "empty"),
    ]:
        value, error = evaluate(units)
        assert value is None and reason in error, (units, error)


def test_ezpoints_rewards_hand_worked():
    env = EZPointsEnv()
    env.reset(options={"cards": [(2, "H"), (6, "S")]})
    assert [env.step(act(u))[1:4] for u in ("2", "*", "6", "=")] == [(0.0, False, False)] * 3 + [(10.0, True, False)]
    env.reset(options={"cards": [(2, "H"), (6, "S")]})
    assert [env.step(act(u))[1] for u in ("2", "+", "6", "=")] == [0.0, 0.0, 0.0, -1.0]  # 8, not 12
    env.reset(options={"cards": [(2, "H"), (12, "S")]})  # the queen counts 10
    assert env.numbers == [2, 10]
    assert [env.step(act(u))[1] for u in ("7", "2", "2")] == [-1.0, 0.0, -1.0]  # 7 not dealt; 2 used twice
    assert env.formula == [BLANK, "2", BLANK]
    assert env.step(act("="))[1:3] == (-1.0, True)  # 10 unused


def test_ezpoints_formula_length_limit_truncates():
    env = EZPointsEnv()
    env.reset(options={"cards": [(2, "H"), (6, "S")]})
    for _ in range(6):
        assert env.step(act("+"))[1:4] == (0.0, False, False)
    assert env.step(act("+"))[1:4] == (-1.0, False, True)  # 6 units > 5: the turn ends the episode unapplied
    assert len(env.formula) == 6


def test_ezpoints_deals_solvable_pairs_like_the_original():
    env = EZPointsEnv()
    ranks = set()
    for seed in range(300):
        _, info = env.reset(seed=seed)
        a, b = info["numbers"]
        assert (a + b == 12 or a * b == 12) and info["solvable"]
        ranks.update(env.ranks)
    assert ranks == set(range(2, 14))  # never an ace; J, Q, K dealt (as 10)


def test_ezpoints_oracle_always_wins():
    env = EZPointsEnv()
    for seed in range(150):
        rewards, terminated, _, info = run_oracle(env, seed)
        assert terminated and info["success"] and rewards[-1] == 10.0 and len(rewards) == 4


def test_points24_rewards_hand_worked():
    env = Points24Env()
    env.reset(options={"cards": [(8, "H"), (3, "S"), (8, "D"), (3, "C")]})
    units = ["8", "/", "(", "3", "-", "8", "/", "3", ")", "="]
    assert [env.step(act(u))[1] for u in units] == [0.0] * 9 + [10.0]
    env.reset(options={"cards": [(2, "H"), (4, "S"), (1, "D"), (1, "C")]})
    # the original's eval reads "2", "4" as 24; here two numbers side by side are no formula
    assert [env.step(act(u))[1] for u in ("2", "4", "*", "1", "*", "1", "=")][-1] == -1.0


def test_points24_unsolvable_hand_is_reported_and_the_oracle_submits():
    env = Points24Env()
    _, info = env.reset(options={"cards": [(1, "H"), (1, "S"), (1, "D"), (1, "C")]})
    assert info["solvable"] is False
    reply = env.oracle_reply()
    assert parse_reply(reply, env.vocabulary) == "=" and "No formula" in reply
    assert env.step(reply)[1:3] == (-1.0, True)


def test_points24_solvability_matches_an_independent_float_search_on_every_hand():
    def can(nums):  # the classic search: combine two numbers at a time, floats with a tolerance
        if len(nums) == 1:
            return abs(nums[0] - 24) < 1e-9
        for i, j in itertools.permutations(range(len(nums)), 2):
            a, b, rest = nums[i], nums[j], [nums[k] for k in range(len(nums)) if k not in (i, j)]
            if any(can(rest + [v]) for v in (a + b, a - b, a * b) + ((a / b,) if b else ())):
                return True
        return False

    hands = list(itertools.combinations_with_replacement(range(1, 11), 4))
    mine = [is_solvable(h, 24, "+-*/") for h in hands]
    assert mine == [can(list(map(float, h))) for h in hands]
    assert sum(mine) == 566  # of 715 hands of 1..10; with 1..13 it is the well-known 1362 of 1820
    for h in hands[::40]:  # the full solver agrees with the fast check
        assert bool(solutions(h, 24, "+-*/")) == is_solvable(h, 24, "+-*/")


def test_points24_oracle_reaches_24_whenever_a_solution_exists():
    env = Points24Env()
    solvable = 0
    for seed in range(120):
        rewards, terminated, _, info = run_oracle(env, seed)
        assert terminated
        if info["solvable"]:
            solvable += 1
            assert info["success"] and rewards[-1] == 10.0 and all(r == 0.0 for r in rewards[:-1])
        else:
            assert rewards == [-1.0]
    assert 60 < solvable < 120


def test_points24_face_cards_option_and_only_solvable():
    env = Points24Env(treat_face_cards_as_10=False, only_solvable=True)
    assert env.vocabulary[:13] == tuple(str(n) for n in range(1, 14))
    assert "'K' as '13'" in env.reset(seed=0)[0]["text"]
    for seed in range(20):
        _, info = env.reset(seed=seed)
        assert info["solvable"] and all(1 <= n <= 13 for n in info["numbers"])
    env.reset(options={"cards": [(13, "H"), (11, "S"), (1, "D"), (1, "C")]})
    assert env.numbers == [13, 11, 1, 1] and env.step(act("13"))[1] == 0.0

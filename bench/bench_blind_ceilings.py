"""Blind ceilings: the best success a policy can reach from the observation TEXT alone (no image).

A game's text (``TokenGameEnv._observation``) is its prompt plus one "Last turn:" line; MiniGrid's
prompt also shows "Turns left: N" (a clock), EZPoints' the formula typed so far (blanks left out).
A blind policy is therefore a table ``(visible text) -> action``; this script searches those tables
exactly (every start state, exact weights) and then replays the best one in the real env, reading
only ``obs["text"]``, over many seeded episodes.

MiniGrid Empty-Random-NxN: the goal is always the bottom-right interior cell; the agent starts on a
uniform free cell facing a uniform direction. What a blind agent can sense through the feedback:
``move forward`` (moved / a wall is in the way / onto the goal, which ends the episode), and the
no-op probes ``pick up`` / ``toggle`` (front cell empty / a wall / the goal). ``drop`` / ``done``
sense nothing (a wait). Two blind classes are searched:

* ``clock``: ``(turns left, last feedback) -> action``, what the prompt actually carries (the
  feedback names the last action and its outcome); searched by coordinate ascent with restarts;
* ``memory``: any function of the whole action/feedback history (an upper bound for a policy that
  could remember, e.g. a prompt with history); exact belief-state dynamic programming.

EZPoints: ``(formula text, last feedback) -> unit``, searched exhaustively over the reachable
tables (coordinate ascent with restarts; exact over the 7 hands' weights), and the full-memory bound.

    .venv/bin/python bench/bench_blind_ceilings.py [--episodes 1000] [--caps 8 10 12 14 20]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import sys
from collections import Counter
from fractions import Fraction

DIRS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid agent_dir 0..3
# Blind-distinct action classes: toggle senses what pick up senses, done/drop sense nothing.
MG_ACTIONS = ("turn left", "turn right", "move forward", "pick up", "drop")


# ----------------------------------------------------------------------------------- MiniGrid model
def mg_states(size: int) -> list[tuple[int, int, int]]:
    goal = (size - 2, size - 2)
    return [(x, y, d) for x in range(1, size - 1) for y in range(1, size - 1) for d in range(4) if (x, y) != goal]


def mg_step(size: int, s: tuple[int, int, int], a: str) -> tuple[tuple[int, int, int], str, bool]:
    """(next state, feedback class, success)."""
    x, y, d = s
    if a == "turn left":
        return (x, y, (d - 1) % 4), "L", False
    if a == "turn right":
        return (x, y, (d + 1) % 4), "R", False
    fx, fy = x + DIRS[d][0], y + DIRS[d][1]
    wall = not (1 <= fx <= size - 2 and 1 <= fy <= size - 2)
    goal = (fx, fy) == (size - 2, size - 2)
    if a == "move forward":
        if wall:
            return s, "Fw", False
        return (fx, fy, d), "Fm", goal
    if a == "pick up":
        return s, "Pw" if wall else ("Pg" if goal else "Pe"), False
    return s, "W", False


MG_OBS = ("start", "L", "R", "Fm", "Fw", "Pe", "Pw", "Pg", "W")


def mg_eval_clock(size: int, cap: int, table: dict) -> float:
    states = mg_states(size)
    wins = 0
    for s in states:
        o = "start"
        for t in range(cap):
            s, o, ok = mg_step(size, s, table[(t, o)])
            if ok:
                wins += 1
                break
    return wins / len(states)


def mg_search_clock(size: int, cap: int, restarts: int, seed: int = 0) -> tuple[float, dict]:
    """Coordinate ascent over ``(t, feedback) -> action`` tables from random and heuristic starts."""
    rng = random.Random(seed)
    keys = [(t, o) for t in range(cap) for o in MG_OBS]
    best, best_table = -1.0, None
    starts = [_mg_heuristic(cap)] + [None] * restarts
    for init in starts:
        table = dict(init) if init else {k: rng.choice(MG_ACTIONS) for k in keys}
        score = mg_eval_clock(size, cap, table)
        improved = True
        while improved:
            improved = False
            order = keys[:]
            rng.shuffle(order)
            for k in order:
                keep = table[k]
                for a in MG_ACTIONS:
                    if a == keep:
                        continue
                    table[k] = a
                    v = mg_eval_clock(size, cap, table)
                    if v > score + 1e-12:
                        score, keep, improved = v, a, True
                table[k] = keep
        if score > best:
            best, best_table = score, dict(table)
    return best, best_table


def _mg_heuristic(cap: int) -> dict:
    """Wall following: forward until a bump, then turn right (a reasonable hand-written start)."""
    table = {}
    for t in range(cap):
        for o in MG_OBS:
            table[(t, o)] = "turn right" if o == "Fw" else "move forward"
    return table


def mg_memory_bound(size: int, cap: int) -> float:
    """The best blind success with full memory of actions and feedback: belief-state DP."""
    states = mg_states(size)

    @functools.cache
    def value(t: int, belief: tuple) -> int:
        if t == cap or not belief:
            return 0
        best = 0
        for a in MG_ACTIONS[:4]:  # waiting never helps with memory
            parts: dict[str, Counter] = {}
            wins = 0
            for s, n in belief:
                s2, o, ok = mg_step(size, s, a)
                if ok:
                    wins += n
                else:
                    parts.setdefault(o, Counter())[s2] += n
            v = wins + sum(value(t + 1, tuple(sorted(c.items()))) for c in parts.values())
            best = max(best, v)
        return best

    return value(0, tuple(sorted(Counter(states).items()))) / len(states)


def mg_oracle_lengths(size: int) -> Counter:
    """Shortest sighted solution length (turns) from every start state (BFS in (x, y, d))."""
    out = Counter()
    for s0 in mg_states(size):
        frontier, seen, depth = [s0], {s0}, 0
        done = False
        while frontier and not done:
            depth += 1
            nxt = []
            for s in frontier:
                for a in MG_ACTIONS[:3]:
                    s2, _, ok = mg_step(size, s, a)
                    if ok:
                        done = True
                        break
                    if s2 not in seen:
                        seen.add(s2)
                        nxt.append(s2)
                if done:
                    break
            frontier = nxt
        out[depth] += 1
    return out


_MG_FEEDBACK = (
    ("you turned left", "L"),
    ("you turned right", "R"),
    ("you moved forward", "Fm"),
    ("you could not move forward", "Fw"),
    ("cell in front of you is empty", "Pe"),
    ("pick up a wall", "Pw"),
    ("pick up the goal", "Pg"),
    ("you carry nothing to drop", "W"),
    ("none yet", "start"),
)


def mg_replay(minigrid_id: str, cap: int, table: dict, episodes: int, seed0: int = 10_000) -> float:
    """The table played in the real env, reading only the observation text."""
    from a2c_ppo_acktr.envs.minigrid_text import MiniGridTextEnv

    env = MiniGridTextEnv(minigrid_id=minigrid_id, image_size=64, view="full", max_turns=cap)
    wins = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed0 + ep)
        while True:
            text = obs["text"]
            left = int(re.search(r"Turns left: (\d+)\.", text).group(1))
            last = text.rsplit("Last turn: ", 1)[1]
            o = next(c for key, c in _MG_FEEDBACK if key in last)
            action = table[(cap - left, o)]
            obs, _, term, trunc, info = env.step(json.dumps({"thoughts": "", "action": action}))
            if term or trunc:
                wins += bool(info["success"])
                break
    return wins / episodes


# ----------------------------------------------------------------------------------- EZPoints model
@functools.cache
def ez_hands() -> dict[tuple[int, int], Fraction]:
    """The dealt multisets of card numbers and their exact probabilities (``EZPointsEnv._deal_cards``)."""
    out: Counter = Counter()
    for rank in range(2, 14):
        first = min(rank, 10)
        p = Fraction(1, 12)
        if first in (1, 2, 3, 4, 6):
            out[tuple(sorted((first, 12 // first)))] += p / 2
            out[tuple(sorted((first, 12 - first)))] += p / 2
        else:
            out[tuple(sorted((first, 12 - first)))] += p
    return dict(out)


EZ_UNITS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "+", "*", "=")


def ez_play(hand: tuple[int, int], policy, cap: int = 10) -> bool:
    """One hand under ``policy(formula_text, last_feedback_class) -> unit``, with the env's rules."""
    from a2c_ppo_acktr.envs.cards.formula import BLANK, evaluate

    formula: list[str] = []
    used: list[int] = []
    last = "start"
    for _ in range(cap):
        if len(formula) > 5:
            return False
        text = " ".join(u for u in formula if u != BLANK)
        unit = policy(text, last)
        if unit is None:
            return False
        if unit.isdigit():
            n = int(unit)
            if used.count(n) >= hand.count(n):
                formula.append(BLANK)
                last = f"bad {unit}"
                continue
            used.append(n)
        if unit == "=":
            value, err = evaluate(formula)
            return err is None and value == 12 and len(used) == 2
        formula.append(unit)
        last = f"ok {unit}"
    return False


_GUESSES = (10, 2, 5, 7, 3, 4, 9, 8, 6)  # card numbers by how often they are dealt


def ez_heuristic(formula: str, last: str) -> str:
    """A hand-written blind policy (the search's starting point for unset entries): guess the
    likeliest card, pick the likelier operator for it, type its partner, submit."""
    hands = ez_hands()
    typed = formula.split()
    if not typed:
        if last.startswith("bad "):
            n = int(last[4:])
            if n not in _GUESSES:
                return str(_GUESSES[0])
            k = _GUESSES.index(n)
            return str(_GUESSES[k + 1]) if k + 1 < len(_GUESSES) else "="
        return str(_GUESSES[0])
    c = int(typed[0])
    if len(typed) == 1:
        plus = hands.get(tuple(sorted((c, 12 - c))), 0)
        times = hands.get(tuple(sorted((c, 12 // c))), 0) if 12 % c == 0 else 0
        return "+" if plus >= times else "*"
    if len(typed) == 2:
        return str(12 - c if typed[1] == "+" else 12 // c) if not last.startswith("bad ") else "="
    return "="


def ez_allowed(formula: str) -> tuple[str, ...]:
    """Units that can still lead to a win after ``formula`` (typed units, blanks left out): a
    formula of two cards is ``n op n``."""
    k = len(formula.split())
    return EZ_UNITS[:10] if k in (0, 2) else (("+", "*") if k == 1 else ("=",))


def ez_eval(table: dict) -> Fraction:
    return sum(
        (p for hand, p in ez_hands().items() if ez_play(hand, lambda f, o: table.get((f, o)) or ez_heuristic(f, o))),
        Fraction(0),
    )


def ez_search(restarts: int, seed: int = 0) -> tuple[Fraction, dict]:
    """Coordinate ascent over the reachable ``(formula, feedback) -> unit`` entries (unset entries
    play :func:`ez_heuristic`; restarts differ in the order the entries are tried)."""
    rng = random.Random(seed)
    best, best_table = Fraction(-1), None
    for r in range(restarts + 1):
        table: dict = {}
        score = ez_eval(table)
        improved = True
        while improved:
            improved = False
            keys = set()
            for hand in ez_hands():

                def record(f, o, _t=table, _keys=keys):
                    _keys.add((f, o))
                    return _t.get((f, o)) or ez_heuristic(f, o)

                ez_play(hand, record)
            keys = sorted(keys)
            rng.shuffle(keys)
            for k in keys:
                keep = table.get(k) or ez_heuristic(*k)
                for u in ez_allowed(k[0]):
                    table[k] = u
                    v = ez_eval(table)
                    if v > score:
                        score, keep, improved = v, u, True
                table[k] = keep
                if improved:
                    break  # the reachable keys changed
        if score > best:
            best, best_table = score, dict(table)
    return best, best_table


def ez_memory_bound() -> Fraction:
    """Full memory: the agent knows which guesses failed and how many blanks it spent (exact DP)."""
    hands = ez_hands()

    def value(belief: dict, formula: tuple, used: tuple, turns: int) -> Fraction:
        # belief: hand -> probability, all consistent with the history
        if turns == 0 or len(formula) > 5 or not belief:
            return Fraction(0)
        best = Fraction(0)
        for unit in ez_allowed(" ".join(u for u in formula if u != " ")):
            total = Fraction(0)
            if unit == "=":
                from a2c_ppo_acktr.envs.cards.formula import evaluate

                val, err = evaluate(formula)
                if err is None and val == 12 and len(used) == 2:
                    total = sum(belief.values(), Fraction(0))
            elif unit.isdigit():
                n = int(unit)
                good = {h: p for h, p in belief.items() if used.count(n) < h.count(n)}
                bad = {h: p for h, p in belief.items() if h not in good}
                if good:
                    total += value(good, formula + (unit,), used + (n,), turns - 1)
                if bad:
                    total += value(bad, formula + (" ",), used, turns - 1)
            else:
                total = value(belief, formula + (unit,), used, turns - 1)
            best = max(best, total)
        return best

    return value(dict(hands), (), (), 6)


def ez_replay(table: dict, episodes: int, seed0: int = 10_000) -> float:
    from a2c_ppo_acktr.envs.cards.ezpoints import EZPointsEnv

    env = EZPointsEnv(image_size=64, max_turns=10)
    wins = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed0 + ep)
        while True:
            text = obs["text"]
            formula = re.search(r"current formula: (.*?)\. You can choose", text).group(1)
            last = text.rsplit("Last turn: ", 1)[1]
            m = re.match(r"(\d+) is not one of your unused cards", last)
            chose = re.match(r"you chose '(.*)'\.", last)
            o = f"bad {m.group(1)}" if m else (f"ok {chose.group(1)}" if chose else "start")
            unit = table.get((formula, o)) or ez_heuristic(formula, o)
            obs, _, term, trunc, info = env.step(json.dumps({"thoughts": "", "action": unit}))
            if term or trunc:
                wins += bool(info["success"])
                break
    return wins / episodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--caps", type=int, nargs="+", default=[6, 8, 10, 12, 14, 20])
    p.add_argument("--sizes", type=int, nargs="+", default=[5, 6])
    p.add_argument("--restarts", type=int, default=20)
    p.add_argument("--memory-cap", type=int, default=14, help="largest cap for the full-memory DP (it grows fast)")
    args = p.parse_args()

    print("## EZPoints (max_turns 10)")
    hands = ez_hands()
    print("hands:", {f"{a},{b}": float(p) for (a, b), p in sorted(hands.items())})
    fixed = sum(
        (p for h, p in hands.items() if ez_play(h, lambda f, o: {"": "10", "10": "+", "10 +": "2"}.get(f, "="))),
        Fraction(0),
    )
    heur = ez_eval({})
    score, table = ez_search(args.restarts)
    replay = ez_replay(table, args.episodes)
    print(
        f"fixed '10 + 2 =': {float(fixed):.4f}; hand-written feedback policy {float(heur):.4f}; best (formula, last "
        f"feedback) table: exact {float(score):.4f}, "
        f"replayed in EZPointsEnv over {args.episodes} deals {replay:.4f}; full-memory bound "
        f"{float(ez_memory_bound()):.4f}"
    )
    print("table:", {f"{k[0]!r}|{k[1]}": v for k, v in sorted(table.items())})
    sys.stdout.flush()

    for size in args.sizes:
        mid = f"MiniGrid-Empty-Random-{size}x{size}-v0"
        lengths = mg_oracle_lengths(size)
        print(
            f"\n## {mid}: {len(mg_states(size))} start states; sighted shortest solution lengths "
            f"{dict(sorted(lengths.items()))}"
        )
        print(
            "| turn cap | sighted (oracle) | blind clock+feedback (exact) | same, replayed in env | blind full memory "
            "(exact) |"
        )
        print("|---:|---:|---:|---:|---:|")
        for cap in args.caps:
            sighted = sum(n for k, n in lengths.items() if k <= cap) / sum(lengths.values())
            score, table = mg_search_clock(size, cap, args.restarts)
            replay = mg_replay(mid, cap, table, args.episodes)
            mem = f"{mg_memory_bound(size, cap):.4f}" if cap <= args.memory_cap else "-"
            print(f"| {cap} | {sighted:.4f} | {score:.4f} | {replay:.4f} ({args.episodes} ep) | {mem} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

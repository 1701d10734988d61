"""Formula games (EZPoints, Points24): the formula typed unit by unit, its exact value, a solver.

Rules shared by RL4VLM's ``gym-cards/gym_cards/envs/ezpoints.py`` and ``points.py``:

* each turn appends one unit to the formula: a card number, an operator or a parenthesis;
* a number that is not one of the unused cards (counting repeats) is illegal: reward -1, and a
  blank is appended in its place, so that the formula still grows (the original's own comment);
* ``=`` ends the episode (``terminated``): reward 10 when the formula uses every card and equals
  the target, else -1;
* when a turn starts with the formula already longer than the game's limit (5 units for EZPoints,
  20 for Points24) the episode ends ``truncated`` with -1 and the unit is not applied;
* any other unit: reward 0.

How the formula is valued is where this module departs from the original, on purpose: the original
joins the units into a string and calls Python's ``eval`` on it, and compares the float with ``==``.
That accepts formulas no card player would (two cards side by side are one number: ``2``, ``4`` is
24; ``*``, ``*`` is a power; ``//`` floor division; unary minus) and rejects correct ones whose float
value is off by a rounding (``8 / (3 - 8 / 3)`` is 23.99999999999999). Here a formula is read by the
grammar of ordinary arithmetic over the units (``+ - * /`` binary, ``*``/``/`` binding tighter,
parentheses, no unary sign, no two numbers side by side) and valued exactly with fractions; blanks
are skipped (in the original they are spaces, which ``eval`` skips too).
"""

from __future__ import annotations

import functools
import itertools
from fractions import Fraction
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
from PIL import Image, ImageDraw

from a2c_ppo_acktr.envs.cards.common import CardGameConfig, Outcome, TokenGameEnv, format_reply
from a2c_ppo_acktr.envs.cards.drawing import SUITS, TABLE_GREEN, card_face

BLANK = " "  # what an illegal card leaves in the formula (the original appends " ")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


class Evaluation(NamedTuple):
    """A formula's exact value, or why it has none."""

    value: Optional[Fraction]
    error: Optional[str] = None


def evaluate(units: Sequence[str]) -> Evaluation:
    """The exact value of a formula given as units (``["(", "3", "+", "5", ")", "*", "3"]``).

    Returns:
        ``Evaluation(value, None)``, or ``Evaluation(None, reason)`` for an incomplete or malformed
        formula or a division by zero.
    """
    tokens = [u for u in units if u != BLANK]
    if not tokens:
        return Evaluation(None, "the formula is empty")
    pos = 0

    def peek() -> Optional[str]:
        return tokens[pos] if pos < len(tokens) else None

    def expr() -> Fraction:
        nonlocal pos
        value = term()
        while peek() in ("+", "-"):
            op = tokens[pos]
            pos += 1
            rhs = term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term() -> Fraction:
        nonlocal pos
        value = factor()
        while peek() in ("*", "/"):
            op = tokens[pos]
            pos += 1
            rhs = factor()
            if op == "/" and rhs == 0:
                raise ZeroDivisionError
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor() -> Fraction:
        nonlocal pos
        tok = peek()
        if tok is None:
            raise SyntaxError("the formula ends where a number or '(' is expected")
        if tok == "(":
            pos += 1
            value = expr()
            if peek() != ")":
                raise SyntaxError("a '(' is not closed")
            pos += 1
            return value
        if tok.isdigit():
            pos += 1
            return Fraction(int(tok))
        raise SyntaxError(f"{tok!r} where a number or '(' is expected")

    try:
        value = expr()
    except ZeroDivisionError:
        return Evaluation(None, "the formula divides by zero")
    except SyntaxError as e:
        return Evaluation(None, str(e))
    if pos != len(tokens):
        return Evaluation(None, f"{tokens[pos]!r} cannot follow what comes before it")
    return Evaluation(value, None)


# ---------------------------------------------------------------------------------------------
# Solver
# ---------------------------------------------------------------------------------------------
_Tree = Union[int, tuple]  # a card number, or (operator, left, right)


def _units(tree: _Tree, parent: Optional[str] = None, right: bool = False) -> list[str]:
    """The units of an expression tree, with the parentheses its reading needs and no others."""
    if isinstance(tree, int):
        return [str(tree)]
    op, left, rhs = tree
    inner = _units(left, op, False) + [op] + _units(rhs, op, True)
    if parent is not None and (
        _PRECEDENCE[op] < _PRECEDENCE[parent]
        or (right and _PRECEDENCE[op] == _PRECEDENCE[parent] and parent in ("-", "/"))
    ):
        return ["(", *inner, ")"]
    return inner


def _combine(items: list[tuple[Fraction, _Tree]], operators: tuple[str, ...]):
    """Every (value, tree) using all of ``items`` once, combining two at a time in every order."""
    if len(items) == 1:
        yield items[0]
        return
    for i, j in itertools.permutations(range(len(items)), 2):
        (a, ta), (b, tb) = items[i], items[j]
        rest = [items[k] for k in range(len(items)) if k not in (i, j)]
        for op in operators:
            if op == "+":
                value = a + b
            elif op == "-":
                value = a - b
            elif op == "*":
                value = a * b
            elif b == 0:
                continue
            else:
                value = a / b
            yield from _combine(rest + [(value, (op, ta, tb))], operators)


@functools.lru_cache(maxsize=4096)
def _solutions(
    numbers: tuple[int, ...], target: int, operators: tuple[str, ...], parentheses: bool
) -> tuple[tuple[str, ...], ...]:
    found = set()
    for value, tree in _combine([(Fraction(n), n) for n in numbers], operators):
        if value != target:
            continue
        units = tuple(_units(tree))
        if not parentheses and "(" in units:
            continue
        found.add(units)
    # shortest first (fewest parentheses), then a fixed order: the oracle's choice is reproducible
    return tuple(sorted(found, key=lambda u: (len(u), u)))


def solutions(
    numbers: Sequence[int], target: int, operators: Sequence[str], parentheses: bool = True
) -> tuple[tuple[str, ...], ...]:
    """Every formula (as units, without ``=``) that uses each number once and equals ``target``.

    Formulas differing only in the order of the operands are all listed; parentheses appear only
    where the reading needs them. Shortest first, then in a fixed order. Cached per multiset.

    Args:
        numbers: The card numbers (repeats allowed).
        target: The value to reach.
        operators: The binary operators allowed (``+ - * /`` or a subset).
        parentheses: Whether the game offers ``(`` and ``)``.
    """
    return _solutions(tuple(sorted(int(n) for n in numbers)), int(target), tuple(operators), bool(parentheses))


def _splits(numbers: tuple[int, ...]):
    """Every split of ``numbers`` into two non-empty ordered parts (each pair once)."""
    n = len(numbers)
    seen = set()
    for mask in range(1, (1 << n) - 1):
        left = tuple(numbers[i] for i in range(n) if mask >> i & 1)
        right = tuple(numbers[i] for i in range(n) if not mask >> i & 1)
        if (left, right) not in seen:
            seen.add((left, right))
            yield left, right


@functools.lru_cache(maxsize=1 << 16)
def _reachable(numbers: tuple[int, ...], operators: tuple[str, ...]) -> frozenset[Fraction]:
    """Every value of an expression using each of ``numbers`` (sorted) once, any parenthesization."""
    if len(numbers) == 1:
        return frozenset((Fraction(numbers[0]),))
    values = set()
    for left, right in _splits(numbers):
        for a in _reachable(left, operators):
            for b in _reachable(right, operators):
                if "+" in operators:
                    values.add(a + b)
                if "-" in operators:
                    values.add(a - b)
                if "*" in operators:
                    values.add(a * b)
                if "/" in operators and b != 0:
                    values.add(a / b)
    return frozenset(values)


def is_solvable(numbers: Sequence[int], target: int, operators: Sequence[str], parentheses: bool = True) -> bool:
    """Whether :func:`solutions` is non-empty, found faster: the values of every part of the hand
    are cached and shared between hands, and the last operation is solved for its right operand.

    Without parentheses and with more than two numbers the operator precedence restricts the
    formulas, and the answer comes from :func:`solutions` itself.
    """
    ops = tuple(operators)
    nums = tuple(sorted(int(n) for n in numbers))
    if not parentheses and len(nums) > 2:
        return bool(solutions(nums, target, ops, parentheses))
    goal = Fraction(int(target))
    if len(nums) == 1:
        return nums[0] == goal
    for left, right in _splits(nums):
        rights = _reachable(right, ops)
        for a in _reachable(left, ops):
            # the b with a (op) b == goal, for each operator
            if "+" in ops and goal - a in rights:
                return True
            if "-" in ops and a - goal in rights:
                return True
            if "*" in ops and (goal / a in rights if a != 0 else goal == 0 and bool(rights)):
                return True
            if "/" in ops and (a / goal in rights and a != 0 if goal != 0 else a == 0 and any(b != 0 for b in rights)):
                return True
    return False


def plan(
    numbers: Sequence[int], target: int, operators: Sequence[str], parentheses: bool, formula: Sequence[str]
) -> Optional[tuple[str, ...]]:
    """The first solution (in :func:`solutions` order) that extends ``formula``, blanks skipped.

    Returns:
        Its units, or None when no listed solution extends ``formula`` (none exists, or the formula
        already went astray; formulas are never erased).
    """
    typed = _typed(formula)
    for units in solutions(numbers, target, operators, parentheses):
        if units[: len(typed)] == typed:
            return units
    return None


def next_unit(
    numbers: Sequence[int], target: int, operators: Sequence[str], parentheses: bool, formula: Sequence[str]
) -> Optional[str]:
    """The next unit of :func:`plan`: ``"="`` when the formula is a solution already, None without a plan."""
    units = plan(numbers, target, operators, parentheses, formula)
    if units is None:
        return None
    typed = _typed(formula)
    return "=" if len(units) == len(typed) else units[len(typed)]


def _typed(formula: Sequence[str]) -> tuple[str, ...]:
    return tuple(u for u in formula if u != BLANK)


# ---------------------------------------------------------------------------------------------
# The env both games share
# ---------------------------------------------------------------------------------------------
_RANK_PRINTED = {1: "A", 11: "J", 12: "Q", 13: "K"}
_RANK_LETTER = {1: "A", 10: "T", 11: "J", 12: "Q", 13: "K"}  # the original's card names ("HT", "SQ")


def card_name(rank: int, suit: str) -> str:
    """The original's name of a card: suit letter then rank letter (``"HT"`` is the ten of hearts)."""
    return suit + _RANK_LETTER.get(rank, str(rank))


class FormulaGameEnv(TokenGameEnv):
    """Base of EZPoints and Points24 (see the module docstring for the rules).

    Subclasses set ``FORMULA_LIMIT``, ``OPERATORS``, ``PARENTHESES`` and implement
    :meth:`_deal_cards`, :meth:`target`, :meth:`_prompt` and :meth:`_draw_formula`.

    Privileged state: ``ranks`` and ``suits`` of the cards (rank 1..13), ``numbers`` (their values
    in the game), ``formula`` (units typed, blanks included), ``used`` (card numbers typed),
    ``solvable`` (whether a formula reaching the target exists).
    """

    FORMULA_LIMIT: int = 0
    OPERATORS: tuple[str, ...] = ()
    PARENTHESES: bool = False

    def __init__(self, cfg: CardGameConfig | None = None, render_mode: str | None = None, **overrides) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.ranks: list[int] = []
        self.suits: list[str] = []
        self.numbers: list[int] = []
        self.formula: list[str] = []
        self.used: list[int] = []
        self.solvable = False

    # ------------------------------------------------------------------ subclass hooks
    def target(self) -> int:
        raise NotImplementedError

    def _deal_cards(self) -> list[tuple[int, str]]:
        """(rank 1..13, suit) of each card, drawn from ``self.np_random``."""
        raise NotImplementedError

    def _number(self, rank: int) -> int:
        """The value a card of ``rank`` has in the game (J, Q, K count 10 unless configured otherwise)."""
        return min(rank, 10)

    def _draw_formula(self, draw: ImageDraw.ImageDraw, size: int) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ game
    def _random_suit(self) -> str:
        return SUITS[int(self.np_random.integers(len(SUITS)))]

    def _deal(self, options: dict) -> None:
        """Option ``cards``: a list of (rank 1..13, suit letter) forcing the hand."""
        if "cards" in options:
            cards = [(int(r), str(s)) for r, s in options["cards"]]
            bad = [c for c in cards if not (1 <= c[0] <= 13 and c[1] in SUITS)]
            if bad:
                raise ValueError(f"options['cards'] holds {bad}; each card is (rank 1..13, one of {SUITS})")
        else:
            cards = self._deal_cards()
        self.ranks = [r for r, _ in cards]
        self.suits = [s for _, s in cards]
        self.numbers = [self._number(r) for r in self.ranks]
        self.formula = []
        self.used = []
        self.solvable = is_solvable(self.numbers, self.target(), self.OPERATORS, self.PARENTHESES)

    def _play(self, token: str) -> Outcome:
        if len(self.formula) > self.FORMULA_LIMIT:
            return Outcome(
                -1.0, False, True, f"the formula is longer than {self.FORMULA_LIMIT} units; the game is over."
            )
        if token.isdigit():
            number = int(token)
            if self.used.count(number) >= self.numbers.count(number):
                self.formula.append(BLANK)
                return Outcome(
                    -1.0, False, False, f"{token} is not one of your unused cards; a blank was added to the formula."
                )
            self.used.append(number)
        if token == "=":
            value, error = evaluate(self.formula)
            won = error is None and value == self.target() and len(self.used) == len(self.numbers)
            return Outcome(10.0 if won else -1.0, True, False, "you chose '='.", success=won)
        self.formula.append(token)
        return Outcome(0.0, False, False, f"you chose {token!r}.")

    def formula_text(self) -> str:
        """The formula as typed, units separated by spaces, blanks left out."""
        return " ".join(u for u in self.formula if u != BLANK)

    def _draw(self) -> np.ndarray:
        size = self.cfg.image_size
        canvas = Image.new("RGB", (size, size), TABLE_GREEN)
        width = int(size / len(self.ranks) * 0.9)
        height = int(width * 7 / 5)
        for i, (rank, suit) in enumerate(zip(self.ranks, self.suits)):
            face = card_face(_RANK_PRINTED.get(rank, str(rank)), suit, width, height)
            canvas.paste(face, (round(5 * size / 300) + int(i * width * 1.1), (size - height) // 2))
        self._draw_formula(ImageDraw.Draw(canvas), size)
        return np.asarray(canvas, dtype=np.uint8)

    def _game_info(self) -> dict:
        return {
            "cards": [card_name(r, s) for r, s in zip(self.ranks, self.suits)],
            "numbers": list(self.numbers),
            "formula": list(self.formula),
            "solvable": self.solvable,
        }

    def solver_reply(self) -> str:
        return oracle_reply(self.numbers, self.target(), self.OPERATORS, self.PARENTHESES, self.formula)


def oracle_reply(
    numbers: Sequence[int], target: int, operators: Sequence[str], parentheses: bool, formula: Sequence[str]
) -> str:
    """The oracle's reply: ``=`` on a finished solution, else the next unit of :func:`plan` (a pure
    function of the state).

    With no plan (no solution exists for these cards, or the formula went astray) it submits ``=``,
    which ends the episode at once: every other way to end it costs the same -1.
    """
    cards = ", ".join(str(n) for n in numbers)
    typed = " ".join(_typed(formula)) or "empty"
    value, error = evaluate(formula)
    if error is None and value == target and sorted(int(u) for u in formula if u.isdigit()) == sorted(numbers):
        return format_reply(
            f"The cards are {cards}. The formula {typed} uses every card and equals {target}, so it is complete.", "="
        )
    units = plan(numbers, target, operators, parentheses, formula)
    if units is None:
        if not is_solvable(numbers, target, operators, parentheses):
            return format_reply(
                f"The cards are {cards}. No formula using each card once equals {target}, so I submit.", "="
            )
        return format_reply(
            f"The cards are {cards} and the formula is {typed}. It cannot be completed to {target}, so I submit.", "="
        )
    unit = units[len(_typed(formula))]
    return format_reply(
        f"The cards are {cards} and the formula is {typed}. {' '.join(units)} equals {target}, so I append {unit}.",
        unit,
    )

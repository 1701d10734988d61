"""Points24 (``gym_cards/Points24-v0``): type a formula of the four cards that equals 24.

Rules, from RL4VLM ``gym-cards/gym_cards/envs/points.py`` (the formula rules shared with EZPoints
are in :mod:`.formula`):

* four cards of uniform rank A..K and suit, drawn independently; the hand need not be solvable
  (``info["solvable"]`` says whether it is; ``only_solvable=True`` redeals until it is, which the
  original does not do);
* ``treat_face_cards_as_10`` (default, as in RL4VLM's training): J, Q, K count 10 and the numbers
  are 1..10; otherwise they count 11, 12, 13 and the numbers are 1..13;
* units: the numbers, ``+ - * / ( )`` and ``=``;
* the formula may grow to 20 units; a turn that starts with more ends the episode (-1, truncated);
* the image: the four cards side by side on a green table, ``Formula:`` and the units below them.

Vocabulary and prompt from RL4VLM ``VLM_PPO/a2c_ppo_acktr/rl_utils.py`` (``get_prompt``).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import ImageDraw

from a2c_ppo_acktr.envs.cards.common import CardGameConfig
from a2c_ppo_acktr.envs.cards.drawing import font
from a2c_ppo_acktr.envs.cards.formula import FormulaGameEnv, is_solvable

OPERATOR_UNITS = ("+", "-", "*", "/", "(", ")", "=")


def vocabulary(treat_face_cards_as_10: bool) -> tuple[str, ...]:
    """The units: numbers 1..10 (or 1..13), then the operators, parentheses and ``=``."""
    top = 10 if treat_face_cards_as_10 else 13
    return tuple(str(n) for n in range(1, top + 1)) + OPERATOR_UNITS


PROMPT = (
    "You are an expert 24 points card game player. You are observing four cards in the image. "
    "You are observing the current formula: {formula}. "
    "You can choose between {choices}. "
    "The number or operator you choose will be appended to the current formula. "
    "{faces} "
    "Your goal is to output a formula that evaluates to {target}, and each number can only be used once.\n"
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{{"thoughts": "<first check whether the current formula equals {target}; if it does, choose \'=\'; otherwise '
    "consider "
    'which number or operator should be appended to the current formula to make it equal {target}>", "action": '
    '"<number or operator>"}}'
)
FACES_AS_10 = "Note that 'A' counts as '1' and 'J', 'Q', and 'K' count as '10'."
FACES_AS_RANKS = "Note that 'A' counts as '1', 'J' as '11', 'Q' as '12' and 'K' as '13'."
_MAX_REDEALS = 1000


@dataclass(frozen=True)
class Points24Config(CardGameConfig):
    """Points24 settings (the original's two options, plus ``only_solvable``).

    Attributes:
        target_points: The value the formula must reach.
        treat_face_cards_as_10: J, Q and K count 10 (numbers 1..10) instead of 11, 12, 13.
        only_solvable: Redeal until a solution exists (the original deals any hand).
    """

    target_points: int = 24
    treat_face_cards_as_10: bool = True
    only_solvable: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target_points < 1:
            raise ValueError(f"target_points={self.target_points} must be a positive integer such as 24")


class Points24Env(FormulaGameEnv):
    """Gymnasium env ``gym_cards/Points24-v0`` (see the module docstring)."""

    task_type_name = "points24"

    config_class = Points24Config
    FORMULA_LIMIT = 20
    OPERATORS = ("+", "-", "*", "/")
    PARENTHESES = True

    def _vocabulary(self) -> tuple[str, ...]:
        return vocabulary(self.cfg.treat_face_cards_as_10)

    def target(self) -> int:
        return self.cfg.target_points

    def _number(self, rank: int) -> int:
        return min(rank, 10) if self.cfg.treat_face_cards_as_10 else rank

    def _deal_cards(self) -> list[tuple[int, str]]:
        for _ in range(_MAX_REDEALS):
            ranks = [int(self.np_random.integers(1, 14)) for _ in range(4)]
            cards = [(r, self._random_suit()) for r in ranks]
            if not self.cfg.only_solvable or self._has_solution([self._number(r) for r in ranks]):
                return cards
        raise RuntimeError(
            f"no solvable hand for target_points={self.cfg.target_points} in {_MAX_REDEALS} deals; use a reachable "
            "target or only_solvable=False"
        )

    def _has_solution(self, numbers: list[int]) -> bool:
        return is_solvable(numbers, self.target(), self.OPERATORS, self.PARENTHESES)

    def _prompt(self) -> str:
        choices = "[" + ", ".join(f"'{u}'" for u in self.vocabulary) + "]"
        faces = FACES_AS_10 if self.cfg.treat_face_cards_as_10 else FACES_AS_RANKS
        return PROMPT.format(formula=self.formula_text(), choices=choices, faces=faces, target=self.target())

    def _draw_formula(self, draw: ImageDraw.ImageDraw, size: int) -> None:
        letters = font(round(16 * size / 300))
        draw.text((10 * size / 300, size * 0.70), "Formula:", fill="white", font=letters)
        draw.text((10 * size / 300, size * 0.80), self.formula_text(), fill="white", font=letters)

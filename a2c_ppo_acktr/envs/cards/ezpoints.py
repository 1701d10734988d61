"""EZPoints (``gym_cards/EZPoints-v0``): type a formula of the two cards that equals 12.

Rules, from RL4VLM ``gym-cards/gym_cards/envs/ezpoints.py`` (the formula rules shared with Points24
are in :mod:`.formula`):

* two cards, always solvable: the first has rank 2..K (never an ace; J, Q, K count 10); when its
  number divides 12 the second card is 12 / first with probability 1/2, else 12 - first; the two
  are swapped with probability 1/2; suits are uniform;
* units: the numbers 1..10, ``+``, ``*`` and ``=`` (no ``-``, ``/`` or parentheses);
* the formula may grow to 5 units; a turn that starts with more ends the episode (-1, truncated);
* the image: the two cards side by side on a green table, ``Formula: ...`` below them.

Vocabulary and prompt from RL4VLM ``VLM_PPO/a2c_ppo_acktr/rl_utils.py`` (``get_prompt``).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import ImageDraw

from a2c_ppo_acktr.envs.cards.common import CardGameConfig
from a2c_ppo_acktr.envs.cards.drawing import font
from a2c_ppo_acktr.envs.cards.formula import FormulaGameEnv

TARGET = 12  # the dealing below builds pairs for 12 only, so the target is not configurable
VOCABULARY = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "+", "*", "=")
PROMPT = (
    "You are an expert card game player. You are observing two cards in the image. "
    "You are observing the current formula: {formula}. "
    "You can choose between ['1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '+', '*', '=']. "
    "The number or operator you choose will be appended to the current formula. "
    "Note that 'J', 'Q', and 'K' count as '10'. "
    "Your goal is to output a formula that evaluates to 12, and each number can only be used once.\n"
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{{"thoughts": "<first check whether the current formula is complete; if it is, choose \'=\'; otherwise consider '
    'which number or operator should be appended to the current formula to make it equal 12>", "action": "<number or '
    'operator>"}}'
)
_DIVIDES_12 = (1, 2, 3, 4, 6)


@dataclass(frozen=True)
class EZPointsConfig(CardGameConfig):
    """EZPoints settings (those of every card game; the target is fixed at 12)."""


class EZPointsEnv(FormulaGameEnv):
    """Gymnasium env ``gym_cards/EZPoints-v0`` (see the module docstring)."""

    task_type_name = "ezpoints"

    config_class = EZPointsConfig
    FORMULA_LIMIT = 5
    OPERATORS = ("+", "*")
    PARENTHESES = False

    def _vocabulary(self) -> tuple[str, ...]:
        return VOCABULARY

    def target(self) -> int:
        return TARGET

    def _deal_cards(self) -> list[tuple[int, str]]:
        rng = self.np_random
        first_rank = int(rng.integers(2, 14))
        first_suit = self._random_suit()
        first = min(first_rank, 10)
        # the original draws the coin only when the number divides 12 (Python's short-circuit `and`)
        if first in _DIVIDES_12 and rng.random() <= 0.5:
            second = TARGET // first
        else:
            second = TARGET - first
        cards = [(first_rank, first_suit), (second, self._random_suit())]
        if rng.random() <= 0.5:
            cards.reverse()
        return cards

    def _prompt(self) -> str:
        return PROMPT.format(formula=self.formula_text())

    def _draw_formula(self, draw: ImageDraw.ImageDraw, size: int) -> None:
        draw.text(
            (10 * size / 300, size * 0.86),
            f"Formula: {self.formula_text()}",
            fill="white",
            font=font(round(20 * size / 300)),
        )

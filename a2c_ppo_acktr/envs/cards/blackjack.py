"""Blackjack (``gym_cards/Blackjack-v0``): gymnasium's toy-text blackjack, seen as card images.

Rules, from RL4VLM ``gym-cards/gym_cards/envs/blackjack.py`` (itself gymnasium's ``Blackjack-v1``,
Sutton & Barto's Example 5.1):

* an infinite deck (cards drawn with replacement): A, 2-9 at 1/13 each, value 10 at 4/13;
  ``hit`` draws a card, ``stand`` ends the player's turn; no doubling, splitting or surrender;
* an ace counts 11 while that does not bust the hand ("usable ace"), else 1;
* a hit that busts the player ends the episode with -1 at once;
* on ``stand`` the dealer draws until the total is 17 or more (standing on soft 17), then the
  higher total wins: +1 win, 0 draw, -1 loss; a dealer bust is a player win; no dealer peek for
  blackjack, and a natural pays like any other win (+1) by default;
* ``natural=True``: a winning natural pays +1.5; ``sab=True``: a natural beats any non-natural dealer
  hand (+1). The original checks ``sorted(hand) == [1, 10]`` on (value, face, suit) triples, which is
  never true, so there both flags do nothing; here they act on the card values as documented.
* drawing: a green table; "Dealer" above the dealer's first card and a face-down card (the hole card
  stays face down, also after ``stand``); "Player" above the player's cards, five to a row. A
  value-10 card shows J, Q or K (uniformly), never a 10, as in the original.

Vocabulary ``stand``/``hit`` and prompt from RL4VLM ``VLM_PPO/a2c_ppo_acktr/rl_utils.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
from PIL import Image, ImageDraw

from a2c_ppo_acktr.envs.cards.common import CardGameConfig, Outcome, TokenGameEnv, format_reply
from a2c_ppo_acktr.envs.cards.drawing import SUITS, TABLE_GREEN, card_back, card_face, font

VOCABULARY = ("stand", "hit")
PROMPT = (
    "You are a blackjack player. You are observing the current game state, you can choose between ['stand', 'hit']. "
    "The image shows the dealer's cards at the top (one face up, one face down) and your cards at the bottom.\n"
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{"thoughts": "<first describe your total points and the dealer\'s total points then think about which action to '
    'choose>", '
    '"action": "<stand or hit>"}'
)
DECK = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10)  # 1 = ace; 10, J, Q, K are worth 10
FACES_OF_TEN = ("J", "Q", "K")


class Card(NamedTuple):
    value: int  # 1 (ace) .. 10
    face: str  # "A", "2".."9", "J", "Q", "K"
    suit: str  # one of drawing.SUITS


@dataclass(frozen=True)
class BlackjackConfig(CardGameConfig):
    """Blackjack settings (gymnasium's flags; both off in RL4VLM).

    Attributes:
        natural: A winning natural (ace + ten-card) pays 1.5 instead of 1.
        sab: Sutton & Barto's rule: a natural beats any dealer hand that is not a natural. Overrides
            ``natural``.
    """

    natural: bool = False
    sab: bool = False


# ------------------------------------------------------------------ rules (pure functions)
def usable_ace(values: Sequence[int]) -> bool:
    """Whether an ace can count 11 without busting."""
    return 1 in values and sum(values) + 10 <= 21


def hand_total(values: Sequence[int]) -> int:
    """The hand's total, with a usable ace counted 11."""
    return sum(values) + 10 if usable_ace(values) else sum(values)


def is_bust(values: Sequence[int]) -> bool:
    return hand_total(values) > 21


def hand_score(values: Sequence[int]) -> int:
    """The total, or 0 for a bust hand (any standing hand beats a bust dealer)."""
    return 0 if is_bust(values) else hand_total(values)


def is_natural(values: Sequence[int]) -> bool:
    """An ace and a ten-card as the first two cards."""
    return sorted(values) == [1, 10]


def settle(player: Sequence[int], dealer: Sequence[int], natural: bool = False, sab: bool = False) -> float:
    """The reward of a player who stood with ``player`` against the dealer's final ``dealer``."""
    a, b = hand_score(player), hand_score(dealer)
    reward = float(a > b) - float(a < b)
    if sab and is_natural(player) and not is_natural(dealer):
        return 1.0
    if not sab and natural and is_natural(player) and reward == 1.0:
        return 1.5
    return reward


def basic_strategy(total: int, soft: bool, dealer_up: int) -> str:
    """The hit/stand basic strategy of this game (no doubling, splitting or surrender).

    For an infinite deck and a dealer standing on soft 17 (Sutton & Barto, Figure 5.2; also what
    dynamic programming over this env's rules gives, checked in ``tests/test_cards.py``):
    hard 17+ stand; hard 13-16 stand against 2-6; hard 12 stand against 4-6; soft 19+ stand;
    soft 18 stand against 2-8; otherwise hit.

    Args:
        total: The player's total (a usable ace counted 11).
        soft: Whether the hand has a usable ace.
        dealer_up: The dealer's face-up card value, 1 (ace) .. 10.

    Returns:
        ``"stand"`` or ``"hit"``.
    """
    if soft:
        if total >= 19 or (total == 18 and 2 <= dealer_up <= 8):
            return "stand"
        return "hit"
    if total >= 17 or (13 <= total <= 16 and 2 <= dealer_up <= 6) or (total == 12 and 4 <= dealer_up <= 6):
        return "stand"
    return "hit"


def oracle_reply(player: Sequence[int], dealer_up: int) -> str:
    """The oracle's reply: :func:`basic_strategy` with its reason (a pure function of the state)."""
    total, soft = hand_total(player), usable_ace(player)
    action = basic_strategy(total, soft, dealer_up)
    up = "an ace" if dealer_up == 1 else str(dealer_up)
    kind = "soft" if soft else "hard"
    return format_reply(f"My total is {kind} {total} and the dealer shows {up}. Basic strategy says {action}.", action)


class BlackjackEnv(TokenGameEnv):
    """Gymnasium env ``gym_cards/Blackjack-v0`` (see the module docstring).

    Privileged state: ``player`` and ``dealer`` (lists of :class:`Card`, dealer's first card face up).
    """

    task_type_name = "blackjack"

    config_class = BlackjackConfig

    def __init__(self, cfg: BlackjackConfig | None = None, render_mode: str | None = None, **overrides) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.player: list[Card] = []
        self.dealer: list[Card] = []

    def _vocabulary(self) -> tuple[str, ...]:
        return VOCABULARY

    def _draw_card(self) -> Card:
        value = DECK[int(self.np_random.integers(len(DECK)))]
        suit = SUITS[int(self.np_random.integers(len(SUITS)))]
        face = "A" if value == 1 else FACES_OF_TEN[int(self.np_random.integers(3))] if value == 10 else str(value)
        return Card(value, face, suit)

    def _deal(self, options: dict) -> None:
        """Options ``player`` and ``dealer`` (lists of :class:`Card`, two or more each) force the hands;
        the dealer's later draws still come from ``np_random``."""
        if "player" in options or "dealer" in options:
            self.player = [Card(*c) for c in options["player"]]
            self.dealer = [Card(*c) for c in options["dealer"]]
            if len(self.player) < 2 or len(self.dealer) < 2:
                raise ValueError("options['player'] and options['dealer'] need two cards or more each")
            return
        self.dealer = [self._draw_card(), self._draw_card()]
        self.player = [self._draw_card(), self._draw_card()]

    @property
    def player_values(self) -> list[int]:
        return [c.value for c in self.player]

    @property
    def dealer_values(self) -> list[int]:
        return [c.value for c in self.dealer]

    def _play(self, token: str) -> Outcome:
        if token == "hit":
            self.player.append(self._draw_card())
            if is_bust(self.player_values):
                return Outcome(-1.0, True, False, "you chose 'hit' and went bust.")
            return Outcome(0.0, False, False, "you chose 'hit'.")
        while hand_total(self.dealer_values) < 17:
            self.dealer.append(self._draw_card())
        reward = settle(self.player_values, self.dealer_values, natural=self.cfg.natural, sab=self.cfg.sab)
        return Outcome(reward, True, False, "you chose 'stand'.", success=reward > 0)

    def _draw(self) -> np.ndarray:
        size = self.cfg.image_size
        k = size / 300.0
        img = Image.new("RGB", (size, size), TABLE_GREEN)
        draw = ImageDraw.Draw(img)
        label = font(round(16 * k))
        w, h = round(70 * k), round(98 * k)
        gap = round(4 * k)
        draw.text((5 * k, 5 * k), "Dealer", fill="white", font=label)
        first = self.dealer[0]
        img.paste(card_face(first.face, first.suit, w, h), (round(5 * k), round(25 * k)))
        img.paste(card_back(w, h), (round(78 * k), round(25 * k)))
        draw.text((5 * k, 130 * k), "Player", fill="white", font=label)
        for i, card in enumerate(self.player):
            row, col = divmod(i, 5)
            img.paste(
                card_face(card.face, card.suit, w, h),
                (round(5 * k) + col * (w + gap), round(150 * k) + row * (h + gap)),
            )
        return np.asarray(img, dtype=np.uint8)

    def _prompt(self) -> str:
        return PROMPT

    def _game_info(self) -> dict:
        return {"player_cards": list(self.player), "dealer_cards": list(self.dealer)}

    def solver_reply(self) -> str:
        return oracle_reply(self.player_values, self.dealer[0].value)

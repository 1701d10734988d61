"""NumberLine (``gym_cards/NumberLine-v0``): step the current number to the target, one at a time.

Rules, from RL4VLM ``gym-cards/gym_cards/envs/numberline.py`` (the later version, which also keeps
start and target apart in ``reset``):

* start and target are uniform on ``0..max_position``; when they are equal the target becomes
  ``(target + 1) % max_position`` (so targets are not uniform: ``max_position`` is rarer);
* ``-`` subtracts one unless the number is 0, ``+`` adds one unless it is ``max_position``;
* reward +1 and ``terminated`` when the number reaches the target, else -1 when the distance did not
  shrink (a wrong move, or a move blocked at an end), else 0;
* ``truncated`` after ``2 * max_position`` turns without reaching the target;
* the image: white, ``Target: t`` and ``Current: c`` in large black letters, nothing else.

The vocabulary ``-``/``+`` and the prompt are those of RL4VLM's ``VLM_PPO/a2c_ppo_acktr/rl_utils.py``
(``get_prompt``, ``text_projection``), in this project's reply format. An invalid reply also counts
toward the ``2 * max_position`` turns (the original counted every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from a2c_ppo_acktr.envs.cards.common import CardGameConfig, Outcome, TokenGameEnv, format_reply
from a2c_ppo_acktr.envs.cards.drawing import font

VOCABULARY = ("-", "+")
PROMPT = (
    "You are playing a game called number line. You will see a target number and a current number in the image. "
    "Your goal is to move the current number closer to the target by choosing either adding or subtracting one "
    "to the current number.\n"
    "Each turn, reply with ONE JSON object and nothing else:\n"
    '{"thoughts": "<first read out the current and target number, then think carefully about which action to choose>", '
    '"action": "<- or +>"}\n'
    'The action is "-" (subtract one) or "+" (add one).'
)


@dataclass(frozen=True)
class NumberLineConfig(CardGameConfig):
    """NumberLine settings.

    Attributes:
        max_position: The largest number on the line (the original's default is 5).
    """

    max_position: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_position < 2:
            raise ValueError(
                f"max_position={self.max_position} must be >= 2 so that a target different from the start exists"
            )


class NumberLineEnv(TokenGameEnv):
    """Gymnasium env ``gym_cards/NumberLine-v0`` (see the module docstring).

    Privileged state: ``position``, ``target``, ``start``.
    """

    task_type_name = "numberline"

    config_class = NumberLineConfig

    def __init__(self, cfg: NumberLineConfig | None = None, render_mode: str | None = None, **overrides) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.start = self.target = self.position = 0

    def _vocabulary(self) -> tuple[str, ...]:
        return VOCABULARY

    def _turn_cap(self) -> int:
        return min(self.cfg.max_turns, 2 * self.cfg.max_position)

    def _deal(self, options: dict) -> None:
        """Options ``start`` and ``target`` (ints in ``0..max_position``, different) force the game."""
        top = self.cfg.max_position
        if "start" in options or "target" in options:
            start, target = int(options["start"]), int(options["target"])
            if not (0 <= start <= top and 0 <= target <= top and start != target):
                raise ValueError(f"options start={start}, target={target} must be different numbers in 0..{top}")
        else:
            start = int(self.np_random.integers(0, top + 1))
            target = int(self.np_random.integers(0, top + 1))
            if start == target:
                target = (target + 1) % top
        self.start, self.target, self.position = start, target, start

    def _play(self, token: str) -> Outcome:
        before = abs(self.position - self.target)
        if token == "-" and self.position > 0:
            self.position -= 1
        elif token == "+" and self.position < self.cfg.max_position:
            self.position += 1
        after = abs(self.position - self.target)
        feedback = f"you chose {token!r}."
        if after == 0:
            return Outcome(1.0, True, False, feedback, success=True)
        return Outcome(-1.0 if after >= before else 0.0, False, False, feedback)

    def _draw(self) -> np.ndarray:
        size = self.cfg.image_size
        scale = size / 300.0
        img = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(img)
        letters = font(round(36 * scale))
        draw.text((30 * scale, 60 * scale), f"Target: {self.target}", fill="black", font=letters)
        draw.text((30 * scale, 180 * scale), f"Current: {self.position}", fill="black", font=letters)
        return np.asarray(img, dtype=np.uint8)

    def _prompt(self) -> str:
        return PROMPT

    def _game_info(self) -> dict:
        return {"target": self.target, "current": self.position}

    def solver_reply(self) -> str:
        return oracle_reply(self.position, self.target)


def oracle_reply(position: int, target: int) -> str:
    """The oracle's reply: step toward the target (a pure function of the state).

    Raises:
        ValueError: If the number is already at the target (the episode has ended).
    """
    if position == target:
        raise ValueError(f"the current number {position} is already the target; the episode is over")
    token = "+" if position < target else "-"
    side = "below" if position < target else "above"
    verb = "add" if token == "+" else "subtract"
    return format_reply(
        f"The current number is {position} and the target is {target}. It is {side} the target, so I {verb} one.", token
    )

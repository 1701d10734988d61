"""An env and a reward function defined outside the package, as a user writes them (imported by
``env.env_id=user_game:ParityEnv`` and ``env.reward_fn=user_game:plus_ten``; pytest puts ``tests/`` on
``sys.path``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from a2c_ppo_acktr.envs.cards.common import Outcome, TokenGameConfig, TokenGameEnv, format_reply
from a2c_ppo_acktr.envs.cards.drawing import font


@dataclass(frozen=True)
class ParityConfig(TokenGameConfig):
    largest: int = 9  # the number shown is drawn from 0..largest


class ParityEnv(TokenGameEnv):
    """One turn: the image shows a number; reply "even" or "odd". Reward 1 when right, else 0."""

    task_type_name = "parity"
    config_class = ParityConfig

    def __init__(self, cfg: ParityConfig | None = None, render_mode: str | None = None, **overrides) -> None:
        super().__init__(cfg, render_mode, **overrides)
        self.number = 0

    def _vocabulary(self) -> tuple[str, ...]:
        return ("even", "odd")

    def _turn_cap(self) -> int:
        return 1

    def _deal(self, options: dict) -> None:
        self.number = int(self.np_random.integers(0, self.cfg.largest + 1))

    def _play(self, token: str) -> Outcome:
        right = token == ("even" if self.number % 2 == 0 else "odd")
        return Outcome(1.0 if right else 0.0, True, False, f"you said {token}.", success=right)

    def _draw(self) -> np.ndarray:
        size = self.cfg.image_size
        img = Image.new("RGB", (size, size), "white")
        ImageDraw.Draw(img).text((size * 0.3, size * 0.3), str(self.number), fill="black", font=font(size // 3))
        return np.asarray(img, dtype=np.uint8)

    def _prompt(self) -> str:
        return 'Is the number in the image even or odd? Reply {"thoughts": "...", "action": "<even or odd>"}.'

    def _game_info(self) -> dict:
        return {"number": self.number}

    def solver_reply(self) -> str:
        return format_reply(f"The number is {self.number}.", "even" if self.number % 2 == 0 else "odd")


CALLS: list[dict] = []  # every call of plus_ten in this process: what it was given


def plus_ten(reply: str, reward: float, info: dict, episode: dict) -> float:
    """The env's reward plus 10: every shaped reward is then >= 9, which no game reward reaches."""
    CALLS.append({"reply": reply, "reward": reward, "question_type": episode.get("question_type")})
    return reward + 10.0


def not_a_number(reply: str, reward: float, info: dict, episode: dict) -> object:
    return "ten"

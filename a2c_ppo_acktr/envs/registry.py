"""One registry for every task the pipeline runs: ``env.env_id`` -> an env.

Training (:class:`~a2c_ppo_acktr.envs.batch.BatchEnv`), labelling, SFT preprocessing and evaluation
build their envs with :func:`make_env` and talk to them through the few methods below, so no loop
branches on the env.

==================================== ================================================ ==============
``env.env_id``                       env                                              task name
==================================== ================================================ ==============
``VSI-v0``                           spatial questions in indoor scenes (:mod:`.vsi_env`) question type
``NumberLine-v0``                    gym-cards NumberLine (:mod:`.cards.numberline`)   ``numberline``
``EZPoints-v0``                      gym-cards EZPoints (:mod:`.cards.ezpoints`)       ``ezpoints``
``Points24-v0``                      gym-cards Points24 (:mod:`.cards.points24`)       ``points24``
``Blackjack-v0``                     gym-cards Blackjack (:mod:`.cards.blackjack`)     ``blackjack``
``MiniGrid-<...>``, ``BabyAI-<...>`` any ``minigrid`` id (:mod:`.minigrid_text`)      ``minigrid``
``Sokoban-v0``                       Sokoban (:mod:`.sokoban`)                         ``sokoban``
``module.path:ClassName``            your own env class (imported when an env is made) its ``task_type_name``
==================================== ================================================ ==============

The card ids may also be written with RL4VLM's namespace (``gym_cards/NumberLine-v0``).

**Your own env.** ``env.env_id=my_pkg.games:ParityEnv`` runs a class defined outside the package
through training, labelling and evaluation. It implements
:class:`~a2c_ppo_acktr.envs.protocol.TextEnv` (a one-token game can subclass
:class:`~a2c_ppo_acktr.envs.cards.common.TokenGameEnv` and write six small methods). With a
``config_class`` (a dataclass) it is built like the games below, ``cls(config)``; without one,
``cls(**env.game)``. Its report category is its ``task_type_name`` (else the class name).

**Your own reward.** ``env.reward_fn=my_pkg.rewards:shaped`` replaces every step's reward with
``shaped(reply=..., reward=..., info=..., episode=...)`` (the reply text, the env's reward, the step's
info, the episode's ``episode_fields()``), on any env (:mod:`.reward_fn`). The score (``info["score"]``,
what evaluation reports) stays the env's.

Settings: ``env.image_size``, ``env.max_turns`` and ``env.invalid_penalty`` apply to every env that
has them (a game's config field of the same name; Sokoban sizes its image by ``tile_size``); the
game's own settings go in ``env.game`` (``{"max_position": 7}``, ``{"dim_room": [7, 7],
"num_boxes": 2}``, ``{"view": "full"}``), validated by the game's config class. Every other ``env.*``
field is VSI's.

What the pipeline asks of an env (``env.unwrapped``) is :class:`~a2c_ppo_acktr.envs.protocol.TextEnv`:
gymnasium's ``reset``/``step``, the reply parser, random, chance and oracle replies, what a record
keeps of an episode, the overview picture and ``get_state``/``set_state``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from a2c_ppo_acktr.common import entry_points
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.env_ids import (  # noqa: F401 (re-exported)
    CARD_IDS,
    CARD_NAMESPACE,
    MINIGRID_PREFIXES,
    OVERLAYS,
    SOKOBAN_ID,
    TESTED_IDS,
    VSI_ID,
    UnknownEnvError,
    canonical_id,
    is_vsi,
    overlay_path,
)

_SHARED_FIELDS = ("image_size", "max_turns", "invalid_penalty")


class GameConfigError(ValueError, UserError):
    """``env.game`` (or a shared ``env.*`` field) holds a setting the game refuses; the message says where to change
    it."""


# What the pipeline calls on an env (envs/protocol.TextEnv); a user's env class must have them all.
_TEXT_ENV_MEMBERS = (
    "reset",
    "step",
    "close",
    "episode_reward",
    "task_type",
    "parse",
    "random_reply",
    "chance_reply",
    "oracle_reply",
    "episode_fields",
    "overview_image",
    "get_state",
    "set_state",
)


def _user_env_class(spec: str) -> type:
    """The class ``env.env_id=module:Class`` names, checked against the env contract.

    Raises:
        EntryPointError: it cannot be loaded, is not a class, or lacks members of the contract.
    """
    cls = entry_points.load(spec, "env.env_id")
    if not isinstance(cls, type):
        raise entry_points.EntryPointError(f"env.env_id={spec!r} names a {type(cls).__name__}, not an env class")
    missing = [m for m in _TEXT_ENV_MEMBERS if not hasattr(cls, m)]
    if missing:
        raise entry_points.EntryPointError(
            f"env.env_id={spec!r}: {cls.__name__} lacks {missing} of the env contract "
            "(a2c_ppo_acktr.envs.protocol.TextEnv); "
            "a one-token game can subclass a2c_ppo_acktr.envs.cards.common.TokenGameEnv"
        )
    return cls


def env_class(env_id: str) -> type:
    """The env class behind ``env_id`` (imports its module)."""
    name = canonical_id(env_id)
    if entry_points.is_entry_point(name):
        return _user_env_class(name)
    if name == VSI_ID:
        from a2c_ppo_acktr.envs.vsi_env import VSIEnv

        return VSIEnv
    if name in CARD_IDS:  # the entry points the card games register with gymnasium
        from a2c_ppo_acktr.envs.cards import ENTRY_POINTS

        return entry_points.load(ENTRY_POINTS[CARD_NAMESPACE + name], "env.env_id")
    if name == SOKOBAN_ID:
        from a2c_ppo_acktr.envs.sokoban import ENTRY_POINTS

        return entry_points.load(ENTRY_POINTS[name], "env.env_id")
    from a2c_ppo_acktr.envs.minigrid_text import MiniGridTextEnv

    return MiniGridTextEnv


def game_config(env_cfg: Any) -> Any:
    """The game config an ``EnvConfig`` asks for: the game's config class with the shared fields it
    has and ``env.game`` applied (``env.game`` wins where both set a field). None for VSI (its settings
    are the ``EnvConfig`` itself) and for a user's env class without a ``config_class`` (it takes
    ``env.game`` as keyword arguments). The entry points call it before they load a model, so a bad
    setting stops a run in its first second.

    Raises:
        GameConfigError: ``env.game`` names a field the game does not have, or a value it refuses (the
            message names the env and the known fields, or the flag to change).
        UnknownEnvError, EntryPointError: ``env.env_id`` names no env.
    """
    name = canonical_id(env_cfg.env_id)
    if name == VSI_ID:
        if env_cfg.game:
            raise GameConfigError(
                f"env.game={env_cfg.game!r} is set but env.env_id={name!r} takes its settings from the other env.* "
                "fields; leave env.game empty"
            )
        return None
    cls = getattr(env_class(name), "config_class", None)
    if cls is None:
        return None
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: getattr(env_cfg, k) for k in _SHARED_FIELDS if k in known}
    if name.startswith(MINIGRID_PREFIXES):
        values["minigrid_id"] = name
    unknown = sorted(set(env_cfg.game) - known)
    if unknown:
        raise GameConfigError(
            f"env.game has {unknown}, which {name} does not take; its settings are {sorted(known - {'minigrid_id'})}"
        )
    values.update(env_cfg.game)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise GameConfigError(f"{name}: {e}; {_setting_hint(cls, str(e))}") from e


def _setting_hint(cls: type, message: str) -> str:
    """Where to change the setting an error names: the shared ``--env.<field>`` flag (with the game's
    smallest image size, when that is the one), else ``env.game``."""
    for key in _SHARED_FIELDS:
        if message.startswith(f"{key}="):
            floor = getattr(cls, "min_image_size", None) if key == "image_size" else None
            return f"pass --env.image_size {floor} (or more)" if floor else f"set it with --env.{key}"
    return f"set it in env.game (or env.{'/'.join(_SHARED_FIELDS)})"


def make_env(env_cfg: Any) -> Any:
    """One env for ``env_cfg.env_id``: the env class itself, or, with ``env.reward_fn``, that env
    behind :class:`~a2c_ppo_acktr.envs.reward_fn.ShapedReward`.

    Raises:
        UnknownEnvError: Unknown ``env.env_id``.
        EntryPointError: ``env.env_id`` or ``env.reward_fn`` names user code that cannot be loaded.
        ValueError: Bad ``env.game`` settings.
    """
    cls = env_class(env_cfg.env_id)
    cfg = game_config(env_cfg)
    if cfg is not None:
        env = cls(cfg)
    elif is_vsi(env_cfg.env_id):
        env = cls(env_cfg)
    else:
        try:
            env = cls(**env_cfg.game)
        except TypeError as e:
            raise GameConfigError(f"{env_cfg.env_id}: {e}; set its settings in env.game") from e
    if env_cfg.reward_fn:
        from a2c_ppo_acktr.envs.reward_fn import ShapedReward

        env = ShapedReward(env, entry_points.load(env_cfg.reward_fn, "env.reward_fn"), env_cfg.reward_fn)
    return env


def task_name(env_id: str) -> str:
    """The report category of a game (``numberline``, ``minigrid``, ...); VSI's are question types."""
    name = canonical_id(env_id)
    if name == VSI_ID:
        raise ValueError("VSI-v0 episodes are reported by question type, not by one task name")
    cls = env_class(name)
    return getattr(cls, "task_type_name", "") or cls.__name__

"""User code named by a setting: ``module.path:Name`` (Gymnasium's entry points, verl's reward files).

``env.env_id`` may name an env class and ``env.reward_fn`` a reward function this way. The form is
checked when the config is built (nothing is imported then); :func:`load` imports the object when an
env is made, with one-line errors for a module that cannot be imported or a name it lacks.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from a2c_ppo_acktr.common.errors import UserError

_FORM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


class EntryPointError(ValueError, UserError):
    """A ``module:Name`` setting that is malformed, or whose module or name cannot be loaded."""


def is_entry_point(text: str) -> bool:
    """Whether ``text`` has the ``module.path:Name`` form."""
    return bool(_FORM.match(text))


def load(spec: str, setting: str) -> Any:
    """The object ``spec`` (``module.path:Name``) names; ``setting`` (``env.env_id``) is named in errors.

    Raises:
        EntryPointError: malformed, the module cannot be imported (its own error is quoted), or it has
            no such name.
    """
    if not is_entry_point(spec):
        raise EntryPointError(f"{setting}={spec!r} is not of the form 'module.path:Name'")
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 (user code: any import-time error is reported in one line)
        raise EntryPointError(
            f"{setting}={spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {e}); "
            "is it on PYTHONPATH?"
        ) from e
    if not hasattr(module, name):
        raise EntryPointError(f"{setting}={spec!r}: module {module_name!r} has no {name!r}")
    return getattr(module, name)

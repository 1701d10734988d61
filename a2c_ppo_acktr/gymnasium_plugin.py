"""``gymnasium.make("VSI-v0")`` in any interpreter of an environment where vsi-ppo is installed.

Gymnasium 0.26-0.29 imported the plugins of the ``gymnasium.envs`` entry-point group when it was
imported (setup.py declares :func:`a2c_ppo_acktr.envs.register_envs` there); gymnasium 1.0 removed
that discovery, and this package needs gymnasium >= 1.0. So the installation also puts
``vsi_ppo_gymnasium.pth`` into site-packages (setup.py, ``build_py``). Its one line imports this
module when the interpreter starts, which only puts a finder first in ``sys.meta_path``. The finder
does nothing until ``gymnasium`` itself is imported; then, once gymnasium's ``__init__`` has run, it
registers this package's ids (``VSI-v0``, ``gym_cards/*``, ``Sokoban-v0``: entry-point strings, so no
env module, torch or open3d is imported) and takes itself out of ``sys.meta_path``.

An interpreter that never imports gymnasium pays for one small module import. Set
``VSI_PPO_NO_GYMNASIUM_PLUGIN=1`` to turn the hook off (the ids then register when
``a2c_ppo_acktr.envs`` is imported, as they always do). A failure while registering is a warning,
never a failed ``import gymnasium``.
"""

from __future__ import annotations

import os
import sys

DISABLE_ENV = "VSI_PPO_NO_GYMNASIUM_PLUGIN"


class _RegisterAfterLoad:
    """The loader of ``gymnasium``, wrapped so that :func:`_register` runs right after its module."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name):  # get_code, get_filename, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Hand the real loader back to the module before anything can look at it.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _register()


def _register() -> None:
    if "a2c_ppo_acktr.envs" in sys.modules:  # gymnasium imported by that package: it registers the ids itself
        return
    try:
        from a2c_ppo_acktr.envs import register_envs

        register_envs()
    except Exception as e:  # noqa: BLE001 - never break `import gymnasium` for a user who does not use these envs
        import warnings

        warnings.warn(
            f"vsi-ppo could not register its gymnasium ids ({type(e).__name__}: {e}); "
            f"`import a2c_ppo_acktr.envs` registers them",
            RuntimeWarning,
            stacklevel=2,
        )


class GymnasiumImportHook:
    """A ``sys.meta_path`` finder that answers only for ``gymnasium``, once: it asks the finders
    after it for the real spec and wraps its loader (:class:`_RegisterAfterLoad`)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium":
            return None
        uninstall()
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RegisterAfterLoad(spec.loader)
        return spec


def install() -> bool:
    """Put the hook first in ``sys.meta_path`` (idempotent). Returns whether it is installed: not when
    ``VSI_PPO_NO_GYMNASIUM_PLUGIN`` is set, nor when gymnasium is already imported (the ids are then
    registered by importing ``a2c_ppo_acktr.envs``)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return False
    if "gymnasium" in sys.modules:
        return False
    if not any(isinstance(f, GymnasiumImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, GymnasiumImportHook())  # before the path finder that would load it
    return True


def uninstall() -> None:
    """Remove the hook from ``sys.meta_path``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, GymnasiumImportHook)]


install()

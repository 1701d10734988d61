"""Import a script of ``bench/`` as a module for its tests (the folder is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_module(name: str) -> Iterator[ModuleType]:
    """Yield ``bench/<name>.py`` as module ``name`` (registered in ``sys.modules`` while in use, so
    its dataclasses can look their module up), for a ``yield from`` in a module-scoped fixture."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        sys.modules.pop(name, None)

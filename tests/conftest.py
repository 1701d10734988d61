"""Shared test fixtures: offline mode, a per-checkout tiny-model cache, tiny model paths, the loaded tiny model.

Offline variables are set in ``pytest_configure`` (before any test module imports
``huggingface_hub``, which reads them at import time), so no test can reach the network.
Tiny models are cached under pytest's cache directory (``.pytest_cache/d/vsi_cache``); the
cache key hashes everything that defines a tiny model, so a stale build is never reused. Their
weight seed is ``$VSI_TINY_SEED`` (default 0): the suite must pass with any seed, since another
CPU's rounding changes the weights as another seed does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    cache = getattr(config, "cache", None)  # None under `-p no:cacheprovider`: use a fresh temp dir
    os.environ["VSI_CACHE"] = (
        str(cache.mkdir("vsi_cache")) if cache is not None else tempfile.mkdtemp(prefix="vsi_cache_")
    )
    from a2c_ppo_acktr.tiny import TinySeedError, default_seed

    try:  # one line at start-up, not the same traceback in every test that builds a model
        default_seed()
    except TinySeedError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_report_header(config: pytest.Config) -> str:
    from a2c_ppo_acktr.tiny import SEED_ENV, default_seed

    return f"tiny builds: seed {default_seed()} (${SEED_ENV}, default 0)"


@pytest.fixture(scope="session")
def tiny_family_path() -> Callable[..., str]:
    """Factory: ``tiny_family_path(family, seed=None) -> str``, the cached tiny model directory
    (seed ``None``: ``$VSI_TINY_SEED``, else 0)."""
    from a2c_ppo_acktr.tiny import tiny_model_dir

    def get(family: str, seed: Optional[int] = None) -> str:
        return str(tiny_model_dir(family, seed=seed))

    return get


@pytest.fixture(scope="session")
def tiny_model_path(tiny_family_path: Callable[..., str]) -> str:
    """The cached tiny Qwen2.5-VL directory (the default ``tiny:qwen2_5_vl`` model, at ``$VSI_TINY_SEED``)."""
    return tiny_family_path("qwen2_5_vl")


@pytest.fixture(scope="module")
def loaded(tiny_model_path):
    """The tiny Qwen2.5-VL loaded on CPU (a ``LoadedVLM``), once per test module (its tests share it;
    ``helpers.fresh_policy`` builds a policy on a deep copy of its model)."""
    from a2c_ppo_acktr.policy.loading import load_vlm
    from helpers import tiny_model_cfg

    return load_vlm(tiny_model_cfg(tiny_model_path))


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """The mini benchmark (scripts/make_mini_vsibench.py): 2 rooms, 16 frames of 64x64 at 2 fps each,
    about 20 questions of all 10 types (~2 s); one per test module."""
    from helpers import mini_vsibench_module

    out = tmp_path_factory.mktemp("mini")
    mini_vsibench_module().make_mini_vsibench(out, scenes=2, seed=0, frames=16, size=64)
    return out


@pytest.fixture(scope="session")
def vsi_cache_dir() -> Path:
    """The session's ``$VSI_CACHE`` (tiny models live in its ``tiny`` subdirectory)."""
    return Path(os.environ["VSI_CACHE"])


@pytest.fixture(autouse=True)
def one_multiprocess_test_at_a_time(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Under pytest-xdist (``scripts/test.sh`` runs two workers) the tests that start several
    processes (marker ``multiprocess``) take turns: two 2-rank DeepSpeed jobs at once would put four
    busy processes on a 2-core machine. A file lock in the workers' shared temp directory orders them;
    the other worker goes on with single-process tests meanwhile."""
    if request.node.get_closest_marker("multiprocess") is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    import fcntl

    with open(tmp_path_factory.getbasetemp().parent / "multiprocess.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test computes with one intra-op thread: the tiny models' matrices are a few dozen wide,
    so threads only add contention on a shared CPU (and CPU bf16 rounding can depend on their number)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

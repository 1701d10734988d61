"""Timing helpers the benchmark scripts share (imported as ``timing`` from ``bench/``)."""
from __future__ import annotations

import resource
import time
from typing import Callable, Sequence


def best_interleaved(fns: Sequence[Callable[[], object]], repeats: int, warmup: bool = True) -> list[float]:
    """Best-of-``repeats`` wall time of each function, run alternately so that load drift on a shared
    CPU hits all of them alike (the minimum is the least noisy estimate). ``warmup`` calls each once
    first (JIT, caches, thread pools); turn it off when a call changes state the timing depends on."""
    if warmup:
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return [min(t) for t in times]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

"""Timing helper shared by the benchmark scripts (run from the repo root)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_time_s(fn: Callable[[], object], runs: int) -> float:
    """Best wall time of `runs` calls of `fn`, in seconds (the least disturbed run)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best

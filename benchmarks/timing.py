"""The benchmarks' one timing loop: warm calls, then the median of back-to-back timed calls."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeat: int, warm: int = 2) -> float:
    """``warm`` untimed calls of ``fn``, then the median wall time in seconds of ``repeat`` calls."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)

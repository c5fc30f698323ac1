"""Peak extra memory of one call: the resident-set high-water mark on Linux, tracemalloc elsewhere.

The one home of the peak-memory probe: the bench measures each case's prepared call with
:func:`peak_extra_memory`, and the memory tests' child processes (tests/rss_probe.py) use
:func:`status_kib` and :func:`reset_peak` around the call they check.
"""

from __future__ import annotations

import ctypes
import tracemalloc
from typing import Any, Callable

from qlinear import _native


def status_kib(field: str) -> int | None:
    """A field of /proc/self/status (``VmRSS``, ``VmHWM``) in KiB; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> int | None:
    """Return the heap's free pages to the system and restart the peak resident set (VmHWM)
    from the current one; the current resident set in KiB, or None where Linux's
    /proc/self/clear_refs is not available.

    Memory the allocator kept from earlier calls would otherwise be reused by the measured
    call without raising the resident set, hence the ``malloc_trim`` first.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set restarts from the current one
    except OSError:
        return None
    return status_kib("VmRSS")


def peak_extra_memory(fn: Callable[[], Any]) -> tuple[int, str]:
    """Peak bytes one call adds to the process, output included, and how it was measured.

    On Linux: the resident-set high-water mark above the resident size before the call, which
    sees the native engine's C allocations (tracemalloc does not). Elsewhere: tracemalloc's
    peak (NumPy's allocations only). The native engine's output pool is emptied first, so that
    the call allocates everything it uses.
    """
    if _native.available() and hasattr(_native._C, "pool_clear"):
        _native._C.pool_clear()
    base = reset_peak()
    if base is not None:
        out = fn()
        peak = status_kib("VmHWM")
        del out
        if peak is not None:
            return max(0, peak - base) * 1024, "rss"
    return _peak_traced(fn), "tracemalloc"


def _peak_traced(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        del out
    finally:
        tracemalloc.stop()
    return peak

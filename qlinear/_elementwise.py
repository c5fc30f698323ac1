"""Element-wise passes (quantize, dequantize, round-and-saturate) in large blocks, on all cores
for large tensors.

A tensor is seen as (pre, C, post) where per-axis parameters run along C (per-tensor
parameters: C = 1). Each block of at most ``BLOCK`` elements goes through every pass of its
kernel before the next block starts. Results are the same bits as one whole-array pass: every
operation is element-wise.

Measured on the 2-core benchmark machine (16M-element QuantizeLinear, six NumPy passes per
block): blocks of 1 Mi elements ran at 14 ms single-threaded, 256 Ki at 14 ms and 64 Ki at
25 ms (NumPy's cost per call outweighs any cache gain; the 32 MiB L3 holds a 1 Mi block's
passes). Threads pay only with few, large tasks: every handoff of the GIL between two threads
that call NumPy back to back costs a thread wake-up, which is slow in this VM (~0.1-0.3 ms).
A pool task per 256 Ki block made the 16M case *slower* (24 ms) than one thread; one task per
thread, each running its share of 1 Mi blocks, took 8.4 ms. Below 1 Mi elements one thread
does all (0.9 ms single against 0.65 ms split at 1 Mi, a loss below that).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

BLOCK = 1 << 20
# From this many elements on, the blocks are shared among the threads, one task per thread.
PARALLEL_MIN = 1 << 21

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="qlinear-ew")
        return _pool


def scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A per-thread float32 buffer of ``shape`` (one block), reused across blocks and calls."""
    size = math.prod(shape)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(max(size, 1), dtype=np.float32)
    return buf[:size].reshape(shape)


def _blocks(pre: int, c: int, post: int, block: int) -> list[tuple[slice, slice, slice]]:
    everything = slice(None)
    if post >= block:
        return [(slice(p, p + 1), slice(k, k + 1), slice(q, q + block))
                for p in range(pre) for k in range(c) for q in range(0, post, block)]
    if c * post >= block:
        step = block // post
        return [(slice(p, p + 1), slice(k, k + step), everything) for p in range(pre) for k in range(0, c, step)]
    step = max(1, block // max(1, c * post))
    return [(slice(p, p + step), everything, everything) for p in range(0, pre, step)]


def as_3d(shape: tuple[int, ...], axis: int | None) -> tuple[int, int, int]:
    """(pre, C, post) for a tensor whose parameters run along ``axis`` (None: per tensor)."""
    if axis is None:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def run_blocked(kernel: Callable[..., None], arrays: Sequence[np.ndarray], params: Sequence[np.ndarray]) -> None:
    """kernel(*array_blocks, *param_blocks) over blocks of 3-D arrays of one shape (pre, C, post).

    ``params`` are 0-d (per tensor) or shaped (C, 1) (per axis); each block gets its slice.
    """
    pre, c, post = arrays[0].shape
    total = pre * c * post
    if total == 0:
        return
    if total <= BLOCK and total < PARALLEL_MIN:  # the common case: one call, no slicing
        kernel(*arrays, *params)
        return
    threads = _threads() if total >= PARALLEL_MIN else 1
    blocks = _blocks(pre, c, post, min(BLOCK, -(-total // threads)))
    threads = min(threads, len(blocks))

    def share(i: int) -> None:
        for block in blocks[i::threads]:
            kernel(*(a[block] for a in arrays), *(p if p.ndim == 0 else p[block[1]] for p in params))

    if threads == 1:
        share(0)
        return
    errors = np.geterr()  # NumPy's error state is per thread: the helpers take the caller's

    def helper(i: int) -> None:
        with np.errstate(**errors):
            share(i)

    pool = _get_pool()
    helpers = [pool.submit(helper, i) for i in range(1, threads)]
    try:
        share(0)
    finally:
        for h in helpers:
            h.result()

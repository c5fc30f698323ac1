"""Element-wise passes (quantize, dequantize, round-and-saturate) of the NumPy engine, in blocks.

A tensor is seen as (pre, C, post) where per-axis parameters run along C (per-tensor
parameters: C = 1). Each block of at most ``BLOCK`` elements goes through every pass of its
kernel before the next block starts, so the temporaries are one block, never the whole
tensor. Results are the same bits as one whole-array pass: every operation is element-wise.
(Blocks of 1 Mi elements: NumPy's cost per call stays small against the work, and a block's
passes stay in the caches.) One thread: the native engine is the fast, threaded path; this
one stays the plain second implementation.
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Sequence

import numpy as np

BLOCK = 1 << 20

_local = threading.local()


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
    if total <= BLOCK:  # the common case: one call, no slicing
        kernel(*arrays, *params)
        return
    for block in _blocks(pre, c, post, BLOCK):
        kernel(*(a[block] for a in arrays), *(p if p.ndim == 0 else p[block[1]] for p in params))

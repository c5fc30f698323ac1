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

from ._requant import round_saturate_block, saturation_params

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


# --------------------------------------------------------------------------- requantization


def round_saturate(values: np.ndarray, y_zero_point: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """sat_T(rne(values) + y_zero_point) for a float32 array (overwritten) and a per-tensor zp."""
    out = np.empty(values.shape, dtype=out_dtype)
    shape3 = as_3d(values.shape, None)
    run_blocked(round_saturate_block, [values.reshape(shape3), out.reshape(shape3)],
                saturation_params(y_zero_point.reshape(()), out_dtype))
    return out


def _scale_round_saturate_block(values: np.ndarray, out: np.ndarray, scale: np.ndarray, lo: np.ndarray,
                                hi: np.ndarray, zp: np.ndarray) -> None:
    values *= scale  # float32(float32(acc) · m): one float32 multiplication
    round_saturate_block(values, out, lo, hi, zp)


def _bias_scale_round_saturate_block(values: np.ndarray, out: np.ndarray, bias: np.ndarray, scale: np.ndarray,
                                     lo: np.ndarray, hi: np.ndarray, zp: np.ndarray) -> None:
    values += bias  # exact: the caller guarantees |acc| + |B| <= 2**24
    _scale_round_saturate_block(values, out, scale, lo, hi, zp)


def requantize_channels(values: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray,
                        bias: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """sat_T(rne((values + bias) · multiplier) + y_zero_point) for float32 ``values`` of shape
    (N, M, ...) (overwritten), a per-tensor (0-d) or per-channel ((M,)) float32 multiplier and
    an optional float32 bias per channel ((M,)) whose sums with ``values`` are exact.

    The bias addition and the multiplication run block by block with the rounding, while each
    block is in cache. ``out``: where to write (a contiguous array of values' shape and
    y_zero_point's dtype), a new array if None.
    """
    if out is None:
        out = np.empty(values.shape, dtype=y_zero_point.dtype)
    per_channel = multiplier.ndim == 1 or bias is not None
    shape3 = as_3d(values.shape, 1 if per_channel else None)
    scale = multiplier.reshape(-1, 1) if multiplier.ndim == 1 else multiplier.reshape(())
    params = [scale, *saturation_params(y_zero_point.reshape(()), out.dtype)]
    kernel = _scale_round_saturate_block
    if bias is not None:
        kernel = _bias_scale_round_saturate_block
        params.insert(0, bias.reshape(-1, 1))
    # An infinite product saturates and a tiny one rounds to 0 or a denormal: float32
    # arithmetic as the contract intends, not an error (even under np.errstate(all="raise")).
    with np.errstate(over="ignore", under="ignore"):
        run_blocked(kernel, [values.reshape(shape3), out.reshape(shape3)], params)
    return out

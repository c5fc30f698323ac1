"""Requantization: int32 accumulator → 8-bit output, in float32 exactly as the contract orders it."""

from __future__ import annotations

import functools

import numpy as np

try:  # the ufunc behind np.clip, without its Python wrapper (~4 us a call, which small outputs feel)
    from numpy._core.umath import clip as _clip
except ImportError:  # NumPy < 2
    _clip = np.clip

from . import dtypes
from ._elementwise import as_3d, run_blocked


@functools.lru_cache(maxsize=None)
def _range(dtype: np.dtype) -> tuple[np.float32, np.float32]:
    lo, hi = dtypes.INT_RANGE[dtype]  # exact in float32: every integer type here has <= 16 bits
    return np.float32(lo), np.float32(hi)


def saturation_params(y_zero_point: np.ndarray, out_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(min - zp, max - zp, zp) as float32: the clamp bounds before zp is added, and zp."""
    if y_zero_point.size == 1:  # per tensor: the same few values on every call
        return _scalar_saturation(np.dtype(out_dtype), int(y_zero_point.reshape(-1)[0]), y_zero_point.ndim)
    lo, hi = _range(np.dtype(out_dtype))
    zp = y_zero_point.astype(np.float32)
    return lo - zp, hi - zp, zp


@functools.lru_cache(maxsize=1024)
def _scalar_saturation(dtype: np.dtype, zp: int, ndim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = _range(dtype)
    z = np.full((1,) * ndim, zp, dtype=np.float32)
    params = (np.asarray(lo - z), np.asarray(hi - z), z)
    for arr in params:
        arr.flags.writeable = False  # shared between calls
    return params


def round_saturate_block(values: np.ndarray, out: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                         zp: np.ndarray, may_have_nan: bool = False) -> None:
    """out = sat_T(rne(values) + zp) for one block; ``values`` (float32) is overwritten.

    Clamping to [min - zp, max - zp] before adding zp keeps the addition an exact sum of small
    integers (|v| <= 510) even where ``values`` was huge or infinite. With ``may_have_nan``,
    NaN is sent to the lower bound, i.e. T's minimum (QuantizeLinear's documented result);
    requantization never produces NaN because its multiplier is checked finite.
    """
    if may_have_nan and np.isnan(values.min()):  # min() propagates NaN: one fast pass
        np.copyto(values, np.float32(-np.inf), where=np.isnan(values))
    np.rint(values, out=values)
    _clip(values, lo, hi, out=values)
    values += zp
    np.copyto(out, values, casting="unsafe")  # exact: every value is an integer of T's range


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


def multiplier(in_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray) -> np.ndarray:
    """float32(float32(in_scale · w_scale) / y_scale), in that order (all operands float32)."""
    # Overflow to inf is reported by the caller's finiteness check; underflow to a denormal or
    # 0 is float32 arithmetic (a zero multiplier requantizes everything to y_zero_point).
    with np.errstate(over="ignore", under="ignore"):
        return (in_scale * w_scale) / y_scale

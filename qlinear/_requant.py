"""Requantization: int32 accumulator → 8-bit output, in float32 exactly as the contract orders it.

The contract's arithmetic on one block (the witness every engine matches); the blocked passes
of the NumPy engine that run it over whole tensors are in ``qlinear._elementwise``."""

from __future__ import annotations

import functools

import numpy as np

try:  # the ufunc behind np.clip, without its Python wrapper (~4 us a call, which small outputs feel)
    from numpy._core.umath import clip as _clip
except ImportError:  # NumPy < 2
    _clip = np.clip

from . import dtypes


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


def multiplier(in_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray) -> np.ndarray:
    """float32(float32(in_scale · w_scale) / y_scale), in that order (all operands float32)."""
    # Overflow to inf is reported by the caller's finiteness check; underflow to a denormal or
    # 0 is float32 arithmetic (a zero multiplier requantizes everything to y_zero_point).
    with np.errstate(over="ignore", under="ignore"):
        return (in_scale * w_scale) / y_scale

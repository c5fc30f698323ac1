"""Requantization: int32 accumulator → 8-bit output, in float32 exactly as the contract orders it."""

from __future__ import annotations

import numpy as np


def round_saturate(values: np.ndarray, y_zero_point: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """sat_T(rne(values) + y_zero_point) for a float32 array, which is overwritten.

    ``y_zero_point`` is an integer array broadcastable to ``values``. Clipping to
    [min - zp, max - zp] before adding zp keeps every addition an exact sum of small
    integers (|v| <= 510), even where ``values`` was huge or infinite.
    """
    info = np.iinfo(out_dtype)
    zp = y_zero_point.astype(np.float32)
    np.rint(values, out=values)
    np.clip(values, info.min - zp, info.max - zp, out=values)
    values += zp
    return values.astype(out_dtype)


def requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    """sat_T3(rne(float32(float32(acc) · multiplier)) + y_zero_point), T3 = y_zero_point's dtype.

    ``float32(acc)`` rounds to nearest (NumPy's int32 → float32 cast), which is part of the
    contract above 2**24. ``multiplier`` is float32 and broadcasts against ``acc``.
    """
    values = acc.astype(np.float32)
    values *= multiplier
    return round_saturate(values, y_zero_point, y_zero_point.dtype)


def multiplier(in_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray) -> np.ndarray:
    """float32(float32(in_scale · w_scale) / y_scale), in that order (all operands float32)."""
    with np.errstate(over="ignore"):  # overflow to inf is reported by the caller's finiteness check
        return (in_scale * w_scale) / y_scale

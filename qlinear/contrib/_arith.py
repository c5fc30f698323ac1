"""Float32 arithmetic as onnxruntime's x86 kernels perform it: fused multiply-add, cvtps2dq,
MlasQuantizeLinear. Every function takes and returns NumPy arrays and is element-wise."""

from __future__ import annotations

import numpy as np

from .. import dtypes

F32 = np.float32
F64 = np.float64
INT32_MIN = -(2 ** 31)


def fma(x, y, z) -> np.ndarray:
    """float32 fma(x, y, z): x·y + z rounded once to float32 (round to nearest even).

    Why this is exact. x and y are float32 (24-bit significands), so x·y needs at most 48 bits
    and is exact in float64 (53 bits; float32's exponent range is far inside float64's, so no
    overflow, underflow or subnormal loss). The float64 sum s = x·y + z may round; rounding
    that s again to float32 is then a *double rounding*, wrong when s lands exactly on a float32
    halfway point that the exact sum was not on. TwoSum (Knuth; exact in float64 without
    overflow) gives the rounding error e of s exactly. Where e != 0, s is replaced by its
    neighbour toward the exact sum when its last significand bit is 0, i.e. s is rounded to
    *odd* instead of to nearest; rounding to odd at 53 bits and then to nearest at 24 bits
    (53 >= 24 + 2) equals one rounding to nearest of the exact sum (Boldo and Melquiond,
    "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
    IEEE TC 2008). An inexact s is never a float32 midpoint after this step, and an exact s
    is the exact sum. Infinite or NaN operands skip the correction (s is already right).
    """
    x = np.asarray(x, F32)
    y = np.asarray(y, F32)
    z = np.asarray(z, F32)
    p = x.astype(F64) * y  # exact
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + z
        # TwoSum(p, z): e = (p - (s - bb)) + (z - bb) with bb = s - p, exact for finite s.
        bb = s - p
        e = (p - (s - bb)) + (z.astype(F64) - bb)
        fix = (e != 0) & np.isfinite(e) & ((s.view(np.int64) & 1) == 0)
        if np.any(fix):
            s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
        return s.astype(F32)


def cvt(values: np.ndarray) -> np.ndarray:
    """x86 cvtps2dq: float32 → int32 rounding half to even; NaN and |v| >= 2**31 give INT_MIN
    (the "integer indefinite" value). Returned as int64 so callers can add and clamp safely."""
    v = np.asarray(values, F32)
    out = np.full(v.shape, INT32_MIN, dtype=np.int64)
    ok = np.abs(v) < F32(2 ** 31)  # False for NaN
    np.copyto(out, np.rint(v), where=ok, casting="unsafe")
    return out


def saturate(ints: np.ndarray, dtype: np.dtype) -> np.ndarray:
    lo, hi = dtypes.INT_RANGE[np.dtype(dtype)]
    return np.clip(ints, lo, hi).astype(dtype)


def mlas_quantize(values, y_scale: np.float32, y_zero_point: int, dtype: np.dtype) -> np.ndarray:
    """MlasQuantizeLinear: sat(cvt(clamp(f(v / y_scale), min - zp, max - zp)) + zp).

    The division is one float32 division (not a multiplication by a reciprocal); the clamp
    comes before the conversion, so no value reaches cvt's INT_MIN; NaN becomes the type's
    minimum (the clamp's max(NaN, lo) returns lo in MLAS's operand order).
    """
    dtype = np.dtype(dtype)
    lo, hi = dtypes.INT_RANGE[np.dtype(dtype)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.divide(np.asarray(values, F32), F32(y_scale), dtype=F32)
    if q.ndim == 0:
        q = q.reshape(1)  # ufuncs' out= needs an array
        return _quantize_inplace(q, lo, hi, y_zero_point, dtype).reshape(())
    return _quantize_inplace(q, lo, hi, y_zero_point, dtype)


def _quantize_inplace(q: np.ndarray, lo: int, hi: int, zp: int, dtype: np.dtype) -> np.ndarray:
    """clamp (NaN to the low end), round half to even, add zp, in q's own float32 buffer."""
    # fmax returns its other operand for NaN: NaN -> lo - zp, as MLAS's max(NaN, lo)
    np.fmax(q, F32(lo - zp), out=q)
    np.minimum(q, F32(hi - zp), out=q)
    np.rint(q, out=q)
    if dtype.itemsize <= 2:
        # q + zp is an integer in [lo, hi], |.| <= 65535 < 2**24: exact in float32, and the
        # cast is exact
        q += F32(zp)
        return q.astype(dtype)
    return (q.astype(np.int64) + zp).astype(dtype)


def requantize_multiply(values, multiplier, y_zero_point: int, dtype: np.dtype) -> np.ndarray:
    """MlasRequantizeOutput's epilogue: sat(rne(clamp(f(v · m), min - zp, max - zp)) + zp)."""
    lo, hi = dtypes.INT_RANGE[np.dtype(dtype)]
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.asarray(values, F32) * np.asarray(multiplier, F32)
    q = np.clip(q, F32(lo - y_zero_point), F32(hi - y_zero_point))
    return (np.rint(q).astype(np.int64) + y_zero_point).astype(dtype)

"""QLinearMatMul-21 with float8 operands or a float8 output (FORMATS.md Part A, Part B §5).

Every float8 value is an integer multiple of 2**e (e = the format's smallest subnormal exponent:
-9, -10, -16, -17 for e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), and an 8-bit integer minus its zero
point is an integer (e = 0). So each centered operand is an integer number of units, and the dot
product is an exact integer sum S times 2**(ea + eb):

- in int64 when K · max|ia| · max|ib| < 2**63 (e4m3 × e4m3 up to K ≈ 1.5e8, e5m2 × int8 up to
  K ≈ 9.6e6: Part B §5's table);
- else (e5m2 × e5m2: one product can pass 2**63) each operand is split into a high and a low
  half, four int64 products are summed and the exact total is assembled in Python integers.

S · 2**(ea + eb) is then rounded once to float32 (the accumulator), and the 8-bit contract's
float32 requantization follows: m = float32(float32(a_scale · b_scale) / y_scale), y =
float32(acc · m), then rne + zero point + saturation for an integer output, or + zero point and
the saturating conversion for a float8 output (the operator has no ``saturate`` attribute).
Two 8-bit operands keep the 8-bit contract's wrap32 accumulator.

Non-finite operands (float8 NaN, e5m2 ±inf) make the outputs they reach what IEEE arithmetic
gives the centered values' dot product (computed in float64 for those outputs only): NaN where a
NaN, an inf · 0 or inf − inf meets, else ±inf.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _validate as v
from . import dtypes

_OPERANDS = tuple(t for t in dtypes.TYPES if (t.is_int and t.bits == 8) or (t.is_float and t.bits == 8))
_SCALES = (dtypes.F32, dtypes.F16, dtypes.BF16)


def _names(types) -> str:
    return ", ".join(t.name for t in types)


def operand(op: str, name: str, value: Any) -> tuple[np.ndarray, dtypes.QType]:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array of type {_names(_OPERANDS)}; got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if t is None or t not in _OPERANDS:
        raise TypeError(f"{op}: {name} must have type {_names(_OPERANDS)}; got dtype {arr.dtype}")
    return arr, t


def scale(op: str, name: str, value: Any, divides: bool = False) -> np.ndarray:
    """A float32, float16 or bfloat16 scale (a Python float is float32), widened exactly to float32."""
    if isinstance(value, float):
        return v.nonzero_scale(op, name, value) if divides else v.scale(op, name, value)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a float or a NumPy array of type {_names(_SCALES)}; "
                        f"got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if arr.dtype != np.float64 and (t is None or t not in _SCALES):
        raise TypeError(f"{op}: {name} must have type {_names(_SCALES)}; got dtype {arr.dtype}")
    wide = arr.astype(np.float32) if t in (dtypes.F16, dtypes.BF16) else arr  # exact
    return v.nonzero_scale(op, name, wide) if divides else v.scale(op, name, wide)


def _units(arr: np.ndarray, t: dtypes.QType) -> tuple[np.ndarray, np.ndarray | None]:
    """(float64 units, float64 values or None): an array as integer multiples of 2**e, held
    exactly in float64 (|units| < 2**34); non-finite float8 codes as 0 units, their float64
    values returned for the IEEE pass."""
    if t.is_int:
        return arr.astype(np.float64), None
    f = t.decode(arr).astype(np.float64)
    finite = np.isfinite(f)
    if finite.all():
        f *= 2.0 ** -t.fmt.unit_exponent  # exact: a power of two, integers < 2**34
        return f, None
    units = np.where(finite, f, 0.0) * 2.0 ** -t.fmt.unit_exponent
    return units, f


def _exact_dot(ia: np.ndarray, ib: np.ndarray, bound_a: int, bound_b: int, k: int) -> tuple[np.ndarray, bool]:
    """(S, is_int64): the exact integer matmul of unit arrays (float64 holding integers below
    2**34), as int64 when it fits, else an object array of Python ints."""
    if k * bound_a * bound_b < 2 ** 53:
        # float64 BLAS (multi-threaded, ~100x NumPy's integer matmul), exact: every product is an
        # integer of magnitude <= bound_a * bound_b and every partial sum, in whatever order and
        # blocking the BLAS adds them, with or without fused multiply-add, an integer of
        # magnitude <= K * bound_a * bound_b < 2**53, which float64 holds exactly; so every
        # floating-point operation is exact and the result is the exact integer sum. (e4m3 x e4m3:
        # up to K ~ 1.7e5 at the formats' largest values; the bounds are the data's own maxima.)
        return np.matmul(ia, ib).astype(np.int64), True
    ia, ib = ia.astype(np.int64), ib.astype(np.int64)  # exact: integers below 2**34
    if k * bound_a * bound_b < 2 ** 63:
        return np.matmul(ia, ib), True
    s = max(bound_a.bit_length(), bound_b.bit_length()) // 2 + 1
    mask = (1 << s) - 1
    ah, al = ia >> s, ia & mask  # ia = ah·2^s + al, exactly (arithmetic shift)
    bh, bl = ib >> s, ib & mask
    # each partial product < 2**(2·(bits - s) + log2 K): inside int64 for these formats' K
    hh, hl, lh, ll = (np.matmul(ah, bh), np.matmul(ah, bl), np.matmul(al, bh), np.matmul(al, bl))
    total = (hh.astype(object) * (1 << (2 * s)) + (hl.astype(object) + lh.astype(object)) * (1 << s)
             + ll.astype(object))
    return total, False


def _round_to_f32(total: np.ndarray, exponent: int) -> np.ndarray:
    """float32(total · 2**exponent) rounded once, for an object array of Python ints."""
    out = np.empty(total.shape, np.float32)
    flat = out.reshape(-1)
    for i, n in enumerate(total.reshape(-1)):
        n = int(n)
        mag = abs(n)
        extra = mag.bit_length() - 24
        if extra > 0:  # keep 24 significant bits, ties to even
            q, r = mag >> extra, mag & ((1 << extra) - 1)
            half = 1 << (extra - 1)
            if r > half or (r == half and q & 1):
                q += 1
            mag = q << extra
        val = math.ldexp(float(mag), exponent)  # exact: 24 bits and a power of two
        flat[i] = np.float32(-val if n < 0 else val)
    return out


def qlinear_matmul(op: str, a: Any, a_scale: Any, a_zero_point: Any, b: Any, b_scale: Any, b_zero_point: Any,
                   y_scale: Any, y_zero_point: Any, operand_param) -> np.ndarray:
    """QLinearMatMul-21 for float8 operands or output (see the module notes); ``operand_param``
    is matmul.py's per-tensor/per-row/per-column parameter check."""
    a, at = operand(op, "a", a)
    b, bt = operand(op, "b", b)
    for name, zp in (("a_zero_point", a_zero_point), ("b_zero_point", b_zero_point), ("y_zero_point", y_zero_point)):
        if zp is None:
            raise TypeError(f"{op}: {name} is required")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: a and b must have rank >= 1; got shapes {a.shape} and {b.shape}")
    azp, _ = operand(op, "a_zero_point", a_zero_point)
    bzp, _ = operand(op, "b_zero_point", b_zero_point)
    yzp, yt = operand(op, "y_zero_point", y_zero_point)
    if azp.dtype != a.dtype or bzp.dtype != b.dtype:
        which, want, got = ("a_zero_point", a.dtype, azp.dtype) if azp.dtype != a.dtype else ("b_zero_point", b.dtype, bzp.dtype)
        raise TypeError(f"{op}: {which} must have the type of its operand ({want}); got dtype {got}")
    a_s = scale(op, "a_scale", a_scale)
    b_s = scale(op, "b_scale", b_scale)
    y_s = v.per_tensor(op, "y_scale", scale(op, "y_scale", y_scale, divides=True))
    yzp = v.per_tensor(op, "y_zero_point", yzp)
    v.same_shape(op, "a_scale", a_s, "a_zero_point", azp)
    v.same_shape(op, "b_scale", b_s, "b_zero_point", bzp)
    for name, z, t in (("a_zero_point", azp, at), ("b_zero_point", bzp, bt), ("y_zero_point", yzp, yt)):
        if t.is_float and not np.isfinite(t.decode(z)).all():
            raise ValueError(f"{op}: {name} must be finite; got {t.decode(z).ravel()[~np.isfinite(t.decode(z).ravel())][0]}")
    a_s = operand_param(op, "a_scale", a_s, "a", a.shape)
    azp = operand_param(op, "a_zero_point", azp, "a", a.shape)
    b_s = operand_param(op, "b_scale", b_s, "b", b.shape)
    bzp = operand_param(op, "b_zero_point", bzp, "b", b.shape)
    ka, kb = a.shape[-1], (b.shape[-2] if b.ndim > 1 else b.shape[0])
    if ka != kb:
        raise ValueError(f"{op}: a and b cannot be multiplied: a has shape {a.shape} (K = {ka}) "
                         f"but b has shape {b.shape} (K = {kb})")
    try:
        out_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (
            ((a.shape[-2],) if a.ndim > 1 else ()) + ((b.shape[-1],) if b.ndim > 1 else ()))
    except ValueError:
        raise ValueError(f"{op}: the batch dimensions of a {a.shape[:-2]} and b {b.shape[:-2]} do not broadcast") from None
    v.check_size(op, "the output's int64 accumulator", out_shape, 8)

    a2 = a[None, :] if a.ndim == 1 else a  # numpy.matmul's 1-D rule: computed as matrices,
    b2 = b[:, None] if b.ndim == 1 else b  # the added axis dropped at the end
    ia, fa = _units(a2, at)
    ib, fb = _units(b2, bt)
    za, _ = _units(azp, at)
    zb, _ = _units(bzp, bt)
    ia = ia - za  # exact in float64: |units| < 2**34 each
    ib = ib - zb
    bound_a = int(np.abs(ia).max(initial=0))
    bound_b = int(np.abs(ib).max(initial=0))
    ea = 0 if at.is_int else at.fmt.unit_exponent
    eb = 0 if bt.is_int else bt.fmt.unit_exponent
    total, in_int64 = _exact_dot(ia, ib, bound_a, bound_b, ka)
    if at.is_int and bt.is_int:  # two 8-bit operands: the 8-bit contract's wrap32 accumulator
        acc = ((total + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.float32)
    elif in_int64:
        # int64 -> float32 rounds once; the power-of-two scaling is exact (these sums stay far
        # inside float32's normal range: at least 2**-34 per unit, at most 2**63 units)
        acc = np.ldexp(total.astype(np.float32), ea + eb).astype(np.float32)
    else:
        acc = _round_to_f32(total, ea + eb)
    if fa is not None or fb is not None:
        # non-finite operands: IEEE float64 on the centered values, for the outputs they reach
        ca = fa - za * 2.0 ** ea if fa is not None else ia * 2.0 ** ea  # exact in float64
        cb = fb - zb * 2.0 ** eb if fb is not None else ib * 2.0 ** eb
        with np.errstate(invalid="ignore", over="ignore"):
            special = np.matmul(ca, cb)
        acc = np.where(np.isfinite(special), acc, special.astype(np.float32))
    with np.errstate(over="ignore", under="ignore"):
        m = (a_s * b_s) / y_s  # float32(float32(a_scale · b_scale) / y_scale)
    m = v.finite_multiplier(op, np.asarray(m, np.float32), "a_scale * b_scale / y_scale")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.asarray(np.multiply(acc, m, dtype=np.float32)).reshape(out_shape)
    if yt.is_int:
        lo, hi = np.float32(yt.lo), np.float32(yt.hi)
        z = np.float32(int(yzp))
        y = np.rint(y)
        y = np.fmin(np.fmax(y, lo - z), hi - z) + z  # NaN -> T's min, as QuantizeLinear
        return y.astype(yt.dtype)
    z = np.float32(yt.decode(yzp).reshape(()))
    if z != 0:
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.add(y, z, dtype=np.float32)
    return yt.encode(np.asarray(y, np.float32), True)


def node_problem(version: int, elems: dict[int, int]) -> str | None:
    """Why a QLinearMatMul node cannot run, from its inputs' ONNX element types (input index:
    element type; 0 unknown), or None: version 10 takes 8-bit operands and float32 scales,
    version 21 also float8 operands and float16/bfloat16 scales."""
    for i, elem in elems.items():
        if not elem:
            continue
        try:
            t = dtypes.from_onnx(elem)
        except KeyError:
            t = None
        if i in (1, 4, 6):
            ok = t is dtypes.F32 or (version >= 21 and t in _SCALES)
        else:
            ok = t is not None and t in _OPERANDS and (version >= 21 or (t.is_int and t.bits == 8))
        if not ok:
            name = t.name if t is not None else f"ONNX element type {elem}"
            return f"input {i} is {name}, which QLinearMatMul-{version} does not take"
    return None

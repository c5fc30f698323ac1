"""Independent, plainly written oracle for qlinear's six operators.

Written straight from /work/shared/SEMANTICS.md and the ONNX operator pages, sharing no code
with the package under test. It is slow on purpose:

* integer accumulation in int64 (exact: |term| <= 255 * 255, so even 10**9 terms fit),
  with an explicit Python loop over the reduction (kernel taps and input channels for
  convolutions, k for matrix products); only batch, output channels/columns and output
  pixels are vectorized;
* requantization with explicit float32 operations in the contract's order;
* wrap32 applied once, to the exact sum;
* its own padding / auto_pad / output-shape computation taken from the spec text, and the
  window gathered by index arithmetic (no padded copy, no im2col).

The oracle does not validate its inputs; the tests only feed it valid ones.
"""

from __future__ import annotations

import itertools

import numpy as np

INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.int32): (-(2**31), 2**31 - 1),
}


# ----------------------------------------------------------------------------- small helpers


def wrap32(v):
    """Two's-complement wrap of exact integers (int64 array) to int32."""
    v = np.asarray(v, dtype=np.int64)
    return (((v + 2**31) % 2**32) - 2**31).astype(np.int32)


def f32(v):
    """A scale as float32 (Python floats and float64 are rounded to float32 first)."""
    return np.asarray(v).astype(np.float32)


def zero_point(zp, tensor_dtype):
    """(int64 values, dtype) of a zero point; None means 0, a Python int takes tensor_dtype."""
    if zp is None:
        return np.zeros((), np.int64), np.dtype(tensor_dtype)
    if isinstance(zp, (int, np.integer)) and not isinstance(zp, np.ndarray):
        dt = np.dtype(tensor_dtype) if isinstance(zp, int) else np.asarray(zp).dtype
        return np.asarray(int(zp), dtype=np.int64), dt
    zp = np.asarray(zp)
    return zp.astype(np.int64), zp.dtype


def saturate_round(v_f32, zp_int64, out_dtype):
    """sat_T( rne(v) + zp ) for a float32 array v; NaN must not occur here."""
    lo, hi = INT_RANGES[np.dtype(out_dtype)]
    r = np.rint(v_f32.astype(np.float32))  # float32 rne, ties to even
    # float64 holds every float32 integer exactly; once |r| >= 2**53 the result saturates anyway.
    s = r.astype(np.float64) + zp_int64.astype(np.float64)
    return np.asarray(np.clip(s, lo, hi)).astype(out_dtype)


def requantize(acc_int32, multiplier_f32, y_zp_int64, out_dtype):
    """y = sat( rne( float32( float32(acc) * m ) ) + y_zero_point )."""
    acc_f = acc_int32.astype(np.float32)  # round-to-nearest int32 -> float32
    with np.errstate(over="ignore"):
        prod = (acc_f * multiplier_f32).astype(np.float32)  # one float32 multiplication
    assert prod.dtype == np.float32
    return saturate_round(prod, y_zp_int64, out_dtype)


def multiplier(x_scale, w_scale, y_scale):
    """m = float32( float32(x_scale * w_scale) / y_scale ), elementwise in float32."""
    xs, ws, ys = f32(x_scale), f32(w_scale), f32(y_scale)
    prod = np.multiply(xs, ws, dtype=np.float32)
    m = np.divide(prod, ys, dtype=np.float32)
    assert m.dtype == np.float32
    return m


# ----------------------------------------------------------------------------- conv geometry


def conv_geometry(in_spatial, kernel, auto_pad="NOTSET", pads=None, strides=None, dilations=None):
    """Return (pads_begin, pads_end, out_spatial) from the ONNX Conv attribute text."""
    n = len(in_spatial)
    strides = [1] * n if strides is None else list(strides)
    dilations = [1] * n if dilations is None else list(dilations)
    begin, end, out = [], [], []
    for i in range(n):
        size, k, s, d = in_spatial[i], kernel[i], strides[i], dilations[i]
        span = (k - 1) * d + 1  # extent of the dilated kernel
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # output_shape[i] = ceil(input_shape[i] / strides[i]); padding as needed for that
            o = -(-size // s)
            total = max(0, (o - 1) * s + span - size)
            small, large = total // 2, total - total // 2
            # odd padding: the extra pixel goes at the end (UPPER) or the beginning (LOWER)
            pb, pe = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            pb = pe = 0
            o = (size - span) // s + 1
        else:  # NOTSET: explicit pads [x1_begin, x2_begin, ..., x1_end, x2_end, ...]
            pb = 0 if pads is None else pads[i]
            pe = 0 if pads is None else pads[n + i]
            o = (size + pb + pe - span) // s + 1
        begin.append(pb)
        end.append(pe)
        out.append(o)
    return begin, end, out


def _conv_accumulate(x, w, x_zp, w_zp, auto_pad, dilations, group, kernel_shape, pads, strides):
    """Exact Σ (x - x_zp)(w - w_zp) over taps and input channels; int64 [N, M, *out]."""
    x = np.asarray(x)
    w = np.asarray(w)
    nsp = x.ndim - 2
    kernel = list(w.shape[2:]) if kernel_shape is None else list(kernel_shape)
    strides = [1] * nsp if strides is None else list(strides)
    dilations = [1] * nsp if dilations is None else list(dilations)
    pb, _pe, out = conv_geometry(x.shape[2:], kernel, auto_pad, pads, strides, dilations)

    n_batch, c_in = x.shape[0], x.shape[1]
    m_out, c_per_group = w.shape[0], w.shape[1]
    m_per_group = m_out // group
    assert c_in == c_per_group * group

    xs = x.astype(np.int64) - x_zp  # x_zp: scalar
    wzp = np.broadcast_to(np.asarray(w_zp, np.int64).reshape(-1), (m_out,))  # per tensor or [M]
    ws = w.astype(np.int64) - wzp.reshape((m_out,) + (1,) * (w.ndim - 1))

    acc = np.zeros((n_batch, m_out) + tuple(out), np.int64)
    if 0 in acc.shape:
        return acc

    for tap in itertools.product(*[range(k) for k in kernel]):
        # input coordinate of this tap for every output coordinate, per axis
        idx, valid = [], []
        for i in range(nsp):
            coord = np.arange(out[i]) * strides[i] - pb[i] + tap[i] * dilations[i]
            ok = (coord >= 0) & (coord < x.shape[2 + i])
            idx.append(np.where(ok, coord, 0))
            valid.append(ok)
        mask = valid[0]
        for v in valid[1:]:
            mask = np.multiply.outer(mask, v)
        grid = np.ix_(*idx)
        for g in range(group):
            ms = slice(g * m_per_group, (g + 1) * m_per_group)
            for c_local in range(c_per_group):
                c = g * c_per_group + c_local
                # [N, *out]: x at this tap, 0 where the tap falls into padding
                xv = xs[(slice(None), c) + grid] * mask
                wv = ws[(ms, c_local) + tap]  # [Mg]
                acc[:, ms] += xv[:, None] * wv.reshape((1, -1) + (1,) * nsp)
    return acc


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    x = np.asarray(x)
    w = np.asarray(w)
    xzp, _ = zero_point(x_zero_point, x.dtype)
    wzp, _ = zero_point(w_zero_point, w.dtype)
    acc = _conv_accumulate(x, w, xzp.reshape(()), wzp,
                           auto_pad, dilations, group, kernel_shape, pads, strides)
    return wrap32(acc)


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None):
    x = np.asarray(x)
    w = np.asarray(w)
    xzp, _ = zero_point(x_zero_point, x.dtype)
    wzp, _ = zero_point(w_zero_point, w.dtype)
    yzp, ydt = zero_point(y_zero_point, None)
    acc = _conv_accumulate(x, w, xzp.reshape(()), wzp,
                           auto_pad, dilations, group, kernel_shape, pads, strides)
    nsp = x.ndim - 2
    m_out = w.shape[0]
    if B is not None:
        acc = acc + np.asarray(B).astype(np.int64).reshape((1, m_out) + (1,) * nsp)
    acc32 = wrap32(acc)
    m = multiplier(np.asarray(x_scale).reshape(-1)[0],
                   np.broadcast_to(f32(w_scale).reshape(-1), (m_out,)),
                   np.asarray(y_scale).reshape(-1)[0])
    m = m.reshape((1, m_out) + (1,) * nsp)
    return requantize(acc32, m, yzp.reshape(()), ydt)


# ----------------------------------------------------------------------------- matmul


def _row_param(p, a_nd):
    """a-side parameter (scalar, [M] or [..., M, 1]) shaped to broadcast against [..., M, K]."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim == 1:
        return p.reshape(-1, 1)
    return p


def _col_param(p):
    """b-side parameter (scalar, [N] or [..., 1, N]) shaped to broadcast against [..., K, N]."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim == 1:
        return p.reshape(1, -1)
    return p


def _matmul_accumulate(a, b, a_zp, b_zp):
    """Exact Σ_k (a - a_zp)(b - b_zp) with numpy.matmul shape rules; returns (int64, squeeze)."""
    a = np.asarray(a)
    b = np.asarray(b)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = a.reshape(1, -1) if a_vec else a
    b2 = b.reshape(-1, 1) if b_vec else b
    az = a2.astype(np.int64) - a_zp
    bz = b2.astype(np.int64) - b_zp
    k_len = a2.shape[-1]
    assert b2.shape[-2] == k_len
    batch = np.broadcast_shapes(az.shape[:-2], bz.shape[:-2])
    acc = np.zeros(batch + (a2.shape[-2], b2.shape[-1]), np.int64)
    for k in range(k_len):
        acc += az[..., :, k:k + 1] * bz[..., k:k + 1, :]
    return acc, a_vec, b_vec


def _squeeze(y, a_vec, b_vec):
    if a_vec and b_vec:
        return y.reshape(y.shape[:-2])
    if a_vec:
        return y.reshape(y.shape[:-2] + (y.shape[-1],))
    if b_vec:
        return y.reshape(y.shape[:-1])
    return y


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    a = np.asarray(a)
    b = np.asarray(b)
    azp, _ = zero_point(a_zero_point, a.dtype)
    bzp, _ = zero_point(b_zero_point, b.dtype)
    acc, av, bv = _matmul_accumulate(a, b, _row_param(azp, a.ndim), _col_param(bzp))
    return _squeeze(wrap32(acc), av, bv)


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    a = np.asarray(a)
    b = np.asarray(b)
    azp, _ = zero_point(a_zero_point, a.dtype)
    bzp, _ = zero_point(b_zero_point, b.dtype)
    yzp, ydt = zero_point(y_zero_point, None)
    acc, av, bv = _matmul_accumulate(a, b, _row_param(azp, a.ndim), _col_param(bzp))
    acc32 = wrap32(acc)
    m = multiplier(_row_param(a_scale, a.ndim), _col_param(b_scale), np.asarray(y_scale).reshape(()))
    y = requantize(acc32, m, yzp.reshape(()), ydt)
    return _squeeze(y, av, bv)


# ----------------------------------------------------------------------------- (de)quantize


def _axis_shape(x_ndim, param, axis):
    """Shape that broadcasts a per-axis 1-D parameter along `axis` (or a scalar)."""
    param = np.asarray(param)
    if param.size == 1 and param.ndim <= 1:
        return ()
    ax = axis % x_ndim
    shape = [1] * x_ndim
    shape[ax] = param.size
    return tuple(shape)


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1):
    x = np.asarray(x)
    xf = x.astype(np.float32)  # int32 input is converted to float32 first
    if y_zero_point is None:
        zp, dt = np.zeros((), np.int64), np.dtype(np.uint8)
    else:
        zp, dt = zero_point(y_zero_point, None)
    shape = _axis_shape(x.ndim, y_scale, axis)
    scale = f32(y_scale).reshape(shape)
    zp = zp.reshape(shape) if zp.size > 1 else zp.reshape(())
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.divide(xf, scale, dtype=np.float32)  # float32 division, not x * (1 / scale)
    lo, _hi = INT_RANGES[dt]
    nan = np.isnan(q)
    y = saturate_round(np.where(nan, np.float32(0), q), zp, dt)
    return np.asarray(np.where(nan, np.array(lo, dt), y).astype(dt))  # NaN -> T's min (onnxruntime)


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1):
    x = np.asarray(x)
    zp, _ = zero_point(x_zero_point, x.dtype)
    shape = _axis_shape(x.ndim, x_scale, axis)
    scale = f32(x_scale).reshape(shape)
    zp = zp.reshape(shape) if zp.size > 1 else zp.reshape(())
    diff = (x.astype(np.int64) - zp).astype(np.float32)  # exact integer difference, rounded once
    with np.errstate(over="ignore"):
        y = np.multiply(diff, scale, dtype=np.float32)
    return np.asarray(y, dtype=np.float32)


# ----------------------------------------------------------------------------- newer formats
#
# Written from the ONNX spec text (QuantizeLinear/DequantizeLinear 19-28, the Cast page's float8
# tables, docs/technical/float4.md and float6.md) and FORMATS.md Part A, sharing nothing with
# qlinear: every value is an exact rational (fractions.Fraction) or an exact float64; each
# rounding is written out (nearest, ties to even). Vectorized only where a sweep needs it
# (``encode_float``), with float64 comparisons that are exact for these values.

from fractions import Fraction  # noqa: E402
import math  # noqa: E402

import ml_dtypes  # noqa: E402

#: name: (exponent bits, mantissa bits, bias, flavour, ml_dtypes storage)
#: flavour "fn": no inf, S.1111.111 is NaN; "fnuz": no inf, no -0, 0x80 is NaN; "ieee": e5m2,
#: all-ones exponent is inf (mantissa 0) or NaN; "finite": float4/float6, every code a number.
FLOAT_FORMATS = {
    "float8e4m3fn": (4, 3, 7, "fn", ml_dtypes.float8_e4m3fn),
    "float8e4m3fnuz": (4, 3, 8, "fnuz", ml_dtypes.float8_e4m3fnuz),
    "float8e5m2": (5, 2, 15, "ieee", ml_dtypes.float8_e5m2),
    "float8e5m2fnuz": (5, 2, 16, "fnuz", ml_dtypes.float8_e5m2fnuz),
    "float4e2m1": (2, 1, 1, "finite", ml_dtypes.float4_e2m1fn),
    "float6e2m3": (2, 3, 1, "finite", ml_dtypes.float6_e2m3fn),
    "float6e3m2": (3, 2, 3, "finite", ml_dtypes.float6_e3m2fn),
}

#: integer types: (min, max, storage)
INT_TYPES = {
    "uint8": (0, 255, np.uint8), "int8": (-128, 127, np.int8),
    "uint16": (0, 65535, np.uint16), "int16": (-32768, 32767, np.int16),
    "uint4": (0, 15, ml_dtypes.uint4), "int4": (-8, 7, ml_dtypes.int4),
    "uint2": (0, 3, ml_dtypes.uint2), "int2": (-2, 1, ml_dtypes.int2),
}

NAN = "nan"


def float_format_value(code, name):
    """The value of one code: a Fraction, ±math.inf, or NAN; a negative zero is ("-0")."""
    e_bits, m_bits, bias, flavour, _ = FLOAT_FORMATS[name]
    width = 1 + e_bits + m_bits
    sign = (code >> (width - 1)) & 1
    exp = (code >> m_bits) & ((1 << e_bits) - 1)
    man = code & ((1 << m_bits) - 1)
    if flavour == "fnuz" and code == 1 << (width - 1):
        return NAN
    if flavour == "fn" and exp == (1 << e_bits) - 1 and man == (1 << m_bits) - 1:
        return NAN
    if flavour == "ieee" and exp == (1 << e_bits) - 1:
        return NAN if man else (-math.inf if sign else math.inf)
    if exp == 0:  # subnormal: 2^(1-bias) * 0.man
        mag = Fraction(man, 1 << m_bits) * Fraction(2) ** (1 - bias)
    else:  # normal: 2^(exp-bias) * 1.man
        mag = (1 + Fraction(man, 1 << m_bits)) * Fraction(2) ** (exp - bias)
    if mag == 0 and sign:
        return "-0"
    return -mag if sign else mag


def e8m0_value(code):
    """float8e8m0: 2^(code-127); 0xFF is NaN."""
    return NAN if code == 255 else Fraction(2) ** (code - 127)


def decode_table(name):
    """float64 value of every code of a format (NaN for NaN codes; -0.0 for negative zero)."""
    width = 1 + FLOAT_FORMATS[name][0] + FLOAT_FORMATS[name][1]
    out = np.zeros(1 << width, np.float64)
    for code in range(1 << width):
        val = float_format_value(code, name)
        out[code] = np.nan if val == NAN else (-0.0 if val == "-0" else float(val))
    return out


def _nan_code(name, negative):
    flavour = FLOAT_FORMATS[name][3]
    if flavour == "fnuz":
        return 0x80
    return (0xFF if negative else 0x7F)  # e4m3fn and e5m2: 0x7F | sign


def encode_float(values, name, saturate):
    """Codes (uint8) of float64 values (each exactly a float16/bfloat16/float32 value) in a
    format: nearest representable, ties to the even code, and the rules of FORMATS.md Part A
    for overflow, infinities, NaN and zeros. Vectorized: the comparisons below are exact in
    float64 (the formats' values and the midpoints between them are float64 values)."""
    e_bits, m_bits, bias, flavour, _ = FLOAT_FORMATS[name]
    width = 1 + e_bits + m_bits
    sign_bit = 1 << (width - 1)
    # the non-negative finite values and their codes, ascending
    pos = [(float(float_format_value(c, name)), c) for c in range(sign_bit)
           if float_format_value(c, name) not in (NAN, math.inf, -math.inf)]
    pos.sort()
    vals = np.array([p[0] for p in pos])
    codes = np.array([p[1] for p in pos], np.int64)
    top, below = vals[-1], vals[-2]
    overflow_mid = top + (top - below) / 2  # halfway to the next value the exponent would give
    v = np.asarray(values, np.float64)
    neg = np.signbit(v)
    a = np.abs(v)
    nan = np.isnan(v)
    a_safe = np.where(nan | np.isinf(a), 0.0, a)
    lo_i = np.clip(np.searchsorted(vals, a_safe, side="right") - 1, 0, len(vals) - 1)
    hi_i = np.minimum(lo_i + 1, len(vals) - 1)
    lo_v, hi_v = vals[lo_i], vals[hi_i]
    mid = (lo_v + hi_v) / 2
    pick_hi = (a_safe > mid) | ((a_safe == mid) & (codes[hi_i] % 2 == 0) & (hi_i != lo_i))
    mag = np.where(pick_hi, codes[hi_i], codes[lo_i])
    top_odd = codes[-1] % 2 == 1
    over = np.isinf(a) | (a_safe > overflow_mid) | ((a_safe == overflow_mid) & top_odd)
    out = mag | np.where(neg, sign_bit, 0)
    if flavour == "fnuz":
        out = np.where(mag == 0, 0, out)  # no negative zero
    if saturate or flavour == "finite":
        over_code = codes[-1] | np.where(neg, sign_bit, 0)
    elif flavour == "ieee":
        over_code = np.where(neg, 0xFC, 0x7C)  # ±inf
    else:
        over_code = np.array([_nan_code(name, n) for n in neg.ravel()], np.int64).reshape(neg.shape)
    out = np.where(over, over_code, out)
    if flavour == "finite":
        nan_code = np.full(v.shape, codes[-1])  # NaN gives +max
    else:
        nan_code = np.where(neg, _nan_code(name, True), _nan_code(name, False))
    out = np.where(nan, nan_code, out)
    return out.astype(np.uint8)


def round_saturate_exact(values, zp, lo, hi):
    """sat(rne(v) + zp) for exact float64 values (int64 result); NaN -> lo, ±inf -> hi/lo.
    float64's rint is exact round-half-even on these values (|v| < 2**53 or already integral)."""
    v = np.asarray(values, np.float64)
    nan = np.isnan(v)
    r = np.clip(np.rint(np.where(nan, 0, v)), -(2.0**40), 2.0**40).astype(np.int64) + zp
    return np.where(nan, lo, np.clip(r, lo, hi))


def as_format(codes, name):
    """Codes viewed as the format's ml_dtypes array."""
    return np.asarray(codes, np.uint8).view(FLOAT_FORMATS[name][4])


# exact rationals and the wide float types ---------------------------------------------------

#: name: (precision in bits incl. the hidden one, smallest normal exponent, largest exponent)
WIDE = {"float32": (24, -126, 127), "float16": (11, -14, 15), "bfloat16": (8, -126, 127)}
WIDE_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def to_exact(v):
    """A finite number (NumPy scalar of any float/int type) as a Fraction; inf/NaN as floats."""
    f = float(np.asarray(v).astype(np.float64)) if np.asarray(v).dtype.kind != "i" else int(v)
    if isinstance(f, float) and not math.isfinite(f):
        return f
    return Fraction(f)


def round_wide(value, sign_negative, name):
    """|value| (a Fraction >= 0) rounded to nearest-even in a wide float type, with the sign:
    a Python float (exact), ±inf on overflow, ±0.0 keeping the sign."""
    p, emin, emax = WIDE[name]
    a = abs(value)
    if a == 0:
        return -0.0 if sign_negative else 0.0
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, emin)
    quantum = Fraction(2) ** (e - p + 1)
    n = a / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    r = whole * quantum
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if r > largest:
        return -math.inf if sign_negative else math.inf
    return -float(r) if sign_negative else float(r)


def _round_half_even(fr):
    whole = fr.numerator // fr.denominator
    rest = fr - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    return whole


def _type_of(arr):
    """The oracle's name of a NumPy dtype."""
    dt = np.dtype(arr.dtype if hasattr(arr, "dtype") else arr)
    for name, (_, _, _, _, st) in FLOAT_FORMATS.items():
        if dt == np.dtype(st):
            return name
    for name, (_, _, st) in INT_TYPES.items():
        if dt == np.dtype(st):
            return name
    for name, st in WIDE_DTYPE.items():
        if dt == np.dtype(st):
            return name
    if dt == np.dtype(ml_dtypes.float8_e8m0fnu):
        return "float8e8m0"
    if dt == np.int32:
        return "int32"
    raise KeyError(dt)


def element_value(arr_elem, name):
    """One element's exact value: Fraction, ±inf, NAN, or "-0"."""
    if name in FLOAT_FORMATS:
        return float_format_value(int(np.asarray(arr_elem).reshape(1).view(np.uint8)[0]), name)
    if name == "float8e8m0":
        return e8m0_value(int(np.asarray(arr_elem).reshape(1).view(np.uint8)[0]))
    if name in INT_TYPES or name == "int32":
        return Fraction(int(np.asarray(arr_elem).astype(np.int64)))
    f = float(np.asarray(arr_elem).astype(np.float64))
    if math.isnan(f):
        return NAN
    if math.isinf(f):
        return f
    if f == 0 and math.copysign(1, f) < 0:
        return "-0"
    return Fraction(f)


def _param_index(i, x_shape, p_shape, axis, block_size):
    """The flat parameter index element i (a multi-index) of x uses: per tensor, axis, blocked."""
    if math.prod(p_shape) == 1 and not block_size:
        return 0
    ax = axis % len(x_shape)
    if block_size:
        j = list(i)
        j[ax] = i[ax] // block_size
        return int(np.ravel_multi_index(tuple(j), p_shape))
    return i[ax]


def _negative(v):
    return v == "-0" or (isinstance(v, Fraction) and v < 0) or (isinstance(v, float) and v < 0)


def _to_wide(v, name):
    """An exact value (Fraction, ±inf, NAN, "-0") rounded to a wide type: float, or NAN."""
    if v == NAN:
        return NAN
    if isinstance(v, float):
        return v
    if v == "-0":
        return -0.0
    return round_wide(abs(v), v < 0, name)


def quantize_linear_v(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1,
                      output_dtype=None, precision=None, version=28):
    """QuantizeLinear 19-28 from the spec text, element by element, exact rationals.

    P: precision if set; from version 23 the scale's type (float32 for an int32 or float8e8m0
    scale); else float32. x and y_scale rounded to P, the quotient rounded to P once.
    Integer outputs: rne(q) + zp saturated, NaN -> min, ±inf -> max/min. Float outputs:
    q + zp in P (skipped when zp is zero), then encode_float (saturate; float4/6 always).
    """
    x = np.asarray(x)
    s = np.asarray(y_scale)
    if s.dtype == np.float64:
        s = s.astype(np.float32)
    st = _type_of(s)
    if output_dtype is not None:
        out_name = _type_of(np.dtype(output_dtype))
    elif y_zero_point is not None:
        out_name = _type_of(np.asarray(y_zero_point))
    else:
        out_name = "uint8"
    if precision is not None:
        P = _type_of(np.dtype(precision))
    elif version >= 23 and st in WIDE:
        P = st
    else:
        P = "float32"
    xt = _type_of(x)
    zp = None if y_zero_point is None else np.asarray(y_zero_point).reshape(s.shape if s.size > 1 else (1,))
    out = []
    for i in np.ndindex(*x.shape):
        k = _param_index(i, x.shape, s.shape, axis, block_size)
        xv = _to_wide(element_value(x[i], xt), P)
        sv = _to_wide(element_value(s.reshape(-1)[k] if s.ndim else s, st), P)
        # one correctly rounded IEEE division in P; a NaN x stays NaN with its sign (the
        # operand IEEE arithmetic propagates)
        if xv == NAN:
            q = math.copysign(math.nan, float(np.asarray(x[i]).astype(np.float64)))
        elif math.isinf(xv):
            q = math.copysign(math.inf, xv) * (1 if sv > 0 else -1)
        else:
            neg = (math.copysign(1, xv) < 0) != (sv < 0)
            q = round_wide(abs(Fraction(xv) / Fraction(sv)), neg, P)
        zv = Fraction(0) if zp is None else element_value(zp.reshape(-1)[k], out_name)
        if out_name in INT_TYPES:
            lo, hi, _ = INT_TYPES[out_name]
            if math.isnan(q):
                r = lo
            elif math.isinf(q):
                r = hi if q > 0 else lo
            else:
                r = min(max(_round_half_even(Fraction(q)) + int(zv), lo), hi)
            out.append(r)
        else:
            # float8: a zero zero point adds nothing; float4/float6: a given one is added
            # (IEEE: -0 + 0 = +0, an exact zero sum is +0)
            float8 = FLOAT_FORMATS[out_name][0] + FLOAT_FORMATS[out_name][1] == 7
            adds = zp is not None and (not float8 or (zv != "-0" and zv != 0))
            if adds and math.isfinite(q):
                z = Fraction(0) if zv == "-0" else zv
                total = Fraction(q) + z
                if total == 0 and math.copysign(1, q) < 0 and zv == "-0":
                    q = -0.0  # -0 + -0 = -0
                else:
                    q = round_wide(abs(total), total < 0, P)
            out.append(q)
    if out_name in INT_TYPES:
        return np.array(out, np.int64).reshape(x.shape).astype(INT_TYPES[out_name][2])
    codes = encode_float(np.array(out, np.float64).reshape(x.shape), out_name, saturate)
    return as_format(codes, out_name)


def dequantize_linear_v(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None):
    """DequantizeLinear 19-28: float32(x - zp) exactly then rounded once, times float32(scale)
    rounded once in float32, then rounded once to the output type (output_dtype, else the
    scale's type; float32 for a float8e8m0 scale)."""
    x = np.asarray(x)
    s = np.asarray(x_scale)
    if s.dtype == np.float64:
        s = s.astype(np.float32)
    st = _type_of(s)
    xt = _type_of(x)
    out_name = _type_of(np.dtype(output_dtype)) if output_dtype is not None else (st if st in WIDE else "float32")
    zp = None if x_zero_point is None else np.asarray(x_zero_point).reshape(s.shape if s.size > 1 else (1,))
    out = []
    for i in np.ndindex(*x.shape):
        k = _param_index(i, x.shape, s.shape, axis, block_size)
        xv = element_value(x[i], xt)
        sv = element_value(s.reshape(-1)[k] if s.ndim else s, st)
        sv = _to_wide(sv, "float32")
        zv = Fraction(0) if zp is None else element_value(zp.reshape(-1)[k], xt)
        if xv == NAN or zv == NAN:
            out.append(np.nan)
            continue
        if isinstance(xv, float):  # ±inf (e5m2)
            d = xv if not isinstance(zv, float) else (xv - zv)
        else:
            zq = Fraction(0) if zv == "-0" else zv
            if zq == 0:
                d = -0.0 if xv == "-0" else _to_wide(xv, "float32")
            else:
                xq = Fraction(0) if xv == "-0" else xv
                d = _to_wide(xq - zq, "float32")
        # one float32 multiplication
        if isinstance(d, float) and (math.isinf(d) or math.isnan(d)):
            y = d * sv if sv != 0 else np.nan
        else:
            neg = (math.copysign(1, d) < 0) != (math.copysign(1, sv) < 0)
            y = round_wide(abs(Fraction(d) * Fraction(sv)), neg, "float32")
        if out_name != "float32" and not (math.isinf(y) or math.isnan(y)):
            y = round_wide(abs(Fraction(y)), math.copysign(1, y) < 0, out_name)
        out.append(y)
    return np.array(out, np.float64).reshape(x.shape).astype(WIDE_DTYPE[out_name])


def _exact_product_sum(terms):
    """Exact sum of products of (value, value) pairs, values Fraction / ±inf / NAN, with IEEE's
    rules for the non-finite ones: NaN if a NaN, inf·0 or +inf + -inf occurs, else ±inf."""
    total = Fraction(0)
    infs = set()
    for x, w in terms:
        if x == NAN or w == NAN:
            return math.nan
        if isinstance(x, float) or isinstance(w, float):  # an infinity
            other = w if isinstance(x, float) else x
            if not isinstance(other, float) and other == 0:
                return math.nan
            sx = 1 if (x > 0) else -1
            sw = 1 if (w > 0) else -1
            infs.add(sx * sw)
            continue
        total += x * w
    if len(infs) == 2:
        return math.nan
    if infs:
        return math.inf * infs.pop()
    return total


def qlinear_matmul_v21(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """QLinearMatMul-21 (2-D a and b), from the spec text and FORMATS.md Part A: the dot product
    of the centered values summed exactly (two 8-bit operands: wrap32), rounded once to
    float32; m = float32(float32(a_scale · b_scale) / y_scale) with the scales widened to
    float32; y = float32(acc · m); integer output: rne + zp saturated (NaN -> min); float8
    output: + zp in float32, saturating conversion."""
    at, bt, yt = _type_of(a), _type_of(b), _type_of(np.asarray(y_zero_point))
    M, K = a.shape
    N = b.shape[1]

    def param(p, i, j, per):  # per: "row" (a) or "col" (b)
        p = np.asarray(p).reshape(-1)
        if p.size == 1:
            return p[0]
        return p[i] if per == "row" else p[j]

    def f32_value(p):
        return Fraction(float(np.asarray(p).astype(np.float64)))

    ys = f32_value(y_scale)
    yzp = element_value(np.asarray(y_zero_point).reshape(-1)[0], yt)
    out = []
    for i in range(M):
        for j in range(N):
            az = element_value(param(a_zero_point, i, j, "row"), at)
            bz = element_value(param(b_zero_point, i, j, "col"), bt)
            az = Fraction(0) if az == "-0" else az
            bz = Fraction(0) if bz == "-0" else bz

            def centered(v, z):
                if v == NAN:
                    return NAN
                if isinstance(v, float):
                    return v
                return (Fraction(0) if v == "-0" else v) - z
            terms = [(centered(element_value(a[i, k], at), az), centered(element_value(b[k, j], bt), bz))
                     for k in range(K)]
            total = _exact_product_sum(terms)
            if at in INT_TYPES and bt in INT_TYPES:
                total = Fraction((int(total) + 2**31) % 2**32 - 2**31)
            if isinstance(total, float):
                acc = total
            else:
                acc = round_wide(abs(total), total < 0, "float32")
            s_a, s_b = f32_value(param(a_scale, i, j, "row")), f32_value(param(b_scale, i, j, "col"))
            prod = round_wide(abs(s_a * s_b), s_a * s_b < 0, "float32")
            q = Fraction(prod) / ys
            m = round_wide(abs(q), q < 0, "float32")
            if math.isnan(acc) or math.isinf(acc):
                y = acc * m if m != 0 else math.nan
            else:
                p_ = Fraction(acc) * Fraction(m)
                y = round_wide(abs(p_), (p_ < 0) or (p_ == 0 and (math.copysign(1, acc) * math.copysign(1, m) < 0)),
                               "float32")
            if yt in INT_TYPES:
                lo, hi, _ = INT_TYPES[yt]
                if math.isnan(y):
                    out.append(lo)
                elif math.isinf(y):
                    out.append(hi if y > 0 else lo)
                else:
                    out.append(min(max(_round_half_even(Fraction(y)) + int(yzp), lo), hi))
            else:
                if math.isfinite(y) and yzp not in ("-0",) and yzp != 0:
                    t = Fraction(y) + yzp
                    y = round_wide(abs(t), t < 0, "float32")
                out.append(y)
    if yt in INT_TYPES:
        return np.array(out, np.int64).reshape(M, N).astype(INT_TYPES[yt][2])
    return as_format(encode_float(np.array(out, np.float64).reshape(M, N), yt, 1), yt)


__all__ = [
    "conv_geometry", "conv_integer", "dequantize_linear", "matmul_integer", "qlinear_conv",
    "qlinear_matmul", "quantize_linear", "wrap32", "multiplier", "INT_RANGES",
    "FLOAT_FORMATS", "INT_TYPES", "decode_table", "encode_float", "quantize_linear_v", "dequantize_linear_v", "qlinear_matmul_v21",
]

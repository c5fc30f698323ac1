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


__all__ = [
    "conv_geometry", "conv_integer", "dequantize_linear", "matmul_integer", "qlinear_conv",
    "qlinear_matmul", "quantize_linear", "wrap32", "multiplier", "INT_RANGES",
]

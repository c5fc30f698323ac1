"""QLinearGlobalAveragePool, QLinearAveragePool and QLinearSoftmax (com.microsoft), as
onnxruntime 1.32's CPU kernels compute them (docs/contract.md)."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Sequence

import numpy as np

from .. import _validate as v
from .. import dtypes
from .._geometry import AUTO_PADS, explicit_pads
from . import _params as p
from ._arith import F32, INT32_MIN, requantize_multiply


def _wrap32(values: np.ndarray) -> np.ndarray:
    return ((values + 2 ** 31) % 2 ** 32) - 2 ** 31


def _to_channels_first(x: np.ndarray, channels_last: int) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last else x


def _from_channels_first(y: np.ndarray, channels_last: int) -> np.ndarray:
    return np.moveaxis(y, 1, -1) if channels_last else y


def _global_average_multiplier(op: str, shape: tuple[int, ...], sx, sy) -> tuple[int, np.float32]:
    """(count, m) of a channels-first x of ``shape``, checked as onnxruntime checks them."""
    count = math.prod(shape[2:])
    if count >= 2 ** 24:
        raise ValueError(f"{op}: the pooled window has {count} elements; onnxruntime requires fewer than 2**24")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        m = F32(sx / F32(sy * F32(count)))
    if not (2.0 ** -32 <= m < 256.0):
        raise ValueError(f"{op}: the requantization multiplier x_scale / (y_scale * {count}) = {m} "
                         "is outside [2**-32, 256), which onnxruntime refuses")
    v.check_size(op, "the int64 sums", shape[:2], 8)
    return count, m


def _global_average_values(x: np.ndarray, count: int, m: np.float32, zx, zy) -> np.ndarray:
    """The integer path of MLAS on a checked channels-first x: (N, C, 1, ...)."""
    acc = _wrap32(x.sum(axis=tuple(range(2, x.ndim)), dtype=np.int64, keepdims=True) - np.int64(zx) * count)
    return requantize_multiply(acc.astype(F32), m, zy, x.dtype)


def _global_average(op: str, x: np.ndarray, sx, zx, sy, zy) -> np.ndarray:
    """x channels-first (N, C, spatial...) → (N, C, 1, ...): the integer path of MLAS."""
    count, m = _global_average_multiplier(op, x.shape, sx, sy)
    return _global_average_values(x, count, m, zx, zy)


def bound_global_average_pool(X: Any, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any, *,
                              channels_last: int = 0):
    """``qlinear_global_average_pool`` bound to these parameters and to inputs like X, for a
    caller that passes the same parameter objects every time (a graph's planned node,
    ``qlinear.graph.evaluator``): everything is validated now, once; ``f(X2)`` gives the
    function's result for an X2 of X's shape and dtype under an unchanged output size limit,
    None for anything else (the caller then calls the function). None when this call would
    fail (the function then reports it)."""
    op = "qlinear_global_average_pool"
    try:
        x = p.tensor(op, "X", X)
        cl = p.flag(op, "channels_last", channels_last)
        if type(X) is not np.ndarray or x.ndim < 3:
            return None
        sx, zx = p.qparams(op, "x_scale", x_scale, "x_zero_point", x_zero_point, "X", x.dtype)
        sy, zy = p.qparams(op, "y_scale", y_scale, "y_zero_point", y_zero_point, "X", x.dtype, divides=True)
        count, m = _global_average_multiplier(op, _to_channels_first(x, cl).shape, sx, sy)
    except (ValueError, TypeError):
        return None
    shape, dtype, limit = x.shape, x.dtype, v.max_output_bytes()

    def run(X: Any) -> np.ndarray | None:
        if type(X) is not np.ndarray or X.dtype is not dtype or X.shape != shape or v.max_output_bytes() != limit:
            return None
        return _from_channels_first(_global_average_values(_to_channels_first(X, cl), count, m, zx, zy), cl)

    return run


def qlinear_global_average_pool(X: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any,
                                y_zero_point: Any, *, channels_last: int = 0) -> np.ndarray:
    """com.microsoft QLinearGlobalAveragePool: acc = wrap32(Σx - x_zp · n) over the n spatial
    positions, m = f(x_scale / f(y_scale · f(n))), y = sat(rne(clamp(f(f(acc) · m))) + y_zp).
    X is (N, C, spatial...), or (N, spatial..., C) with channels_last."""
    op = "qlinear_global_average_pool"
    x = p.tensor(op, "X", X)
    cl = p.flag(op, "channels_last", channels_last)
    if x.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3 (N, C, spatial...); got shape {x.shape}")
    sx, zx = p.qparams(op, "x_scale", x_scale, "x_zero_point", x_zero_point, "X", x.dtype)
    sy, zy = p.qparams(op, "y_scale", y_scale, "y_zero_point", y_zero_point, "X", x.dtype, divides=True)
    y = _global_average(op, _to_channels_first(x, cl), sx, zx, sy, zy)
    return _from_channels_first(y, cl)


def _pool_geometry(op: str, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                   pads: Sequence[int] | None, auto_pad: str, ceil_mode: int):
    """(begin pads, end pads, output sizes) as onnxruntime's PoolAttributes computes them."""
    nd = len(spatial)
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{op}: attribute auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID; got {auto_pad!r}")
    # onnxruntime does not clamp the needed padding at 0: with a kernel smaller than the
    # stride it is negative, and C++'s truncating division makes a negative begin pad,
    # which shifts every window right.
    begin, end = explicit_pads(spatial, kernel, strides, None, auto_pad, pads, split="onnxruntime-pool")
    out = []
    for i in range(nd):
        span = spatial[i] + begin[i] + end[i] - kernel[i]
        if auto_pad == "NOTSET" and max(begin[i], end[i]) >= kernel[i]:
            raise ValueError(f"{op}: pads {list(begin) + list(end)} must be smaller than kernel_shape "
                             f"{list(kernel)} (onnxruntime's constraint)")
        if span < 0:
            raise ValueError(f"{op}: kernel_shape {list(kernel)} is larger than the padded input "
                             f"{[spatial[j] + begin[j] + end[j] for j in range(nd)]}")
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + begin[i]:
            o -= 1  # the last window would start in the end padding
        out.append(o)
    return begin, end, out


def qlinear_average_pool(X: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any = None,
                         *, kernel_shape: Sequence[int], auto_pad: str = "NOTSET", ceil_mode: int = 0,
                         channels_last: int = 0, count_include_pad: int = 0,
                         pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> np.ndarray:
    """com.microsoft QLinearAveragePool.

    A kernel covering the whole spatial extent with no padding takes the integer path of
    QLinearGlobalAveragePool. Otherwise, in float32: d = f(x_scale · (x - x_zp)); each window's
    valid taps summed in row-major order from 0; v = f(sum / count) with count the kernel size
    (count_include_pad) or the valid taps; y = sat(cvt(f(f(v / y_scale) + y_zp))).
    """
    op = "qlinear_average_pool"
    x = p.tensor(op, "X", X)
    cl = p.flag(op, "channels_last", channels_last)
    ceil = p.flag(op, "ceil_mode", ceil_mode)
    include_pad = p.flag(op, "count_include_pad", count_include_pad)
    if x.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3 (N, C, spatial...); got shape {x.shape}")
    nd = x.ndim - 2
    kernel = v.ints_attribute(op, "kernel_shape", kernel_shape, nd, 1, "one per spatial axis")
    stride = v.ints_attribute(op, "strides", strides, nd, 1, "one per spatial axis") if strides is not None else (1,) * nd
    if pads is not None:
        pads = v.ints_attribute(op, "pads", pads, 2 * nd, 0, "begin and end per spatial axis")
    sx, zx = p.qparams(op, "x_scale", x_scale, "x_zero_point", x_zero_point, "X", x.dtype)
    sy, zy = p.qparams(op, "y_scale", y_scale, "y_zero_point", y_zero_point, "X", x.dtype, divides=True)
    xc = _to_channels_first(x, cl)
    spatial = xc.shape[2:]
    begin, end, out = _pool_geometry(op, spatial, kernel, stride, pads, auto_pad, ceil)
    if tuple(kernel) == tuple(spatial) and not any(begin) and not any(end):
        y = _global_average(op, xc, sx, zx, sy, zy)
        return _from_channels_first(y, cl)
    for i in range(nd):
        if begin[i] < 0:  # windows start past the input's beginning: drop what none reads
            xc = xc[(slice(None), slice(None)) + (slice(None),) * i + (slice(-begin[i], None),)]
            begin[i] = 0
    spatial = xc.shape[2:]
    v.check_size(op, "the output's int64 values", xc.shape[:2] + tuple(out), 8)
    v.check_size(op, "the float32 copy of X", xc.shape, 4)
    with np.errstate(over="ignore", invalid="ignore"):
        deq = (xc.astype(np.int32) - zx).astype(F32) * sx
    # Windows may reach past the end padding (ceil_mode); pad enough zeros on both sides so
    # every tap is a slice. Adding +0.0 leaves a float32 sum unchanged, and the sum starts at
    # +0.0, so zero taps change nothing and the valid taps keep their row-major order.
    extra = [max(0, (out[i] - 1) * stride[i] + kernel[i] - (spatial[i] + begin[i])) for i in range(nd)]
    padded = np.pad(deq, [(0, 0), (0, 0)] + [(begin[i], extra[i]) for i in range(nd)])
    total = np.zeros(xc.shape[:2] + tuple(out), dtype=F32)
    for off in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(slice(off[i], off[i] + (out[i] - 1) * stride[i] + 1, stride[i]) for i in range(nd))
        total += padded[(slice(None), slice(None)) + sl]
    if include_pad:
        count = np.full(tuple(out), F32(math.prod(kernel)))
    else:
        sizes = []
        for i in range(nd):
            start = np.arange(out[i]) * stride[i] - begin[i]
            stop = np.minimum(start + kernel[i], spatial[i])
            sizes.append(stop - np.maximum(start, 0))
        count = np.ones((), dtype=np.int64)
        for i, s in enumerate(sizes):
            count = np.multiply.outer(count, s)
        count = count.astype(F32)
    lo, hi = dtypes.INT_RANGE[np.dtype(x.dtype)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = (total / count) / sy + F32(zy)
    ok = np.abs(q) < F32(2 ** 31)  # static_cast<int32_t> gives INT_MIN outside (and for NaN)
    ints = np.where(ok, np.rint(np.where(ok, q, 0)), INT32_MIN).astype(np.int64)
    y = np.clip(ints, lo, hi).astype(x.dtype)
    return _from_channels_first(y, cl)


# ----------------------------------------------------------------------------- softmax


def softmax_table(x_scale: np.float32, reduce_len: int) -> np.ndarray:
    """T[i] = float32(exp((i - 255 + shift) · x_scale)), exp in double (libm), where
    shift = max(0, logf(f(FLT_MAX / reduce_len)) - 5) / x_scale keeps the row sums finite.

    The logarithm is taken in float32 (C++ picks logf for a float argument): with a double log
    the table moved by an ulp and 13 of 600k outputs differed from onnxruntime.
    """
    quotient = F32(np.finfo(F32).max / F32(reduce_len))
    # logf modelled as the float32 rounding of the double log: CPU-independent (NumPy's own
    # float32 log differs from it for 2.8% of the lengths up to 200,000; both matched
    # onnxruntime on 6M outputs, the double log itself did not)
    shift = max(0.0, float(F32(math.log(float(quotient)))) - 5.0) / float(x_scale)
    xs = float(x_scale)
    # The largest exponent, shift · x_scale = logf(...) - 5 <= 83.7, is far from double's overflow;
    # the table is built with Python's math.exp (libm), not NumPy's vectorized exp.
    return np.array([math.exp((i - 255 + shift) * xs) for i in range(256)], dtype=np.float64).astype(F32)


@functools.lru_cache(maxsize=256)
def _cached_softmax_table(scale_bits: bytes, reduce_len: int) -> np.ndarray:
    """softmax_table remembered by the float32 scale's bits and the row length (a model's
    node builds its 256 libm exponentials once instead of on every run); read-only."""
    table = softmax_table(np.frombuffer(scale_bits, F32)[0], reduce_len)
    table.flags.writeable = False
    return table


def _softmax_rows(r: np.ndarray, table: np.ndarray, big_y: np.float32, zy: int, hi: int,
                  dtype: np.dtype) -> np.ndarray:
    """QLinearSoftmax of int32 rows along axis 1 of ``r`` (pre, d, post), d >= 1:
    e_j = table[x_j - max + 255], S = Σ e_j in order in float32,
    y_j = min(rne(e_j · Y / S) + zy, hi) in ``dtype``, shaped as ``r``.

    Each row stays where it is (axis 1) instead of being moved last: the arithmetic is
    elementwise or per row, so the layout does not change a value."""
    d = r.shape[1]
    e = np.take(table, r - np.maximum.reduce(r, axis=1, keepdims=True) + 255)
    if d <= _COLUMN_SUM_MAX:
        # S added term by term: the float32 additions of cumsum (which accumulates in order:
        # e_0 + e_1, then + e_2, ...), the same values in the same order, without its slow
        # walk along short strided rows
        total = e[:, 0].copy()
        for j in range(1, d):
            total += e[:, j]
        total = total[:, None]
    else:
        total = np.cumsum(e, axis=1, dtype=F32)[:, -1:]  # cumsum adds in order (no pairwise sum)
    # rne(e_j · Y / S) in double, in place (the same operations as
    # np.rint((e.astype(f64) * Y) / S.astype(f64)) without a fresh temporary per step)
    q = e.astype(np.float64)
    q *= float(big_y)
    q /= total.astype(np.float64)
    np.rint(q, out=q)
    np.minimum(q, float(hi - zy), out=q)  # q >= 0: only the top clamps
    q += zy
    return q.astype(dtype)


#: rows up to this length sum their exponentials term by term rather than by cumsum
_COLUMN_SUM_MAX = 32
#: QLinearSoftmax over rows of two: from this many rows on, through a table of the 511
#: possible rows (building it costs about as much as a few hundred rows)
_PAIR_ROWS = 256


@functools.lru_cache(maxsize=64)
def _pair_table(scale_bits: bytes, y_scale_bits: bytes, zy: int, dtype: np.dtype) -> np.ndarray:
    """(511, 2): the outputs of the row (k, 0) for k = -255 ... 255, by ``_softmax_rows``.

    An 8-bit row (a, b) has the outputs of the row (a - b, 0): the values reach the table only
    through x_j - max, which the two rows share ((0, b - a) when a >= b, (a - b, 0) otherwise),
    and the rest of the arithmetic depends on the table's values only. Read-only."""
    k = np.arange(-255, 256, dtype=np.int32)
    reps = np.stack([k, np.zeros_like(k)], axis=1)[:, :, None]
    sy = np.frombuffer(y_scale_bits, F32)[0]
    _, hi = dtypes.INT_RANGE[np.dtype(dtype)]
    out = _softmax_rows(reps, _cached_softmax_table(scale_bits, 2), np.floor(F32(1) / sy), zy, hi, dtype)
    out = np.ascontiguousarray(out[:, :, 0])
    out.flags.writeable = False
    return out


def _softmax_pairs(x3: np.ndarray, scale_bits: bytes, y_scale_bits: bytes, zy: int) -> np.ndarray:
    """``_softmax_rows`` of 8-bit rows of two along axis 1 of ``x3`` (pre, 2, post), by
    ``_pair_table``: the row (a, b) is looked up at a - b + 255 (a - b lies in [-255, 255]
    for both 8-bit types, so int16 holds it)."""
    table = _pair_table(scale_bits, y_scale_bits, zy, x3.dtype)
    diff = np.subtract(x3[:, 0], x3[:, 1], dtype=np.int16)  # (pre, post)
    diff += 255
    pre, _, post = x3.shape
    if post == 1:
        # np.take along axis 0 fetches whole rows of the table (indexing the (511, 2) array
        # with an index array took over ten times as long)
        return np.take(table, diff.reshape(pre), axis=0).reshape(pre, 2, 1)
    y = np.empty(x3.shape, x3.dtype)
    np.take(np.ascontiguousarray(table[:, 0]), diff, out=y[:, 0])
    np.take(np.ascontiguousarray(table[:, 1]), diff, out=y[:, 1])
    return y


def qlinear_softmax(X: np.ndarray, X_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any,
                    *, opset: int, axis: int = -1) -> np.ndarray:
    """com.microsoft QLinearSoftmax.

    Rows are the ``axis`` (opset >= 13) or everything from ``axis`` on, flattened (opset < 13).
    The axis defaults to the schema's -1 for every opset (measured: onnxruntime does not switch
    to ONNX Softmax-1's default of 1 below 13). Per row: e_j = T[x_j - max + 255]
    (``softmax_table``), S = Σ e_j summed in order in float32, Y = floor(f(1 / y_scale)),
    y_j = min(rne(e_j · Y / S) + y_zp, type max), where the product and quotient are computed in
    double from the float32 e_j, Y and S (measured: 0 mismatches in 5.9M outputs; float32
    arithmetic gave 1283 of 600k, and overflowed to inf where e_j · Y > FLT_MAX). x_zero_point
    is not used.
    """
    op = "qlinear_softmax"
    x = p.tensor(op, "X", X)
    if not isinstance(opset, (int, np.integer)) or isinstance(opset, bool) or opset < 1:
        raise ValueError(f"{op}: attribute opset must be a positive integer; got {opset!r}")
    if x.ndim == 0:
        raise ValueError(f"{op}: X must have rank >= 1; got a 0-d array")
    sx, _ = p.qparams(op, "X_scale", X_scale, "x_zero_point", x_zero_point, "X", x.dtype)
    if not sx > 0:
        raise ValueError(f"{op}: X_scale must be positive (the exponent table divides by it); got {sx}")
    sy, zy = p.qparams(op, "y_scale", y_scale, "y_zero_point", y_zero_point, "X", x.dtype,
                       divides=True, required_zp=True)
    ax = p.axis(op, axis, x.ndim)
    if x.size == 0:
        return np.empty(x.shape, x.dtype)
    v.check_size(op, "the float64 products", x.shape, 8)  # X may be a broadcast view
    # rows along axis 1 of (pre, d, post): the axis itself (opset >= 13), or everything from
    # it on, flattened (opset < 13: post is 1)
    pre = math.prod(x.shape[:ax])
    if opset < 13:
        x3 = x.reshape(pre, -1, 1)
    else:
        x3 = x.reshape(pre, x.shape[ax], -1)
    d = x3.shape[1]
    if d == 2 and x3.shape[0] * x3.shape[2] >= _PAIR_ROWS:
        y = _softmax_pairs(x3, F32(sx).tobytes(), F32(sy).tobytes(), int(zy))
    else:
        _, hi = dtypes.INT_RANGE[np.dtype(x.dtype)]
        y = _softmax_rows(x3.astype(np.int32), _cached_softmax_table(F32(sx).tobytes(), d),
                          np.floor(F32(1) / sy), int(zy), hi, x.dtype)
    return y.reshape(x.shape)

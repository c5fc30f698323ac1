"""Vectorized float "glue" operators for the ONNX backend (the graph loop is
:mod:`qlinear.graph.evaluator`).

onnx.reference's implementations of the float operators that sit between quantized layers
are written for clarity: Conv loops over windows and channels, the pools over windows in
Python, Resize in float64, unary operators copy their result once more with ``astype``. On
real models those operators took most of qlinear's time (a QDQ MobileNetV2: float Conv
~970 ms of ~935-1000 ms; onnxruntime runs the whole model in ~25 ms). This module replaces
them with NumPy implementations of the same ONNX semantics:

- ``Conv`` (every rank, group, pad, stride, dilation, auto_pad): one im2col matrix per group
  and one BLAS matrix product (``np.matmul``); a 1x1 kernel without padding needs no im2col;
  a depthwise kernel (one input channel per group) is a sum of weighted taps instead. For
  float32 with two spatial axes the native engine runs it on its own threads
  (``qlinear/csrc/fconv/``, ``qlinear/csrc/elementwise/fconv.c``) in the order docs/qdq.md
  ("Float Conv") documents, the same bits on every ISA level and thread count: the depthwise
  taps are the NumPy formulation's operations (the same bits as it), the products are not
  BLAS's order (within float32 rounding of it).
- ``AveragePool`` (pads, strides, dilations, auto_pad, ceil_mode, count_include_pad),
  ``GlobalAveragePool``, ``GlobalMaxPool``: sums of strided views, one divisor per window.
- ``Resize`` (opset 11+, nearest and linear, coordinate modes half_pixel, asymmetric,
  align_corners, pytorch_half_pixel, half_pixel_symmetric; every nearest_mode): source
  coordinates in float64 as onnx.reference computes them, so nearest picks the same
  elements (onnxruntime's float32 coordinates can pick the neighbour only where a coordinate
  is within float32 rounding of a rounding boundary, see ``_resize_coords``); linear
  interpolates one axis at a time. Cubic, antialias, axes, keep_aspect_ratio_policy,
  tf_crop_and_resize and Resize-10 run as onnx.reference runs them.
- ``Sigmoid``, ``Softmax`` (both axis semantics: opset 13+ one axis, opset < 13 the 2-D
  coercion), ``LeakyRelu``, ``Relu`` without the extra copies (a large Relu against a block
  of zeros: NumPy's vectorized array-array maximum); ``Reshape`` without
  onnx.reference's per-call index arrays.

Float arithmetic follows the operator definitions; the order of float32 operations is not
always onnxruntime's (BLAS blocking in Conv, separable linear Resize), so results agree
within float32 rounding (tests/test_backend_float.py pins the tolerances); data movement
and selections (nearest Resize, GlobalMaxPool, Relu, LeakyRelu's select, Reshape) are exact. A node outside what
is implemented here (another dtype, an attribute linked to a function's attribute, a mode
listed above as delegated) runs as onnx.reference runs it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

import onnx
from onnx.reference.op_run import OpRun
from onnx.reference.ops import load_op

from ... import _blas, _native
from ..._geometry import explicit_pads, window_output_sizes
from ..proto import node_attributes

__all__ = ["conv", "average_pool", "resize", "softmax", "sigmoid", "relu", "leaky_relu", "FLOAT_KERNELS"]

_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------- geometry


def _tap_slices(off, out, strides, dilations):
    """Index of the strided view that tap ``off`` of every output window reads."""
    return tuple(slice(off[i] * dilations[i], off[i] * dilations[i] + (out[i] - 1) * strides[i] + 1,
                       strides[i]) for i in range(len(out)))


def _padded(x, pb, pe, extra=None, value=0):
    nd = x.ndim - 2
    extra = extra or [0] * nd
    if not any(pb) and not any(pe) and not any(extra):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(pb[i], pe[i] + extra[i]) for i in range(nd)],
                  constant_values=value)


def _geometry(x_shape, kernel, strides, dilations, pads, auto_pad):
    nd = len(x_shape) - 2
    spatial = list(x_shape[2:])
    kernel = [int(k) for k in kernel]
    if len(kernel) != nd:  # backend.check_model refuses it where x's shape is known beforehand
        raise ValueError(f"kernel_shape {kernel} has {len(kernel)} values; x {tuple(x_shape)} has "
                         f"{nd} spatial axes")
    strides = [int(s) for s in strides] if strides else [1] * nd
    dilations = [int(d) for d in dilations] if dilations else [1] * nd
    pb, pe = explicit_pads(spatial, kernel, strides, dilations, auto_pad or "NOTSET", pads)
    return spatial, kernel, strides, dilations, pb, pe


# --------------------------------------------------------------------------- Conv


def _native_conv() -> Any:
    """The compiled module for the float Conv (qlinear/csrc/fconv/, elementwise/fconv.c), or None
    when the NumPy engine is selected or the extension is not built (then the NumPy formulation
    runs)."""
    return _native.native()


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, auto_pad: str = "NOTSET",
         dilations=None, group: int = 1, kernel_shape=None, pads=None, strides=None) -> np.ndarray:
    """ONNX Conv for float tensors of any rank: im2col per group and one matrix product.

    float16 inputs are computed in float32 and rounded once at the end.
    """
    out_dtype = x.dtype
    if x.dtype == np.float16:
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"Conv: X has rank {x.ndim} and W rank {w.ndim}; both must be equal "
                         "and at least 3")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    g = int(group)
    if g < 1 or c != cg * g or m % g:
        raise ValueError(f"Conv: X has {c} channels, W is {w.shape}, group={g}; needs "
                         "C = W.shape[1] * group and M divisible by group")
    kernel = kernel_shape if kernel_shape else w.shape[2:]
    spatial, kernel, strides, dilations, pb, pe = _geometry(x.shape, kernel, strides, dilations,
                                                            pads, auto_pad)
    if list(kernel) != list(w.shape[2:]):
        raise ValueError(f"Conv: kernel_shape {kernel} differs from W's spatial shape "
                         f"{list(w.shape[2:])}")
    nd = len(spatial)
    out = window_output_sizes(spatial, kernel, strides, dilations, pb, pe)
    mg = m // g
    ksize = math.prod(kernel)
    p = math.prod(out)
    dt = x.dtype
    w = w.astype(dt, copy=False)
    C = _native_conv() if nd == 2 and dt == np.float32 and min(pb) >= 0 and min(pe) >= 0 else None
    if cg == 1 and ksize > 1 and C is not None:
        # the compiled kernel (qlinear/csrc/elementwise/fconv.c): the loop below, same float32
        # operations in the same order (bit-identical), in one pass per plane; the bias too
        y = _native.empty((n, m, *out), dt)
        C.fdwconv2d(np.ascontiguousarray(x), np.ascontiguousarray(w), None if b is None
                    else np.ascontiguousarray(b.astype(dt, copy=False)), y, n, c, *spatial, mg,
                    *out, *kernel, *strides, *dilations, pb[0], pb[1])
        return y.astype(out_dtype, copy=False)
    if cg == 1 and ksize > 1:
        # depthwise (or channel multiplier): a weighted sum of taps, no im2col
        xp = _padded(x, pb, pe)
        if mg > 1:
            xp = np.repeat(xp, mg, axis=1)  # output channel o reads input channel o // mg
        wt = w.reshape(m, ksize)
        y = np.zeros((n, m, *out), dtype=dt)
        taps = [_tap_slices(off, out, strides, dilations)
                for off in itertools.product(*[range(k) for k in kernel])]

        def channels(c0: int, c1: int) -> None:
            # the taps of channels [c0, c1) added in order into y, through one reused product
            # buffer (a temporary per tap costs an allocation and its page faults)
            yc = y[:, c0:c1]
            tmp = np.empty_like(yc)
            shape = (1, c1 - c0) + (1,) * nd
            for t, sl in enumerate(taps):
                np.multiply(wt[c0:c1, t].reshape(shape), xp[(slice(None), slice(c0, c1)) + sl], out=tmp)
                yc += tmp

        _blas.split_channels(m, y.size * ksize, channels)
    elif C is not None:
        # the compiled matrix product (qlinear/csrc/fconv/fgemm.c) on the engine's threads, in
        # the documented order (docs/qdq.md, "Float Conv"), the bias added in it; a 1x1 kernel
        # with stride 1 and no padding reads x as it is, any other the compiled im2col matrix
        y = _native.empty((n, m, *out), dt)
        bias = None if b is None else np.ascontiguousarray(b.astype(dt, copy=False))
        wm = np.ascontiguousarray(w)
        kk = cg * ksize
        if ksize == 1 and not any(pb) and not any(pe) and strides == [1, 1]:
            xc = np.ascontiguousarray(x)
            C.fgemm(wm, bias, xc, y, g, n, mg, kk, p, p, c * p, cg * p)
        else:
            cols = _native.empty((g, kk, n * p), dt)
            C.fim2col(np.ascontiguousarray(x), cols, n, c, *spatial, *out, *kernel, *strides, *dilations,
                      pb[0], pb[1])
            C.fgemm(wm, bias, cols, y, g, n, mg, kk, p, n * p, p, kk * n * p)
        return y.astype(out_dtype, copy=False)
    else:
        if ksize == 1 and not any(pb) and not any(pe):
            xs = x[(slice(None), slice(None)) + tuple(slice(None, (out[i] - 1) * strides[i] + 1,
                                                            strides[i]) for i in range(nd))]
            cols = xs.reshape(n, g, cg, p).transpose(1, 2, 0, 3).reshape(g, cg, n * p)
        else:
            xp = _padded(x, pb, pe)
            s = xp.strides
            view = np.lib.stride_tricks.as_strided(
                xp, shape=(n, g, cg, *kernel, *out),
                strides=(s[0], s[1] * cg, s[1], *[s[2 + i] * dilations[i] for i in range(nd)],
                         *[s[2 + i] * strides[i] for i in range(nd)]),
                writeable=False)
            order = (1, 2, *range(3, 3 + nd), 0, *range(3 + nd, 3 + 2 * nd))
            cols = view.transpose(order).reshape(g, cg * ksize, n * p)
        if g == 1:  # one 2-D product (a stacked matmul of one would loop in NumPy)
            y = _blas.matmul(w.reshape(mg, cg * ksize), cols[0])[None]
        else:
            y = _blas.batched_matmul(w.reshape(g, mg, cg * ksize), cols)  # (g, mg, n*p)
        if n == 1:
            y = y.reshape(1, m, *out)
        else:
            y = np.ascontiguousarray(y.reshape(g, mg, n, p).transpose(2, 0, 1, 3)).reshape(
                n, m, *out)
    if b is not None:
        y += b.astype(dt, copy=False).reshape((1, m) + (1,) * nd)
    return y.astype(out_dtype, copy=False)


# --------------------------------------------------------------------------- pools


def average_pool(x: np.ndarray, *, kernel_shape, strides=None, pads=None, dilations=None,
                 auto_pad: str = "NOTSET", ceil_mode: int = 0,
                 count_include_pad: int = 0) -> np.ndarray:
    """ONNX AveragePool: the taps of every window summed in row-major order, then divided.

    The divisor counts the taps inside the input (``count_include_pad=0``) or inside the
    padded input (``=1``); taps past the end padding, which only ``ceil_mode`` creates, never
    count.
    """
    spatial, kernel, strides, dilations, pb, pe = _geometry(x.shape, kernel_shape, strides,
                                                            dilations, pads, auto_pad)
    nd = len(spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # onnxruntime's pooling split (not clamped at 0; a negative pad crops the input: a
        # stride larger than the kernel centres the windows)
        pb, pe = explicit_pads(spatial, kernel, strides, None, auto_pad, None, split="onnxruntime-pool")
        crop = tuple(slice(max(0, -pb[i]), spatial[i] - max(0, -pe[i])) for i in range(nd))
        x = x[(slice(None), slice(None)) + crop]
        spatial = list(x.shape[2:])
        pb, pe = [max(0, v) for v in pb], [max(0, v) for v in pe]
    out = window_output_sizes(spatial, kernel, strides, dilations, pb, pe, ceil_mode)
    extra = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 - (spatial[i] + pb[i] + pe[i])) for i in range(nd)]
    xp = _padded(x, pb, pe, extra)
    # float16 windows are summed in float32 (as global_average_pool, onnx.reference and
    # onnxruntime do): nine float16 taps of 40000 overflowed 65504 where their mean does not
    acc = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    y = np.zeros(x.shape[:2] + tuple(out), dtype=acc)
    counted = np.zeros([1, 1] + [spatial[i] + pb[i] + pe[i] + extra[i] for i in range(nd)],
                       dtype=np.int64)
    inside = tuple(slice(0, spatial[i] + pb[i] + pe[i]) if count_include_pad
                   else slice(pb[i], pb[i] + spatial[i]) for i in range(nd))
    counted[(0, 0) + inside] = 1
    count = np.zeros([1, 1] + out, dtype=np.int64)
    for off in itertools.product(*[range(k) for k in kernel]):
        sl = (slice(None), slice(None)) + _tap_slices(off, out, strides, dilations)
        y += xp[sl]
        count += counted[sl]
    with np.errstate(divide="ignore", invalid="ignore"):  # a window wholly in padding: NaN
        y /= count.astype(acc)
    return y.astype(x.dtype, copy=False)


def global_average_pool(x: np.ndarray) -> np.ndarray:
    n, c = x.shape[:2]
    flat = np.ascontiguousarray(x).reshape(n, c, -1)
    y = flat.mean(axis=2, dtype=np.float32 if x.dtype == np.float16 else x.dtype)
    return y.astype(x.dtype, copy=False).reshape((n, c) + (1,) * (x.ndim - 2))


def global_max_pool(x: np.ndarray) -> np.ndarray:
    n, c = x.shape[:2]
    return np.ascontiguousarray(x).reshape(n, c, -1).max(axis=2).reshape(
        (n, c) + (1,) * (x.ndim - 2))


# --------------------------------------------------------------------------- activations


#: Sigmoid's cutoff per float type: below x = -c, exp(x) is used instead of 1/(1+exp(-x)).
#: c = 80 for float32 and float64 (float32: exp(80) > 5e34, where 1/(1+e) loses the subnormal
#: result's digits or overflows to 0); 11 for float16, whose exp(-x) overflows its 65504
#: from x = -11.1 on (1/(1+inf) was 0 where the result is 6e-6 ... 6e-8).
_SIGMOID_CUTOFF = {np.dtype(np.float16): 11.0}


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), in place on one temporary.

    Below x = -c (``_SIGMOID_CUTOFF``: 80, float16 11), where exp(-x) overflows or 1/(1+e)
    loses the subnormal result's digits, exp(x) is the value to within rounding and is used
    instead.
    """
    t = x.dtype.type  # typed scalars: NumPy's Python-scalar promotion costs ~10 us a call
    c = t(_SIGMOID_CUTOFF.get(x.dtype, 80.0))
    y = np.negative(x)
    np.minimum(y, c, out=y)  # no overflow; x < -c is recomputed below
    np.exp(y, out=y)
    y += t(1)
    np.reciprocal(y, out=y)
    low = x < -c
    if low.any():
        y[low] = np.exp(x[low])
    return y


def softmax(x: np.ndarray, axis: int = -1, *, coerce_2d: bool = False) -> np.ndarray:
    """Softmax along ``axis``; ``coerce_2d`` (opset < 13) over all axes from ``axis`` on."""
    if x.size == 0:
        return x.copy()
    axis = axis + x.ndim if axis < 0 else axis
    if coerce_2d:
        shape = x.shape
        lead = math.prod(shape[:axis])
        return softmax(x.reshape(lead, -1), 1).reshape(shape)
    k = x.shape[axis]
    if k <= 8 and axis == x.ndim - 1 and x.ndim > 1:
        # a short last axis (class scores): reductions over strided columns instead of
        # NumPy's per-row reduction loop
        cols = [x[..., i] for i in range(k)]
        mx = cols[0].copy()
        for col in cols[1:]:
            np.maximum(mx, col, out=mx)
        y = x - mx[..., None]
        np.exp(y, out=y)
        s = y[..., 0].copy()
        for i in range(1, k):
            s += y[..., i]
        y /= s[..., None]
        return y
    y = x - x.max(axis=axis, keepdims=True)
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


#: Zeros for :func:`relu`'s blocks (read-only, shared).
_RELU_ZEROS = {dt: np.zeros(1 << 12, dt) for dt in (np.dtype(np.float32), np.dtype(np.float64))}
for _z in _RELU_ZEROS.values():
    _z.flags.writeable = False


def relu(x: np.ndarray) -> np.ndarray:
    """``np.maximum(x, 0)``, the same ufunc on the same values (NaN propagates, -0.0 gives +0.0).

    A large contiguous float tensor is taken as rows of 4096 against one row of zeros: NumPy's
    maximum runs its vectorized array-array loop there, while against a scalar 0 it took twice
    as long (float32 64x80x80, NumPy 2.4: 306 -> 164 us); the output comes from the native
    engine's buffer pool (no fresh pages to fault in).
    """
    zeros = _RELU_ZEROS.get(x.dtype)
    if zeros is None or x.size < (1 << 14) or not x.flags.c_contiguous:
        return np.maximum(x, x.dtype.type(0))
    out = _native.empty(x.shape, x.dtype)
    flat, o = x.reshape(-1), out.reshape(-1)
    b = zeros.size
    k = flat.size - flat.size % b
    np.maximum(flat[:k].reshape(-1, b), zeros, out=o[:k].reshape(-1, b))
    if k < flat.size:
        np.maximum(flat[k:], zeros[:flat.size - k], out=o[k:])
    return out


def leaky_relu(x: np.ndarray, alpha: float) -> np.ndarray:
    """``x if x >= 0 else alpha * x`` (onnxruntime's definition, its float32 product).

    For 0 <= alpha <= 1 that is ``max(x, alpha * x)`` (for x >= 0, x >= alpha*x; for x < 0,
    alpha*x >= x), and for alpha >= 1 ``min(x, alpha * x)``: two passes instead of a mask,
    a product and a select. NaN propagates either way.
    """
    t = x.dtype.type
    y = x * t(alpha)
    if 0 <= alpha <= 1:
        return np.maximum(x, y, out=y)
    if alpha >= 1:
        return np.minimum(x, y, out=y)
    return np.where(x >= t(0), x, y)


# --------------------------------------------------------------------------- Resize


def _resize_coords(mode: str, n_out: int, n_in: int, scale: float) -> np.ndarray:
    """Source coordinate of every output index along one axis, in float64.

    float64, as onnx.reference computes them: at an exact tie (a coordinate whose true value
    is a half-integer, e.g. 3.5 for 2 outputs from 7 inputs), a float32 evaluation lands one
    ulp on either side depending on how the scale rounded, so the tie rule of nearest_mode
    would not be applied. onnxruntime computes in float32 (and at such ties may pick the other
    neighbour); everywhere else the index is the same.
    """
    y = np.arange(n_out, dtype=np.float64)
    if mode == "asymmetric":
        return y / scale
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        # the integer output length, as onnxruntime (onnx.reference divides by scale * n_in - 1)
        return y * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        offset = n_in / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5
    raise ValueError(f"Resize: coordinate_transformation_mode {mode!r} is not implemented here")


def _nearest_index(xo: np.ndarray, nearest_mode: str, n_in: int) -> np.ndarray:
    fl = np.floor(xo)
    frac = xo - fl
    if nearest_mode == "round_prefer_floor":
        idx = fl + (frac > 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = fl + (frac >= 0.5)
    elif nearest_mode == "floor":
        idx = fl
    elif nearest_mode == "ceil":
        idx = np.ceil(xo)
    else:
        raise ValueError(f"Resize: nearest_mode {nearest_mode!r} is not one of "
                         "round_prefer_floor, round_prefer_ceil, floor, ceil")
    return np.clip(idx, 0, n_in - 1).astype(np.intp)


def resize(x: np.ndarray, *, scales=None, sizes=None, mode: str = "nearest",
           coordinate_transformation_mode: str = "half_pixel",
           nearest_mode: str = "round_prefer_floor") -> np.ndarray:
    """ONNX Resize (opset 11+) for nearest and linear, without axes/antialias/aspect policy.

    Output sizes: ``sizes``, or ``int(scale * input_dim)`` with the product in float32 as
    onnxruntime computes it (``0.6f * 5`` is 3, and a float32 scale that rounded below
    ``out / in`` still gives ``out``). The per-axis scale is the given one or ``out / in``.
    An axis whose scale is 1 and length unchanged is left as it is; the others are resized
    one axis at a time (a gather for nearest, two gathers and weights for linear).
    """
    r = x.ndim
    if sizes is not None and np.asarray(sizes).size:
        out = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(out) != r:
            raise ValueError(f"Resize: sizes has {len(out)} values for a rank-{r} input")
        if any(v < 0 for v in out):
            raise ValueError(f"Resize: sizes must be non-negative, got {out}")
        sc = [out[i] / x.shape[i] if x.shape[i] else 1.0 for i in range(r)]
    elif scales is not None and np.asarray(scales).size:
        s32 = np.asarray(scales, dtype=np.float32).reshape(-1)
        if len(s32) != r:
            raise ValueError(f"Resize: scales has {len(s32)} values for a rank-{r} input")
        if not (s32 > 0).all():
            raise ValueError(f"Resize: scales must be positive, got {s32.tolist()}")
        out = [int(s32[i] * np.float32(x.shape[i])) for i in range(r)]
        sc = [float(v) for v in s32]
    else:
        raise ValueError("Resize: one of scales and sizes must be given")
    axes = [i for i in range(r) if not (sc[i] == 1 and out[i] == x.shape[i])]
    if mode == "nearest":
        y = x
        for i in axes:  # one axis at a time: a gather of whole slabs
            xo = _resize_coords(coordinate_transformation_mode, out[i], x.shape[i], sc[i])
            y = np.take(y, _nearest_index(xo, nearest_mode, x.shape[i]), axis=i)
        return y if axes else x.copy()
    if mode != "linear":
        raise ValueError(f"Resize: mode {mode!r} is not implemented here")
    dt = x.dtype
    work = np.float32 if dt == np.float16 else dt
    y = x.astype(work, copy=False)
    for i in axes:
        n_in = x.shape[i]
        xo = _resize_coords(coordinate_transformation_mode, out[i], n_in, sc[i])
        xo = np.clip(xo, 0, n_in - 1)
        i0 = np.minimum(xo.astype(np.intp), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w1 = xo - i0  # weight of i1
        w0 = 1 - w1  # weight of i0 (i0 == i1 only at the last index, where w1 = 0)
        shape = [1] * r
        shape[i] = out[i]
        y = (np.take(y, i0, axis=i) * w0.astype(work).reshape(shape)
             + np.take(y, i1, axis=i) * w1.astype(work).reshape(shape))
    return y.astype(dt, copy=False) if axes else x.copy()


class _FloatOp(OpRun):
    """Base: attributes parsed once; ``compute`` runs supported inputs, the rest delegates.

    ``run`` is overridden (not ``_run``) so a call costs one Python frame, not OpRun's
    attribute plumbing and output checks; a node with an attribute linked to a function's
    attribute, or one ``supported`` refuses, runs as onnx.reference runs it.
    """

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = onnx.defs.get_schema(onnx_node.op_type, opset, "").since_version
        self.given = node_attributes(onnx_node)
        self._delegate = load_op("", onnx_node.op_type, self.version)(onnx_node, run_params)
        self._linked = any(a.ref_attr_name for a in onnx_node.attribute)
        self._static_ok = not self._linked and self.supported_node()

    def supported_node(self) -> bool:
        return True

    def supported(self, *args) -> bool:
        return args and getattr(args[0], "dtype", None) in _FLOATS

    def run(self, *args, **kwargs):  # noqa: D102
        if kwargs or not self._static_ok or not self.supported(*args):
            return self._delegate.run(*args, **kwargs)
        return (self.compute(*args),)

    def _run(self, *args, **kwargs):  # run() does the work
        raise NotImplementedError

    def compute(self, *args):
        raise NotImplementedError


class Conv(_FloatOp):
    def compute(self, x, w, b=None):
        g = self.given
        return conv(x, w, b, auto_pad=g.get("auto_pad", "NOTSET"), dilations=g.get("dilations"),
                    group=g.get("group", 1), kernel_shape=g.get("kernel_shape"),
                    pads=g.get("pads"), strides=g.get("strides"))

    def supported(self, x, w, b=None):
        return (getattr(x, "dtype", None) in _FLOATS and getattr(w, "dtype", None) == x.dtype
                and (b is None or b.dtype == x.dtype))


class AveragePool(_FloatOp):
    def compute(self, x):
        g = self.given
        return average_pool(x, kernel_shape=g["kernel_shape"], strides=g.get("strides"),
                            pads=g.get("pads"), dilations=g.get("dilations"),
                            auto_pad=g.get("auto_pad", "NOTSET"), ceil_mode=g.get("ceil_mode", 0),
                            count_include_pad=g.get("count_include_pad", 0))

    def supported_node(self):
        return "kernel_shape" in self.given


class GlobalAveragePool(_FloatOp):
    def compute(self, x):
        return global_average_pool(x)


class GlobalMaxPool(_FloatOp):
    def compute(self, x):
        return global_max_pool(x)


class Sigmoid(_FloatOp):
    def compute(self, x):
        return sigmoid(x)


class Softmax(_FloatOp):
    def compute(self, x):
        default = -1 if self.version >= 13 else 1
        return softmax(x, self.given.get("axis", default), coerce_2d=self.version < 13)


class LeakyRelu(_FloatOp):
    def compute(self, x):
        return leaky_relu(x, self.given.get("alpha", 0.01))


class Relu(_FloatOp):
    def compute(self, x):
        return relu(x)

    def supported(self, *args):
        return args and isinstance(args[0], np.ndarray) and args[0].dtype.kind in "fiu"


class Resize(_FloatOp):
    _MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
              "half_pixel_symmetric")
    _NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

    def supported_node(self):
        g = self.given
        return (self.version >= 11 and g.get("mode", "nearest") in ("nearest", "linear")
                and g.get("coordinate_transformation_mode", "half_pixel") in self._MODES
                and g.get("nearest_mode", "round_prefer_floor") in self._NEAREST
                and not g.get("antialias", 0) and g.get("axes") is None
                and g.get("keep_aspect_ratio_policy", "stretch") == "stretch")

    def supported(self, x, *rest):
        if not isinstance(x, np.ndarray):
            return False
        if self.given.get("mode", "nearest") == "nearest":
            return True  # a selection: any element type
        return x.dtype in _FLOATS

    def compute(self, x, roi=None, scales=None, sizes=None):
        g = self.given
        return resize(x, scales=scales, sizes=sizes, mode=g.get("mode", "nearest"),
                      coordinate_transformation_mode=g.get("coordinate_transformation_mode",
                                                           "half_pixel"),
                      nearest_mode=g.get("nearest_mode", "round_prefer_floor"))


class Reshape(_FloatOp):
    """A view with the new shape; 0 copies the input dimension unless ``allowzero`` (14+)."""

    def supported(self, data, shape=None, *rest):
        return isinstance(data, np.ndarray) and isinstance(shape, np.ndarray) \
            and shape.dtype == np.int64 and shape.ndim == 1 and not rest

    def compute(self, data, shape):
        dims = shape.tolist()
        if not self.given.get("allowzero", 0):
            if len(dims) > data.ndim and 0 in dims[data.ndim:]:
                return self._delegate.run(data, shape)[0]  # its error message
            dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return data.reshape(dims)


class _AxesView(_FloatOp):
    """Unsqueeze / Squeeze: the view onnx.reference returns (np.expand_dims / np.squeeze, both
    a reshape of the input), its shape worked out by onnx.reference once per input shape and
    axes (its checks and messages on the way) and applied as ``data.reshape`` afterwards."""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        self._shapes: dict[tuple, tuple] = {}
        axes = self.given.get("axes")  # versions 1-12: an attribute
        self._attr_axes = None if axes is None else tuple(int(a) for a in axes)

    def supported(self, data=None, axes=None, *rest):
        if rest or type(data) is not np.ndarray:
            return False
        if self.version < 13:
            return axes is None
        return axes is None or (type(axes) is np.ndarray and axes.dtype == np.int64 and axes.ndim == 1)

    def compute(self, data, axes=None):
        key = (data.shape, self._attr_axes if axes is None else tuple(axes.tolist()))
        shape = self._shapes.get(key)
        if shape is None:
            args = (data,) if axes is None else (data, axes)
            shape = self._delegate.run(*args)[0].shape
            if len(self._shapes) >= 64:
                self._shapes.clear()
            self._shapes[key] = shape
        return data.reshape(shape)


class Unsqueeze(_AxesView):
    pass


class Squeeze(_AxesView):
    pass


#: Operators never folded into constants: their outputs differ between runs on the same
#: inputs (random generators) or they have effects beyond their outputs.
_NOT_FOLDABLE = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                           "Multinomial", "Bernoulli", "Dropout"})

FLOAT_KERNELS: list[type[OpRun]] = [Conv, AveragePool, GlobalAveragePool, GlobalMaxPool, Sigmoid,
                                    Softmax, LeakyRelu, Relu, Resize, Reshape, Unsqueeze, Squeeze]

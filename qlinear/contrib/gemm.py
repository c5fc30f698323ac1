"""QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLinear, QLinearConv
(channels_last), QuantizeLinear and DequantizeLinear (com.microsoft), as onnxruntime 1.32's CPU
kernels compute them (docs/contract.md). The integer products go through qlinear's exact
integer GEMM (``qlinear.matmul_integer`` / the prepared forms); the float epilogues are here."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import _validate as v
from .. import dtypes
from .. import _native
from ..conv import qlinear_conv as _qlinear_conv
from ..matmul import matmul_integer, prepare_matmul_integer
from ..quantize import dequantize_linear as _dequantize_linear
from ..quantize import quantize_linear as _quantize_linear
from . import _params as p
from ._arith import F32, mlas_quantize, requantize_multiply

_SIXTEEN_BIT = (np.dtype(np.uint16), np.dtype(np.int16))


def _column_param(op: str, name: str, arr: np.ndarray, n: int) -> np.ndarray:
    """A per-tensor (one element, returned 0-d) or per-column ([N] or [1, N], returned [N]) value."""
    if arr.size == 1:
        return arr.reshape(())
    if arr.shape in ((n,), (1, n)):
        return arr.reshape(n)
    raise ValueError(f"{op}: {name} must have one element or one per column of B ({n}); got shape {arr.shape}")


def _product_as(op: str, product, *args) -> np.ndarray:
    """``product(*args)`` (qlinear's MatMulInteger, or an emulation of it), its errors naming
    ``op``, the operator the caller called, instead of matmul_integer."""
    try:
        return product(*args)
    except ValueError as e:
        inner = "matmul_integer: "
        if str(e).startswith(inner):
            raise ValueError(f"{op}: {str(e)[len(inner):]}") from None
        raise


class PreparedQGemm:
    """QGemm with a constant B (and its scale and zero point) validated and pre-transformed once
    (``qlinear.prepare_matmul_integer``); ``run`` takes the remaining inputs."""

    def __init__(self, B: np.ndarray, b_scale: Any, b_zero_point: Any, *, transB: int = 0) -> None:
        op = self.op = "qgemm"
        b = p.tensor(op, "B", B)
        if b.ndim != 2:
            raise ValueError(f"{op}: B must be 2-D; got shape {b.shape}")
        self.trans_b = p.flag(op, "transB", transB)
        b2 = np.ascontiguousarray(b.T) if self.trans_b else b
        self.k, self.n = b2.shape
        if b_zero_point is None:
            raise TypeError(f"{op}: b_zero_point is required")
        bzp = _column_param(op, "b_zero_point", v.zero_point(op, "b_zero_point", b_zero_point, "B", b.dtype), self.n)
        self.b_scale = _column_param(op, "b_scale", v.scale(op, "b_scale", b_scale), self.n)
        self._b, self._b_zero_point = b2, bzp
        self._product = prepare_matmul_integer(b2, bzp)

    def _accumulate(self, a: np.ndarray, a_zero_point: np.ndarray) -> np.ndarray:
        """The int32 integer product (the exact one; an emulation may compute another)."""
        return self._product.run(a, a_zero_point)

    def run(self, A: np.ndarray, a_scale: Any, a_zero_point: Any, C: np.ndarray | None = None,
            y_scale: Any = None, y_zero_point: Any = None, *, alpha: float = 1.0, transA: int = 0) -> np.ndarray:
        op = self.op
        a = p.tensor(op, "A", A)
        ta = p.flag(op, "transA", transA)
        if a.ndim != 2:
            raise ValueError(f"{op}: A must be 2-D; got shape {a.shape}")
        a2 = np.ascontiguousarray(a.T) if ta else a
        if a2.shape[1] != self.k:
            raise ValueError(f"{op}: A{'ᵀ' if ta else ''} {a2.shape} and B{'ᵀ' if self.trans_b else ''} "
                             f"{(self.k, self.n)} cannot be multiplied (K differs)")
        m, n = a2.shape[0], self.n
        sa, za = p.qparams(op, "a_scale", a_scale, "a_zero_point", a_zero_point, "A", a.dtype, required_zp=True)
        acc = _product_as(op, self._accumulate, a2, np.asarray(za, a.dtype))
        if C is not None:
            c = v.integer_tensor(op, "C", C, (np.dtype(np.int32),))
            try:
                np.broadcast_to(c, (m, n))
            except ValueError:
                raise ValueError(f"{op}: C must broadcast to (M, N) = {(m, n)}; got shape {c.shape}") from None
            acc = np.add(acc, c, dtype=np.int32)  # wraps modulo 2**32, as onnxruntime's int32 adds
        with np.errstate(all="ignore"):  # float32 arithmetic: underflow and overflow are values
            s = F32(p.float_attribute(op, "alpha", alpha)) * sa * self.b_scale  # f(f(alpha · a_scale) · b_scale_j)
        if y_scale is None:
            if y_zero_point is not None:
                raise TypeError(f"{op}: y_zero_point is given without y_scale")
            with np.errstate(all="ignore"):
                return acc.astype(F32) * s
        if y_zero_point is None:
            raise TypeError(f"{op}: y_zero_point is required with y_scale (it decides the output dtype)")
        yzp = v.output_zero_point(op, "y_zero_point", y_zero_point)
        ys, yz = p.qparams(op, "y_scale", y_scale, "y_zero_point", yzp, "Y", yzp.dtype, divides=True)
        with np.errstate(all="ignore"):
            mult = v.finite_multiplier(op, np.asarray(s / ys, F32), "alpha * a_scale * b_scale / y_scale")
        return requantize_multiply(acc.astype(F32), mult, yz, yzp.dtype)


    def bound_run(self, A: Any, a_scale: Any, a_zero_point: Any, C: Any = None, y_scale: Any = None,
                  y_zero_point: Any = None, *, alpha: float = 1.0, transA: int = 0):
        """``run`` bound to these parameters and to inputs like A, for a caller that passes the
        same parameter objects every time (a graph's planned node, ``qlinear.graph.evaluator``):
        every parameter is validated now, once; ``f(A2)`` gives run's result for an A2 of A's
        shape and dtype (the integer product still checks it), None for anything else (the
        caller then calls ``run``). None when this call would not succeed, or for a subclass
        (an emulation computes another product)."""
        if type(self) is not PreparedQGemm or type(A) is not np.ndarray:
            return None
        op = self.op
        try:
            ta = p.flag(op, "transA", transA)
            if A.ndim != 2 or (A.T if ta else A).shape[1] != self.k:
                return None
            m, n = (A.T if ta else A).shape[0], self.n
            sa, za = p.qparams(op, "a_scale", a_scale, "a_zero_point", a_zero_point, "A", A.dtype, required_zp=True)
            c = None
            if C is not None:
                c = v.integer_tensor(op, "C", C, (np.dtype(np.int32),))
                np.broadcast_to(c, (m, n))
            with np.errstate(all="ignore"):
                s = F32(p.float_attribute(op, "alpha", alpha)) * sa * self.b_scale
            if y_scale is None:
                if y_zero_point is not None:
                    return None
                mult = yz = ydt = None
            else:
                if y_zero_point is None:
                    return None
                yzp = v.output_zero_point(op, "y_zero_point", y_zero_point)
                ys, yz = p.qparams(op, "y_scale", y_scale, "y_zero_point", yzp, "Y", yzp.dtype, divides=True)
                with np.errstate(all="ignore"):
                    mult = v.finite_multiplier(op, np.asarray(s / ys, F32), "alpha * a_scale * b_scale / y_scale")
                ydt = yzp.dtype
        except (ValueError, TypeError):
            return None
        shape, dtype, zpa, accumulate = A.shape, A.dtype, np.asarray(za, A.dtype), self._accumulate
        lean = _lean_requantize(mult, yz, ydt)

        def run(A: Any) -> np.ndarray | None:
            if type(A) is not np.ndarray or A.dtype is not dtype or A.shape != shape:
                return None
            a2 = np.ascontiguousarray(A.T) if ta else A
            acc = _product_as(op, accumulate, a2, zpa)
            if c is not None:
                acc = np.add(acc, c, dtype=np.int32)  # wraps modulo 2**32, as onnxruntime's int32 adds
            if mult is None:
                with np.errstate(all="ignore"):
                    return acc.astype(F32) * s
            if lean is not None:
                return lean(acc)
            return requantize_multiply(acc.astype(F32), mult, yz, ydt)

        return run


def _lean_requantize(mult: Any, yz: Any, ydt: Any):
    """``requantize_multiply(acc.astype(float32), mult, yz, ydt)`` for a bound QGemm, as ufuncs
    into one float32 buffer with the bounds made once (its own ufunc calls cost more than the
    arithmetic on a classifier's few outputs): f(f(acc) · m) clamped to [qmin - yz, qmax - yz]
    (m is finite and acc an integer, so no NaN reaches the clamp), rounded half to even, plus yz
    (|q + yz| <= 65535 < 2**24 for 8- and 16-bit outputs: exact in float32, and so is the cast).
    None for another output type (the general epilogue then runs)."""
    if mult is None or ydt is None or np.dtype(ydt).itemsize > 2:
        return None
    lo, hi = dtypes.INT_RANGE[np.dtype(ydt)]
    z = int(yz)
    flo, fhi, fz = F32(lo - z), F32(hi - z), F32(z)
    m = np.asarray(mult, F32)

    def lean(acc: np.ndarray) -> np.ndarray:
        q = acc.astype(F32)
        with np.errstate(over="ignore"):  # f(acc · m) may round past float32's range: ±inf clamps
            np.multiply(q, m, out=q)
        np.maximum(q, flo, out=q)
        np.minimum(q, fhi, out=q)
        np.rint(q, out=q)
        q += fz
        return q.astype(ydt)

    return lean


def prepare_qgemm(B: np.ndarray, b_scale: Any, b_zero_point: Any, *, transB: int = 0) -> PreparedQGemm:
    """Pre-transform QGemm's constant B once for repeated ``run(A, a_scale, a_zero_point, C,
    y_scale, y_zero_point, *, alpha, transA)`` calls."""
    return PreparedQGemm(B, b_scale, b_zero_point, transB=transB)


def qgemm(A: np.ndarray, a_scale: Any, a_zero_point: Any, B: np.ndarray, b_scale: Any, b_zero_point: Any,
          C: np.ndarray | None = None, y_scale: Any = None, y_zero_point: Any = None, *,
          alpha: float = 1.0, transA: int = 0, transB: int = 0) -> np.ndarray:
    """com.microsoft QGemm.

    acc = wrap32(C + Σ_k (a - a_zp)(b - b_zp_j)) (C int32, broadcast to (M, N), added before any
    scaling), s_j = f(f(alpha · a_scale) · b_scale_j). Without y_scale: y = f(f(acc) · s_j)
    (float32). With y_scale: y = sat(rne(clamp(f(f(acc) · f(s_j / y_scale)))) + y_zp), the dtype
    of y_zero_point. b_scale and b_zero_point may be per column.
    """
    p.tensor("qgemm", "A", A)
    return PreparedQGemm(B, b_scale, b_zero_point, transB=transB).run(
        A, a_scale, a_zero_point, C, y_scale, y_zero_point, alpha=alpha, transA=transA)


def _matmul_integer_to_float(op: str, a: np.ndarray, b: np.ndarray, sa: np.float32, za: int,
                             b_scale: Any, b_zero_point: Any, bias: Any, product=matmul_integer) -> np.ndarray:
    if b.ndim < 1 or a.ndim < 1:
        raise ValueError(f"{op}: A and B must have rank >= 1; got shapes {a.shape} and {b.shape}")
    n = b.shape[-1] if b.ndim > 1 else 1
    bs = _column_param(op, "b_scale", v.scale(op, "b_scale", b_scale), n)
    if b_zero_point is None:
        bz = np.zeros((), b.dtype)
    else:
        bz = _column_param(op, "b_zero_point", v.zero_point(op, "b_zero_point", b_zero_point, "B", b.dtype), n)
    acc = _product_as(op, product, a, b, np.asarray(za, a.dtype), bz)
    with np.errstate(over="ignore", invalid="ignore"):
        y = acc.astype(F32) * (sa * bs)  # s_j = f(a_scale · b_scale_j), then one multiply
        if bias is not None:
            bias_arr = p.float_tensor(op, "bias", bias)
            if bias_arr.shape != (n,):
                raise ValueError(f"{op}: bias must be 1-D with one value per column of B ({n},); got shape {bias_arr.shape}")
            y = y + bias_arr  # a separate float32 addition, not an fma
    return y


def matmul_integer_to_float(A: np.ndarray, B: np.ndarray, a_scale: Any, b_scale: Any, a_zero_point: Any = None,
                            b_zero_point: Any = None, bias: np.ndarray | None = None) -> np.ndarray:
    """com.microsoft MatMulIntegerToFloat: acc = Σ (a - a_zp)(b - b_zp_j) exactly (numpy.matmul
    shapes), y = f(f(f(acc) · f(a_scale · b_scale_j)) + bias_j). a_zero_point is per tensor;
    b_scale and b_zero_point per tensor or per column. a_scale is per tensor, or per row of A
    ((..., M, 1)), then y = f(f(f(f(acc) · b_scale_j) + bias_j) · a_scale_i)."""
    return _matmul_integer_to_float_op(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)


def _matmul_integer_to_float_op(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None,
                                product=matmul_integer) -> np.ndarray:
    """``matmul_integer_to_float`` with the integer product computed by ``product``."""
    op = "matmul_integer_to_float"
    a = p.tensor(op, "A", A)
    b = p.tensor(op, "B", B)
    sa_arr = v.scale(op, "a_scale", a_scale)
    if sa_arr.size == 1:
        sa, za = p.qparams(op, "a_scale", a_scale, "a_zero_point", a_zero_point, "A", a.dtype)
        return _matmul_integer_to_float(op, a, b, sa, za, b_scale, b_zero_point, bias, product)
    # Per row of A (shape (..., M, 1)): onnxruntime computes the product with a unit A scale,
    # adds the bias, and then multiplies by the broadcast A scale (measured; other shapes
    # gave results no formula here matched, so they are refused).
    _, za = p.qparams(op, "a_scale", F32(1), "a_zero_point", a_zero_point, "A", a.dtype)
    y = _matmul_integer_to_float(op, a, b, F32(1), za, b_scale, b_zero_point, bias, product)
    if sa_arr.shape[-1] != 1 or sa_arr.ndim > y.ndim or np.broadcast_shapes(sa_arr.shape, y.shape) != y.shape:
        raise ValueError(f"{op}: a_scale must have one element or one per row of A (shape (..., M, 1) "
                         f"broadcasting to the output {y.shape}); got shape {sa_arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        return y * sa_arr


def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ai.onnx DynamicQuantizeLinear as onnxruntime computes it: mn = min(min x, 0),
    mx = max(max x, 0) ignoring NaN; scale = 1 if mx == mn else f(f(mx - mn) / 255);
    zp = rne(clamp(f(0 - f(mn / scale)), 0, 255)); y = MlasQuantizeLinear(x, scale, zp) (uint8).
    Returns (y, scale as a 0-d float32 array, zero point as a 0-d uint8 array)."""
    op = "dynamic_quantize_linear"
    arr = p.float_tensor(op, "x", x)
    v.check_size(op, "the output", arr.shape, 1)  # before reducing x (maybe a broadcast view)
    C = _native.native()
    if C is not None and arr.dtype == F32 and arr.size:
        # the usual case in one native call (parameters and quantization; a few microseconds
        # less than the NumPy scalars below, which a GPT-2 block pays for four times): the
        # same float32 operations, and None where the guarded branch below is needed
        y = np.empty(arr.shape, np.uint8)
        flat = np.ascontiguousarray(arr).reshape(-1)
        got = C.dynamic_quantize(C.get_isa(), flat, flat.size, y.reshape(-1))
        if got is not None:
            return y, np.asarray(got[0], F32), np.asarray(got[1], np.uint8)
    lo_x = hi_x = F32(0)
    if arr.size:
        # arr.min() and arr.max() are these reductions, without their Python wrappers
        lo_x, hi_x = np.minimum.reduce(arr, axis=None), np.maximum.reduce(arr, axis=None)
        if lo_x != lo_x or hi_x != hi_x:  # NaN is ignored (fmin/fmax skip it; all NaN: 0)
            flat = arr.reshape(-1)
            lo_x, hi_x = F32(np.fmin.reduce(flat)), F32(np.fmax.reduce(flat))
            if lo_x != lo_x:
                lo_x = hi_x = F32(0)
    zero = F32(0)
    mn = zero if zero < lo_x else lo_x  # min(lo_x, 0) and max(hi_x, 0), first operand on ties
    mx = zero if zero > hi_x else hi_x
    if -1e37 < lo_x and hi_x < 1e37 and (mx == mn or mx - mn > F32(1e-30)):
        # the usual case, without np.errstate's cost (microseconds a call): mx - mn is finite,
        # the scale a normal float32 and |mn / scale| <= 255-ish, so no operation below
        # overflows, divides by zero or makes NaN
        scale = F32(1) if mx == mn else F32(F32(mx - mn) / F32(255))
        initial = F32(zero - F32(mn / scale))
    else:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scale = F32(1) if mx == mn else F32(F32(mx - mn) / F32(255))
            initial = F32(zero - F32(mn / scale))
    if zero <= initial <= F32(255):
        zp = round(float(initial))  # Python's round: half to even, exact on a float
    elif initial != initial:
        # NaN (an infinite input makes the scale infinite and mn / scale NaN): onnxruntime's
        # clamp returns the upper bound (measured: [-inf, 2] and [inf, -inf] give 255)
        zp = 255
    else:
        zp = int(np.rint(np.clip(initial, zero, F32(255))))
    if C is not None and arr.dtype == F32:
        # MlasQuantizeLinear equals ONNX QuantizeLinear here: one float32 division, clamping
        # to [0 - zp, 255 - zp] before rounding equals saturating after (integer bounds), and
        # NaN goes to 0 in both; the native kernel computes the latter
        y = np.empty(arr.shape, np.uint8)
        flat = np.ascontiguousarray(arr).reshape(-1)
        C.quantize(C.get_isa(), flat, 3, 1, 1, flat.size, 0, np.array([scale], F32),
                   np.array([zp], np.int32), y.reshape(-1), 0)
    else:
        y = mlas_quantize(arr, scale, zp, np.dtype(np.uint8))
    return y, np.asarray(scale, F32), np.asarray(zp, np.uint8)


def dynamic_quantize_matmul(A: np.ndarray, B: np.ndarray, b_scale: Any, b_zero_point: Any = None,
                            bias: np.ndarray | None = None) -> np.ndarray:
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 by ``dynamic_quantize_linear``,
    then ``matmul_integer_to_float`` with A's dynamic scale and zero point."""
    return _dynamic_quantize_matmul_op(A, B, b_scale, b_zero_point, bias)


def _dynamic_quantize_matmul_op(A, B, b_scale, b_zero_point=None, bias=None, product=matmul_integer) -> np.ndarray:
    """``dynamic_quantize_matmul`` with the integer product computed by ``product``."""
    op = "dynamic_quantize_matmul"
    a_float = p.float_tensor(op, "A", A)
    b = p.tensor(op, "B", B)
    qa, sa, za = dynamic_quantize_linear(a_float)
    return _matmul_integer_to_float(op, qa, b, F32(sa), int(za), b_scale, b_zero_point, bias, product)


def quantize_linear(x: np.ndarray, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1) -> np.ndarray:
    """com.microsoft QuantizeLinear: ONNX QuantizeLinear's arithmetic (one float32 division,
    ties to even, saturation, NaN to the minimum) for uint8, int8, uint16 and int16 outputs,
    per tensor or along ``axis``. 8-bit outputs run on ``qlinear.quantize_linear``."""
    op = "quantize_linear"
    zp_arr = None if y_zero_point is None else np.asarray(y_zero_point)
    if zp_arr is None or zp_arr.dtype not in _SIXTEEN_BIT:
        return _quantize_linear(x, y_scale, y_zero_point, axis=axis)
    arr = p.float_tensor(op, "x", x)
    s = v.nonzero_scale(op, "y_scale", y_scale)
    v.same_shape(op, "y_scale", s, "y_zero_point", zp_arr)
    s, zp = _along_axis(op, arr, s, zp_arr, axis)
    lo, hi = dtypes.INT_RANGE[np.dtype(zp_arr.dtype)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = arr / s
    q = np.where(np.isnan(q), F32(-np.inf), q)
    q = np.clip(q, (lo - zp).astype(F32), (hi - zp).astype(F32))
    return (np.rint(q).astype(np.int64) + zp).astype(zp_arr.dtype)


def _along_axis(op: str, x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int):
    if scale.size == 1:
        return scale.reshape(()), zp.reshape(()).astype(np.int64)
    if scale.ndim != 1:
        raise ValueError(f"{op}: the scale must be a scalar or 1-D (per axis); got shape {scale.shape}")
    ax = v.axis_attribute(op, axis, x.ndim)
    if scale.shape[0] != x.shape[ax]:
        raise ValueError(f"{op}: the scale has {scale.shape[0]} elements but x has {x.shape[ax]} along axis {axis}")
    shape = [1] * x.ndim
    shape[ax] = -1
    return scale.reshape(shape), zp.reshape(shape).astype(np.int64)


def dequantize_linear(x: np.ndarray, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1) -> np.ndarray:
    """com.microsoft DequantizeLinear: y = f(f(x - x_zp) · x_scale) for uint8, int8, uint16,
    int16 and int32 (zero point 0) inputs, per tensor or along ``axis``. The 16-bit difference is
    exact in float32 (|x - zp| <= 65535 < 2**24). 8-bit and int32 inputs run on
    ``qlinear.dequantize_linear``."""
    op = "dequantize_linear"
    arr = v.integer_tensor(op, "x", x, (*v.DEQUANTIZABLE, *_SIXTEEN_BIT))
    if arr.dtype not in _SIXTEEN_BIT:
        return _dequantize_linear(arr, x_scale, x_zero_point, axis=axis)
    s = v.scale(op, "x_scale", x_scale)
    zp = np.zeros(s.shape, arr.dtype) if x_zero_point is None else v.zero_point(op, "x_zero_point", x_zero_point, "x", arr.dtype)
    v.same_shape(op, "x_scale", s, "x_zero_point", zp)
    s, z = _along_axis(op, arr, s, zp, axis)
    with np.errstate(over="ignore"):
        return (arr.astype(np.int64) - z).astype(F32) * s


def qlinear_conv(x: np.ndarray, x_scale: Any, x_zero_point: Any, w: np.ndarray, w_scale: Any, w_zero_point: Any,
                 y_scale: Any, y_zero_point: Any, B: np.ndarray | None = None, *, channels_last: int = 0,
                 auto_pad: str = "NOTSET", dilations: Sequence[int] | None = None, group: int = 1,
                 kernel_shape: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                 strides: Sequence[int] | None = None) -> np.ndarray:
    """com.microsoft QLinearConv: the ONNX QLinearConv (``qlinear.qlinear_conv``); with
    channels_last, x and y are (N, spatial..., C) while w stays (M, C/group, k...)."""
    cl = p.flag("qlinear_conv", "channels_last", channels_last)
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                 pads=pads, strides=strides)
    xin = np.moveaxis(x, -1, 1) if cl and isinstance(x, np.ndarray) and x.ndim >= 3 else x
    y = _qlinear_conv(xin, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B,
                        **{k: val for k, val in attrs.items() if val is not None})
    return np.moveaxis(y, 1, -1) if cl else y

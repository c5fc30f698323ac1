"""QuantizeLinear (10, 13) and DequantizeLinear (10, 13): per tensor or per axis."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import _native, _qdq, dtypes
from . import _validate as v
from ._prepared import RepeatMemo, copy_contiguous
from ._qdq import LATEST
from .engines.native import formats as nformats
from .engines.native import quantize as nq
from ._elementwise import as_3d, run_blocked, scratch
from ._requant import round_saturate_block, saturation_params

_QUANTIZABLE = (np.dtype(np.float32), np.dtype(np.int32))


def _axis_param(op: str, name: str, arr: np.ndarray, x_shape: tuple[int, ...], axis: Any) -> tuple[np.ndarray, int | None]:
    """A per-tensor (one element) or per-axis (1-D along ``axis``) parameter.

    Returns it 0-d with axis None, or shaped (C, 1) with the normalized axis: the layout
    ``run_blocked`` takes for a tensor seen as (pre, C, post).
    """
    if arr.size == 1:
        return arr.reshape(()), None
    if arr.ndim != 1:
        raise ValueError(f"{op}: {name} must be a scalar or 1-D (per axis); got shape {arr.shape}")
    if not x_shape:
        raise ValueError(f"{op}: {name} is per axis ({arr.shape[0]} elements) but x is 0-d")
    ax = v.axis_attribute(op, axis, len(x_shape))
    if arr.shape[0] != x_shape[ax]:
        raise ValueError(
            f"{op}: {name} has {arr.shape[0]} elements but x has {x_shape[ax]} along axis {axis} "
            f"(x shape {x_shape})"
        )
    return arr.reshape(-1, 1), ax


def _quantize_block(x: np.ndarray, out: np.ndarray, scale: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                    zp: np.ndarray) -> None:
    values = scratch(x.shape)
    np.divide(x, scale, out=values, dtype=np.float32)  # an int32 x is cast to float32 first
    round_saturate_block(values, out, lo, hi, zp, may_have_nan=True)


def _dequantize_block(x: np.ndarray, out: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> None:
    # 8-bit values and zero points are exact in float32, and so is their difference; an int32
    # x has a zero zero point and its cast to float32 rounds to nearest. (A plain cast, then
    # float32 arithmetic: measured 1.5x faster than one mixed-type subtraction.)
    np.copyto(out, x, casting="unsafe")
    out -= zp
    out *= scale


# The last per-tensor call of each direction, for the repeat path: a call passing the same
# immutable parameters (NumPy scalars, Python numbers, None: equal values validate alike) and a
# contiguous x of the same shape and dtype object goes straight to the kernel. Never an array: a
# 0-d array could be changed between calls. A non-contiguous x takes the full path (a broadcast
# view runs block by block there, without a copy).
_REPEAT = {True: RepeatMemo("quantize_linear", "x", copies=False),
           False: RepeatMemo("dequantize_linear", "x", copies=False)}


def quantize_linear(x: np.ndarray, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1,
                    block_size: int = 0, saturate: int = 1, output_dtype: Any = None, precision: Any = None,
                    version: int = LATEST) -> np.ndarray:
    """ONNX QuantizeLinear (versions 10 to 28): y = convert(x / y_scale (+ y_zero_point)).

    x: float32, float16, bfloat16 or int32. y_scale: float32, float16, bfloat16, int32 or
    float8e8m0 (a Python float is float32). The output type T is ``output_dtype`` (a NumPy or
    ml_dtypes dtype, or an ONNX element type), else y_zero_point's type, else uint8: uint8,
    int8, uint16, int16, uint4, int4, uint2, int2 (ml_dtypes' dtypes, one element per byte),
    float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz, float4e2m1, float6 e2m3/e3m2.

    The division runs in P = ``precision`` if set; else, from version 23, y_scale's type
    (float32 for an int32 or float8e8m0 scale); else float32: both operands rounded to P, one
    correctly rounded division. Integer T: rne, + y_zero_point, saturated; +inf goes to T's
    max, -inf and NaN to T's min. Float T: + y_zero_point in P, then one round-to-nearest-even
    conversion; ``saturate=1`` sends ±inf and overflow to ±max, ``saturate=0`` to NaN (±inf
    for e5m2); float4/float6 always saturate (NaN gives +max). Parameters per tensor, per
    ``axis`` (1-D), or blocked (``block_size`` > 0: the rank of x, ceil(D / block_size) along
    ``axis``). ``version`` (default the newest) selects the version's types, attributes and
    division precision. docs/contract.md has the whole contract.
    """
    op = "quantize_linear"
    plain = output_dtype is None and precision is None and block_size == 0 and version == LATEST
    if plain:
        out = _REPEAT[True].repeat(x, (y_scale, y_zero_point), nq.run)
        if out is not None:
            return out
    if not isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: x must be a NumPy array of dtype float32 or int32; got a Python {type(x).__name__}")
    if (plain and x.dtype in _QUANTIZABLE and _plain_scale(y_scale)
            and (not isinstance(y_zero_point, (np.ndarray, np.generic)) or y_zero_point.dtype in dtypes.EIGHT_BIT)):
        # the 8-bit contract's own path (float32 or int32 x, float32 scale, P = float32)
        return _quantize_8bit(op, v.as_array(op, "x", x), y_scale, y_zero_point, axis, y_scale, y_zero_point)
    ver = _qdq.version_of(op, version)
    x, xt = _qdq.input_tensor(op, "x", x, _qdq.Q_INPUTS, ver)
    qp = _qdq.QuantizeParams(op, x, xt, y_scale, y_zero_point, axis, block_size, saturate, output_dtype,
                             precision, ver)
    v.check_size(op, "the output", x.shape, qp.out.dtype.itemsize)
    if (qp.out.native and x.dtype in _QUANTIZABLE and qp.scale_type is dtypes.F32
            and qp.precision is dtypes.F32 and qp.layout.kind != "blocked"):
        # the same arithmetic: the 8-bit path (its kernels), with the validated parameters as
        # arrays, which the repeat-call cache never keys on (the call's attributes are not
        # part of its key)
        zp = qp.zero_point if qp.zero_point is not None else np.zeros(qp.scale.shape, qp.out.dtype)
        scale = np.asarray(qp.scale, np.float32)
        return _quantize_8bit(op, x, scale, zp, axis, scale, zp)
    out = nformats.quantize(x, xt, qp)
    return out if out is not None else _qdq.quantize(x, xt, qp)


def _plain_scale(s: Any) -> bool:
    """A float32 scale (or a Python float): what the 8-bit path takes without conversion."""
    return isinstance(s, float) or (isinstance(s, (np.ndarray, np.generic)) and s.dtype == np.float32)


def _quantize_8bit(op: str, x: np.ndarray, y_scale: Any, y_zero_point: Any, axis: Any, scale_arg: Any,
                   zp_arg: Any) -> np.ndarray:
    """The 8-bit path: float32 or int32 x, a float32 scale per tensor or per axis, P = float32."""
    scale = v.nonzero_scale(op, "y_scale", y_scale)
    if y_zero_point is None:
        zp = np.zeros(scale.shape, dtype=np.uint8)
    else:
        zp = v.output_zero_point(op, "y_zero_point", y_zero_point)
        v.same_shape(op, "y_scale", scale, "y_zero_point", zp)
    scale, ax = _axis_param(op, "y_scale", scale, x.shape, axis)
    zp_b, _ = _axis_param(op, "y_zero_point", zp, x.shape, axis)  # same shape as y_scale
    v.check_size(op, "the output", x.shape, zp.dtype.itemsize)  # x may be a broadcast view
    shape3 = as_3d(x.shape, ax)
    C = _native.native()
    if C is not None and x.flags.c_contiguous:  # (a broadcast view goes block by block below)
        out = _native.empty(x.shape, zp.dtype)
        _REPEAT[True].remember(x, (scale_arg, zp_arg), nq.elementwise(True, x, shape3, ax is not None, scale, zp_b, out))
        return out
    out = np.empty(x.shape, dtype=zp.dtype)
    # NaN goes to T's min (in round_saturate_block), the value onnxruntime's CPU kernel gives.
    # x / tiny scale overflows to ±inf, which saturates; x / huge scale underflows to 0 or a
    # denormal, which rounds to 0: float32 arithmetic, not an error.
    with np.errstate(over="ignore", under="ignore"):
        run_blocked(_quantize_block, [x.reshape(shape3), out.reshape(shape3)],
                    [scale, *saturation_params(zp_b, zp.dtype)])
    return out


def dequantize_linear(x: np.ndarray, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1,
                      block_size: int = 0, output_dtype: Any = None, version: int = LATEST) -> np.ndarray:
    """ONNX DequantizeLinear (versions 10 to 28): y = round_out(float32(x - x_zero_point) · x_scale).

    x: uint8, int8, uint16, int16, int32, uint4, int4, uint2, int2 or a float8/float6/float4
    format (ml_dtypes' dtypes); x_zero_point of x's type (int32: 0 only). x_scale: float32,
    float16, bfloat16 or float8e8m0 (a Python float is float32). The difference is exact,
    converted to float32 (rounded once only for int32 above 2**24 and for float-format
    differences float32 cannot hold), one float32 multiplication, then one rounding to the
    output type: ``output_dtype`` (float32, float16, bfloat16; version 23 on), else x_scale's
    type (float32 for a float8e8m0 scale). Per tensor, per ``axis`` or blocked (``block_size``).
    """
    op = "dequantize_linear"
    plain = output_dtype is None and block_size == 0 and version == LATEST
    if plain:
        out = _REPEAT[False].repeat(x, (x_scale, x_zero_point), nq.run)
        if out is not None:
            return out
    if not (plain and isinstance(x, np.ndarray) and x.dtype in v.DEQUANTIZABLE and _plain_scale(x_scale)):
        ver = _qdq.version_of(op, version)
        x, xt = _qdq.input_tensor(op, "x", x, _qdq.DQ_INPUTS, ver)
        dp = _qdq.DequantizeParams(op, x, xt, x_scale, x_zero_point, axis, block_size, output_dtype, ver)
        if not (x.dtype in v.DEQUANTIZABLE and dp.out is dtypes.F32 and np.asarray(x_scale).dtype == np.float32
                and dp.layout.kind != "blocked"):
            v.check_size(op, "the output", x.shape, dp.out.dtype.itemsize)
            out = nformats.dequantize(x, xt, dp)
            return out if out is not None else _qdq.dequantize(x, xt, dp)
    return _dequantize_8bit(op, x, x_scale, x_zero_point, axis)


def _dequantize_8bit(op: str, x: Any, x_scale: Any, x_zero_point: Any, axis: Any) -> np.ndarray:
    """The 8-bit path: uint8, int8 or int32 x, a float32 scale per tensor or per axis."""
    x = v.integer_tensor(op, "x", x, v.DEQUANTIZABLE)
    scale = v.scale(op, "x_scale", x_scale)
    if x_zero_point is None:
        zp = np.zeros(scale.shape, dtype=x.dtype)
    else:
        zp = v.zero_point(op, "x_zero_point", x_zero_point, "x", x.dtype)
        v.same_shape(op, "x_scale", scale, "x_zero_point", zp)
        if x.dtype == np.int32 and np.any(zp != 0):
            raise ValueError(f"{op}: x_zero_point must be 0 when x is int32; got {zp.ravel()[zp.ravel() != 0][0]}")
    scale, ax = _axis_param(op, "x_scale", scale, x.shape, axis)
    zp, _ = _axis_param(op, "x_zero_point", zp, x.shape, axis)  # same shape as x_scale
    v.check_size(op, "the output", x.shape, 4)  # x may be a broadcast view
    shape3 = as_3d(x.shape, ax)
    C = _native.native()
    if C is not None and x.flags.c_contiguous:
        out = _native.empty(x.shape, np.float32)
        _REPEAT[False].remember(x, (x_scale, x_zero_point),
                                nq.elementwise(False, x, shape3, ax is not None, scale, zp, out))
        return out
    out = np.empty(x.shape, dtype=np.float32)
    zp = zp.astype(np.float32)
    # A huge scale overflows to ±inf, a tiny one underflows to 0 or a denormal, as float32 does.
    with np.errstate(over="ignore", under="ignore"):
        run_blocked(_dequantize_block, [x.reshape(shape3), out.reshape(shape3)], [scale, zp])
    return out


def _real_array(x: np.ndarray) -> bool:
    """Contiguous, or a view without a broadcast axis (stride 0), which the fast paths copy to
    a contiguous array first (a broadcast view takes the plain functions and their checks)."""
    return x.flags.c_contiguous or 0 not in x.strides


class PreparedQuantize:
    """``quantize_linear(x, y_scale, y_zero_point, axis=axis)`` with the parameters validated
    once (the backend's QuantizeLinear nodes whose scale and zero point are model constants):
    ``run(x)`` gives the same bits. A per-tensor quantization of a float32 ``x`` (a strided or
    transposed view copied first) goes straight to the native kernel; anything else (per axis,
    another dtype, a broadcast view, the NumPy engine) takes :func:`quantize_linear` itself,
    with its checks and messages."""

    def __init__(self, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1):
        op = "quantize_linear"
        scale = v.nonzero_scale(op, "y_scale", y_scale)
        if y_zero_point is None:
            zp = np.zeros(scale.shape, dtype=np.uint8)
        else:
            zp = v.output_zero_point(op, "y_zero_point", y_zero_point)
            v.same_shape(op, "y_scale", scale, "y_zero_point", zp)
        self._args = (y_scale, y_zero_point)
        self._axis = axis
        self._per_tensor = scale.size == 1
        self._scale, self._zp = nq.per_tensor(scale, zp)
        self.dtype = zp.dtype

    def run(self, x: np.ndarray) -> np.ndarray:
        C = _native.native()
        if (C is None or not self._per_tensor or type(x) is not np.ndarray
                or x.dtype != np.float32 or not _real_array(x)):
            return quantize_linear(x, *self._args, axis=self._axis)
        if not x.flags.c_contiguous:  # a transposed or strided view: copied first
            v.check_size("quantize_linear", "a contiguous copy of x", x.shape, 4)
            x = copy_contiguous(x)
        # x is a real contiguous float32 array, so the output (a quarter of its bytes) needs no
        # size check
        out = np.empty(x.shape, dtype=self.dtype)
        nq.quantize_tensor(C, x, self._scale, self._zp, out)
        return out

    def bound_run(self, x: Any) -> Callable[[Any], np.ndarray | None] | None:
        """``run`` bound to inputs like ``x`` when run would take the native kernel for it:
        ``f(x2)`` gives ``run(x2)`` for a C-contiguous float32 array of x's shape while the
        native engine is selected, None for anything else (the caller then calls ``run``);
        None when x does not take the native kernel. For a graph's planned node
        (``qlinear.graph.evaluator``): one Python frame and the native call."""
        C = _native.native()
        if (C is None or not self._per_tensor or type(x) is not np.ndarray or x.dtype != np.float32
                or not x.flags.c_contiguous):
            return None
        shape, dtype, odt = x.shape, x.dtype, self.dtype
        scale, zp, quantize = self._scale, self._zp, nq.quantize_tensor

        def run(x: Any) -> np.ndarray | None:
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or _native.native() is not C):
                return None
            out = np.empty(shape, dtype=odt)
            quantize(C, x, scale, zp, out)
            return out

        return run


class PreparedDequantize:
    """``dequantize_linear(x, x_scale, x_zero_point, axis=axis)`` with the parameters validated
    once: ``run(x)`` gives the same bits; a per-tensor dequantization of an 8-bit ``x`` of the
    zero point's dtype (a strided or transposed view copied first) goes straight to the native
    kernel, anything else takes :func:`dequantize_linear`."""

    def __init__(self, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1):
        op = "dequantize_linear"
        scale = v.scale(op, "x_scale", x_scale)
        zp = None
        if isinstance(x_zero_point, np.ndarray) and x_zero_point.dtype in dtypes.EIGHT_BIT:
            zp = x_zero_point
        self._args = (x_scale, x_zero_point)
        self._axis = axis
        # the fast path needs one scale and, if given, one 8-bit zero point (an int32 zero
        # point, a per-axis one or anything unusual goes through dequantize_linear's checks)
        self._fast = scale.size == 1 and (x_zero_point is None or (zp is not None and zp.size == 1))
        self._zp_dtype = zp.dtype if zp is not None else None
        self._scale, self._zp = nq.per_tensor(scale, zp if zp is not None else np.zeros(1))

    def run(self, x: np.ndarray) -> np.ndarray:
        C = _native.native()
        if (C is None or not self._fast or type(x) is not np.ndarray or not _real_array(x)
                or x.dtype not in dtypes.EIGHT_BIT
                or (self._zp_dtype is not None and x.dtype != self._zp_dtype)):
            return dequantize_linear(x, *self._args, axis=self._axis)
        v.check_size("dequantize_linear", "the output", x.shape, 4)
        if not x.flags.c_contiguous:  # a transposed or strided view: copied first (a quarter
            x = copy_contiguous(x)  # of the output's bytes, checked above)
        out = np.empty(x.shape, dtype=np.float32)
        nq.dequantize_tensor(C, x, self._scale, self._zp, out)
        return out

    def bound_run(self, x: Any) -> Callable[[Any], np.ndarray | None] | None:
        """``run`` bound to inputs like ``x`` when run would take the native kernel for it:
        ``f(x2)`` gives ``run(x2)`` for a C-contiguous array of x's shape and dtype while the
        native engine is selected and the output size limit is unchanged, None for anything
        else (the caller then calls ``run``); None when x does not take the native kernel."""
        C = _native.native()
        if (C is None or not self._fast or type(x) is not np.ndarray or not x.flags.c_contiguous
                or x.dtype not in dtypes.EIGHT_BIT or (self._zp_dtype is not None and x.dtype != self._zp_dtype)):
            return None
        try:
            v.check_size("dequantize_linear", "the output", x.shape, 4)
        except ValueError:
            return None
        shape, dtype, scale, zp = x.shape, x.dtype, self._scale, self._zp
        limit, max_output_bytes, dequantize = v.max_output_bytes(), v.max_output_bytes, nq.dequantize_tensor

        def run(x: Any) -> np.ndarray | None:
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or _native.native() is not C or max_output_bytes() != limit):
                return None
            out = np.empty(shape, dtype=np.float32)
            dequantize(C, x, scale, zp, out)
            return out

        return run



class _PreparedQDQ:
    """What the two prepared forms below share: the parameters' plan (validated and laid out)
    kept per x dtype and shape (at most 16), and the run on it. A subclass names its operator,
    its plain function, the name of its native and NumPy runs, and how a plan is built."""

    _op: str
    _kind: str   # "quantize" or "dequantize": the native and NumPy runs' name in their modules
    _plain: Any

    def plan(self, dtype: Any, shape: tuple[int, ...]) -> None:
        """Validate the parameters for an x of this dtype and shape and keep the result, as the
        first ``run`` of such an x does (the backend calls it when it prepares a model that
        declares x's type and shape): raises the plain call's ValueError/TypeError."""
        self._plan(np.broadcast_to(np.zeros((), dtype), tuple(shape)))

    def _plan(self, x: np.ndarray) -> tuple:
        key = (x.dtype, x.shape)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(x, _qdq.version_of(self._op, self._attrs["version"]))
            if len(self._plans) < 16:
                self._plans[key] = plan
        return plan

    def _make_plan(self, x: np.ndarray, ver: int) -> tuple:
        raise NotImplementedError

    def run(self, x: np.ndarray) -> np.ndarray:
        """The plain call's result for ``x`` (same bits), by the plan kept for its dtype and shape."""
        if type(x) is not np.ndarray or not x.dtype.isnative:
            return type(self)._plain(x, *self._args, **self._attrs)
        xt, params = self._plan(x)
        v.check_size(self._op, "the output", x.shape, params.out.dtype.itemsize)
        out = getattr(nformats, self._kind)(x, xt, params)
        return out if out is not None else getattr(_qdq, self._kind)(x, xt, params)


class PreparedQuantizeLinear(_PreparedQDQ):
    """``quantize_linear(x, y_scale, y_zero_point, **attributes)`` for every type and version,
    with the parameters validated and laid out once per x dtype and shape (the scale rounded
    to the division precision, the zero point converted, the granularity decided): ``run(x)``
    gives the same bits as the plain call. The first call of a dtype and shape raises the
    plain call's errors."""

    _op = "quantize_linear"
    _kind = "quantize"
    _plain = staticmethod(quantize_linear)

    def __init__(self, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1, block_size: int = 0,
                 saturate: int = 1, output_dtype: Any = None, precision: Any = None, version: int = LATEST):
        self._args = (y_scale, y_zero_point)
        self._attrs = dict(axis=axis, block_size=block_size, saturate=saturate, output_dtype=output_dtype,
                           precision=precision, version=version)
        self._plans: dict[tuple, tuple] = {}

    def _make_plan(self, x: np.ndarray, ver: int) -> tuple:
        a = self._attrs
        _, xt = _qdq.input_tensor(self._op, "x", x, _qdq.Q_INPUTS, ver)
        return xt, _qdq.QuantizeParams(self._op, x, xt, *self._args, a["axis"], a["block_size"], a["saturate"],
                                       a["output_dtype"], a["precision"], ver)


class PreparedDequantizeLinear(_PreparedQDQ):
    """``dequantize_linear(x, x_scale, x_zero_point, **attributes)`` for every type and version,
    with the parameters validated and laid out once per x dtype and shape: ``run(x)`` gives the
    same bits as the plain call."""

    _op = "dequantize_linear"
    _kind = "dequantize"
    _plain = staticmethod(dequantize_linear)

    def __init__(self, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1, block_size: int = 0,
                 output_dtype: Any = None, version: int = LATEST):
        self._args = (x_scale, x_zero_point)
        self._attrs = dict(axis=axis, block_size=block_size, output_dtype=output_dtype, version=version)
        self._plans: dict[tuple, tuple] = {}

    def _make_plan(self, x: np.ndarray, ver: int) -> tuple:
        a = self._attrs
        _, xt = _qdq.input_tensor(self._op, "x", x, _qdq.DQ_INPUTS, ver)
        return xt, _qdq.DequantizeParams(self._op, x, xt, *self._args, a["axis"], a["block_size"],
                                         a["output_dtype"], ver)

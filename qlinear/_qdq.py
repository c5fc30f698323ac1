"""QuantizeLinear / DequantizeLinear for every type and version (19-28): validation of the
newer inputs and attributes, and the exact NumPy kernels (FORMATS.md Part A, docs/contract.md).

The 8-bit per-tensor and per-axis cases with float32 parameters keep their own fast paths in
quantize.py (and the native engine); everything else comes here: int16/int4/int2 and the float
formats, float16/bfloat16 inputs and scales, float8e8m0 scales, blocked parameters, ``precision``
and ``output_dtype``.

QuantizeLinear: q = convert(x / y_scale in P (+ y_zero_point)). P = ``precision`` if set; else,
from version 23, the scale's type (float32 for an int32 or float8e8m0 scale); else float32. The
operands are rounded to P once, then one correctly rounded division in P (a float32 division
of the widened operands, then one rounding to P: float32's 24 bits are at least 2p+2 for
float16's and bfloat16's p, so that is the division in P). Integer outputs: rne, the zero point
added exactly, saturated; NaN gives the type's minimum. Float outputs: + zero point in P (for
float8 a zero zero point adds nothing, so -0 keeps its sign as in onnxruntime; a float4/float6
zero point is added as given), then one conversion by the Cast rules.

DequantizeLinear: y = round_to_output(float32(x - x_zero_point) * float32(x_scale)), the
difference exact (and rounded once to float32 where a float format's difference needs it).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from . import _params
from . import _validate as v
from . import dtypes
from .dtypes import BF16, F16, F32, QType

#: the newest QuantizeLinear/DequantizeLinear version; the default of ``version``
LATEST = 28
#: the versions of the operators (a version between two of them means the earlier one)
VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)

_WIDE = (F32, F16, BF16)
_E8M0 = dtypes.get("float8e8m0")
_I32 = dtypes.get("int32")


def version_of(op: str, version: Any) -> int:
    """The operator version whose semantics apply: the newest of VERSIONS at most ``version``."""
    if not isinstance(version, numbers.Integral) or isinstance(version, bool):
        raise TypeError(f"{op}: version must be an integer opset version; got {type(version).__name__}")
    if not VERSIONS[0] <= version:
        raise ValueError(f"{op}: version must be >= {VERSIONS[0]} (the first version of the operator); got {version}")
    return max(x for x in VERSIONS if x <= version)


def _names(types) -> str:
    return ", ".join(t.name for t in types)


def type_attribute(op: str, name: str, value: Any) -> QType | None:
    """An ``output_dtype`` / ``precision`` attribute: None or 0 (unset), an ONNX element type
    (int), a NumPy dtype (ml_dtypes' included) or a registry name."""
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == 0):
        return None
    try:
        return dtypes.get(value)
    except (KeyError, TypeError):
        raise TypeError(f"{op}: attribute {name} must be a quantization type (a NumPy/ml_dtypes dtype or "
                        f"an ONNX element type); got {value!r}") from None


def _since(op: str, what: str, t: QType, version: int, first: int | None = None) -> None:
    first = t.since if first is None else first
    if version < first:
        raise TypeError(f"{op}: {what} of type {t.name} needs version >= {first}; got version {version}")


def _attr_since(op: str, name: str, given: bool, version: int, first: int) -> None:
    if given and version < first:
        raise ValueError(f"{op}: attribute {name} exists from version {first}; got version {version}")


def input_tensor(op: str, name: str, value: Any, allowed: tuple[QType, ...], version: int) -> tuple[np.ndarray, QType]:
    """A tensor input of one of the allowed registry types (at this version)."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array of type {_names(allowed)}; got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if t is None or t not in allowed:
        hint = " (convert with .astype(np.float32))" if arr.dtype == np.float64 else ""
        raise TypeError(f"{op}: {name} must have type {_names(allowed)}; got dtype {arr.dtype}{hint}")
    _since(op, name, t, version)
    return arr, t


def scale_param(op: str, name: str, value: Any, allowed: tuple[QType, ...], version: int,
                divides: bool) -> tuple[np.ndarray, QType]:
    """A scale of one of the allowed types, finite (and non-zero when the operator divides by
    it). A Python float is float32, as in the 8-bit API."""
    if isinstance(value, float):
        value = np.asarray(value)  # float64: rounded to float32 below, overflow reported
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a float or a NumPy array of type {_names(allowed)}; "
                        f"got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if arr.dtype == np.float64:
        with np.errstate(over="ignore", under="ignore"):  # a float64 scale is float32 (as in the 8-bit API)
            f = arr.astype(np.float32)
        bad = np.isfinite(arr) & ~np.isfinite(f)
        if bad.any():
            raise ValueError(f"{op}: {name} must fit float32 (ONNX scales are float32, at most {v.FLOAT32_MAX}); "
                             f"got {arr.ravel()[np.flatnonzero(bad.ravel())[0]]}, which overflows float32")
        arr, t = f, F32
    if t is None or t not in allowed:
        raise TypeError(f"{op}: {name} must have type {_names(allowed)}; got dtype {arr.dtype}")
    if t is _E8M0:
        _since(op, name, t, version)
    elif t.kind == "wide" and t is not F32:
        _since(op, name, t, version, 19)
    values = dtypes.to_float32(arr) if t is not _I32 else arr
    flat = values.ravel()
    bad = ~np.isfinite(flat) if t is not _I32 else np.zeros(flat.shape, bool)
    if divides:
        bad |= flat == 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = f" at flat index {i}" if flat.size > 1 else ""
        what = "finite and not zero (the input is divided by it)" if divides else "finite"
        raise ValueError(f"{op}: {name} must be {what}; got {flat[i]}{where}")
    return arr, t


def zero_point_param(op: str, name: str, value: Any, t: QType) -> np.ndarray:
    """A zero point of type ``t`` (a Python int takes t for integer types)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.generic)) and t.is_int:
        if not t.lo <= value <= t.hi:
            raise ValueError(f"{op}: {name} must fit type {t.name} [{t.lo}, {t.hi}]; got {value}")
        return np.asarray(value).astype(t.dtype)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array of type {t.name}; got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    if arr.dtype != t.dtype:
        raise TypeError(f"{op}: {name} must have type {t.name} (the type of the quantized tensor); got dtype {arr.dtype}")
    return arr


def _layout(op: str, scale_name: str, x_shape, scale: np.ndarray, zp_name: str, zp: np.ndarray | None, axis: int,
            block_size: Any, version: int) -> _params.Layout:
    if not isinstance(block_size, numbers.Integral) or isinstance(block_size, bool):
        raise TypeError(f"{op}: attribute block_size must be an integer; got {type(block_size).__name__}")
    if block_size < 0:
        raise ValueError(f"{op}: attribute block_size must be >= 0; got {block_size}")
    _attr_since(op, "block_size", block_size != 0, version, 21)
    if zp is not None and zp.shape != scale.shape and not (zp.size == 1 and scale.size == 1):
        raise ValueError(f"{op}: {scale_name} and {zp_name} must have the same shape; got {scale.shape} and {zp.shape}")
    lay = _params.layout(op, scale_name, x_shape, scale.shape, axis, int(block_size))
    if lay.kind == "axis" and version < 13:
        raise ValueError(f"{op}: a per-axis {scale_name} needs version >= 13; got version {version}")
    return lay


# ----------------------------------------------------------------------------- QuantizeLinear

Q_INPUTS = (F32, F16, BF16, _I32)
Q_SCALES = (F32, F16, BF16, _I32, _E8M0)
Q_OUTPUTS = tuple(t for t in dtypes.TYPES if (t.is_int and t.bits <= 16) or t.is_float)


class QuantizeParams:
    """A validated QuantizeLinear call's parameters: output type, P, layout and the parameter
    arrays in the layout's shape (scale in P, zero point as float32)."""

    def __init__(self, op: str, x: np.ndarray, xt: QType, y_scale: Any, y_zero_point: Any, axis: Any,
                 block_size: Any, saturate: Any, output_dtype: Any, precision: Any, version: int) -> None:
        scale, st = scale_param(op, "y_scale", y_scale, Q_SCALES, version, divides=True)
        if version < 19 and st is not F32:
            raise TypeError(f"{op}: y_scale must be float32 before version 19; got {st.name} (version {version})")
        if 19 <= version < 23 and st is not xt:
            raise TypeError(f"{op}: y_scale must have x's type ({xt.name}) before version 23, where they share "
                            f"one type; got {st.name} (version {version})")
        if not isinstance(saturate, numbers.Integral) or saturate not in (0, 1):
            raise ValueError(f"{op}: attribute saturate must be 0 or 1; got {saturate!r}")
        _attr_since(op, "saturate", saturate != 1, version, 19)
        out_t = type_attribute(op, "output_dtype", output_dtype)
        _attr_since(op, "output_dtype", out_t is not None, version, 21)
        p = type_attribute(op, "precision", precision)
        _attr_since(op, "precision", p is not None, version, 23)
        if p is not None and p not in _WIDE:
            raise TypeError(f"{op}: attribute precision must be float32, float16 or bfloat16; got {p.name}")
        zp = None
        if y_zero_point is not None:
            if out_t is None and not isinstance(y_zero_point, (np.ndarray, np.generic)):
                raise TypeError(f"{op}: y_zero_point decides the output type, so it must be a NumPy value such as "
                                f"np.uint8({y_zero_point}); got a Python {type(y_zero_point).__name__}")
            zt = out_t if out_t is not None else dtypes.lookup(v.as_array(op, "y_zero_point", y_zero_point).dtype)
            if zt is None or zt not in Q_OUTPUTS:
                zdt = v.as_array(op, "y_zero_point", y_zero_point).dtype
                raise TypeError(f"{op}: y_zero_point must have an output type ({_names(Q_OUTPUTS)}); got dtype {zdt}")
            if out_t is not None and isinstance(y_zero_point, (np.ndarray, np.generic)) \
                    and np.asarray(y_zero_point).dtype != out_t.dtype:
                raise TypeError(f"{op}: output_dtype {out_t.name} differs from y_zero_point's type "
                                f"{np.asarray(y_zero_point).dtype}; they must be one type")
            zp = zero_point_param(op, "y_zero_point", y_zero_point, zt)
            out_t = zt
        if out_t is None:
            out_t = dtypes.get("uint8")
        if out_t not in Q_OUTPUTS:
            raise TypeError(f"{op}: output_dtype must be one of {_names(Q_OUTPUTS)}; got {out_t.name}")
        _since(op, "the output", out_t, version)
        self.layout = _layout(op, "y_scale", x.shape, scale, "y_zero_point", zp, axis, block_size, version)
        if p is None:
            p = st if version >= 23 and st in _WIDE else F32
        self.precision = p
        self.out = out_t
        self.saturate = bool(saturate)
        self.scale_type = st
        self.scale = scale
        self.zero_point = zp
        with np.errstate(over="ignore", under="ignore"):
            # the scale in P, held as float32 (exact); no copy when it is float32 already
            sp = dtypes.to_precision(scale, p).astype(np.float32, copy=False)
        if not (np.isfinite(sp).all() and (sp != 0).all()):
            raise ValueError(f"{op}: y_scale must be finite and not zero in the division precision {p.name}; "
                             f"it overflows or underflows there (y_scale {scale.ravel()[:4]}...)")
        self.p_scale = sp.reshape(self.layout.pshape)
        zf = np.zeros((1, 1, 1), np.float32)  # no zero point: one zero, broadcast
        if zp is not None:
            zf = dtypes.to_float32(zp).astype(np.float32).reshape(self.layout.pshape)
            if out_t.is_float:
                zf = dtypes.to_precision(zf, p).astype(np.float32)  # exact: every narrow float fits P
        self.p_zero = zf
        # float8: a zero zero point adds nothing (onnxruntime and onnx.reference ignore a float8
        # zero point, so -0 keeps its sign there); float4/float6: a given zero point is added
        # as IEEE adds it (-0 + 0 = +0), as onnx.reference and ONNX's own test data do
        self.zero_is_zero = zp is None or (out_t.is_float and out_t.bits == 8 and not np.any(zf))


def quantize(x: np.ndarray, xt: QType, qp: QuantizeParams) -> np.ndarray:
    """The general path: x quantized into a new array of the output type."""
    out = np.empty(x.shape, dtype=qp.out.dtype)
    p, t = qp.precision, qp.out

    def quotient(xs: np.ndarray, s: np.ndarray) -> np.ndarray:
        xp = dtypes.to_precision(xs, p)
        if p is F32:
            return np.divide(xp, s, dtype=np.float32)
        # float32 division of the widened operands, rounded once to P: the division in P
        return dtypes.round_float32(np.divide(xp.astype(np.float32), s, dtype=np.float32), p).astype(np.float32)

    if t.is_int:
        lo, hi = np.float32(t.lo), np.float32(t.hi)
        # sub-byte types are written through a byte view: the two's-complement byte, then only
        # the type's low bits kept (ml_dtypes stores int4 -1 as 0x0F)
        sub = t.bits < 8
        store = np.dtype(np.int8) if sub else t.dtype
        mask = np.uint8((1 << min(t.bits, 8)) - 1)

        def kernel(xs, os, s, z):
            q = quotient(xs, s)
            np.rint(q, out=q)
            np.fmax(q, lo - z, out=q)  # fmax: NaN gives the other operand, so NaN -> T's min
            np.fmin(q, hi - z, out=q)  # bounds are integers: clamping then adding is exact
            q += z
            if sub:
                ob = os.view(store)
                np.copyto(ob, q, casting="unsafe")  # exact: integers in T's range
                u = ob.view(np.uint8)
                u &= mask
            else:
                np.copyto(os, q, casting="unsafe")
    else:
        sat, add = qp.saturate, not qp.zero_is_zero

        def kernel(xs, os, s, z):
            q = quotient(xs, s)
            if add:
                q = dtypes.round_float32(q + z, p).astype(np.float32)  # one addition in P
            os[...] = t.encode(q, sat)

    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        _params.run(kernel, x, out, [qp.p_scale, qp.p_zero], qp.layout)
    return out


# ----------------------------------------------------------------------------- DequantizeLinear

DQ_INPUTS = tuple(t for t in dtypes.TYPES if t.is_int or t.is_float)
DQ_SCALES = (F32, F16, BF16, _E8M0)
DQ_OUTPUTS = _WIDE


class DequantizeParams:
    def __init__(self, op: str, x: np.ndarray, xt: QType, x_scale: Any, x_zero_point: Any, axis: Any,
                 block_size: Any, output_dtype: Any, version: int) -> None:
        scale, st = scale_param(op, "x_scale", x_scale, DQ_SCALES, version, divides=False)
        if version < 19 and st is not F32:
            raise TypeError(f"{op}: x_scale must be float32 before version 19; got {st.name} (version {version})")
        out_t = type_attribute(op, "output_dtype", output_dtype)
        _attr_since(op, "output_dtype", out_t is not None, version, 23)
        if out_t is not None and out_t not in DQ_OUTPUTS:
            raise TypeError(f"{op}: attribute output_dtype must be float32, float16 or bfloat16; got {out_t.name}")
        zp = None
        if x_zero_point is not None:
            zp = zero_point_param(op, "x_zero_point", x_zero_point, xt)
            if xt is _I32 and np.any(zp != 0):
                raise ValueError(f"{op}: x_zero_point must be 0 when x is int32; got {zp.ravel()[zp.ravel() != 0][0]}")
        self.layout = _layout(op, "x_scale", x.shape, scale, "x_zero_point", zp, axis, block_size, version)
        self.out = out_t if out_t is not None else (st if st in _WIDE else F32)
        self.p_scale = dtypes.to_float32(scale).astype(np.float32, copy=False).reshape(self.layout.pshape)
        self.zero = None
        if zp is not None:
            # float formats: the decoded values; integers: exact in int32 (int64 for int32)
            z = dtypes.to_float32(zp).astype(np.float32)  # exact for every type here (int32: zero)
            if np.any(z != 0):  # a zero zero point subtracts nothing (and -0 keeps its sign)
                self.zero = z.reshape(self.layout.pshape)


def dequantize(x: np.ndarray, xt: QType, dp: DequantizeParams) -> np.ndarray:
    out = np.empty(x.shape, dtype=dp.out.dtype)
    ot = dp.out

    def centered(xs, z):
        if xt.is_float:
            f = xt.decode(xs)
            if z is None:
                return f
            # one float32 subtraction: IEEE gives the exact difference rounded once
            f -= z
            return f
        if xt is _I32:
            return xs.astype(np.float32)  # its zero point is 0; one rounding above 2**24
        if z is None:
            return xs.astype(np.float32)
        # integers of at most 16 bits: exact in float32, and so is their difference (< 2**17)
        d = xs.astype(np.float32)
        d -= z
        return d
    if dp.zero is None:
        def kernel(xs, os, s):
            y = centered(xs, None)
            y *= s  # one float32 multiplication (y is a new float32 array)
            os[...] = dtypes.round_float32(y, ot)
        params = [dp.p_scale]
    else:
        def kernel(xs, os, s, z):
            y = centered(xs, z)
            y *= s
            os[...] = dtypes.round_float32(y, ot)
        params = [dp.p_scale, dp.zero]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        _params.run(kernel, x, out, params, dp.layout)
    return out


# ----------------------------------------------------------------------------- graph nodes


def _elem_name(elem: int) -> str:
    try:
        return dtypes.from_onnx(elem).name
    except KeyError:
        return f"ONNX element type {elem}"


def node_problem(op_type: str, version: int, attrs: dict, x: int, scale: int, zero_point: int) -> str | None:
    """Why a QuantizeLinear / DequantizeLinear node of this version cannot run, from its
    attributes and its inputs' ONNX element types (0: unknown before running), or None. The
    same rules as the functions' checks, decided before anything runs."""
    version = version_of(op_type, version)
    q = op_type == "QuantizeLinear"
    inputs = Q_INPUTS if q else DQ_INPUTS
    scales = Q_SCALES if q else DQ_SCALES

    def entry(elem):
        try:
            return dtypes.from_onnx(elem)
        except KeyError:
            return None

    xt, st, zt = entry(x), entry(scale), entry(zero_point)
    if x and (xt is None or xt not in inputs or xt.since > version):
        return f"input x is {_elem_name(x)}, which {op_type}-{version} does not take"
    if scale:
        if st is None or st not in scales:
            return f"the scale is {_elem_name(scale)}, which {op_type}-{version} does not take"
        first = 10 if st is F32 else (24 if st is _E8M0 else 19)
        if version < first:
            return f"a {st.name} scale needs {op_type} version >= {first}; the node is version {version}"
        if q and 19 <= version < 23 and xt is not None and st is not xt:
            return f"QuantizeLinear-{version} takes x and y_scale of one type; got {xt.name} and {st.name}"
    if attrs.get("block_size", 0) and version < 21:
        return f"block_size needs version >= 21; the node is version {version}"
    odt = attrs.get("output_dtype", 0)
    if odt:
        ot = entry(odt)
        allowed = Q_OUTPUTS if q else DQ_OUTPUTS
        if version < (21 if q else 23) or ot is None or ot not in allowed or ot.since > version:
            return f"output_dtype {_elem_name(odt)} is not valid for {op_type}-{version}"
    if zero_point:
        if q:
            if zt is None or zt not in Q_OUTPUTS or zt.since > version:
                return f"the zero point is {_elem_name(zero_point)}, which QuantizeLinear-{version} does not take"
            if odt and odt != zero_point:
                return f"output_dtype {_elem_name(odt)} differs from y_zero_point's type {zt.name}"
        elif x and zero_point != x:
            return f"x_zero_point is {_elem_name(zero_point)} but x is {_elem_name(x)}"
    if q and attrs.get("precision", 0):
        p = entry(attrs["precision"])
        if version < 23 or p not in _WIDE:
            return f"precision {_elem_name(attrs['precision'])} is not valid for QuantizeLinear-{version}"
    return None

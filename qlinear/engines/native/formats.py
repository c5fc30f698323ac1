"""The native engine's QuantizeLinear / DequantizeLinear for the newer types and parameters
(versions 19-28: int16, int4, int2, float8, float6, float4, float16/bfloat16 inputs and
scales, float8e8m0 scales, ``precision``, blocked parameters): qlinear/csrc/formats/.

The parameters come validated and laid out by qlinear/_qdq.py (``QuantizeParams``,
``DequantizeParams``: the scale in P as float32, the zero point as float32, both in the
layout's (P0, nblocks, P2) shape); the formats' facts (mantissa width, bias, special codes,
decode table) come from the registry, qlinear/dtypes. The kernels compute the NumPy path's
arithmetic operation for operation (docs/engine.md, "The newer formats"), so the two engines
agree bit for bit; tests/test_formats.py checks it on every ISA level. ``None`` from
:func:`quantize` / :func:`dequantize` means the call is not one the kernels take (the NumPy
path runs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _native
from ... import dtypes
from ..._params import Layout

#: element type codes of qlinear/csrc/include/formats.h (QF_*); narrow float formats are QF_NF
FORMAT_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3, "uint8": 4, "int8": 5, "uint16": 6,
                "int16": 7, "uint4": 8, "int4": 9, "uint2": 10, "int2": 11}
QF_NF = 12
_FLAVOURS = {"fn": 0, "fnuz": 1, "ieee": 2, "finite": 3}


def _code(t: dtypes.QType) -> int | None:
    if t.is_float:
        return QF_NF
    return FORMAT_CODES.get(t.name)


def _fmt(t: dtypes.QType) -> tuple[Any, Any]:
    """The (mbits, bias, flavour, max_code, nan_code, sign_bit) of a narrow float format and its
    decode table, or (None, None)."""
    if not t.is_float:
        return None, None
    f = t.fmt
    return (f.mbits, f.bias, _FLAVOURS[f.flavour], f.max_code, f.nan_code or 0, f.sign_bit), f.table


def _geometry(lay: Layout) -> tuple[int, ...]:
    """(pre, D, post, B, P0, nb, P2) for the kernels; one parameter per element along a last
    axis (B = 1, nothing after it) becomes rows of D elements with a parameter each."""
    pre, d, post = lay.shape3
    p0, nb, p2 = lay.pshape
    if post == 1 and lay.block == 1 and nb > 1:
        return pre, 1, d, 1, p0, 1, nb
    return pre, d, post, lay.block, p0, nb, p2


def _param(p: np.ndarray | None) -> np.ndarray | None:
    return None if p is None else np.ascontiguousarray(p, dtype=np.float32).reshape(-1)


def quantize(x: np.ndarray, xt: dtypes.QType, qp: Any) -> np.ndarray | None:
    """QuantizeLinear on the native engine, or None (not built, not selected, or int32 x with a
    bfloat16 division precision, which the NumPy path rounds in integers)."""
    C = _native.native()
    out_t = qp.out
    xc, oc = _code(xt), _code(out_t)
    if C is None or xc is None or oc is None or oc < FORMAT_CODES["uint8"] or (xt.name == "int32" and qp.precision is dtypes.BF16):
        return None
    fmt, table = _fmt(out_t)
    out = _native.empty(x.shape, out_t.dtype)
    zero = None
    if qp.zero_point is not None and (out_t.is_int or not qp.zero_is_zero):
        zero = _param(qp.p_zero)
    lo, hi = (int(out_t.lo), int(out_t.hi)) if out_t.is_int else (0, 0)
    C.fmt_convert(C.get_isa(), 1, np.ascontiguousarray(x), xc, out, oc, FORMAT_CODES[qp.precision.name],
                  int(qp.saturate), int(zero is not None and out_t.is_float), lo, hi, fmt, table,
                  _geometry(qp.layout), _param(qp.p_scale), zero)
    return out


def dequantize(x: np.ndarray, xt: dtypes.QType, dp: Any) -> np.ndarray | None:
    """DequantizeLinear on the native engine, or None (not built or not selected)."""
    C = _native.native()
    xc = _code(xt)
    if C is None or xc is None:
        return None
    fmt, table = _fmt(xt)
    out = _native.empty(x.shape, dp.out.dtype)
    C.fmt_convert(C.get_isa(), 0, np.ascontiguousarray(x), xc, out, FORMAT_CODES[dp.out.name], 0, 0, 0, 0, 0,
                  fmt, table, _geometry(dp.layout), _param(dp.p_scale), _param(dp.zero))
    return out

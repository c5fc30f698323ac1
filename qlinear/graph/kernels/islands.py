"""The integer islands' kernels (qlinear.internal QDQIsland, QDQTableIsland), which only
:func:`qlinear.passes.integer_islands` emits: onnxruntime's float glue between quantized nodes
computed on the 8-bit tensors in one pass (qlinear/csrc/island/), the same bytes as its float
nodes (docs/qdq.md, "Integer islands")."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import _native
from ...contrib._arith import mlas_quantize
from .base import data_path
from .contrib import ContribOp

__all__ = ["QDQIsland", "QDQTableIsland", "ISLAND_KERNELS"]


#: what an omitted output ("") gets (the graph loop drops it; None is not a tensor to onnx.reference)
_NONE = np.zeros(0, np.float32)
_NONE.flags.writeable = False


def _operand_value(x: np.ndarray, kind: int, scale: float, zero_point: int, mul, add) -> np.ndarray:
    """An operand's float32 values as onnxruntime's nodes compute them: DequantizeLinear
    f(float(x - z) * s) (the difference exact), then BatchNormalization's f(f(v * s') + b')."""
    v = x if kind == 2 else (x.astype(np.int32) - zero_point).astype(np.float32) * np.float32(scale)
    if mul is not None:
        shape = (1, mul.size) + (1,) * (v.ndim - 2)
        v = v * mul.reshape(shape)
        v = v + add.reshape(shape)
    return v


class QDQIsland(ContribOp):
    """An element-wise island (qlinear.passes.islands): operands A and optionally B (8-bit
    codes behind a DequantizeLinear, kind 1 uint8 and 3 int8, or float32, kind 2), each optionally through a
    per-channel affine (an unfolded BatchNormalization: inputs ``*_mul``, ``*_add``), summed,
    optional Relu; outputs the float32 result and / or its QuantizeLinear (either may be
    omitted). Inputs: a, a_mul, a_add, b, b_mul, b_add.

    Operands of equal shapes and the right dtypes run on the native kernel (``island``, one
    pass, threaded); anything else (broadcasting, the NumPy engine) runs the same float32
    operations with NumPy (the same bytes)."""

    op_domain = "qlinear.internal"

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        g = self.given
        self._dtype = np.dtype(np.int8 if g.get("signed", 0) else np.uint8)
        self._a = (int(g.get("a_kind", 1)), float(g.get("a_scale", 1.0)), int(g.get("a_zero_point", 0)))
        self._b = (int(g.get("b_kind", 0)), float(g.get("b_scale", 1.0)), int(g.get("b_zero_point", 0)))
        self._relu = bool(g.get("relu", 0))
        self._q = (float(g.get("y_scale", 1.0)), int(g.get("y_zero_point", 0)))
        outs = onnx_node.output
        self._want_f = bool(outs[0]) if outs else False
        self._want_q = len(outs) > 1 and bool(outs[1])

    def _check(self, x, kind, what):
        want = np.dtype({1: np.uint8, 2: np.float32, 3: np.int8}[kind])
        if type(x) is not np.ndarray or x.dtype != want:
            raise ValueError(f"QDQIsland: {what} must be a {want} array; got {getattr(x, 'dtype', type(x).__name__)}")

    def _run(self, a, a_mul=None, a_add=None, b=None, b_mul=None, b_add=None, **_):
        (ak, sa, za), (bk, sb, zb) = self._a, self._b
        self._check(a, ak, "a")
        if bk:
            self._check(b, bk, "b")
        dt, (ys, yz) = self._dtype, self._q
        shape = a.shape
        C = _native.native()
        chans = [m.size for m in (a_mul, b_mul) if m is not None]
        same = not bk or b.shape == shape
        ok_aff = all(a.ndim >= 2 and a.shape[1] == c for c in chans) and len(set(chans)) <= 1
        if C is not None and same and ok_aff and a.size:
            c = chans[0] if chans else 1
            planes = shape[0] * c if chans else 1
            out_f = np.empty(shape, np.float32) if self._want_f else None
            out_q = np.empty(shape, dt) if self._want_q else None
            C.island(C.get_isa(), planes, c, a.size // planes, np.ascontiguousarray(a), ak, sa, za, a_mul, a_add,
                     np.ascontiguousarray(b) if bk else None, bk, sb, zb, b_mul, b_add, self._relu,
                     dt == np.int8, out_f, None if out_q is None else out_q.view(np.uint8), ys, yz)
            return (_NONE if out_f is None else out_f, _NONE if out_q is None else out_q)
        v = _operand_value(a, ak, sa, za, a_mul, a_add)
        if bk:
            v = v + _operand_value(b, bk, sb, zb, b_mul, b_add)
        if self._relu:
            v = np.where(v < 0, np.float32(0), v)  # onnxruntime's Relu keeps -0 and NaN
        v = np.asarray(v, np.float32)
        return (v if self._want_f else _NONE,
                mlas_quantize(v, np.float32(ys), yz, dt) if self._want_q else _NONE)


class QDQTableIsland(ContribOp):
    """DequantizeLinear(x) -> (BatchNormalization | Relu | LeakyRelu | Clip)* -> QuantizeLinear
    as a byte table per channel: ``tables`` (C, 256) of the output type, C = 1 (one table) or
    x's channel count (axis 1)."""

    op_domain = "qlinear.internal"

    def _run(self, x, tables, **_):
        if type(x) is not np.ndarray or x.dtype.itemsize != 1 or x.dtype.kind not in "iu" \
                or tables.ndim != 2 or tables.shape[1] != 256:
            raise ValueError("QDQTableIsland: x must be an 8-bit array and tables (C, 256)")
        c = tables.shape[0]
        if c > 1 and (x.ndim < 2 or x.shape[1] != c):
            raise ValueError(f"QDQTableIsland: x {x.shape} must have {c} channels (axis 1)")
        out = np.empty(x.shape, tables.dtype)
        if not x.size:
            return (out,)
        C = _native.native()
        planes = x.shape[0] * c if c > 1 else 1
        if C is not None:
            C.island_lut(C.get_isa(), np.ascontiguousarray(x).view(np.uint8), planes, c, x.size // planes,
                         np.ascontiguousarray(tables).view(np.uint8), out.view(np.uint8))
            return (out,)
        flat = np.ascontiguousarray(x).view(np.uint8).reshape(planes, -1)
        rows = np.arange(planes) % c
        out.reshape(planes, -1)[...] = tables[rows[:, None], flat]
        return (out,)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """``_run``'s native lookup bound to these very constant tables and to a C-contiguous
        x of this shape and dtype (``base.KernelOp.fast_path``): the checks above made once."""
        x, tables = (inputs + [None, None])[:2]
        C = _native.native()
        if (type(self) is not QDQTableIsland or len(inputs) != 2 or 1 not in fixed or C is None
                or type(x) is not np.ndarray or x.dtype.itemsize != 1 or x.dtype.kind not in "iu"
                or not x.flags.c_contiguous or not x.size or type(tables) is not np.ndarray
                or tables.ndim != 2 or tables.shape[1] != 256 or not tables.flags.c_contiguous):
            return None
        c = tables.shape[0]
        if c > 1 and (x.ndim < 2 or x.shape[1] != c):
            return None
        planes = x.shape[0] * c if c > 1 else 1
        plane, shape, dtype, odt = x.size // planes, x.shape, x.dtype, tables.dtype
        lut, native = C.island_lut, _native.native

        def run(x: Any) -> np.ndarray | None:
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or native() is not C):
                return None
            out = np.empty(shape, odt)
            lut(C.get_isa(), x, planes, c, plane, tables, out)
            return out
        return data_path(run)


ISLAND_KERNELS = [QDQIsland, QDQTableIsland]

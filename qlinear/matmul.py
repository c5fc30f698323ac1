"""QLinearMatMul (10) and MatMulInteger (10), with numpy.matmul shape rules.

Scales and zero points are per tensor (one element), per row of ``a`` ([M] or [..., M, 1])
or per column of ``b`` ([N] or [..., 1, N]). The prepared classes pre-transform a constant
``b`` once; the plain functions build one and run it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _validate as v
from ._engine import Reduction, dtype_bound, matmul_accumulate
from ._requant import multiplier, round_saturate


def _operand_param(op: str, name: str, arr: np.ndarray, operand: str, shape: tuple[int, ...]) -> np.ndarray:
    """A per-tensor, per-row (operand "a") or per-column (operand "b") matmul parameter.

    Returned 0-d, or broadcastable to the operand's matrix: (..., M, 1) for rows of a,
    (..., 1, N) for columns of b. Accepted: one element; 1-D with M (N) elements; or the
    operand's rank with the other matrix axis 1 and batch axes equal or 1.
    """
    if arr.size == 1:
        return arr.reshape(())
    if len(shape) < 2:
        raise ValueError(f"{op}: {name} must have one element because {operand} is 1-D; got shape {arr.shape}")
    rows = operand == "a"
    n = shape[-2] if rows else shape[-1]
    matrix = (n, 1) if rows else (1, n)
    if arr.shape == (n,):
        return arr.reshape(matrix)
    if (arr.ndim == len(shape) and arr.shape[-2:] == matrix
            and all(d in (1, sd) for d, sd in zip(arr.shape[:-2], shape[:-2]))):
        return arr
    raise ValueError(
        f"{op}: {name} must have one element (per tensor), shape ({n},) or {(*shape[:-2], *matrix)} "
        f"(per {'row' if rows else 'column'} of {operand} with shape {shape}); got shape {arr.shape}"
    )


class _RightOperand:
    """The validated, centered float32 ``b`` of a matmul (as a matrix: 1-D b becomes (K, 1))."""

    def __init__(self, op: str, b: Any, b_zero_point: Any) -> None:
        self.op = op
        b = v.integer_tensor(op, "b", b)
        if b.ndim == 0:
            raise ValueError(f"{op}: b must have rank >= 1; got a 0-d array")
        self.b_shape = b.shape
        self.dtype = b.dtype
        v.check_size(op, "the float32 copy of b", b.shape, 4)
        if b_zero_point is None:
            zp = np.zeros((), dtype=b.dtype)
        else:
            zp = _operand_param(op, "b_zero_point", v.zero_point(op, "b_zero_point", b_zero_point, "b", b.dtype), "b", b.shape)
        self.zero_point = np.array(zp, copy=True)  # owned: the caller may change its array later
        matrix = b[:, None] if b.ndim == 1 else b
        self.centered = np.subtract(matrix, zp, dtype=np.float32)
        # Each output (one column of one batch entry) sums over the K axis of b.
        # An empty per-column zero point (N = 0) has no extreme: bound with a per-tensor 0.
        bound_zp = np.asarray(zp) if np.asarray(zp).size else np.zeros((), b.dtype)
        self.reduction = Reduction(self.centered, axis=-2, bound=dtype_bound(b.dtype, bound_zp))

    def accumulate(self, a: Any, a_zero_point: Any,
                   out_dtype: type = np.int32) -> tuple[np.ndarray, np.ndarray]:
        """Validate a; return (accumulator of shape (batch..., M, N), a as given): int32
        wrap32 values, or their float32 rounding (for requantization in place)."""
        op = self.op
        a = v.integer_tensor(op, "a", a)
        if a.ndim == 0:
            raise ValueError(f"{op}: a must have rank >= 1; got a 0-d array")
        if a_zero_point is None:
            zp = np.zeros((), dtype=a.dtype)
        else:
            zp = _operand_param(op, "a_zero_point", v.zero_point(op, "a_zero_point", a_zero_point, "a", a.dtype), "a", a.shape)
        matrix = a[None, :] if a.ndim == 1 else a
        b = self.centered
        if matrix.shape[-1] != b.shape[-2]:
            raise ValueError(
                f"{op}: a and b cannot be multiplied: a has shape {a.shape} (K = {matrix.shape[-1]}) "
                f"but b has shape {self.b_shape} (K = {b.shape[-2]})"
            )
        try:
            batch = np.broadcast_shapes(matrix.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(
                f"{op}: the batch dimensions of a {a.shape[:-2]} and b {self.b_shape[:-2]} do not broadcast"
            ) from None
        v.check_size(op, "the output's int32 accumulator", (*batch, matrix.shape[-2], b.shape[-1]), 4)
        v.check_size(op, "the float32 copy of a", a.shape, 4)
        if 0 in matrix.shape or 0 in b.shape:
            # Nothing to multiply: numpy.matmul's result, empty, or zeros when only K is 0 (an
            # empty sum); the engine's reshapes and bounds assume non-empty operands.
            return np.zeros((*batch, matrix.shape[-2], b.shape[-1]), out_dtype), a
        acc = matmul_accumulate(matrix, zp, b, self.reduction, out_dtype)
        return acc, a

    def finish(self, y: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Drop the axes numpy.matmul drops for 1-D operands."""
        if len(self.b_shape) == 1:
            y = y[..., 0]
        if a.ndim == 1:
            y = y[..., 0, :] if len(self.b_shape) > 1 else y[..., 0]
        return y


class PreparedMatMulInteger:
    """MatMulInteger with a constant ``b`` pre-transformed once; call ``run`` per ``a``."""

    def __init__(self, b: np.ndarray, b_zero_point: Any = None) -> None:
        self._b = _RightOperand("matmul_integer", b, b_zero_point)

    def run(self, a: np.ndarray, a_zero_point: Any = None) -> np.ndarray:
        """int32 wrap32((a - a_zero_point) @ (b - b_zero_point)) with numpy.matmul shapes."""
        acc, a = self._b.accumulate(a, a_zero_point)
        return self._b.finish(acc, a)


class PreparedQLinearMatMul:
    """QLinearMatMul with a constant ``b`` and its scale/zero point validated and pre-transformed."""

    def __init__(self, b: np.ndarray, b_scale: Any, b_zero_point: Any) -> None:
        op = "qlinear_matmul"
        if b_zero_point is None:
            raise TypeError(f"{op}: b_zero_point is required")
        self._b = _RightOperand(op, b, b_zero_point)
        bs = v.scale(op, "b_scale", b_scale)
        bzp = v.zero_point(op, "b_zero_point", b_zero_point, "b", self._b.dtype)
        v.same_shape(op, "b_scale", bs, "b_zero_point", bzp)
        self.b_scale = np.array(_operand_param(op, "b_scale", bs, "b", self._b.b_shape), copy=True)

    def run(self, a: np.ndarray, a_scale: Any, a_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The quantized product; output dtype is y_zero_point's."""
        op = "qlinear_matmul"
        if a_zero_point is None:
            raise TypeError(f"{op}: a_zero_point is required")
        a_arr = v.integer_tensor(op, "a", a)
        a_s = v.scale(op, "a_scale", a_scale)
        azp = v.zero_point(op, "a_zero_point", a_zero_point, "a", a_arr.dtype)
        v.same_shape(op, "a_scale", a_s, "a_zero_point", azp)
        a_s = _operand_param(op, "a_scale", a_s, "a", a_arr.shape)
        ys = v.per_tensor(op, "y_scale", v.nonzero_scale(op, "y_scale", y_scale))
        yzp = v.per_tensor(op, "y_zero_point", v.output_zero_point(op, "y_zero_point", y_zero_point))
        if a_s.ndim and self.b_scale.ndim:  # per row and per column: the multiplier is a matrix
            try:
                m_shape = np.broadcast_shapes(a_s.shape, self.b_scale.shape)
            except ValueError:
                m_shape = ()  # batches that do not broadcast: accumulate names them
            v.check_size(op, "the requantization multiplier", m_shape, 4)
        m = v.finite_multiplier(op, multiplier(a_s, self.b_scale, ys), "a_scale * b_scale / y_scale")
        values, a_arr = self._b.accumulate(a_arr, a_zero_point, np.float32)
        # An infinite product saturates, a tiny one rounds to 0 or a denormal: float32 as it should.
        with np.errstate(over="ignore", under="ignore"):
            values *= m  # float32(float32(acc) * m), in place
        return self._b.finish(round_saturate(values, yzp, yzp.dtype), a_arr)


def prepare_matmul_integer(b: np.ndarray, b_zero_point: Any = None) -> PreparedMatMulInteger:
    """Pre-transform MatMulInteger's constant ``b`` once for repeated ``run(a, a_zero_point)`` calls."""
    return PreparedMatMulInteger(b, b_zero_point)


def prepare_qlinear_matmul(b: np.ndarray, b_scale: Any, b_zero_point: Any) -> PreparedQLinearMatMul:
    """Pre-transform QLinearMatMul's constant ``b`` once for repeated
    ``run(a, a_scale, a_zero_point, y_scale, y_zero_point)`` calls."""
    return PreparedQLinearMatMul(b, b_scale, b_zero_point)


def matmul_integer(a: np.ndarray, b: np.ndarray, a_zero_point: Any = None, b_zero_point: Any = None) -> np.ndarray:
    """ONNX MatMulInteger-10: int32 wrap32((a - a_zero_point) @ (b - b_zero_point)).

    numpy.matmul shape rules (1-D operands, broadcast batch dimensions); zero points per tensor,
    per row of a ([M] or [..., M, 1]) or per column of b ([N] or [..., 1, N]).
    """
    return PreparedMatMulInteger(b, b_zero_point).run(a, a_zero_point)


def qlinear_matmul(
    a: np.ndarray,
    a_scale: Any,
    a_zero_point: Any,
    b: np.ndarray,
    b_scale: Any,
    b_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
) -> np.ndarray:
    """ONNX QLinearMatMul-10, exact per docs/contract.md.

    acc = wrap32((a - a_zp) @ (b - b_zp)); m[i, j] = float32(float32(a_scale[i] · b_scale[j]) / y_scale);
    y = sat(rne(float32(float32(acc) · m)) + y_zero_point), dtype of y_zero_point.
    """
    return PreparedQLinearMatMul(b, b_scale, b_zero_point).run(a, a_scale, a_zero_point, y_scale, y_zero_point)

"""QLinearMatMul (10) and MatMulInteger (10), with numpy.matmul shape rules.

Scales and zero points are per tensor (one element), per row of ``a`` ([M] or [..., M, 1])
or per column of ``b`` ([N] or [..., 1, N]). The prepared classes pre-transform a constant
``b`` once; the plain functions build one and run it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from . import _fmatmul, _native, dtypes
from . import _validate as v
from ._prepared import F32, Memo, PLAIN, RepeatMemo, one, one_value, param_key
from .engines.native import matmul as nmm
from ._engine import Reduction, dtype_bound, matmul_accumulate
from ._elementwise import round_saturate
from ._requant import multiplier


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
    """The validated ``b`` of a matmul (as a matrix: 1-D b becomes (K, 1)), ready for either
    engine: centered float32 for the NumPy engine, packed panels for the native engine (per
    ISA level and kernel, built on first use; prepared forms pack at construction)."""

    def __init__(self, op: str, b: Any, b_zero_point: Any, *, owned: bool = False) -> None:
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
        # A prepared form keeps its own copy (never a view of the caller's array); a plain
        # call uses b once, while the caller waits.
        self.matrix = np.array(matrix, copy=True) if owned else matrix
        self.owned = owned
        self.call: tuple | None = None   # the last native call's plan (``_native_matmul``)
        self._last = RepeatMemo(op, "a")  # ``remember``
        self._drop: dict[int, Any] = {}  # a's rank -> the output axes numpy.matmul drops
        self._numpy: tuple | None = None
        self._packed: dict[str, tuple] = {}  # ISA level -> packed form (kernel chosen per level)

    # -- NumPy engine ------------------------------------------------------------------------
    def _numpy_form(self) -> tuple[np.ndarray, Reduction]:
        if self._numpy is None:
            centered = np.subtract(self.matrix, self.zero_point, dtype=np.float32)
            # Each output (one column of one batch entry) sums over the K axis of b.
            # An empty per-column zero point (N = 0) has no extreme: bound with a per-tensor 0.
            zp = self.zero_point if self.zero_point.size else np.zeros((), self.matrix.dtype)
            self._numpy = centered, Reduction(centered, axis=-2, bound=dtype_bound(self.matrix.dtype, zp))
        return self._numpy

    def check_a(self, a: Any, a_zero_point: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Validate a and its zero point against b: (a, a as a matrix, zero point)."""
        op = self.op
        a = v.integer_tensor(op, "a", a)
        if a.ndim == 0:
            raise ValueError(f"{op}: a must have rank >= 1; got a 0-d array")
        if a_zero_point is None:
            zp = np.zeros((), dtype=a.dtype)
        else:
            zp = _operand_param(op, "a_zero_point", v.zero_point(op, "a_zero_point", a_zero_point, "a", a.dtype), "a", a.shape)
        matrix = a[None, :] if a.ndim == 1 else a
        if matrix.shape[-1] != self.matrix.shape[-2]:
            raise ValueError(
                f"{op}: a and b cannot be multiplied: a has shape {a.shape} (K = {matrix.shape[-1]}) "
                f"but b has shape {self.b_shape} (K = {self.matrix.shape[-2]})"
            )
        try:
            batch = (nmm.broadcast_batch(matrix.shape[:-2], self.matrix.shape[:-2])
                     if matrix.ndim > 2 or self.matrix.ndim > 2 else ())
        except ValueError:
            raise ValueError(
                f"{op}: the batch dimensions of a {a.shape[:-2]} and b {self.b_shape[:-2]} do not broadcast"
            ) from None
        v.check_size(op, "the output's int32 accumulator", (*batch, matrix.shape[-2], self.matrix.shape[-1]), 4)
        v.check_size(op, "the float32 copy of a", a.shape, 4)
        return a, matrix, zp

    def accumulate(self, matrix: np.ndarray, zp: np.ndarray, out_dtype: type = np.int32) -> np.ndarray:
        """NumPy engine: the accumulator of shape (batch..., M, N): int32 wrap32 values, or
        their float32 rounding (for requantization in place)."""
        if 0 in matrix.shape or 0 in self.matrix.shape:
            # Nothing to multiply: numpy.matmul's result, empty, or zeros when only K is 0 (an
            # empty sum); the engine's reshapes and bounds assume non-empty operands.
            batch = nmm.broadcast_batch(matrix.shape[:-2], self.matrix.shape[:-2])
            return np.zeros((*batch, matrix.shape[-2], self.matrix.shape[-1]), out_dtype)
        # the NumPy engine's arrays of this call, alive at once: each was checked alone
        batch = nmm.broadcast_batch(matrix.shape[:-2], self.matrix.shape[:-2])
        v.check_total(self.op, [("the output", (*batch, matrix.shape[-2], self.matrix.shape[-1]), 4),
                                ("the float32 copy of a", matrix.shape, 4),
                                ("the float32 copy of b", self.matrix.shape, 4)])
        centered, reduction = self._numpy_form()
        return matmul_accumulate(matrix, zp, centered, reduction, out_dtype)

    # -- native engine -----------------------------------------------------------------------
    def packed(self, isa: str) -> tuple:
        """(which kernel, packed panels, column sums, zero points in the form's terms, Bb) for
        the native engine at ISA level ``isa`` (``nmm.pack_b``); packed once per level."""
        got = self._packed.get(isa)
        if got is None:
            fast = nmm.has_fast(isa) and self._fits_fast_path()
            got = nmm.pack_b(isa, int(fast), self.matrix, self.zero_point)
            self._packed[isa] = got
        return got

    def drop(self, a_ndim: int) -> Any:
        """The output axes numpy.matmul drops for 1-D operands (``nmm.drop_axes``)."""
        got = self._drop.get(a_ndim, self)
        if got is self:
            got = self._drop[a_ndim] = nmm.drop_axes(a_ndim, len(self.b_shape))
        return got

    def remember(self, a: np.ndarray, params: tuple, call: tuple) -> None:
        """After a prepared form's native call (``_native_matmul``) with input a and call
        parameters ``params``, which returned the plan ``call``: keep it for ``repeat`` (see
        ``_prepared.RepeatMemo``). Passed by the caller, never read from ``self.call``: another
        thread's call on the same prepared form may have replaced that meanwhile."""
        self._last.remember(a, params, nmm.with_drop(call, self.drop(a.ndim)) if self.owned else None)

    def repeat(self, a: Any, params: tuple) -> np.ndarray | None:
        """The output of a call that repeats the remembered one (see ``remember``), or None
        (then the call takes the full path)."""
        return self._last.repeat(a, params, nmm.run)

    def bound_repeat(self, params: tuple) -> Callable[[Any], np.ndarray | None] | None:
        """``repeat`` bound once to the remembered call whose parameters are these very objects,
        or None (``_prepared.RepeatMemo.bind``)."""
        return self._last.bind(params, nmm.run)

    def _fits_fast_path(self) -> bool:
        """Whether every b value in the byte kernels' s8 form (int8 as is, uint8 - 128) lies in
        [-64, 64], which proves vpmaddubsw's int16 pair sums cannot saturate (2*255*64 <= 32767)."""
        flag = getattr(self, "_fast", None)
        if flag is None:
            m = self.matrix
            if m.size == 0:
                flag = True
            else:
                lo, hi = (-64, 64) if m.dtype == np.int8 else (64, 192)
                flag = bool(m.min() >= lo and m.max() <= hi)
            self._fast = flag
        return flag

    def finish(self, y: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Drop the axes numpy.matmul drops for 1-D operands."""
        if len(self.b_shape) == 1:
            y = y[..., 0]
        if a.ndim == 1:
            y = y[..., 0, :] if len(self.b_shape) > 1 else y[..., 0]
        return y


def _native_takes(right: "_RightOperand", matrix: np.ndarray | None = None) -> bool:
    """Whether the native engine is selected and its C int sizes hold b (and a's rows)."""
    K, N = right.matrix.shape[-2:]
    return nmm.takes(K, N, None if matrix is None else math.prod(matrix.shape[:-1]))


def _native_matmul(right: _RightOperand, matrix: np.ndarray, zp: np.ndarray,
                   m: np.ndarray | None = None, yzp: np.ndarray | None = None) -> tuple[np.ndarray, tuple]:
    """(a - zp) @ (b - b_zp) on the native engine (``nmm.matmul``): the output and the call's
    plan. A prepared form's plan is for ``_RightOperand.remember``; every call leaves its plan
    in ``right.call`` too, which only a plain call's own operand may read (``_lean_remember``):
    a prepared form's ``right.call`` may be another thread's by then."""
    isa = _native._C.get_isa()
    if right.owned:
        out, call = nmm.matmul(right.matrix, right.packed(isa), None, matrix, zp, m, yzp)
    else:  # a plain call: b is packed inside the GEMM, panel by panel
        out, call = nmm.matmul(right.matrix, None, nmm.raw_b(isa, right.matrix, right.zero_point), matrix, zp,
                               m, yzp)
    right.call = call
    return out, call


def _zero_d_of(x: Any, dtype: np.dtype) -> bool:
    """Whether x is a 0-d ndarray or a NumPy scalar of exactly this dtype."""
    t = type(x)
    if t is np.ndarray:
        return x.ndim == 0 and x.dtype == dtype
    return t is dtype.type


class PreparedMatMulInteger:
    """MatMulInteger with a constant ``b`` pre-transformed once; call ``run`` per ``a``."""

    def __init__(self, b: np.ndarray, b_zero_point: Any = None, *, _owned: bool = True) -> None:
        self._b = _RightOperand("matmul_integer", b, b_zero_point, owned=_owned)
        if _owned and _native_takes(self._b):
            self._b.packed(_native.isa())  # pack once, now

    def run(self, a: np.ndarray, a_zero_point: Any = None) -> np.ndarray:
        """int32 wrap32((a - a_zero_point) @ (b - b_zero_point)) with numpy.matmul shapes."""
        y = self._b.repeat(a, (a_zero_point,))
        if y is not None:
            return y
        y = self._repeat_zero_point(a, a_zero_point)
        if y is not None:
            return y
        a, matrix, zp = self._b.check_a(a, a_zero_point)
        if _native_takes(self._b, matrix):
            acc, call = _native_matmul(self._b, matrix, zp)
            self._b.remember(a, (a_zero_point,), call)
            self._remember_zero_point(a, a_zero_point, call)
        else:
            acc = self._b.accumulate(matrix, zp)
        return self._b.finish(acc, a)

    # The repeat path for a per-tensor zero point given as a 0-d ndarray of a's dtype (what
    # DynamicQuantizeLinear gives a MatMulInteger in onnxruntime's dynamically quantized
    # models: a new array on every run, so ``repeat``, which trusts only immutable
    # parameters, never takes it) or as a NumPy scalar of that dtype (``np.uint8(128)``, a new
    # object on every call in user code: 8 against 3 us a 4x64x64 call before). Nothing is
    # keyed on the object: its value is read on every call, and the checks it passed (a zero
    # point of a's dtype, one element) hold for any 0-d array or scalar of that dtype.
    _zp_call: tuple | None = None

    def _remember_zero_point(self, a: np.ndarray, a_zero_point: Any, call: tuple) -> None:
        if _zero_d_of(a_zero_point, a.dtype) and call is not None and len(call) == 7:
            self._zp_call = (a.shape, a.dtype, nmm.with_drop(call, self._b.drop(a.ndim)), v.max_output_bytes())
        else:
            self._zp_call = None

    def _repeat_zero_point(self, a: Any, a_zero_point: Any) -> np.ndarray | None:
        last = self._zp_call
        if (last is None or type(a) is not np.ndarray or a.dtype is not last[1] or a.shape != last[0]
                or not _zero_d_of(a_zero_point, last[1]) or last[3] != v.max_output_bytes()):
            return None
        C = _native.native()
        if C is None or C.get_isa() != last[2][0]:
            return None
        return nmm.run_zero_point(last[2], a if a.flags.c_contiguous else np.ascontiguousarray(a), a_zero_point)


class PreparedQLinearMatMul:
    """QLinearMatMul with a constant ``b`` and its scale/zero point validated and pre-transformed."""

    def __init__(self, b: np.ndarray, b_scale: Any, b_zero_point: Any, *, _owned: bool = True) -> None:
        op = "qlinear_matmul"
        if b_zero_point is None:
            raise TypeError(f"{op}: b_zero_point is required")
        self._b = _RightOperand(op, b, b_zero_point, owned=_owned)
        bs = v.scale(op, "b_scale", _widened(b_scale))
        bzp = v.zero_point(op, "b_zero_point", b_zero_point, "b", self._b.dtype)
        v.same_shape(op, "b_scale", bs, "b_zero_point", bzp)
        self.b_scale = np.array(_operand_param(op, "b_scale", bs, "b", self._b.b_shape), copy=True)
        self._params = Memo()
        if _owned and _native_takes(self._b):
            self._b.packed(_native.isa())  # pack once, now

    def bound_run(self, a_scale: Any, a_zero_point: Any, y_scale: Any, y_zero_point: Any
                  ) -> Callable[[Any], np.ndarray | None] | None:
        """``run(a, a_scale, a_zero_point, y_scale, y_zero_point)`` bound to these very parameter
        objects after a native call with them: ``f(a)`` gives run's output for an a like that
        call's, None for any other (``_RightOperand.bound_repeat``); None when there is no
        such call."""
        return self._b.bound_repeat((a_scale, a_zero_point, y_scale, y_zero_point))

    def run(self, a: np.ndarray, a_scale: Any, a_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The quantized product; output dtype is y_zero_point's."""
        op = "qlinear_matmul"
        params = (a_scale, a_zero_point, y_scale, y_zero_point)
        y = self._b.repeat(a, params)
        if y is not None:
            return y
        if a_zero_point is None:
            raise TypeError(f"{op}: a_zero_point is required")
        a_arr = v.integer_tensor(op, "a", a)
        # Per-tensor a_scale, y_scale and y_zero_point (the usual case) are validated and turned
        # into the multiplier once per distinct value (keyed by their bits, never by the caller's
        # arrays); a per-row a_scale is validated on every call.
        keys = (param_key(a_scale), param_key(y_scale), param_key(y_zero_point))
        key = None if None in keys else keys
        known = self._params.get(key)
        if known is None:
            a_s = v.scale(op, "a_scale", _widened(a_scale))
            azp = v.zero_point(op, "a_zero_point", a_zero_point, "a", a_arr.dtype)
            v.same_shape(op, "a_scale", a_s, "a_zero_point", azp)
            a_s = _operand_param(op, "a_scale", a_s, "a", a_arr.shape)
            ys = v.per_tensor(op, "y_scale", v.nonzero_scale(op, "y_scale", _widened(y_scale)))
            yzp = v.per_tensor(op, "y_zero_point", v.output_zero_point(op, "y_zero_point", y_zero_point))
            yzp = np.array(yzp, copy=True)  # memoized by value: never a view of the caller's array
            if a_s.ndim and self.b_scale.ndim:  # per row and per column: the multiplier is a matrix
                try:
                    m_shape = np.broadcast_shapes(a_s.shape, self.b_scale.shape)
                except ValueError:
                    m_shape = ()  # batches that do not broadcast: accumulate names them
                v.check_size(op, "the requantization multiplier", m_shape, 4)
            m = v.finite_multiplier(op, multiplier(a_s, self.b_scale, ys), "a_scale * b_scale / y_scale")
            known = self._params.put(key, (m, yzp))
        else:
            # a one-element a_scale: its zero point must be one element too (ONNX: same shape)
            if getattr(a_zero_point, "size", 1) != 1:
                azp = v.zero_point(op, "a_zero_point", a_zero_point, "a", a_arr.dtype)
                v.same_shape(op, "a_scale", np.asarray(a_scale), "a_zero_point", azp)
        m, yzp = known
        a_arr, matrix, zp = self._b.check_a(a_arr, a_zero_point)
        if _native_takes(self._b, matrix):
            acc, call = _native_matmul(self._b, matrix, zp, m, yzp)
            y = self._b.finish(acc, a_arr)
            self._b.remember(a_arr, params, call)
            return y
        values = self._b.accumulate(matrix, zp, np.float32)
        # An infinite product saturates, a tiny one rounds to 0 or a denormal: float32 as it should.
        with np.errstate(over="ignore", under="ignore"):
            values *= m  # float32(float32(acc) * m), in place
        return self._b.finish(round_saturate(values, yzp, yzp.dtype), a_arr)


def prepare_matmul_integer(b: np.ndarray, b_zero_point: Any = None) -> PreparedMatMulInteger:
    """Pre-transform MatMulInteger's constant ``b`` once for repeated ``run(a, a_zero_point)`` calls."""
    return PreparedMatMulInteger(b, b_zero_point)


def prepare_qlinear_matmul(b: np.ndarray, b_scale: Any, b_zero_point: Any
                           ) -> PreparedQLinearMatMul | _fmatmul.PreparedQLinearMatMulF8:
    """Pre-transform QLinearMatMul's constant ``b`` once for repeated
    ``run(a, a_scale, a_zero_point, y_scale, y_zero_point)`` calls. A float8 ``b`` (version 21)
    is decoded once to the exact product's form (see :func:`prepare_qlinear_matmul_float8`)."""
    if _is_float8(b):
        return prepare_qlinear_matmul_float8(b, b_scale, b_zero_point)
    return PreparedQLinearMatMul(b, b_scale, b_zero_point)


def prepare_qlinear_matmul_float8(b: np.ndarray, b_scale: Any, b_zero_point: Any) -> _fmatmul.PreparedQLinearMatMulF8:
    """QLinearMatMul-21's constant ``b`` (uint8, int8 or float8; float32, float16 or bfloat16
    scale) prepared for calls where ``a``, ``b`` or ``y_zero_point`` is float8: validated and
    decoded once to the exact product's float64 form, with the bound that proves it exact."""
    return _fmatmul.PreparedQLinearMatMulF8(b, b_scale, b_zero_point, _operand_param)


def matmul_integer(a: np.ndarray, b: np.ndarray, a_zero_point: Any = None, b_zero_point: Any = None) -> np.ndarray:
    """ONNX MatMulInteger-10: int32 wrap32((a - a_zero_point) @ (b - b_zero_point)).

    numpy.matmul shape rules (1-D operands, broadcast batch dimensions); zero points per tensor,
    per row of a ([M] or [..., M, 1]) or per column of b ([N] or [..., 1, N]).
    """
    key = _lean_key("matmul_integer", a, b)
    y = _lean_matmul(key, a, b, a_zero_point, b_zero_point)
    if y is not None:
        return y
    p = PreparedMatMulInteger(b, b_zero_point, _owned=False)
    y = p.run(a, a_zero_point)
    _lean_remember(key, p._b)
    return y


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
    """ONNX QLinearMatMul-10 and 21, exact per docs/contract.md.

    acc = wrap32((a - a_zp) @ (b - b_zp)); m[i, j] = float32(float32(a_scale[i] · b_scale[j]) / y_scale);
    y = sat(rne(float32(float32(acc) · m)) + y_zero_point), dtype of y_zero_point.

    Version 21: a, b and y_zero_point may each be uint8, int8 or a float8 format (ml_dtypes'
    dtypes), the scales float32, float16 or bfloat16 (widened exactly to float32). With a float8
    operand the dot product is accumulated exactly and rounded once to float32; a float8
    output is y + y_zero_point converted with saturation.
    """
    if _is_narrow_scale(a_scale) or _is_narrow_scale(b_scale) or _is_narrow_scale(y_scale):
        # float16/bfloat16 scales widened exactly to float32 first, so such calls take the lean
        # path too (every check below then sees the float32 values the contract uses)
        a_scale, b_scale, y_scale = (p.astype(np.float32) if _is_narrow_scale(p) else p
                                     for p in (a_scale, b_scale, y_scale))
    key = _lean_key("qlinear_matmul", a, b)
    y = _lean_matmul(key, a, b, a_zero_point, b_zero_point, (a_scale, b_scale, y_scale, y_zero_point))
    if y is not None:
        return y
    if any(_is_float8(p) for p in (a, b, y_zero_point)):
        return _fmatmul.qlinear_matmul("qlinear_matmul", a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                                       y_scale, y_zero_point, _operand_param)
    if any(_is_narrow_scale(p) for p in (a_scale, b_scale, y_scale)):  # float16/bfloat16: exact in float32
        a_scale, b_scale, y_scale = (_fmatmul.scale("qlinear_matmul", n, p, n == "y_scale")
                                     for n, p in (("a_scale", a_scale), ("b_scale", b_scale), ("y_scale", y_scale)))
    p = PreparedQLinearMatMul(b, b_scale, b_zero_point, _owned=False)
    y = p.run(a, a_scale, a_zero_point, y_scale, y_zero_point)
    _lean_remember(key, p._b)
    return y


# ---------------------------------------------------------------------------------------------
# The lean path of plain calls (as for convolutions, qlinear/conv.py): what depends only on the
# operands' shapes and dtypes (the shape checks, the size limit's verdict, the batch indices) is
# remembered by those values after a plain call ran natively (in ``_prepared.PLAIN``); a later
# plain call with equal ones and per-tensor parameters checks the parameters (types, shapes,
# finite scales, a nonzero y_scale, a finite multiplier) in a few operations and calls the
# native engine. Per-row or per-column parameters and anything unusual take the full path, which
# raises the usual errors.
# ---------------------------------------------------------------------------------------------


def _lean_key(op: str, a: Any, b: Any) -> tuple | None:
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        return None
    return (op, a.shape, a.dtype, b.shape, b.dtype, v.max_output_bytes())


def _lean_remember(key: tuple | None, right: _RightOperand) -> None:
    if key is None or right.call is None:
        return
    PLAIN.put(key, right.call)


def _is_float8(p: Any) -> bool:
    t = dtypes.lookup(p.dtype) if isinstance(p, (np.ndarray, np.generic)) else None
    return t is not None and t.is_float


def _is_narrow_scale(p: Any) -> bool:
    return isinstance(p, (np.ndarray, np.generic)) and p.dtype in (dtypes.F16.dtype, dtypes.BF16.dtype)


def _widened(p: Any) -> Any:
    """A float16/bfloat16 scale (QLinearMatMul-21) as float32, exactly (every value of both is a
    float32 value); anything else as given."""
    return p.astype(np.float32) if _is_narrow_scale(p) else p


def _lean_matmul(key: tuple | None, a: np.ndarray, b: np.ndarray, a_zp: Any, b_zp: Any,
                 quant: tuple | None = None) -> np.ndarray | None:
    """A plain call by the lean path (see above), or None: the full path takes it."""
    plan = PLAIN.get(key)
    if plan is None or _native.native() is None:
        return None
    ad, bd = a.dtype, b.dtype
    if a_zp is None and quant is None:
        za = 0
    elif one(a_zp, ad):
        za = one_value(a_zp)
    else:
        return None
    if b_zp is None and quant is None:
        zb = 0
    elif one(b_zp, bd):
        zb = one_value(b_zp)
    else:
        return None
    if quant is not None:
        a_scale, b_scale, y_scale, y_zp = quant
        if not (one(a_scale, F32) and one(b_scale, F32) and one(y_scale, F32)
                and (type(y_zp) is np.ndarray or isinstance(y_zp, np.generic)) and y_zp.dtype in nmm.RANGES
                and y_zp.size == 1):
            return None
        quant = (one_value(a_scale), one_value(b_scale), one_value(y_scale), y_zp.dtype, one_value(y_zp))
    return nmm.run_plain(plan, a if a.flags.c_contiguous else np.ascontiguousarray(a), za,
                         b if b.flags.c_contiguous else np.ascontiguousarray(b), zb, quant,
                         nmm.drop_axes(a.ndim, b.ndim))

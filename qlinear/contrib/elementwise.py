"""QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearWhere
(com.microsoft), as onnxruntime 1.32's x86-64 CPU kernels compute them (docs/contract.md)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import _native, dtypes
from .. import _validate as v
from . import _params as p
from ._arith import F32, cvt, fma, mlas_quantize, saturate

# From this many outputs on, a binary operator is evaluated once for all 256 x 256 input
# pairs and looked up: 65536 table entries cost less than the per-element float64 work.
_PAIR_TABLE_MIN = 1 << 17
_BYTES = np.arange(256, dtype=np.uint8)


def _input0_is_span_scalar(shape0: tuple[int, ...], shape1: tuple[int, ...]) -> bool:
    """Whether onnxruntime's broadcaster hands input 0 to the kernel as a scalar per span.

    onnxruntime merges the innermost axes into spans; its first (innermost) merged axis is the
    innermost axis where the output is not 1 (or the outermost common axis). When input 0 is
    1 along it, every span pairs one element of input 0 with a run of input 1, and QLinearAdd
    runs with the operands' roles swapped (input 0 is checked before input 1, so two
    one-element inputs also count as "input 0 scalar"). A rank-0 input 1 against input 0 makes
    input 0 the span scalar when input 0's last axis is 1.
    """
    r0, r1 = len(shape0), len(shape1)
    if r0 == 0:
        return True
    if r1 == 0:
        return shape0[-1] <= 1
    common = min(r0, r1)
    for i in range(1, common + 1):
        d0, d1 = shape0[-i], shape1[-i]
        if max(d0, d1) == 1 and i < common:
            continue
        return d0 <= 1
    return False  # unreachable: the loop returns at the outermost common axis


_PAIR_TABLES: dict[tuple, np.ndarray] = {}  # recent 256 x 256 tables by operator and parameters


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray, b: np.ndarray,
            shape: tuple[int, ...], key: tuple) -> np.ndarray:
    """fn over the broadcast of a and b: directly, or through a 256 x 256 table for big outputs
    (the same fn evaluated on every pair of 8-bit values, so the same bits). ``key`` names the
    operator and every parameter fn depends on; a model's nodes reuse their tables across runs."""
    size = int(np.prod(shape))
    if size < _PAIR_TABLE_MIN:
        a2, b2 = np.broadcast_arrays(a, b)
        return fn(a2, b2)
    table = _PAIR_TABLES.get(key)
    if table is None:
        av = _BYTES.view(a.dtype)
        bv = _BYTES.view(b.dtype)
        table = fn(av[:, None], bv[None, :]).reshape(-1)
        table.flags.writeable = False
        if len(_PAIR_TABLES) >= 256:
            _PAIR_TABLES.clear()
        _PAIR_TABLES[key] = table
    v.check_size(f"qlinear_{key[0]}", "the index of operand pairs", shape, 2)
    index = np.left_shift(a.view(np.uint8), 8, dtype=np.uint16) | b.view(np.uint8)
    return table[np.broadcast_to(index, shape) if index.shape != shape else index]


def _flat_operand(x: np.ndarray, shape: tuple[int, ...], size: int) -> tuple[np.ndarray, bool]:
    """An operand as the native kernels take it: (bytes, is_scalar). One element is a
    broadcast scalar; an operand as large as the output is its own contiguous run; any other
    broadcast is materialized (an 8-bit copy, cheap next to the float arithmetic)."""
    if x.size == 1:
        return x.reshape(-1).view(np.uint8), True
    if x.size != size:
        x = np.broadcast_to(x, shape)
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8), False


def _native_binary(C, mul: bool, first: np.ndarray, second: np.ndarray, shape: tuple[int, ...],
                   dtype: np.dtype, f0, f1, f2, z0: int, z1: int) -> np.ndarray:
    """QLinearAdd / QLinearMul on the compiled kernels (qlinear/csrc/elementwise/elementwise.c,
    csrc/isa/elementwise_avx2.c): the same float32 operations in the same order, fma as an
    explicit fused multiply-add."""
    size = int(np.prod(shape))
    out = np.empty(shape, dtype)
    if size:
        fp, ps = _flat_operand(first, shape, size)
        fq, qs = _flat_operand(second, shape, size)
        C.qbinary(C.get_isa(), int(mul), fp, ps, fq, qs, size, float(f0), float(f1), float(f2),
                  int(z0), int(z1), dtype == np.int8, out.reshape(-1).view(np.uint8))
    return out


def _binary_inputs(op, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point):
    a = p.tensor(op, "A", A)
    b = p.tensor(op, "B", B)
    p.same_dtype(op, "B", b, "A", a)
    sa, za = p.qparams(op, "A_scale", A_scale, "A_zero_point", A_zero_point, "A", a.dtype)
    sb, zb = p.qparams(op, "B_scale", B_scale, "B_zero_point", B_zero_point, "B", b.dtype)
    sc, zc = p.qparams(op, "C_scale", C_scale, "C_zero_point", C_zero_point, "A", a.dtype, divides=True)
    shape = p.broadcast_shape(op, "A and B", a.shape, b.shape)
    v.check_size(op, "the output", shape, 1)
    return a, b, (sa, za), (sb, zb), (sc, zc), shape


def _add_constants(a_params: tuple, b_params: tuple, c_params: tuple, swap: bool):
    """QLinearAdd's float32 constants (rA, rB, F) for the operand order onnxruntime uses:
    F = f(C_zp - fma(r_first, z_first, f(r_second · z_second))), first = B when ``swap``."""
    (sa, za), (sb, zb), (sc, zc) = a_params, b_params, c_params
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ra, rb = F32(sa / sc), F32(sb / sc)
        (r_first, z_first), (r_second, z_second) = ((rb, zb), (ra, za)) if swap else ((ra, za), (rb, zb))
        folded = F32(F32(zc) - fma(r_first, F32(z_first), F32(r_second * F32(z_second))))
    return ra, rb, folded


def _mul_constant(a_params: tuple, b_params: tuple, c_params: tuple) -> np.float32:
    """QLinearMul's r = f(f(A_scale · B_scale) / C_scale)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return F32(F32(a_params[0] * b_params[0]) / c_params[0])


def qlinear_add(A: np.ndarray, A_scale: Any, A_zero_point: Any, B: np.ndarray, B_scale: Any,
                B_zero_point: Any, C_scale: Any, C_zero_point: Any = None) -> np.ndarray:
    """com.microsoft QLinearAdd: C = quantize(dequantize(A) + dequantize(B)), as MLAS's AVX2
    kernel computes it (uint8 or int8; numpy broadcasting; per-tensor parameters).

    With rA = f(A_scale / C_scale), rB = f(B_scale / C_scale) and
    F = f(C_zp - fma(rA, A_zp, f(rB · B_zp))), C = sat(cvt(fma(a, rA, fma(b, rB, F)))), where
    fma rounds once and cvt gives INT_MIN (hence the type's minimum) at |v| >= 2**31 or NaN.
    Where onnxruntime's broadcaster treats A as the per-span scalar, A and B swap roles.
    """
    op = "qlinear_add"
    a, b, (sa, za), (sb, zb), (sc, zc), shape = _binary_inputs(
        op, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
    swap = _input0_is_span_scalar(a.shape, b.shape)
    ra, rb, folded = _add_constants((sa, za), (sb, zb), (sc, zc), swap)
    r_first, r_second = (rb, ra) if swap else (ra, rb)
    C = _native.native()
    if C is not None:
        first, second = (b, a) if swap else (a, b)
        return _native_binary(C, False, first, second, shape, a.dtype, r_first, r_second, folded, 0, 0)

    def add(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        inner = fma(second.astype(F32), r_second, folded)
        return saturate(cvt(fma(first.astype(F32), r_first, inner)), a.dtype)

    key = ("add", a.dtype.str, swap, ra.tobytes(), rb.tobytes(), folded.tobytes())
    if swap:
        return _binary(lambda x, y: add(y, x), a, b, shape, key)
    return _binary(add, a, b, shape, key)


def qlinear_mul(A: np.ndarray, A_scale: Any, A_zero_point: Any, B: np.ndarray, B_scale: Any,
                B_zero_point: Any, C_scale: Any, C_zero_point: Any = None) -> np.ndarray:
    """com.microsoft QLinearMul: r = f(f(A_scale · B_scale) / C_scale),
    C = sat(cvt(f(f((a - A_zp)(b - B_zp) · r) + C_zp))); the integer product is exact
    (|.| <= 65536 < 2**24), no fma, same INT_MIN quirk as QLinearAdd."""
    op = "qlinear_mul"
    a, b, (sa, za), (sb, zb), (sc, zc), shape = _binary_inputs(
        op, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
    r = _mul_constant((sa, za), (sb, zb), (sc, zc))
    C = _native.native()
    if C is not None:
        return _native_binary(C, True, a, b, shape, a.dtype, r, F32(zc), 0.0, za, zb)

    def mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        prod = ((x.astype(np.int32) - za) * (y.astype(np.int32) - zb)).astype(F32)
        with np.errstate(over="ignore", invalid="ignore"):
            return saturate(cvt(prod * r + F32(zc)), a.dtype)

    return _binary(mul, a, b, shape, ("mul", a.dtype.str, za, zb, zc, r.tobytes()))


class PreparedBinary:
    """QLinearAdd or QLinearMul with its six per-tensor parameters validated and folded once,
    for an ONNX graph whose scales and zero points are constants (qlinear.backend caches one
    per node): ``run(A, B)`` then only checks the tensors and runs the kernel.

    The parameters are validated as :func:`qlinear_add` / :func:`qlinear_mul` validate them,
    for tensors of ``dtype``; ``run`` takes the prepared path only for two NumPy arrays of
    exactly that dtype on the native engine, and hands anything else (another dtype, a
    Python list, the NumPy engine) to the public function with the original parameters, which
    validates everything and gives the same result or error. The output shape and operand
    order are remembered per pair of input shapes.
    """

    def __init__(self, op: str, dtype: np.dtype, A_scale: Any, A_zero_point: Any, B_scale: Any,
                 B_zero_point: Any, C_scale: Any, C_zero_point: Any = None):
        if op not in ("add", "mul"):
            raise ValueError(f"PreparedBinary: op must be 'add' or 'mul'; got {op!r}")
        self._mul = int(op == "mul")
        self._fn = qlinear_mul if self._mul else qlinear_add
        name = f"qlinear_{op}"
        self.dtype = np.dtype(dtype)
        if self.dtype not in dtypes.EIGHT_BIT:
            raise TypeError(f"{name}: A must have dtype uint8 or int8; got dtype {self.dtype}")
        self._params = (A_scale, A_zero_point, B_scale, B_zero_point, C_scale, C_zero_point)
        pa = p.qparams(name, "A_scale", A_scale, "A_zero_point", A_zero_point, "A", self.dtype)
        pb = p.qparams(name, "B_scale", B_scale, "B_zero_point", B_zero_point, "B", self.dtype)
        pc = p.qparams(name, "C_scale", C_scale, "C_zero_point", C_zero_point, "A", self.dtype, divides=True)
        self._signed = self.dtype == np.int8
        if self._mul:
            # kernel arguments: f0 = r, f1 = C_zp, f2 unused, z0 = A_zp, z1 = B_zp
            self._args = {False: (float(_mul_constant(pa, pb, pc)), float(F32(pc[1])), 0.0, pa[1], pb[1])}
        else:
            # f0 = r_first, f1 = r_second, f2 = F; the order depends on the shapes (swap)
            self._args = {}
            for swap in (False, True):
                ra, rb, folded = _add_constants(pa, pb, pc, swap)
                r_first, r_second = (rb, ra) if swap else (ra, rb)
                self._args[swap] = (float(r_first), float(r_second), float(folded), 0, 0)
        self._plans: dict[tuple, tuple] = {}

    def _plan(self, sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple:
        plan = self._plans.get((sa, sb))
        if plan is None:
            name = "qlinear_mul" if self._mul else "qlinear_add"
            shape = p.broadcast_shape(name, "A and B", sa, sb)
            v.check_size(name, "the output", shape, 1)
            swap = False if self._mul else _input0_is_span_scalar(sa, sb)
            plan = (shape, int(np.prod(shape)), swap)
            if len(self._plans) >= 64:
                self._plans.clear()
            self._plans[(sa, sb)] = plan
        return plan

    def run(self, A: Any, B: Any) -> np.ndarray:
        """QLinearAdd / QLinearMul of A and B with the prepared parameters."""
        C = _native.native()
        if C is None or type(A) is not np.ndarray or type(B) is not np.ndarray \
                or A.dtype != self.dtype or B.dtype != self.dtype:
            pa, za, pb, zb, pc, zc = self._params
            return self._fn(A, pa, za, B, pb, zb, pc, zc)
        shape, size, swap = self._plan(A.shape, B.shape)
        out = np.empty(shape, self.dtype)
        if size:
            first, second = (B, A) if swap else (A, B)
            # a C-contiguous operand as large as the output is handed over as it is (the
            # kernel reads its bytes through the buffer protocol); anything else is flattened
            if first.size == size and first.flags.c_contiguous:
                fp, ps = first, False
            else:
                fp, ps = _flat_operand(first, shape, size)
            if second.size == size and second.flags.c_contiguous:
                fq, qs = second, False
            else:
                fq, qs = _flat_operand(second, shape, size)
            f0, f1, f2, z0, z1 = self._args[swap]
            C.qbinary(C.get_isa(), self._mul, fp, ps, fq, qs, size, f0, f1, f2, z0, z1, self._signed, out)
        return out

    def bound_run(self, A: Any, B: Any) -> Callable[[Any, Any], np.ndarray | None] | None:
        """``run`` bound to operands like A and B when both are C-contiguous arrays of the
        prepared dtype and of the output's size (no broadcasting) on the native engine:
        ``f(A2, B2)`` gives ``run(A2, B2)`` for operands of the same shapes, dtype and
        contiguity while the native engine is selected, None for anything else (the caller then
        calls ``run``); None when A and B are not such operands. For a graph's planned node
        (``qlinear.graph.evaluator``): one Python frame and the native call."""
        C = _native.native()
        if (C is None or type(A) is not np.ndarray or type(B) is not np.ndarray or A.dtype != self.dtype
                or B.dtype != self.dtype or not A.flags.c_contiguous or not B.flags.c_contiguous):
            return None
        try:
            shape, size, swap = self._plan(A.shape, B.shape)
        except ValueError:
            return None
        if not size or A.size != size or B.size != size:
            return None
        sa, sb, dtype, mul, signed, qbinary = A.shape, B.shape, self.dtype, self._mul, self._signed, C.qbinary
        f0, f1, f2, z0, z1 = self._args[swap]

        def run(A: Any, B: Any) -> np.ndarray | None:
            if (type(A) is not np.ndarray or type(B) is not np.ndarray or A.dtype is not dtype or B.dtype is not dtype
                    or A.shape != sa or B.shape != sb or not A.flags.c_contiguous or not B.flags.c_contiguous
                    or _native.native() is not C):
                return None
            out = np.empty(shape, dtype)
            first, second = (B, A) if swap else (A, B)
            qbinary(C.get_isa(), mul, first, False, second, False, size, f0, f1, f2, z0, z1, signed, out)
            return out

        return run


def prepare_qlinear_binary(op: str, dtype: Any, A_scale: Any, A_zero_point: Any, B_scale: Any,
                           B_zero_point: Any, C_scale: Any, C_zero_point: Any = None) -> PreparedBinary:
    """A :class:`PreparedBinary` for ``op`` "add" (QLinearAdd) or "mul" (QLinearMul) on
    ``dtype`` (uint8 or int8) tensors: the parameters validated and folded once."""
    return PreparedBinary(op, np.dtype(dtype), A_scale, A_zero_point, B_scale, B_zero_point, C_scale,
                          C_zero_point)


# ----------------------------------------------------------------------------- table ops


def lookup_table(x_dtype: np.dtype, x_scale: np.float32, x_zero_point: int,
                 g: Callable[[np.ndarray], np.ndarray] | None,
                 y_scale: np.float32, y_zero_point: int) -> np.ndarray:
    """The 256-entry table onnxruntime builds, indexed by the input's byte:
    MlasQuantizeLinear(g(f(x_scale · f(x - x_zero_point)))), g the identity when None."""
    values = _BYTES.view(x_dtype).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        deq = (values - F32(x_zero_point)) * x_scale
    return mlas_quantize(deq if g is None else g(deq), y_scale, y_zero_point, x_dtype)


def _apply_table(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    C = _native.native()
    if C is None or x.size < 64:
        return table[x.view(np.uint8)]
    out = np.empty(x.shape, table.dtype)
    C.lut(np.ascontiguousarray(x).reshape(-1).view(np.uint8), table.view(np.uint8),
          out.reshape(-1).view(np.uint8))
    return out


def bound_table(x: Any, table: np.ndarray) -> Callable[[Any], np.ndarray | None] | None:
    """``apply_table(x2, table)`` bound to inputs like x when it takes the native lookup
    (a C-contiguous 8-bit array of at least 64 elements): ``f(x2)`` gives its result for an
    x2 of x's shape and dtype, C-contiguous, while the native engine is selected, None for
    anything else (the caller then calls ``apply_table``); None when x is not such an input."""
    C = _native.native()
    if (C is None or type(x) is not np.ndarray or x.size < 64 or not x.flags.c_contiguous
            or x.dtype not in dtypes.EIGHT_BIT):
        return None
    shape, dtype, tbytes, lut = x.shape, x.dtype, table.view(np.uint8), C.lut

    def run(x: Any) -> np.ndarray | None:
        if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                or _native.native() is not C):
            return None
        out = np.empty(shape, table.dtype)
        lut(x.reshape(-1).view(np.uint8), tbytes, out.reshape(-1).view(np.uint8))
        return out

    return run


_TABLES: dict[tuple, np.ndarray] = {}  # recent tables by operator and parameters


def cached_table(kind: str, x_dtype: np.dtype, x_scale: np.float32, x_zero_point: int,
                 y_scale: np.float32, y_zero_point: int, alpha: np.float32 = F32(0)) -> np.ndarray:
    """:func:`lookup_table` for ``kind`` "identity", "sigmoid" or "leaky_relu" (``alpha``),
    remembered by its exact parameters (the bits of the float32 scales): a model's nodes
    build their tables once instead of on every run."""
    key = (kind, np.dtype(x_dtype).str, F32(x_scale).tobytes(), int(x_zero_point),
           F32(y_scale).tobytes(), int(y_zero_point), F32(alpha).tobytes())
    table = _TABLES.get(key)
    if table is None:
        g = {"identity": None, "sigmoid": mlas_logistic, "leaky_relu": _leaky(F32(alpha))}[kind]
        table = lookup_table(x_dtype, x_scale, x_zero_point, g, y_scale, y_zero_point)
        table.flags.writeable = False
        if len(_TABLES) >= 1024:
            _TABLES.clear()
        _TABLES[key] = table
    return table


_LOGISTIC = {  # MLAS's rational approximation (mlas/lib/logistic.cpp), float32 constants
    "alpha": [F32(4.37031012579801e-11), F32(1.15627324459942e-07), F32(6.08574864600143e-05),
              F32(8.51377133304701e-03), F32(2.48287947061529e-01)],
    "beta": [F32(6.10247389755681e-13), F32(5.76102136993427e-09), F32(6.29106785017040e-06),
             F32(1.70198817374094e-03), F32(1.16817656904453e-01), F32(9.93151921023180e-01)],
}


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """MLAS's logistic on AVX2+FMA (LogisticKernelFma3): clamp to [-18, 18], odd polynomial p
    and even q by Horner's rule with fused multiply-adds, then max(0, f(f(p / q) + 0.5))."""
    v = np.clip(np.asarray(x, F32), F32(-18), F32(18))
    x2 = v * v
    al, be = _LOGISTIC["alpha"], _LOGISTIC["beta"]
    num = fma(x2, al[0], al[1])
    for c in al[2:]:
        num = fma(num, x2, c)
    num = num * v
    den = fma(x2, be[0], be[1])
    for c in be[2:]:
        den = fma(den, x2, c)
    return np.maximum(F32(0), (num / den) + F32(0.5))


def unary_table(kind: str, dtype: np.dtype, X_scale: Any, X_zero_point: Any, Y_scale: Any,
                Y_zero_point: Any = None, alpha: float = 0.0) -> np.ndarray:
    """The validated 256-entry table of QLinearSigmoid (``kind`` "sigmoid") or QLinearLeakyRelu
    ("leaky_relu") for X of ``dtype``: what those functions apply, indexed by X's byte (the
    backend keeps one per node when the parameters are model constants)."""
    op = {"sigmoid": "qlinear_sigmoid", "leaky_relu": "qlinear_leaky_relu"}[kind]
    sx, zx = p.qparams(op, "X_scale", X_scale, "X_zero_point", X_zero_point, "X", dtype)
    sy, zy = p.qparams(op, "Y_scale", Y_scale, "Y_zero_point", Y_zero_point, "X", dtype, divides=True)
    return cached_table(kind, dtype, sx, zx, sy, zy, F32(alpha))


def apply_table(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[x] for an 8-bit array x of the table's dtype (unchecked: see :func:`unary_table`)."""
    return _apply_table(x, table)


def _unary_table_op(op, X, X_scale, X_zero_point, Y_scale, Y_zero_point, kind, alpha=F32(0)):
    x = p.tensor(op, "X", X)
    v.check_size(op, "the output", x.shape, 1)  # X may be a broadcast view
    return _apply_table(x, unary_table(kind, x.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, alpha))


def _leaky(a: np.float32) -> Callable[[np.ndarray], np.ndarray]:
    def leaky(v: np.ndarray) -> np.ndarray:
        # v * a is computed for every v, also v = 0 where np.where keeps v: with an infinite
        # alpha that is 0 · inf = NaN, invalid but discarded (onnxruntime multiplies only v < 0)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(v >= 0, v, v * a)

    return leaky


def qlinear_sigmoid(X: np.ndarray, X_scale: Any, X_zero_point: Any, Y_scale: Any,
                    Y_zero_point: Any = None) -> np.ndarray:
    """com.microsoft QLinearSigmoid: a 256-entry table of MLAS's AVX2+FMA logistic
    (``mlas_logistic``) between dequantization and MlasQuantizeLinear."""
    return _unary_table_op("qlinear_sigmoid", X, X_scale, X_zero_point, Y_scale, Y_zero_point, "sigmoid")


def qlinear_leaky_relu(X: np.ndarray, X_scale: Any, X_zero_point: Any, Y_scale: Any,
                       Y_zero_point: Any = None, *, alpha: float = 0.01) -> np.ndarray:
    """com.microsoft QLinearLeakyRelu: table of v >= 0 ? v : f(alpha · v) (alpha as float32)."""
    alpha = p.float_attribute("qlinear_leaky_relu", "alpha", alpha)
    return _unary_table_op("qlinear_leaky_relu", X, X_scale, X_zero_point, Y_scale, Y_zero_point,
                           "leaky_relu", F32(alpha))


def _requantized(x: np.ndarray, scale: np.float32, zp: int, y_scale: np.float32, y_zp: int) -> np.ndarray:
    """An input brought to the output's parameters: copied when they are the same (same scale
    bits and zero point), else through the identity table."""
    if np.float32(scale).tobytes() == np.float32(y_scale).tobytes() and zp == y_zp:
        return x
    return _apply_table(x, cached_table("identity", x.dtype, scale, zp, y_scale, y_zp))


def qlinear_concat(Y_scale: Any, Y_zero_point: Any, *inputs: Any, axis: int) -> np.ndarray:
    """com.microsoft QLinearConcat(Y_scale, Y_zero_point, X0, X0_scale, X0_zero_point, X1, ...):
    each input requantized to Y's parameters by a table (or copied when its parameters are
    Y's), then concatenated along ``axis``. The dtype is Y_zero_point's."""
    op = "qlinear_concat"
    if len(inputs) == 0 or len(inputs) % 3:
        raise ValueError(f"{op}: inputs must be triples (tensor, scale, zero point); got {len(inputs)} values")
    yzp = p.tensor(op, "Y_zero_point", Y_zero_point)
    dtype = yzp.dtype
    sy, zy = p.qparams(op, "Y_scale", Y_scale, "Y_zero_point", yzp, "Y", dtype, divides=True)
    parts = []
    for i in range(0, len(inputs), 3):
        k = i // 3
        x = _concat_tensor(op, k, inputs[i], dtype)
        s, z = p.qparams(op, f"input {k}'s scale", inputs[i + 1], f"input {k}'s zero point",
                         inputs[i + 2], f"input {k}", dtype)
        _concat_rank(op, k, x)
        parts.append((x, s, z))
    return _concatenated(op, [x for x, _, _ in parts], axis,
                         lambda: [_requantized(x, s, z, sy, zy) for x, s, z in parts])


def _concat_tensor(op: str, k: int, value: Any, dtype: np.dtype) -> np.ndarray:
    x = p.tensor(op, f"input {k}", value)
    if x.dtype != dtype:
        raise TypeError(f"{op}: input {k} must have Y_zero_point's dtype {dtype}; got dtype {x.dtype}")
    return x


def _concat_rank(op: str, k: int, x: np.ndarray) -> None:
    if x.ndim == 0:
        raise ValueError(f"{op}: input {k} must have rank >= 1 (onnxruntime cannot concatenate scalars); "
                         f"got a 0-d array")


def _concatenated(op: str, xs: list[np.ndarray], axis: int, converted: Callable[[], list]) -> np.ndarray:
    """The shapes of ``xs`` checked against each other along ``axis``, the output's size
    bounded, then ``converted()`` (the requantized inputs) concatenated."""
    first = xs[0]
    ax = p.axis(op, axis, first.ndim)
    for k, x in enumerate(xs):
        if x.ndim != first.ndim or x.shape[:ax] + x.shape[ax + 1:] != first.shape[:ax] + first.shape[ax + 1:]:
            raise ValueError(f"{op}: input {k} has shape {x.shape}; every input must have input 0's "
                             f"shape {first.shape} except along axis {ax}")
    out_shape = list(first.shape)
    out_shape[ax] = sum(x.shape[ax] for x in xs)
    v.check_size(op, "the output", tuple(out_shape), 1)  # (each requantized input is smaller)
    return np.concatenate(converted(), axis=ax)


class PreparedQLinearConcat:
    """QLinearConcat with Y's and every input's scale and zero point (constants of the model)
    validated once, and each input's requantization table (or none: its parameters are Y's)
    chosen once; ``run`` takes the tensors and computes what ``qlinear_concat`` computes. The
    constructor raises what ``qlinear_concat`` raises about the parameters (the backend then
    keeps the full path, which reports the first error in its usual order)."""

    def __init__(self, Y_scale: Any, Y_zero_point: Any, params: Sequence[tuple[Any, Any]], *, axis: int) -> None:
        op = "qlinear_concat"
        if not params:
            raise ValueError(f"{op}: inputs must be triples (tensor, scale, zero point); got 0 values")
        yzp = p.tensor(op, "Y_zero_point", Y_zero_point)
        self.dtype = yzp.dtype
        sy, zy = p.qparams(op, "Y_scale", Y_scale, "Y_zero_point", yzp, "Y", self.dtype, divides=True)
        self.tables: list[np.ndarray | None] = []
        for k, (scale, zero_point) in enumerate(params):
            s, z = p.qparams(op, f"input {k}'s scale", scale, f"input {k}'s zero point", zero_point,
                             f"input {k}", self.dtype)
            same = np.float32(s).tobytes() == np.float32(sy).tobytes() and z == zy  # as _requantized
            self.tables.append(None if same else cached_table("identity", self.dtype, s, z, sy, zy))
        self.axis = axis

    def run(self, *tensors: Any) -> np.ndarray:
        """The concatenation of ``tensors`` (one per parameter pair, in order)."""
        op = "qlinear_concat"
        if len(tensors) != len(self.tables):
            raise ValueError(f"{op}: {len(self.tables)} inputs were prepared; got {len(tensors)}")
        xs = []
        for k, value in enumerate(tensors):
            x = _concat_tensor(op, k, value, self.dtype)
            _concat_rank(op, k, x)
            xs.append(x)
        tables = self.tables
        return _concatenated(op, xs, self.axis,
                             lambda: [x if t is None else _apply_table(x, t) for x, t in zip(xs, tables)])

    def bound_run(self, *tensors: Any) -> Callable[..., np.ndarray | None] | None:
        """``run`` bound to tensors like these (NumPy arrays of the prepared dtype whose shapes
        concatenate), for a graph's planned node (``qlinear.graph.evaluator``): the checks are
        done now, once; ``f(*tensors2)`` gives run's result for arrays of the same shapes and
        dtype under an unchanged output size limit, None for anything else (the caller then
        calls ``run``). None when run would not take these tensors."""
        if len(tensors) != len(self.tables) or any(type(t) is not np.ndarray or t.dtype != self.dtype
                                                    for t in tensors):
            return None
        try:
            op = "qlinear_concat"
            for k, x in enumerate(tensors):
                _concat_rank(op, k, x)
            ax = p.axis(op, self.axis, tensors[0].ndim)
            first = tensors[0]
            if any(x.ndim != first.ndim or x.shape[:ax] + x.shape[ax + 1:] != first.shape[:ax] + first.shape[ax + 1:]
                   for x in tensors):
                return None
            out_shape = list(first.shape)
            out_shape[ax] = sum(x.shape[ax] for x in tensors)
            v.check_size(op, "the output", tuple(out_shape), 1)
        except (ValueError, TypeError):
            return None
        shapes, dtype, tables, limit = [x.shape for x in tensors], self.dtype, self.tables, v.max_output_bytes()

        def run(*xs: Any) -> np.ndarray | None:
            if v.max_output_bytes() != limit:
                return None
            for x, shape in zip(xs, shapes):
                if type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape:
                    return None
            return np.concatenate([x if t is None else _apply_table(x, t) for x, t in zip(xs, tables)], axis=ax)

        return run


def qlinear_where(condition: np.ndarray, X: np.ndarray, x_scale: Any, x_zero_point: Any, Y: np.ndarray,
                  y_scale: Any, y_zero_point: Any, z_scale: Any, z_zero_point: Any) -> np.ndarray:
    """com.microsoft QLinearWhere: where(condition, X, Y) with X and Y requantized to Z's
    parameters by tables (or copied when theirs are Z's); numpy broadcasting of all three."""
    op = "qlinear_where"
    if not isinstance(condition, (np.ndarray, np.generic)) or np.asarray(condition).dtype != np.bool_:
        raise TypeError(f"{op}: condition must be a NumPy bool array; got "
                        f"{getattr(condition, 'dtype', type(condition).__name__)}")
    x = p.tensor(op, "X", X)
    y = p.tensor(op, "Y", Y)
    p.same_dtype(op, "Y", y, "X", x)
    sx, zx = p.qparams(op, "x_scale", x_scale, "x_zero_point", x_zero_point, "X", x.dtype)
    sy, zy = p.qparams(op, "y_scale", y_scale, "y_zero_point", y_zero_point, "Y", x.dtype)
    sz, zz = p.qparams(op, "z_scale", z_scale, "z_zero_point", z_zero_point, "X", x.dtype, divides=True)
    v.check_size(op, "the output", p.broadcast_shape(op, "condition, X and Y", np.shape(condition),
                                                    x.shape, y.shape), 1)
    return np.where(condition, _requantized(x, sx, zx, sz, zz), _requantized(y, sy, zy, sz, zz))

"""QLinearMatMul-21 with float8 operands or a float8 output (FORMATS.md Part A, Part B §5).

Every float8 value is an integer multiple of 2**e (e = the format's smallest subnormal exponent:
-9, -10, -16, -17 for e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), and an 8-bit integer minus its zero
point is an integer (e = 0). So each centered operand is an integer number of units, and the dot
product is an exact integer sum S times 2**(ea + eb). S is computed exactly by a float64 GEMM
of the units wherever a bound proves every partial sum an integer below 2**53 (always for
e4m3 x e4m3 up to K = 18,641 whatever the zero points; for e5m2 checked on the data), else
from four exact GEMMs of the operands' high and low halves assembled in 128-bit integers, else
in Python integers (see "The exact dot product" below).

S · 2**(ea + eb) is then rounded once to float32 (the accumulator), and the 8-bit contract's
float32 requantization follows: m = float32(float32(a_scale · b_scale) / y_scale), y =
float32(acc · m), then rne + zero point + saturation for an integer output, or + zero point and
the saturating conversion for a float8 output (the operator has no ``saturate`` attribute).
Two 8-bit operands keep the 8-bit contract's wrap32 accumulator. On the native engine the
operands' decoding and this output step are compiled (qlinear/csrc/f8mm/, the output conversion
by the formats' own QuantizeLinear kernels); a prepared ``b`` is decoded once.

Non-finite operands (float8 NaN, e5m2 ±inf) make the outputs they reach what IEEE arithmetic
gives the centered values' dot product: NaN where a NaN, an inf · 0 or inf − inf meets, else
±inf (counted exactly, not left to a BLAS).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _blas
from . import _validate as v
from . import dtypes
from ._prepared import ContentMemo, Memo, content_key, contiguous, param_key
from .engines.native import f8mm as _nf8

_OPERANDS = tuple(t for t in dtypes.TYPES if (t.is_int and t.bits == 8) or (t.is_float and t.bits == 8))
_SCALES = (dtypes.F32, dtypes.F16, dtypes.BF16)


def _names(types) -> str:
    return ", ".join(t.name for t in types)


def operand(op: str, name: str, value: Any) -> tuple[np.ndarray, dtypes.QType]:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array of type {_names(_OPERANDS)}; got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if t is None or t not in _OPERANDS:
        raise TypeError(f"{op}: {name} must have type {_names(_OPERANDS)}; got dtype {arr.dtype}")
    return arr, t


def scale(op: str, name: str, value: Any, divides: bool = False) -> np.ndarray:
    """A float32, float16 or bfloat16 scale (a Python float is float32), widened exactly to float32."""
    if isinstance(value, float):
        return v.nonzero_scale(op, name, value) if divides else v.scale(op, name, value)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a float or a NumPy array of type {_names(_SCALES)}; "
                        f"got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)
    t = dtypes.lookup(arr.dtype)
    if arr.dtype != np.float64 and (t is None or t not in _SCALES):
        raise TypeError(f"{op}: {name} must have type {_names(_SCALES)}; got dtype {arr.dtype}")
    wide = arr.astype(np.float32) if t in (dtypes.F16, dtypes.BF16) else arr  # exact
    return v.nonzero_scale(op, name, wide) if divides else v.scale(op, name, wide)


# ---------------------------------------------------------------------------------------------
# The exact dot product. Each operand becomes its centered values in *units* (integers: a float8
# value - zero point in multiples of 2**e, e = the format's unit exponent; an 8-bit integer -
# zero point as it is), held exactly in float64 (|units| < 2**34). The product S = ia @ ib is
# then an integer matrix, and the float64 GEMM computes it exactly when
#
#     bound = sum_k max_i |ia[i, k]| * max_j |ib[k, j]|  <  2**53:
#
# for a fixed output (i, j), every product ia[i, k] * ib[k, j] and every partial sum of any
# subset of them is an integer of magnitude <= sum_k |ia[i, k]| |ib[k, j]| <= bound < 2**53, and
# float64 holds every such integer exactly; so each multiplication, addition or fused
# multiply-add the BLAS performs has a representable exact result and is exact, in whatever
# order, blocking or thread split it sums. (The bound itself is computed in float64 from
# non-negative terms, relative error below (K + 1) * 2**-53; requiring the computed value below
# 2**52 leaves that margin for any K below 2**50.)
#
# Worst cases without looking at the data (centered magnitudes up to twice the format's maximum
# when the zero point is the opposite extreme), against the 2**52 limit: e4m3fn units <= 2 * 448
# * 2**9 = 458,752, so e4m3fn x e4m3fn takes one GEMM for K <= 21,399 whatever the values and
# zero points (85,598 with zero zero points, the usual case: 229,376**2 * K < 2**52); e4m3fnuz
# (<= 2 * 240 * 2**10 = 491,520 units) for K <= 18,641 (74,565); int8/uint8 (<= 255 units) x
# e4m3 for K <= 3.5e7. Beyond, the split path below keeps it exact. e5m2 spans too many
# binades for a data-free guarantee (57,344 * 2**16 < 2**31.8 units), so the bound is taken
# from the operands' actual maxima on every call (the prepared b's once): e5m2 data with a
# moderate range passes it. Where it fails, each operand is split into high and low halves
# (ia = ah * 2**s + al, 0 <= al < 2**s), the four products - each proved exact by the same
# bound - are taken as float64 GEMMs and assembled in 128-bit integers (csrc/f8mm/f8mm.c); and
# where even that fails (K beyond ~2**18 with wide e5m2 data), in Python integers.
# ---------------------------------------------------------------------------------------------

_TABLES: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _tables(t: dtypes.QType) -> tuple[np.ndarray, np.ndarray]:
    """(units, values) of every code of an 8-bit operand type, float64 (NaN/inf where the code
    is one): units = value * 2**-e, exact (a power of two)."""
    known = _TABLES.get(t.name)
    if known is None:
        codes = np.arange(256, dtype=np.uint8)
        if t.is_int:
            values = codes.view(t.dtype).astype(np.float64)
            units = values
        else:
            values = t.decode(codes).astype(np.float64)
            units = values * 2.0 ** -t.fmt.unit_exponent
        units.flags.writeable = values.flags.writeable = False
        known = _TABLES[t.name] = (units, values)
    return known


_LEFT: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}


def _left_tables(t: dtypes.QType) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(units, bad, lo, hi) of an 8-bit operand type for the one-call product: the units of every
    code with 0 for a NaN or an infinity, which ``bad`` (uint8, 1) marks, and the least and
    largest finite units (the bound's data-free inputs)."""
    known = _LEFT.get(t.name)
    if known is None:
        units = _tables(t)[0]
        finite = np.isfinite(units)
        fin = np.where(finite, units, 0.0)
        bad = (~finite).astype(np.uint8)
        fin.flags.writeable = bad.flags.writeable = False
        known = _LEFT[t.name] = (fin, bad, float(fin[finite].min()), float(fin[finite].max()))
    return known


def _unit_exp(t: dtypes.QType) -> int:
    return 0 if t.is_int else t.fmt.unit_exponent


class _Decoded:
    """One operand as centered units: ``units`` (float64, the operand's shape as a matrix; NaN
    and inf written as 0), ``kmax`` (K,): the largest |units| along each k, ``bad``: whether the
    operand holds a NaN or an infinity (then ``values`` gives the centered values with them)."""

    __slots__ = ("units", "kmax", "bad", "codes", "zp", "t", "left", "_ksum")

    def __init__(self, codes: np.ndarray, t: dtypes.QType, zp: np.ndarray, left: bool) -> None:
        self.codes, self.t, self.left = codes, t, left
        units_table = _tables(t)[0]
        zu = units_table[zp.view(np.uint8)]  # zero point in units (finite)
        self.zp = zu
        k_axis = codes.ndim - 1 if left else codes.ndim - 2
        # the native decoder takes a matrix with one zero point, one per row (a) or per column (b)
        lines = codes.shape[-2] if left else codes.shape[-1]
        rows = int(np.prod(codes.shape[:-1]))
        native = None
        if (zu.ndim == 0 or all(d == 1 for d in zu.shape[:-2])) and codes.size:
            flat = zu.reshape(-1)
            if flat.size == 1:
                mode, zvec = 0, flat
            elif left:  # per row: (M,), repeated over a's batch entries
                mode, zvec = 1, np.tile(flat, rows // lines)
            else:
                mode, zvec = 2, flat
            # a (per call, small) on the calling thread alone: waking the pool would leave its
            # workers spinning on the cores the GEMM's threads start on next; b on the pool
            native = _nf8.decode(codes.reshape(rows, codes.shape[-1]), units_table, zvec, mode, left,
                                 1 if left else 0)
        if native is not None:
            units, kmax, bad = native
            self.units = units.reshape(codes.shape)
            self.kmax = kmax if left else kmax.reshape(-1, codes.shape[-2]).max(axis=0)
            self.bad = bool(bad.any())
            return
        with np.errstate(invalid="ignore"):
            units = units_table[codes.view(np.uint8)] - zu  # exact: integers below 2**34
        finite = np.isfinite(units)
        self.bad = not finite.all()
        if self.bad:
            units = np.where(finite, units, 0.0)
        self.units = units
        mag = np.abs(units)
        axes = tuple(i for i in range(units.ndim) if i != k_axis)
        self.kmax = mag.max(axis=axes, initial=0.0).reshape(-1)

    def ksum(self) -> float:
        """The sum of ``kmax`` (float64; the data-free bound's factor for the other operand)."""
        try:
            return self._ksum
        except AttributeError:
            self._ksum = float(self.kmax.sum())
            return self._ksum

    def values(self) -> np.ndarray:
        """The centered values (float64, NaN and inf kept)."""
        vt = _tables(self.t)[1]
        with np.errstate(invalid="ignore"):
            return vt[self.codes.view(np.uint8)] - self.zp * 2.0 ** _unit_exp(self.t)


def _bound(ka: np.ndarray, kb: np.ndarray) -> float:
    if ka.size == 0:
        return 0.0
    return float(np.dot(ka, kb))


_EXACT = 2.0 ** 52  # the computed bound's limit (see above: the margin for its own rounding)


def _gemm(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.ndim == 2 and y.ndim == 2:
        return _blas.matmul(x, y)  # OpenBLAS, threaded as the project sets it (qlinear/_blas.py)
    return np.matmul(x, y)


def _split(x: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(h, l) with x = h * 2**s + l, 0 <= l < 2**s: exact in float64 (integers below 2**34)."""
    h = np.floor(x * 2.0 ** -s)
    return h, x - h * 2.0 ** s


def _exact_sums(a: _Decoded, b: _Decoded) -> np.ndarray:
    """The exact integer sums S = a.units @ b.units: float64 holding them exactly (or, after a
    split, rounded to odd at 53 bits, which one float32 conversion rounds correctly), or an
    object array of Python ints."""
    ia, ib, ka, kb = a.units, b.units, a.kmax, b.kmax
    if _bound(ka, kb) < _EXACT:
        return _gemm(ia, ib)
    top = max(float(ka.max(initial=0.0)), float(kb.max(initial=0.0)))
    s = max(1, (int(top).bit_length() + 1) // 2)
    # halves: |h| <= |x| / 2**s + 1 (h = floor(x / 2**s)), 0 <= l < 2**s (for a negative x, l
    # may exceed |x|: 2**s is the bound's input, not |x|)
    kah, kbh = np.floor(ka * 2.0 ** -s) + 1, np.floor(kb * 2.0 ** -s) + 1
    kal, kbl = np.full_like(ka, 2.0 ** s), np.full_like(kb, 2.0 ** s)
    if max(_bound(kah, kbh), _bound(kah, kbl), _bound(kal, kbh), _bound(kal, kbl)) < _EXACT:
        ah, al = _split(ia, s)
        bh, bl = _split(ib, s)
        parts = [_gemm(ah, bh), _gemm(ah, bl), _gemm(al, bh), _gemm(al, bl)]  # each exact (bounds)
        out = _nf8.combine(parts, s)
        if out is not None:
            return out
        hh, hl, lh, ll = (p.astype(np.int64).astype(object) for p in parts)  # exact: below 2**53
        return hh * (1 << (2 * s)) + (hl + lh) * (1 << s) + ll
    return _python_sums(ia, ib)


def _python_sums(ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """S in Python integers, for sums beyond every float64 bound (K of hundreds of thousands with
    wide e5m2 operands): int64 products of 17-bit halves, assembled exactly."""
    ia, ib = ia.astype(np.int64), ib.astype(np.int64)  # exact: integers below 2**34
    s = 17
    mask = (1 << s) - 1
    ah, al = ia >> s, ia & mask  # ia = ah·2^s + al, exactly (arithmetic shift)
    bh, bl = ib >> s, ib & mask
    # each partial product below 2**(34 + log2 K): inside int64 for K < 2**29
    hh, hl, lh, ll = (np.matmul(ah, bh), np.matmul(ah, bl), np.matmul(al, bh), np.matmul(al, bl))
    return (hh.astype(object) * (1 << (2 * s)) + (hl.astype(object) + lh.astype(object)) * (1 << s)
            + ll.astype(object))


def _round_to_f32(total: np.ndarray) -> np.ndarray:
    """float32(total) rounded once, for an object array of Python ints (and NaN/inf floats)."""
    out = np.empty(total.shape, np.float32)
    flat = out.reshape(-1)
    for i, n in enumerate(total.reshape(-1)):
        if isinstance(n, float):  # NaN or ±inf written over the sum (the IEEE rules)
            flat[i] = np.float32(n)
            continue
        n = int(n)
        mag = abs(n)
        extra = mag.bit_length() - 24
        if extra > 0:  # keep 24 significant bits, ties to even
            q, r = mag >> extra, mag & ((1 << extra) - 1)
            half = 1 << (extra - 1)
            if r > half or (r == half and q & 1):
                q += 1
            mag = q << extra
        val = float(mag)  # exact: 24 bits and a power of two below 2**128
        flat[i] = np.float32(-val if n < 0 else val)
    return out


def _special(a: _Decoded, b: _Decoded) -> np.ndarray:
    """Where NaN or an infinity reaches an output, what IEEE arithmetic gives the centered
    values' dot product (NaN where a NaN, an inf · 0 or inf - inf occurs, else ±inf), else 0:
    counted by indicator products, independent of how a BLAS treats them."""
    ca, cb = a.values(), b.values()

    def ind(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64)

    with np.errstate(invalid="ignore"):
        a_nan, b_nan = np.isnan(ca), np.isnan(cb)
        a_pinf, a_ninf, b_pinf, b_ninf = ca == np.inf, ca == -np.inf, cb == np.inf, cb == -np.inf
        a_pos, a_neg, b_pos, b_neg = ca > 0, ca < 0, cb > 0, cb < 0
        a_zero, b_zero = ca == 0, cb == 0
    mm = np.matmul
    # a NaN anywhere in row i of a or column j of b makes output (i, j) NaN
    nan = (np.any(a_nan, axis=-1)[..., :, None] | np.any(b_nan, axis=-2)[..., None, :]).astype(np.float64)
    nan = nan + mm(ind(a_pinf | a_ninf), ind(b_zero)) + mm(ind(a_zero), ind(b_pinf | b_ninf))  # inf · 0
    pinf = (mm(ind(a_pinf), ind(b_pos)) + mm(ind(a_ninf), ind(b_neg)) + mm(ind(a_pos), ind(b_pinf))
            + mm(ind(a_neg), ind(b_ninf)))
    ninf = (mm(ind(a_pinf), ind(b_neg)) + mm(ind(a_ninf), ind(b_pos)) + mm(ind(a_pos), ind(b_ninf))
            + mm(ind(a_neg), ind(b_pinf)))
    out = np.zeros(np.broadcast_shapes(nan.shape, pinf.shape), np.float64)
    out[pinf > 0] = np.inf
    out[ninf > 0] = -np.inf
    out[(nan > 0) | ((pinf > 0) & (ninf > 0))] = np.nan
    return out


class _Right:
    """The validated ``b`` with its parameters, decoded once (a prepared form keeps it)."""

    def __init__(self, op: str, b: Any, b_scale: Any, b_zero_point: Any, operand_param) -> None:
        b, bt = operand(op, "b", b)
        if b_zero_point is None:
            raise TypeError(f"{op}: b_zero_point is required")
        if b.ndim == 0:
            raise ValueError(f"{op}: a and b must have rank >= 1; got shape {b.shape}")
        bzp, _ = operand(op, "b_zero_point", b_zero_point)
        if bzp.dtype != b.dtype:
            raise TypeError(f"{op}: b_zero_point must have the type of its operand ({b.dtype}); got dtype {bzp.dtype}")
        b_s = scale(op, "b_scale", b_scale)
        v.same_shape(op, "b_scale", b_s, "b_zero_point", bzp)
        _finite_zero_point(op, "b_zero_point", bzp, bt)
        self.b, self.bt = b, bt
        self.b_s = operand_param(op, "b_scale", b_s, "b", b.shape)
        self.bzp = operand_param(op, "b_zero_point", bzp, "b", b.shape)
        self._decoded: _Decoded | None = None
        self.plans = Memo(8)  # one-call plans by a's shape and parameters (``run``)

    def decoded(self, op: str) -> _Decoded:
        d = self._decoded
        if d is None:
            b2 = self.b[:, None] if self.b.ndim == 1 else self.b
            v.check_size(op, "the float64 copy of b", b2.shape, 8)
            d = self._decoded = _Decoded(b2, self.bt, self.bzp, left=False)
        return d


def _finite_zero_point(op: str, name: str, z: np.ndarray, t: dtypes.QType) -> None:
    if t.is_float and not np.isfinite(t.decode(z)).all():
        raise ValueError(f"{op}: {name} must be finite; got {t.decode(z).ravel()[~np.isfinite(t.decode(z).ravel())][0]}")


def qlinear_matmul(op: str, a: Any, a_scale: Any, a_zero_point: Any, b: Any, b_scale: Any, b_zero_point: Any,
                   y_scale: Any, y_zero_point: Any, operand_param) -> np.ndarray:
    """QLinearMatMul-21 for float8 operands or output (see the module notes); ``operand_param``
    is matmul.py's per-tensor/per-row/per-column parameter check."""
    operand(op, "a", a)  # a's type is named before b's
    right = _plain_right(op, b, b_scale, b_zero_point, operand_param)
    return run(op, right, a, a_scale, a_zero_point, y_scale, y_zero_point, operand_param)


#: Plain calls' decoded ``b`` by its contents (``_prepared.ContentMemo``): a model's constant
#: weight passed to the function again and again is validated and decoded once.
_PLAIN_B = ContentMemo(4, 128 << 20)


def _plain_right(op: str, b: Any, b_scale: Any, b_zero_point: Any, operand_param) -> _Right:
    """The validated ``b`` of a plain call: the one a plain call with the same contents of ``b``
    and its parameters built (kept by ``_PLAIN_B``, built from private copies), else a new one,
    kept when its parameters can be keyed."""
    if type(b) is not np.ndarray or dtypes.lookup(b.dtype) not in _OPERANDS:
        return _Right(op, b, b_scale, b_zero_point, operand_param)  # raises the usual error
    key = ("b", b.dtype, b.shape, content_key(b_scale), content_key(b_zero_point), v.max_output_bytes())
    if key[3] is None or key[4] is None:
        return _Right(op, b, b_scale, b_zero_point, operand_param)
    b = contiguous(op, "b", b)
    right = _PLAIN_B.get(key, b)
    if right is None:
        copy = b.copy()
        right = _Right(op, copy, *(np.copy(p) if isinstance(p, np.ndarray) else p for p in (b_scale, b_zero_point)),
                       operand_param)
        _PLAIN_B.put(key, copy, right, copy.nbytes + 8 * copy.size)  # the copy and its float64 units
    return right


def run(op: str, right: _Right, a: Any, a_scale: Any, a_zero_point: Any, y_scale: Any, y_zero_point: Any,
        operand_param) -> np.ndarray:
    """The product of ``a`` with a validated (and possibly already decoded) ``b``. A one-call
    plan (``_OneCall``) is remembered with ``b`` by a's shape and dtype and the one-element
    parameters' types and bits (``_prepared.param_key``): a later call with equal ones skips
    the checks, whose verdict they decide."""
    plan_key = None
    if type(a) is np.ndarray:
        plan_key = (a.shape, a.dtype, param_key(a_scale), param_key(a_zero_point), param_key(y_scale),
                    param_key(y_zero_point), v.max_output_bytes())
        if None in plan_key:
            plan_key = None
        else:
            plan = right.plans.get(plan_key)
            if plan is not None:
                y = plan(a)
                if y is not None:
                    return y
    a, at = operand(op, "a", a)
    b, bt = right.b, right.bt
    for name, zp in (("a_zero_point", a_zero_point), ("y_zero_point", y_zero_point)):
        if zp is None:
            raise TypeError(f"{op}: {name} is required")
    if a.ndim == 0:
        raise ValueError(f"{op}: a and b must have rank >= 1; got shapes {a.shape} and {b.shape}")
    azp, _ = operand(op, "a_zero_point", a_zero_point)
    yzp, yt = operand(op, "y_zero_point", y_zero_point)
    if azp.dtype != a.dtype:
        raise TypeError(f"{op}: a_zero_point must have the type of its operand ({a.dtype}); got dtype {azp.dtype}")
    a_s = scale(op, "a_scale", a_scale)
    y_s = v.per_tensor(op, "y_scale", scale(op, "y_scale", y_scale, divides=True))
    yzp = v.per_tensor(op, "y_zero_point", yzp)
    v.same_shape(op, "a_scale", a_s, "a_zero_point", azp)
    _finite_zero_point(op, "a_zero_point", azp, at)
    _finite_zero_point(op, "y_zero_point", yzp, yt)
    a_s = operand_param(op, "a_scale", a_s, "a", a.shape)
    azp = operand_param(op, "a_zero_point", azp, "a", a.shape)
    ka, kb = a.shape[-1], (b.shape[-2] if b.ndim > 1 else b.shape[0])
    if ka != kb:
        raise ValueError(f"{op}: a and b cannot be multiplied: a has shape {a.shape} (K = {ka}) "
                         f"but b has shape {b.shape} (K = {kb})")
    try:
        out_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (
            ((a.shape[-2],) if a.ndim > 1 else ()) + ((b.shape[-1],) if b.ndim > 1 else ()))
    except ValueError:
        raise ValueError(f"{op}: the batch dimensions of a {a.shape[:-2]} and b {b.shape[:-2]} do not broadcast") from None
    v.check_size(op, "the output's float64 sums", out_shape, 8)
    with np.errstate(over="ignore", under="ignore"):
        m = (a_s * right.b_s) / y_s  # float32(float32(a_scale · b_scale) / y_scale)
    m = v.finite_multiplier(op, np.asarray(m, np.float32), "a_scale * b_scale / y_scale")

    a2 = a[None, :] if a.ndim == 1 else a  # numpy.matmul's 1-D rule: computed as matrices,
    v.check_size(op, "the float64 copy of a", a2.shape, 8)  # the added axis dropped at the end
    db = right.decoded(op)
    unit_exp = _unit_exp(at) + _unit_exp(bt)
    z = float(yzp) if yt.is_int else float(yt.decode(yzp).reshape(()))
    plan = _one_call(a2, at, azp, right.b, bt, db, m, unit_exp, yt, z, out_shape)
    if plan is not None:
        y = plan(a2)
        if y is not None:
            if plan_key is not None:
                right.plans.put(plan_key, plan)
            return y
    da = _Decoded(a2, at, azp, left=True)
    S = _exact_sums(da, db)
    if at.is_int and bt.is_int:  # two 8-bit operands: the 8-bit contract's wrap32 accumulator
        # (8-bit sums stay far below 2**53: K * 255**2 < 2**53 up to K ~ 1.4e11, the float64 path)
        S = ((S.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.float64)  # exact
    if da.bad or db.bad:
        special = _special(da, db)
        if S.dtype == object:
            S = np.broadcast_to(S, special.shape).copy()
            S[special != 0] = special[special != 0]
        else:
            S = np.where(special != 0, special, S)
    full = S.shape
    if S.dtype != object and full[-2:] == tuple(np.broadcast_shapes(full, m.shape)[-2:]) \
            and all(d == 1 for d in m.shape[:-2]):
        rows = int(np.prod(full[:-1]))
        m2 = m.reshape(m.shape[-2:]) if m.ndim >= 2 else m.reshape(1, 1)
        if m2.shape[0] != 1 and m2.shape[0] != rows:
            m2 = np.tile(m2, (rows // m2.shape[0], 1))
        y = _nf8.finish(np.ascontiguousarray(S).reshape(rows, full[-1]), unit_exp, m2, yt, z)
        if y is not None:
            return y.reshape(out_shape)
    if S.dtype == object:
        acc = _round_to_f32(S)
    else:
        acc = S.astype(np.float32)  # one rounding of the exact sum (or of its round-to-odd form)
    # the power of two is exact: nonzero sums lie between 2**-34 and 2**86 in magnitude
    acc = np.multiply(acc, np.float32(2.0 ** unit_exp), dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.asarray(np.multiply(acc, m, dtype=np.float32)).reshape(out_shape)
    if yt.is_int:
        lo, hi = np.float32(yt.lo), np.float32(yt.hi)
        zf = np.float32(int(yzp))
        y = np.rint(y)
        y = np.fmin(np.fmax(y, lo - zf), hi - zf) + zf  # NaN -> T's min, as QuantizeLinear
        return np.asarray(y.astype(yt.dtype))
    zf = np.float32(z)
    if zf != 0:
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.add(y, zf, dtype=np.float32)
    return np.asarray(yt.encode(np.asarray(y, np.float32), True))


class _OneCall:
    """The product in one native call for one shape of ``a`` and one set of parameters (decode of
    a, the float64 GEMM, the output step: one pool job, the GEMM single-threaded per thread on its
    columns). ``__call__(a)`` gives the output as rows x N, or None (a NaN or an infinity in a, or
    the engine no longer native): the caller then takes the general path. Immutable once built:
    calls may overlap (each allocates its own scratch)."""

    __slots__ = ("gemm", "rows", "k", "fin", "bad", "zvec", "units", "unit", "m2", "out", "out_shape")

    def __call__(self, a: np.ndarray) -> np.ndarray | None:
        if _nf8.available() is None:
            return None
        with _blas.single_threaded():  # the BLAS at one thread: the pool's threads each call it
            y = _nf8.product(self.gemm, a.reshape(self.rows, self.k), self.fin, self.bad, self.zvec, self.units,
                             self.unit, self.m2, self.out)
        return None if y is None else y.reshape(self.out_shape)


def _one_call(a2: np.ndarray, at: dtypes.QType, azp: np.ndarray, b: np.ndarray, bt: dtypes.QType, db: _Decoded,
              m: np.ndarray, unit_exp: int, yt: dtypes.QType, z: float, out_shape: tuple) -> _OneCall | None:
    """The one-call plan of a product (see ``_OneCall``), or None when the call needs the
    general path: no native engine or no OpenBLAS dgemm to call, a batched b, two 8-bit integer
    operands (the wrap32 accumulator), a NaN or an infinity in b, a parameter layout the output
    step does not take, or a bound that a's type and zero points alone do not prove.

    The bound without a look at a's values: every |a's units| is at most amax, the largest
    distance between a finite code's units and a zero point, so sum_k max_i |a[i, k]| ·
    max_j |b[k, j]| <= amax · sum_k kmax_b[k]; below 2**52 (computed; the margin of the general
    bound, see above) every product and partial sum of the GEMM is an integer below 2**53, exact
    in float64 in whatever order, blocking, column split or fused multiply-add the BLAS uses. With
    zero zero points e4m3fn x e4m3fn passes it up to K = 85,598 for any b, e5m2 only against a b
    of small units (an int8 b)."""
    if (at.is_int and bt.is_int) or b.ndim > 2 or db.bad or a2.size == 0 or not all(d == 1 for d in m.shape[:-2]):
        return None
    gemm = _blas.dgemm()
    if gemm is None or _nf8.available() is None:
        return None
    fin, bad, lo, hi = _left_tables(at)
    zu = _tables(at)[0][azp.view(np.uint8)]  # the zero points' units (finite: checked)
    if zu.ndim and not all(d == 1 for d in zu.shape[:-2]):
        return None
    amax = max(hi - float(zu.min()), float(zu.max()) - lo)
    if not amax * db.ksum() < _EXACT:
        return None
    lines = a2.shape[-2]
    rows = a2.size // a2.shape[-1]
    flat = np.ascontiguousarray(zu, np.float64).reshape(-1)
    m2 = m.reshape(m.shape[-2:]) if m.ndim >= 2 else m.reshape(1, 1)
    if m2.shape[0] != 1 and m2.shape[0] != rows:
        m2 = np.tile(m2, (rows // m2.shape[0], 1))
    plan = _OneCall()
    plan.gemm, plan.rows, plan.k, plan.fin, plan.bad = gemm, rows, a2.shape[-1], fin, bad
    plan.zvec = flat if flat.size == 1 else np.tile(flat, rows // lines)
    plan.units, plan.unit, plan.out, plan.out_shape = db.units, 2.0 ** unit_exp, _nf8.output_args(yt, z), out_shape
    plan.m2 = np.ascontiguousarray(m2, np.float32)
    return plan


class PreparedQLinearMatMulF8:
    """QLinearMatMul-21 with a constant ``b`` (any 8-bit or float8 type) whose call involves a
    float8 operand or output: ``b`` is validated and decoded to float64 units once (with the
    bound's per-k maxima), every ``run`` decodes only ``a``."""

    def __init__(self, b: np.ndarray, b_scale: Any, b_zero_point: Any, operand_param) -> None:
        self._op = "qlinear_matmul"
        self._param = operand_param
        self._right = _Right(self._op, b, b_scale, b_zero_point, operand_param)
        self._right.decoded(self._op)

    def run(self, a: np.ndarray, a_scale: Any, a_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The product of ``a`` with the prepared ``b``, as :func:`qlinear.qlinear_matmul`."""
        return run(self._op, self._right, a, a_scale, a_zero_point, y_scale, y_zero_point, self._param)

    def bound_run(self, *params: Any) -> None:
        """No bound repeat path: the graph calls ``run``."""
        return None


def node_problem(version: int, elems: dict[int, int]) -> str | None:
    """Why a QLinearMatMul node cannot run, from its inputs' ONNX element types (input index:
    element type; 0 unknown), or None: version 10 takes 8-bit operands and float32 scales,
    version 21 also float8 operands and float16/bfloat16 scales."""
    for i, elem in elems.items():
        if not elem:
            continue
        try:
            t = dtypes.from_onnx(elem)
        except KeyError:
            t = None
        if i in (1, 4, 6):
            ok = t is dtypes.F32 or (version >= 21 and t in _SCALES)
        else:
            ok = t is not None and t in _OPERANDS and (version >= 21 or (t.is_int and t.bits == 8))
        if not ok:
            name = t.name if t is not None else f"ONNX element type {elem}"
            return f"input {i} is {name}, which QLinearMatMul-{version} does not take"
    return None
